"""Exception hierarchy of the agent. Library code raises these; only the CLI entry point exits.

InferwatchError
├── ConfigError              invalid configuration (CLI exit code 2)
├── CollectorError           a collector failed: unreadable input, bad data, remote error
│   └── SourceFormatError    input parsed but not in the expected shape (garbage /metrics, bad JSON)
│       └── ReadLimitError   a file is larger than the read limit that bounds it (names the setting)
├── NoDataError              expected absence: no GPU, no PSI, runtime not running; carries a hint
├── CatalogError             a sample that does not match the metric catalog
├── ToolError                an external program (py-spy, ldd) could not run or failed
├── StorageError             a file the agent keeps (snapshot, profile) could not be written; carries a reason
└── AssetError               a shipped asset (rules, runbooks, dashboards) is missing, or export would overwrite
"""

from __future__ import annotations

import errno
import os
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


class ReadLimitError(SourceFormatError):
    """A file (procfs, sysfs) holds more than the limit on one read; ``limit`` names the setting."""

    def __init__(self, message: str, limit: str) -> None:
        super().__init__(message)
        self.limit = limit


class NoDataError(InferwatchError):
    """Expected absence of data on this host; not a failure.

    ``hint`` says how to get the data (as node_exporter's ErrNoData messages do). ``samples`` are what
    can still be said about the absence (``inferwatch.runtime.up 0``); the runner validates and keeps them.
    How soon to look again is not the exception's business: the collector registry declares it
    (``inferwatch.agent.node.collectors.Entry``: ``configured``, ``absent_retry_s``) and the runner applies it.
    """

    def __init__(self, message: str, hint: str = "", samples: Sequence[Any] = ()) -> None:
        super().__init__(message)
        self.hint = hint
        self.samples = samples

    def __str__(self) -> str:
        base = super().__str__()
        return f"{base} (hint: {self.hint})" if self.hint else base


class CatalogError(InferwatchError):
    """A sample names a metric or attribute the catalog does not declare."""


class ToolError(InferwatchError):
    """An external program could not be run or returned an error."""


class StorageError(InferwatchError):
    """A file could not be stored; ``reason`` is ``no_space``, ``unwritable``, ``too_large`` or ``io_error``.

    ``no_space`` (full disk, quota, file-size limit) and ``too_large`` are "insufficient storage" (HTTP 507).
    """

    NO_SPACE_ERRNOS = frozenset({errno.ENOSPC, errno.EDQUOT, errno.EFBIG})  # EFBIG: RLIMIT_FSIZE, file size
    UNWRITABLE_ERRNOS = frozenset({errno.EACCES, errno.EPERM, errno.EROFS, errno.ENOTDIR, errno.EEXIST, errno.EISDIR})

    def __init__(self, reason: str, message: str) -> None:
        super().__init__(message)
        self.reason = reason

    @classmethod
    def of(cls, exc: OSError, doing: str) -> StorageError:
        """The error for an OSError met while ``doing`` (e.g. "cannot write to /x"), its reason by errno."""
        if exc.errno in cls.NO_SPACE_ERRNOS:
            reason = "no_space"
        elif exc.errno in cls.UNWRITABLE_ERRNOS:
            reason = "unwritable"
        else:
            reason = "io_error"
        return cls(reason, f"{doing}: {os.strerror(exc.errno) if exc.errno else exc}")


class AssetError(InferwatchError):
    """A file the package ships is missing (a broken install), unknown by name, or in the way of an export."""
