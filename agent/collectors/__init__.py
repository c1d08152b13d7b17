"""The collector registry: one explicit list, no import side effects.

Each collector lives in its own module here (``agent/collectors/<name>.py``), as node_exporter keeps
``collector/<name>_linux.go``. Enable or disable with config (``collectors.NAME.enabled``) or the CLI
(``--collector.NAME`` / ``--no-collector.NAME``).
"""

from __future__ import annotations

from agent.collectors.base import BaseCollector, CollectContext, Collection, Collector
from agent.collectors.binary import BinaryCollector
from agent.collectors.cpu import CPUCollector
from agent.collectors.engine import EngineCollector
from agent.collectors.gpu import GPUCollector
from agent.collectors.pagecache import PageCacheCollector
from agent.collectors.probe import ProbeCollector
from agent.collectors.process import ProcessCollector
from agent.collectors.runtime_profile import RuntimeProfileCollector
from agent.collectors.simd import SimdCollector

REGISTRY: dict[str, type[BaseCollector]] = {
    cls.name: cls
    for cls in (
        PageCacheCollector,
        CPUCollector,
        ProcessCollector,
        GPUCollector,
        EngineCollector,
        RuntimeProfileCollector,
        ProbeCollector,
        BinaryCollector,
        SimdCollector,
    )
}


def enabled_collectors(ctx: CollectContext) -> list[BaseCollector]:
    """Instantiate every collector that the settings (or its default) enable."""
    out = []
    for name, cls in REGISTRY.items():
        cfg = ctx.settings.collector(name)
        enabled = cls.default_enabled if cfg.enabled is None else cfg.enabled
        if enabled:
            out.append(cls(ctx))
    return out


__all__ = ["REGISTRY", "BaseCollector", "CollectContext", "Collection", "Collector", "enabled_collectors"]
