"""How a collector is declared: its :class:`Entry` (default on/off, interval, timeout, lane), next to its class.

Each collector module ends with ``ENTRY = Entry(TheCollector, ...)``; the package (:mod:`inferwatch.agent.node.
collectors`) collects the entries of every module in the folder into its registry, as node_exporter's collectors
register themselves from their own files. Reading an entry has no side effect: nothing runs at import.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

from inferwatch.agent.config import Settings
from inferwatch.agent.node.collectors.base import BaseCollector

HOST_LANE = "host"
TIMING_MARGIN_S = 5.0  # a run's timeout beyond the requests it makes
MAX_TIMEOUT_S = 600.0
SettingsFn = Callable[[Settings], float | None]


def _always(_: Settings) -> bool:
    return True


def _none(_: Settings) -> float | None:
    return None


def _no_sections(_: Settings) -> tuple[Any, ...]:
    return ()


def runtime_configured(s: Settings) -> bool:
    """Is a runtime process configured (pid, pidfile or command-line pattern)?"""
    return bool(s.runtime.pid or s.runtime.pidfile or s.runtime.cmdline_pattern)


@dataclass(frozen=True, slots=True)
class Entry:
    """One collector's declaration. ``interval_s``/``timeout_s`` None: the agent's ``interval_s`` and
    ``min(timeout_s, interval)``; ``lane`` None: a lane (thread) of its own. ``order``: where it stands in the
    registry (the doctor's order, and who goes first on a shared lane); ``needs``: when it has something to read,
    for the docs' default column (e.g. "absent until `runtime.*` is set")."""

    cls: type[BaseCollector]
    order: int
    # what the collector's constructor takes after the context: its section(s) of the settings, or the values it reads
    sections: Callable[[Settings], tuple[Any, ...]] = _no_sections
    enabled: Callable[[Settings], bool] = _always
    interval_s: SettingsFn = _none
    timeout_s: SettingsFn = _none
    lane: str | None = HOST_LANE
    # False: nothing is configured for it to watch, so an absence is final (only a restart with new
    # configuration ends it); the runner does not call it again, the absence and its hint stay in the status.
    configured: Callable[[Settings], bool] = _always
    absent_retry_s: float | None = None  # an absence that lasts (no driver): looked at again only this often
    # the adaptive cadence's slowest interval (Schedule.slow_interval_s); only while collectors.NAME.interval_s is unset
    slow_interval_s: SettingsFn = _none
    needs: str = ""

    @property
    def name(self) -> str:
        return self.cls.name


@dataclass(frozen=True, slots=True)
class Schedule:
    """What the runner applies to one collector or processor (seconds); ``on_scrape``: run on every scrape."""

    interval_s: float
    timeout_s: float
    lane: str
    on_scrape: bool = False
    absence_final: bool = False  # an absence is not retried (nothing configured to watch)
    absent_retry_s: float | None = None  # an absence is retried after this long, not every interval
    # Adaptive cadence: ``interval_s`` while a run is cheap, stretched toward this one as its CPU time grows
    # (inferwatch.agent.node.schedule.adaptive_interval); None: fixed.
    slow_interval_s: float | None = None
