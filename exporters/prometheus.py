"""Prometheus exposition of the agent state.

A custom ``prometheus_client`` collector on the agent's own :class:`CollectorRegistry` (never the
global one): ``collect()`` builds metric families from the latest state, with names and labels from
the catalog, so they match what the OpenTelemetry Collector produces from our OTLP export.

``/metrics`` is answered by :func:`render`, which writes the same text format straight from the state:
byte for byte what ``generate_latest`` makes of the registry (tests/test_exposition.py holds it to that),
without building a family object per metric and re-validating every name and label on every scrape (a
scrape's cost grows with the code and memory it touches: docs/benchmarks.md, "The agent's CPU target").
"""

from __future__ import annotations

import math
from collections import defaultdict
from collections.abc import Iterator
from typing import Any

from prometheus_client import CollectorRegistry
from prometheus_client.core import (
    CounterMetricFamily,
    GaugeMetricFamily,
    HistogramMetricFamily,
    Metric,
)
from prometheus_client.openmetrics.exposition import generate_latest as _openmetrics_latest
from prometheus_client.registry import Collector as _PromCollector
from prometheus_client.samples import Exemplar
from prometheus_client.utils import floatToGoString

from inferwatch.agent import catalog
from inferwatch.agent.catalog.engine import TARGET_ATTRIBUTES
from inferwatch.agent.catalog.spec import Kind, MetricSpec
from inferwatch.agent.common.samples import AnySample, HistogramSample, Sample
from inferwatch.agent.node.state import AgentState

CONTENT_TYPE = "text/plain; version=0.0.4; charset=utf-8"
OPENMETRICS_CONTENT_TYPE = "application/openmetrics-text; version=1.0.0; charset=utf-8"


def _fmt_le(bound: float) -> str:
    return "+Inf" if math.isinf(bound) else repr(float(bound))


Series = list[tuple[tuple[str, ...], AnySample]]


def _series(state: AgentState) -> Iterator[tuple[MetricSpec, tuple[str, ...], Series]]:
    """Every catalog metric in the state, by name: its spec, the target attributes its series carry, and (label
    values: catalog order, then those target attributes; sample).

    A target attribute (:data:`~inferwatch.agent.catalog.engine.TARGET_ATTRIBUTES`: which engine, when the agent
    watches several) is a label of a family where one of its series has it, empty on the others (an empty label is
    no label to Prometheus); a family without any is as the catalog declares it. The same series from two sources
    keeps the first; a sample whose name the catalog lacks is dropped (the runner validates; an attached source
    might not). Both :class:`StateCollector` and :func:`render` read this.
    """
    grouped: dict[str, list[AnySample]] = defaultdict(list)
    for s in state.samples():
        grouped[s.name].append(s)
    for name in sorted(grouped):
        spec = catalog.CATALOG.get(name)
        if spec is None:
            continue
        present = {k for s in grouped[name] for k, _ in s.attributes if k in TARGET_ATTRIBUTES}
        keys = (*spec.attributes, *(k for k in TARGET_ATTRIBUTES if k in present))
        seen: set[tuple[str, ...]] = set()
        series = []
        for s in grouped[name]:
            a = dict(s.attributes)
            values = tuple(a.get(k, "") for k in keys)
            if values not in seen:
                seen.add(values)
                series.append((values, s))
        yield spec, keys[len(spec.attributes) :], series


class StateCollector(_PromCollector):
    def __init__(self, state: AgentState) -> None:
        self.state = state

    def collect(self) -> Iterator[Metric]:
        for spec, targets, series in _series(self.state):
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
                buckets: list[Any] = [(_fmt_le(le), c) for le, c in s.buckets]
                for i, ex in enumerate(s.exemplars[: len(buckets)]):
                    if ex is not None:  # only the OpenMetrics format writes them
                        buckets[i] = (*buckets[i], Exemplar({"trace_id": ex[0]}, ex[1], ex[2] or None))
                family.add_metric(list(values), buckets, s.sum)
            elif isinstance(s, Sample) and isinstance(family, (GaugeMetricFamily, CounterMetricFamily)):
                family.add_metric(list(values), float(s.value))
        return family


