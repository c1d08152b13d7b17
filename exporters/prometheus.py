"""Prometheus exposition of the agent state.

A custom ``prometheus_client`` collector on the agent's own :class:`CollectorRegistry` (never the
global one): ``collect()`` builds metric families from the latest state, with names and labels from
the catalog, so they match what the OpenTelemetry Collector produces from our OTLP export.
"""

from __future__ import annotations

import math
from collections import defaultdict
from collections.abc import Iterator

from prometheus_client import CollectorRegistry, generate_latest
from prometheus_client.core import (
    CounterMetricFamily,
    GaugeMetricFamily,
    HistogramMetricFamily,
    Metric,
)
from prometheus_client.registry import Collector as _PromCollector

from agent import catalog
from agent.catalog.spec import Kind, MetricSpec
from agent.samples import AnySample, HistogramSample, Sample
from agent.state import AgentState

CONTENT_TYPE = "text/plain; version=0.0.4; charset=utf-8"


def _fmt_le(bound: float) -> str:
    return "+Inf" if math.isinf(bound) else repr(float(bound))


class StateCollector(_PromCollector):
    def __init__(self, state: AgentState) -> None:
        self.state = state

    def collect(self) -> Iterator[Metric]:
        grouped: dict[str, list[AnySample]] = defaultdict(list)
        for s in self.state.samples():
            grouped[s.name].append(s)
        for name in sorted(grouped):
            spec = catalog.CATALOG.get(name)
            if spec is None:  # the runner validates; an attached source might not
                continue
            yield self._family(spec, grouped[name])

    @staticmethod
    def _family(spec: MetricSpec, samples: list[AnySample]) -> Metric:
        labels = list(spec.prometheus_labels)
        prom = spec.prometheus
        family: Metric
        if spec.kind is Kind.HISTOGRAM:
            family = HistogramMetricFamily(prom, spec.description, labels=labels)
        elif spec.kind is Kind.COUNTER:
            family = CounterMetricFamily(prom, spec.description, labels=labels)
        else:
            family = GaugeMetricFamily(prom, spec.description, labels=labels)
        seen: set[tuple[str, ...]] = set()
        for s in samples:
            a = dict(s.attributes)
            values = tuple(a.get(k, "") for k in spec.attributes)
            if values in seen:  # the same series from two sources: keep the first
                continue
            seen.add(values)
            if isinstance(s, HistogramSample):
                assert isinstance(family, HistogramMetricFamily)
                family.add_metric(list(values), [(_fmt_le(le), c) for le, c in s.buckets], s.sum)
            elif isinstance(s, Sample) and isinstance(family, (GaugeMetricFamily, CounterMetricFamily)):
                family.add_metric(list(values), float(s.value))
        return family


def make_registry(state: AgentState) -> CollectorRegistry:
    registry = CollectorRegistry(auto_describe=False)
    registry.register(StateCollector(state))
    return registry


def exposition(registry: CollectorRegistry) -> bytes:
    return generate_latest(registry)
