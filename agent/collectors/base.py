"""The collector protocol.

A collector reads one part of the world and returns plain values (:class:`Collection`). It never
knows which sink shows its data, never measures its own duration or success (the runner does), and
takes every OS or hardware boundary from its :class:`CollectContext` (procfs and sysfs roots, the
NVML client, HTTP clients), so it can be tested on recorded files.

Raise :class:`~agent.errors.NoDataError` (with a hint) for expected absence, any other exception for
failure.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, ClassVar, Protocol

from agent.config import Settings
from agent.samples import AnySample, Finding


@dataclass(frozen=True, slots=True)
class Collection:
    """What one collector run produced."""

    samples: Sequence[AnySample] = ()
    findings: Sequence[Finding] = ()
    details: Mapping[str, Any] = field(default_factory=dict)  # shown in the status API


@dataclass
class CollectContext:
    """Everything a collector may touch outside the process, injectable for tests."""

    settings: Settings
    services: dict[str, Any] = field(default_factory=dict)  # shared helpers (runtime locator, nvml client)

    @property
    def procfs(self) -> Path:
        return self.settings.path.procfs

    @property
    def sysfs(self) -> Path:
        return self.settings.path.sysfs


class Collector(Protocol):
    name: ClassVar[str]
    default_enabled: ClassVar[bool]
    default_interval_s: ClassVar[float | None]  # None: the agent's global interval
    lane: ClassVar[str | None]  # "host": runs in turn with the other host reads; None: a thread of its own

    def collect(self) -> Collection: ...

    def close(self) -> None: ...


class BaseCollector:
    """Convenience base: stores the context; subclasses set the class variables and ``collect``."""

    name: ClassVar[str] = ""
    default_enabled: ClassVar[bool] = True
    default_interval_s: ClassVar[float | None] = None
    # Quick local reads share the "host" lane (one worker thread, calls in turn); a collector that waits on
    # the network or a subprocess sets None and gets a lane of its own, so it never delays the others.
    lane: ClassVar[str | None] = "host"
    description: ClassVar[str] = ""

    def __init__(self, ctx: CollectContext) -> None:
        self.ctx = ctx

    def collect(self) -> Collection:  # pragma: no cover - abstract
        raise NotImplementedError

    def quick(self) -> bool:
        """Whether the next call is a quick local read, so it can take its turn on the host lane.

        A collector with a lane of its own (``lane = None``) returns True for a call that will not wait on
        the network or a subprocess (re-exporting a kept result): it then costs no wake-up of its own thread.
        """
        return self.lane == "host"

    def close(self) -> None:
        """Release resources (clients, handles). Safe to call twice."""