class _Format:
    """One metric's fixed text: HELP and TYPE lines, sample names, label names in output (sorted) order."""

    __slots__ = ("buckets", "header", "kind", "labels", "name")

    def __init__(self, spec: MetricSpec, targets: tuple[str, ...] = ()) -> None:
        name = spec.prometheus
        kind = "histogram" if spec.kind is Kind.HISTOGRAM else "counter" if spec.kind is Kind.COUNTER else "gauge"
        doc = spec.description.replace("\\", r"\\").replace("\n", r"\n")
        self.header = f"# HELP {name} {doc}\n# TYPE {name} {kind}\n"
        self.name = name
        self.kind = spec.kind
        # prometheus_client writes labels sorted by label name; a histogram's "le" takes its sorted place too.
        # Each label is (its text up to the value, the index of its value in catalog attribute order).
        all_labels = (*spec.prometheus_labels, *(TARGET_ATTRIBUTES[k] for k in targets))
        names = sorted((label, i) for i, label in enumerate(all_labels))
        self.labels = tuple((f'{label}="', i) for label, i in names)
        self.buckets = sorted([label for label, _ in names] + ["le"]).index("le") if spec.kind is Kind.HISTOGRAM else -1


_FORMATS: dict[tuple[str, tuple[str, ...]], _Format] = {}  # by (metric, target attributes its family carries)


def _escape(value: str) -> str:
    if "\\" in value or "\n" in value or '"' in value:
        return value.replace("\\", r"\\").replace("\n", r"\n").replace('"', r"\"")
    return value


def render(state: AgentState) -> bytes:
    """The state in the Prometheus text format, as ``generate_latest(make_registry(state))`` writes it.

    Written a family at a time into one buffer: a line's text lives until its family is encoded, not until the
    whole body is (one render at 50 engine models, 10,323 lines: an allocation peak of 3.2 MB against 9.3 MB with
    every line held; benchmarks/results/engine_scale_2026-12-02_1615-1639.json).
    """
    body = bytearray()
    out: list[str] = []
    for spec, targets, series in _series(state):
        if out:
            body += "".join(out).encode()
            out.clear()
        fmt = _FORMATS.get((spec.name, targets))
        if fmt is None:
            fmt = _FORMATS[(spec.name, targets)] = _Format(spec, targets)
        out.append(fmt.header)
        prom = fmt.name
        for values, s in series:
            parts = [f'{head}{_escape(values[i])}"' for head, i in fmt.labels]
            if isinstance(s, HistogramSample):
                if fmt.kind is not Kind.HISTOGRAM:
                    continue
                at = fmt.buckets
                for le, count in s.buckets:
                    parts.insert(at, f'le="{_fmt_le(le)}"')
                    out.append(f"{prom}_bucket{{{','.join(parts)}}} {floatToGoString(count)}\n")
                    del parts[at]
                if s.buckets and s.buckets[0][0] >= 0:  # prometheus_client drops count and sum below zero
                    labels = f"{{{','.join(parts)}}}" if parts else ""
                    out.append(f"{prom}_count{labels} {floatToGoString(s.buckets[-1][1])}\n")
                    out.append(f"{prom}_sum{labels} {floatToGoString(s.sum)}\n")
            elif fmt.kind is not Kind.HISTOGRAM:
                labels = f"{{{','.join(parts)}}}" if parts else ""
                out.append(f"{prom}{labels} {floatToGoString(s.value)}\n")
    body += "".join(out).encode()
    return bytes(body)


def render_openmetrics(state: AgentState) -> bytes:
    """The state in the OpenMetrics text format, with the latency histograms' exemplars (trace ids).

    Served when the scraper asks for it (Prometheus does, first, in its Accept header) and the span receiver feeds
    histograms (``receiver.emit_histograms``): through prometheus_client's registry, slower than :func:`render`.
    """
    return _openmetrics_latest(make_registry(state))


def make_registry(state: AgentState) -> CollectorRegistry:
    registry = CollectorRegistry(auto_describe=False)
    registry.register(StateCollector(state))
    return registry
