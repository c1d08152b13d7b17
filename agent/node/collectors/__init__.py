"""The collector registry: one explicit list, no import side effects, and each collector's scheduling.

Each collector lives in its own module here (``agent/node/collectors/<name>.py``), as node_exporter keeps
``collector/<name>_linux.go``, and is declared once below with its default on/off, interval, timeout
and lane (:class:`Entry`); the collectors themselves hold none of it. Enable or disable with config
(``collectors.NAME.enabled``) or the CLI (``--collector.NAME`` / ``--no-collector.NAME``); a configured
``collectors.NAME.interval_s`` / ``timeout_s`` wins over the defaults here, and is the only place a
collector's timing is configured (a section's ``timeout_s``, such as ``probe.timeout_s``, bounds one
request, from which the entry derives the run's default timeout).

Lanes: quick local reads (/proc, /sys, NVML) share the ``host`` lane, one worker thread calling them in
turn; a collector that waits on the network has a lane of its own (``lane=None``), so it never delays
the others.

The registry is part of the composition: its predicates and :func:`schedule` read the whole ``Settings`` to decide
what runs and when, each entry names the sections its collector is built with (``sections``), and the composition
root (agent/node/app.py) hands the runner the result (:func:`schedules`). Neither the runner nor a collector reads the
whole settings.
"""

from __future__ import annotations

from collections.abc import Callable, Iterable
from dataclasses import dataclass
from typing import Any

from inferwatch.agent.config import (
    DEFAULT_ENGINE_INTERVAL_S,
    DEFAULT_PROBE_INTERVAL_S,
    DEFAULT_PROFILE_INTERVAL_S,
    Settings,
)
from inferwatch.agent.node.collectors.base import BaseCollector, CollectContext, Collection, Collector
from inferwatch.agent.node.collectors.cpu import DEFAULT_CPU_INTERVAL_S, CPUCollector
from inferwatch.agent.node.collectors.engine import EngineCollector
from inferwatch.agent.node.collectors.gpu import GPUCollector
from inferwatch.agent.node.collectors.pagecache import PageCacheCollector
from inferwatch.agent.node.collectors.probe import ProbeCollector
from inferwatch.agent.node.collectors.process import ProcessCollector
from inferwatch.agent.node.collectors.runtime_profile import RuntimeProfileCollector
from inferwatch.agent.node.collectors.simd import SimdCollector
from inferwatch.agent.node.host.nvml import NVML_ABSENT_RETRY_S
from inferwatch.agent.node.host.runtime import url_port

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


def _runtime_configured(s: Settings) -> bool:
    return bool(s.runtime.pid or s.runtime.pidfile or s.runtime.cmdline_pattern)


@dataclass(frozen=True, slots=True)
class Entry:
    """One collector's declaration. ``interval_s``/``timeout_s`` None: the agent's ``interval_s`` and
    ``min(timeout_s, interval)``; ``lane`` None: a lane (thread) of its own."""

    cls: type[BaseCollector]
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


REGISTRY: dict[str, Entry] = {
    e.name: e
    for e in (
        Entry(PageCacheCollector, sections=lambda s: (s.pagecache,)),
        Entry(CPUCollector, sections=lambda s: (s.cpu, s.path.machine), interval_s=lambda s: DEFAULT_CPU_INTERVAL_S),
        Entry(ProcessCollector, sections=lambda s: (s.pagecache,), configured=_runtime_configured),
        Entry(GPUCollector, absent_retry_s=NVML_ABSENT_RETRY_S),
        Entry(
            EngineCollector,
            sections=lambda s: (s.engine,),
            lane=None,
            configured=lambda s: bool(s.engine.metrics_url),
            # hang detection's fast path needs two readings 6 s apart soon after the last token
            # (agent/node/engine/hang.py); a costly read (a large exposition: hundreds of models) backs off toward the
            # agent's interval
            interval_s=lambda s: min(s.interval_s, DEFAULT_ENGINE_INTERVAL_S),
            slow_interval_s=lambda s: s.interval_s,
            # the fetch's own deadline plus the parse, not the 2 s interval: a large exposition's 2-5 s read is
            # finished, not cut (the runner starts the next run when a long one ends; the cadence then adapts)
            timeout_s=lambda s: s.engine.timeout_s + TIMING_MARGIN_S,
        ),
        Entry(
            RuntimeProfileCollector,
            sections=lambda s: (s.runtime_profile,),
            enabled=lambda s: bool(s.runtime_profile.url),
            interval_s=lambda s: DEFAULT_PROFILE_INTERVAL_S,
            timeout_s=lambda s: s.runtime_profile.timeout_s + TIMING_MARGIN_S,
            lane=None,
        ),
        Entry(
            ProbeCollector,
            sections=lambda s: (s.probe,),
            enabled=lambda s: bool(s.probe.url),
            interval_s=lambda s: DEFAULT_PROBE_INTERVAL_S,
            timeout_s=lambda s: s.probe.timeout_s * len(s.probe.protocols) + TIMING_MARGIN_S,
            lane=None,
        ),
        Entry(
            SimdCollector,
            sections=lambda s: (s.simd, url_port(s.engine.metrics_url)),
            configured=lambda s: _runtime_configured(s) or url_port(s.engine.metrics_url) is not None,
        ),
    )
}


def is_enabled(name: str, settings: Settings) -> bool:
    cfg = settings.collector(name)
    return REGISTRY[name].enabled(settings) if cfg.enabled is None else cfg.enabled


def schedule(name: str, settings: Settings) -> Schedule:
    """A collector's interval, timeout and lane: ``collectors.NAME`` first, then its entry, then the agent's."""
    entry = REGISTRY.get(name)
    cfg = settings.collector(name)
    interval = cfg.interval_s or (entry.interval_s(settings) if entry else None) or settings.interval_s
    default_timeout = entry.timeout_s(settings) if entry else None
    timeout = cfg.timeout_s or (min(default_timeout, MAX_TIMEOUT_S) if default_timeout else None)
    lane = HOST_LANE if entry is None else entry.lane or name
    final = entry is not None and not entry.configured(settings)
    retry = entry.absent_retry_s if entry else None
    slow = entry.slow_interval_s(settings) if entry is not None and not cfg.interval_s else None
    slow = slow if slow is not None and slow > interval else None  # a configured interval is kept as it is
    return Schedule(interval, timeout or min(settings.timeout_s, interval), lane, False, final, retry, slow)


def schedules(collectors: Iterable[Collector], settings: Settings) -> dict[str, Schedule]:
    """Each collector's :func:`schedule`, by name: what the runner is given."""
    return {c.name: schedule(c.name, settings) for c in collectors}


def build(name: str, ctx: CollectContext, settings: Settings) -> BaseCollector:
    """Collector ``name`` as the agent builds it: the context, then its entry's sections of ``settings``."""
    entry = REGISTRY[name]
    return entry.cls(ctx, *entry.sections(settings))


def enabled_collectors(ctx: CollectContext, settings: Settings) -> list[BaseCollector]:
    """Instantiate every collector that the settings (or its entry's default) enable."""
    return [build(name, ctx, settings) for name in REGISTRY if is_enabled(name, settings)]


__all__ = [
    "HOST_LANE",
    "REGISTRY",
    "BaseCollector",
    "CollectContext",
    "Collection",
    "Collector",
    "Entry",
    "Schedule",
    "build",
    "enabled_collectors",
    "is_enabled",
    "schedule",
    "schedules",
]
