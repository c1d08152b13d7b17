"""The metric catalog: every metric the agent emits, declared once.

The Prometheus and OTLP exporters, ``docs/metrics.md`` (generated), and the alert and dashboard lint
tests all read :data:`CATALOG`. Each domain declares its metrics in its own module; the list below is
the one place that assembles them.
"""

from __future__ import annotations

from inferwatch.agent.catalog import agent, cpu, engine, genai, gpu, memory, process, receiver, runtime
from inferwatch.agent.catalog import simd as simd_catalog
from inferwatch.agent.catalog.spec import Kind, MetricSpec, prometheus_label, prometheus_name
from inferwatch.agent.errors import CatalogError

_MODULES = (agent, cpu, memory, gpu, process, engine, genai, runtime, receiver, simd_catalog)


def _build() -> dict[str, MetricSpec]:
    out: dict[str, MetricSpec] = {}
    prom: dict[str, str] = {}
    for module in _MODULES:
        for spec in module.METRICS:
            if spec.name in out:
                raise CatalogError(f"metric {spec.name} declared twice")
            if spec.prometheus in prom:
                raise CatalogError(f"{spec.name} and {prom[spec.prometheus]} map to {spec.prometheus}")
            out[spec.name] = spec
            prom[spec.prometheus] = spec.name
    return out


CATALOG: dict[str, MetricSpec] = _build()


def get(name: str) -> MetricSpec:
    try:
        return CATALOG[name]
    except KeyError:
        raise CatalogError(f"metric {name!r} is not declared in the catalog") from None


def prometheus_series_names() -> set[str]:
    """Every Prometheus series name the agent can emit (for rule and dashboard lint)."""
    return {n for spec in CATALOG.values() for n in spec.series_names()}


__all__ = ["CATALOG", "Kind", "MetricSpec", "get", "prometheus_label", "prometheus_name", "prometheus_series_names"]
