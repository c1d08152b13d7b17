"""The collector protocol. How often, how long and on which lane a collector runs is not its business:
the registry (:mod:`inferwatch.agent.node.collectors`) declares it and the runner applies it.

A collector reads one part of the world and returns plain values (:class:`Collection`). It never
knows which sink shows its data, never measures its own duration or success (the runner does), and
takes every OS or hardware boundary from its :class:`CollectContext` (procfs and sysfs roots, the
NVML client, HTTP clients), so it can be tested on recorded files.

Raise :class:`~inferwatch.agent.errors.NoDataError` (with a hint) for expected absence, any other exception for
failure. A failure the collector cannot raise itself (its call passed the runner's timeout, or is still
running when the next one is due) is told to it through :meth:`BaseCollector.run_failed`, so a collector
that exports its own health (the engine's ``up``) reports it as it reports a failure it raised.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING, ClassVar, Protocol

from inferwatch.agent.common.retrycounts import RetryCounts
from inferwatch.agent.common.samples import Collection
from inferwatch.agent.node.host.procfs import DEFAULT_READ_LIMITS, ReadLimits

if TYPE_CHECKING:  # the context's types only: an agent imports httpx (and the rest) when a part that uses it is on
    import httpx

    from inferwatch.agent.node.debugprofile.reader import ProfileReader
    from inferwatch.agent.node.host.cpuprobe import CpuProbe
    from inferwatch.agent.node.host.nvml import NVMLClient
    from inferwatch.agent.node.host.runtime import RuntimeLocator


@dataclass(frozen=True, slots=True)
class CollectContext:
    """Everything a collector may touch outside the process, built once by :mod:`inferwatch.agent.node.wiring`.

    Shared instances (one runtime locator, one NVML client, one profile reader) are passed explicitly;
    tests build one with :func:`inferwatch.agent.node.wiring.collect_context` and replace what they fake. No settings:
    a collector's constructor takes its own section (the registry's ``Entry.sections``).
    """

    procfs: Path
    sysfs: Path
    nvml: NVMLClient
    cpu_probe: CpuProbe
    locator: RuntimeLocator
    profile_reader: ProfileReader
    engine_http: httpx.Client | None = None  # None: the engine collector opens (and closes) its own
    # requests sent again after a keep-alive connection closed under them (agent/common/httpclient.py), by source
    http_retries: RetryCounts = field(default_factory=RetryCounts, compare=False)
    read_limits: ReadLimits = DEFAULT_READ_LIMITS  # bytes per procfs/sysfs read, and where hits are counted


class Collector(Protocol):
    name: ClassVar[str]

    def collect(self) -> Collection: ...

    def close(self) -> None: ...


class BaseCollector:
    """Convenience base: stores the context; subclasses set the class variables and ``collect``."""

    name: ClassVar[str] = ""
    description: ClassVar[str] = ""
    reads: ClassVar[str] = ""  # what it reads, for docs/collectors.md's generated table (Markdown)

    def __init__(self, ctx: CollectContext) -> None:
        self.ctx = ctx

    def collect(self) -> Collection:  # pragma: no cover - abstract
        raise NotImplementedError

    def run_failed(self, reason: str) -> None:
        """The runner recorded a failure of this collector that it did not raise: ``timeout`` (a call passed its
        timeout and was abandoned) or ``hung`` (that call has still not returned when the next run is due).

        Called from the runner's scheduler, under its lock: do no I/O here. Default: nothing to do.
        """

    def close(self) -> None:
        """Release resources (clients, handles). Safe to call twice."""
