"""The collector registry: every collector module in this folder, each declaring itself, and the scheduling.

Each collector lives in its own module here (``agent/node/collectors/<name>.py``), as node_exporter keeps
``collector/<name>_linux.go``, and declares itself at its end: ``ENTRY = Entry(TheCollector, order=..., ...)``
with its default on/off, interval, timeout, lane and the settings sections its constructor takes
(:mod:`~inferwatch.agent.node.collectors.registry`). This package reads those entries (importing the modules
runs nothing) into :data:`REGISTRY`, in ``order``. Enable or disable with config (``collectors.NAME.enabled``) or
the CLI (``--collector.NAME`` / ``--no-collector.NAME``); a configured ``collectors.NAME.interval_s`` /
``timeout_s`` wins over the entry's defaults, and is the only place a collector's timing is configured (a
section's ``timeout_s``, such as ``probe.timeout_s``, bounds one request, from which the entry derives the run's
default timeout).

Lanes: quick local reads (/proc, /sys, NVML) share the ``host`` lane, one worker thread calling them in
turn; a collector that waits on the network has a lane of its own (``lane=None``), so it never delays
the others.

The registry is part of the composition: its predicates and :func:`schedule` read the whole ``Settings`` to decide
what runs and when, each entry names the sections its collector is built with (``sections``), and the composition
root (agent/node/app.py) hands the runner the result (:func:`schedules`). Neither the runner nor a collector reads the
whole settings.
"""

from __future__ import annotations

import importlib
import pkgutil
from collections.abc import Iterable

from inferwatch.agent.config import Settings
from inferwatch.agent.errors import InferwatchError
from inferwatch.agent.node.collectors.base import BaseCollector, CollectContext, Collection, Collector
from inferwatch.agent.node.collectors.registry import (
    HOST_LANE,
    MAX_TIMEOUT_S,
    TIMING_MARGIN_S,
    Entry,
    Schedule,
    SettingsFn,
    runtime_configured,
)

NOT_COLLECTORS = frozenset({"base", "registry"})  # the folder's modules that declare no collector


def _entries() -> list[Entry]:
    """Every collector module's ``ENTRY``, in ``order``. A module here without one is a mistake, not skipped."""
    found: list[Entry] = []
    for info in pkgutil.iter_modules(__path__):
        if info.name in NOT_COLLECTORS:
            continue
        module = importlib.import_module(f"{__name__}.{info.name}")
        entry = getattr(module, "ENTRY", None)
        if not isinstance(entry, Entry):
            raise InferwatchError(f"collector module {module.__name__} declares no ENTRY = Entry(...)")
        found.append(entry)
    orders = [e.order for e in found]
    if len(set(orders)) != len(orders):
        raise InferwatchError(f"two collectors share an order: {sorted((e.order, e.name) for e in found)}")
    return sorted(found, key=lambda e: e.order)


REGISTRY: dict[str, Entry] = {e.name: e for e in _entries()}


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
    "MAX_TIMEOUT_S",
    "REGISTRY",
    "TIMING_MARGIN_S",
    "BaseCollector",
    "CollectContext",
    "Collection",
    "Collector",
    "Entry",
    "Schedule",
    "SettingsFn",
    "build",
    "enabled_collectors",
    "is_enabled",
    "runtime_configured",
    "schedule",
    "schedules",
]
