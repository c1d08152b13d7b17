"""Exception hierarchy of the agent. Library code raises these; only the CLI entry point exits.

InferwatchError
├── ConfigError              invalid configuration (CLI exit code 2)
├── CollectorError           a collector failed: unreadable input, bad data, remote error
│   └── SourceFormatError    input parsed but not in the expected shape (garbage /metrics, bad JSON)
├── NoDataError              expected absence: no GPU, no PSI, runtime not running; carries a hint
├── CatalogError             a sample that does not match the metric catalog
├── ToolError                an external program (py-spy, ldd) could not run or failed
└── AssetError               a shipped asset (rules, runbooks, dashboards) is missing, or export would overwrite
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any


class InferwatchError(Exception):
    """Base class of every error the agent raises on purpose."""


class ConfigError(InferwatchError):
    """The configuration is invalid; the message names the field."""


class CollectorError(InferwatchError):
    """A collector could not produce data because something is wrong (not merely absent)."""


class SourceFormatError(CollectorError):
    """A source answered, but not in the format we read (garbage exposition, non-JSON body, ...)."""


class NoDataError(InferwatchError):
    """Expected absence of data on this host; not a failure.

    ``hint`` says how to get the data (as node_exporter's ErrNoData messages do). ``samples`` are what
    can still be said about the absence (``inferwatch.runtime.up 0``); the runner validates and keeps them.
    ``permanent``: only a configuration change (which means a restart) can end it, so the runner does not
    call the collector again (nothing configured to watch); the absence and its hint stay in the status.
    ``retry_s``: what ends the absence changes slowly (a driver installed), so the runner calls the collector
    again only after this many seconds, not every interval; the absence is reported meanwhile.
    """

    def __init__(
        self,
        message: str,
        hint: str = "",
        samples: Sequence[Any] = (),
        permanent: bool = False,
        retry_s: float | None = None,
    ) -> None:
        super().__init__(message)
        self.hint = hint
        self.samples = samples
        self.permanent = permanent
        self.retry_s = retry_s

    def __str__(self) -> str:
        base = super().__str__()
        return f"{base} (hint: {self.hint})" if self.hint else base


class CatalogError(InferwatchError):
    """A sample names a metric or attribute the catalog does not declare."""


class ToolError(InferwatchError):
    """An external program could not be run or returned an error."""


class AssetError(InferwatchError):
    """A file the package ships is missing (a broken install), unknown by name, or in the way of an export."""
