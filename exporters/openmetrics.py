"""The agent state through prometheus_client: the OpenMetrics exposition (with exemplars) and the registry that
tests compare :func:`inferwatch.exporters.prometheus.render` with.

A custom collector on the agent's own :class:`CollectorRegistry` (never the global one): ``collect()`` builds metric
families from the latest state. Imported only when a scrape asks for OpenMetrics and the span receiver feeds
exemplars, or by tests: the plain text path never loads prometheus_client.
"""

from __future__ import annotations

from collections.abc import Iterator
from typing import Any

from prometheus_client import CollectorRegistry
from prometheus_client.core import CounterMetricFamily, GaugeMetricFamily, HistogramMetricFamily, Metric
from prometheus_client.openmetrics.exposition import generate_latest as _openmetrics_latest
from prometheus_client.registry import Collector as _PromCollector
from prometheus_client.samples import Exemplar

from inferwatch.agent.catalog.engine import TARGET_ATTRIBUTES
from inferwatch.agent.catalog.spec import Kind, MetricSpec
from inferwatch.agent.common.samples import HistogramSample, Sample
from inferwatch.agent.node.state import AgentState
from inferwatch.exporters.prometheus import Series, fmt_le, state_series


class StateCollector(_PromCollector):
    def __init__(self, state: AgentState) -> None:
        self.state = state

    def collect(self) -> Iterator[Metric]:
        for spec, targets, series in state_series(self.state):
            yield self._family(spec, targets, series)

    @staticmethod
    def _family(spec: MetricSpec, targets: tuple[str, ...], series: Series) -> Metric:
        labels = [*spec.prometheus_labels, *(TARGET_ATTRIBUTES[k] for k in targets)]
        prom = spec.prometheus
        family: Metric
        if spec.kind is Kind.HISTOGRAM:
            family = HistogramMetricFamily(prom, spec.description, labels=labels)
        elif spec.kind is Kind.COUNTER:
            family = CounterMetricFamily(prom, spec.description, labels=labels)
        else:
            family = GaugeMetricFamily(prom, spec.description, labels=labels)
        for values, s in series:
            if isinstance(s, HistogramSample):
                assert isinstance(family, HistogramMetricFamily)
                buckets: list[Any] = [(fmt_le(le), c) for le, c in s.buckets]
                for i, ex in enumerate(s.exemplars[: len(buckets)]):
                    if ex is not None:  # only the OpenMetrics format writes them
                        buckets[i] = (*buckets[i], Exemplar({"trace_id": ex[0]}, ex[1], ex[2] or None))
                family.add_metric(list(values), buckets, s.sum)
            elif isinstance(s, Sample) and isinstance(family, (GaugeMetricFamily, CounterMetricFamily)):
                family.add_metric(list(values), float(s.value))
        return family


def render_openmetrics(state: AgentState) -> bytes:
    """The state in the OpenMetrics text format (see :func:`inferwatch.exporters.prometheus.render_openmetrics`)."""
    return _openmetrics_latest(make_registry(state))


def make_registry(state: AgentState) -> CollectorRegistry:
    registry = CollectorRegistry(auto_describe=False)
    registry.register(StateCollector(state))
    return registry
