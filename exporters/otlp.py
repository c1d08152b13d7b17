"""OTLP metric export, on the OpenTelemetry SDK's exporters.

Endpoint, protocol (``grpc`` or ``http/protobuf``), headers, timeout and extra resource attributes
come from the standard ``OTEL_*`` variables, read by the SDK's exporters. Every ``OTEL_METRIC_EXPORT_INTERVAL``
(15 s) an export is built from the agent state as it is then (:meth:`OTLPExporter.collect`: the state read once), so
OTLP and Prometheus show the same values: each gauge, counter and up-down counter of the catalog with the series the
state holds, counters cumulative since the agent started. When the collector endpoint is unreachable the batch is
dropped (cumulative temporality: the next success carries full totals), memory stays bounded, and we log once when
export starts failing and once when it recovers. Shutdown exports once more, bounded.

The GenAI semantic-convention histograms (``gen_ai.server.*``, agent/catalog/genai.py) are kept here as the SDK's
explicit-bucket histograms keep them, with the conventions' bucket edges, fed one measurement per finished request by
the span analytics (:meth:`OTLPExporter.record_genai`). Other histograms are Prometheus-only.

The agent's export used the SDK's ``MeterProvider`` with an observable instrument per catalog metric until issue 38
measured what its aggregations held: ~2.4 MB of objects with everything on at 10 models, for values the state holds
already. The exporters are the SDK's (gRPC or HTTP), encoding each export with
:class:`~exporters.otlp_encode.MetricsEncoder` (the same request as the SDK's encoder, a sixth of its CPU).
"""

from __future__ import annotations

import bisect
import logging
import math
import os
import threading
import time
from collections.abc import Callable, Sequence
from typing import Any

from opentelemetry.sdk.metrics.export import (
    AggregationTemporality,
    Gauge,
    Histogram,
    HistogramDataPoint,
    Metric,
    MetricExporter,
    MetricExportResult,
    MetricsData,
    NumberDataPoint,
    ResourceMetrics,
    ScopeMetrics,
    Sum,
)
from opentelemetry.sdk.resources import Resource
from opentelemetry.sdk.util.instrumentation import InstrumentationScope

from inferwatch.agent import __version__, catalog
from inferwatch.agent.catalog import genai
from inferwatch.agent.catalog.spec import Kind
from inferwatch.agent.common.samples import Sample
from inferwatch.agent.node.state import AgentState
from inferwatch.exporters.otlp_encode import MetricsEncoder

log = logging.getLogger(__name__)

DEFAULT_EXPORT_INTERVAL_MS = 15_000
DEFAULT_EXPORT_TIMEOUT_MS = 5_000
SHUTDOWN_TIMEOUT_MS = 5_000
SERVICE_NAME = "inferwatch-agent"
_SDK_LOGGERS = (
    "opentelemetry.exporter.otlp.proto.grpc.exporter",
    "opentelemetry.exporter.otlp.proto.http.metric_exporter",
    "opentelemetry.sdk.metrics._internal.export",
)


def protocol() -> str:
    return (
        os.environ.get("OTEL_EXPORTER_OTLP_METRICS_PROTOCOL") or os.environ.get("OTEL_EXPORTER_OTLP_PROTOCOL") or "grpc"
    ).strip()


def make_exporter() -> MetricExporter:
    """The SDK's OTLP metric exporter for the configured protocol, encoding with :class:`MetricsEncoder`."""
    proto = protocol()
    if proto == "grpc":
        from opentelemetry.exporter.otlp.proto.grpc.metric_exporter import OTLPMetricExporter as GrpcExporter

        class FastGrpcExporter(GrpcExporter):
            _encode = MetricsEncoder()

            def _translate_data(self, data: MetricsData) -> Any:
                return self._encode(data)

        return FastGrpcExporter()
    if proto == "http/protobuf":
        from opentelemetry.exporter.otlp.proto.http.metric_exporter import OTLPMetricExporter as HttpExporter

        from inferwatch.exporters.otlp_http import transport

        class FastHttpExporter(HttpExporter):
            _encode = MetricsEncoder()

            def export(
                self, metrics_data: MetricsData, timeout_millis: float | None = 10_000, **kwargs: Any
            ) -> MetricExportResult:
                if self._shutdown or self._max_export_batch_size is not None:  # the SDK's path: its log, its split
                    return super().export(metrics_data, timeout_millis, **kwargs)
                try:
                    request = self._encode(metrics_data)
                except Exception as exc:  # as the SDK: a batch that does not encode is dropped, not raised
                    log.error("Failed to encode metrics batch: %s", exc)
                    return MetricExportResult.FAILURE
                return self._export_batch(request)

        own = transport("METRICS")  # httpx, not the SDK's requests session (otlp_http.py)
        return FastHttpExporter(_transport=own) if own is not None else FastHttpExporter()
    raise ValueError(f"OTEL_EXPORTER_OTLP_PROTOCOL={proto!r} is not supported (use grpc or http/protobuf)")


class _StateLoggingExporter(MetricExporter):
    """Delegates to the real exporter; logs once per change between failing and working."""

    def __init__(self, inner: MetricExporter, on_result: Callable[[bool], None]) -> None:
        super().__init__(
            preferred_temporality=inner._preferred_temporality,
            preferred_aggregation=inner._preferred_aggregation,
        )
        self._inner = inner
        self._failing = False
        self._on_result = on_result

    def export(self, metrics_data: MetricsData, timeout_millis: float = 10_000, **kwargs: Any) -> MetricExportResult:
        try:
            result = self._inner.export(metrics_data, timeout_millis=timeout_millis, **kwargs)
        except Exception as exc:
            log.debug("OTLP export raised", exc_info=exc)
            result = MetricExportResult.FAILURE
        ok = result is MetricExportResult.SUCCESS
        if not ok and not self._failing:
            log.warning(
                "OTLP metric export failing (endpoint unreachable or refusing); data is dropped until it recovers"
            )
        elif ok and self._failing:
            log.info("OTLP metric export recovered")
        self._failing = not ok
        self._on_result(ok)
        return result

    def force_flush(self, timeout_millis: float = 10_000) -> bool:
        return self._inner.force_flush(timeout_millis=timeout_millis)

    def shutdown(self, timeout_millis: float = 30_000, **kwargs: Any) -> None:
        self._inner.shutdown(timeout_millis=timeout_millis, **kwargs)


def build_resource(identity: dict[str, str], environment: str) -> Resource:
    attrs: dict[str, Any] = dict(identity)
    attrs["service.version"] = __version__
    if environment and environment != "unknown":
        attrs["deployment.environment.name"] = environment
    env_attrs = os.environ.get("OTEL_RESOURCE_ATTRIBUTES", "")
    if not os.environ.get("OTEL_SERVICE_NAME") and "service.name=" not in env_attrs:
        attrs["service.name"] = SERVICE_NAME
    # Resource.create merges OTEL_RESOURCE_ATTRIBUTES; explicitly passed keys win, so drop ours where set.
    for item in env_attrs.split(","):
        key = item.partition("=")[0].strip()
        attrs.pop(key, None)
    return Resource.create(attrs)


class _GenAIHistogram:
    """A ``gen_ai.server.*`` histogram, cumulative: bucket counts, sum, count, min and max per attribute set, as the
    SDK's explicit-bucket aggregation keeps them (a value on an edge counts in the bucket the edge closes)."""

    def __init__(self, bounds: Sequence[float]) -> None:
        self.bounds = tuple(bounds)
        self.series: dict[tuple[tuple[str, str], ...], list[Any]] = {}  # key -> [counts, sum, count, min, max, mapping]
        self.lock = threading.Lock()

    def record(self, value: float, attributes: dict[str, str]) -> None:
        key = tuple(sorted(attributes.items()))
        with self.lock:
            entry = self.series.get(key)
            if entry is None:
                entry = self.series[key] = [[0] * (len(self.bounds) + 1), 0.0, 0, math.inf, -math.inf, attributes]
            entry[0][bisect.bisect_left(self.bounds, value)] += 1
            entry[1] += value
            entry[2] += 1
            entry[3] = min(entry[3], value)
            entry[4] = max(entry[4], value)

    def points(self, start_ns: int, now_ns: int) -> list[HistogramDataPoint]:
        with self.lock:
            return [
                HistogramDataPoint(
                    attributes=mapping,
                    start_time_unix_nano=start_ns,
                    time_unix_nano=now_ns,
                    count=count,
                    sum=total,
                    bucket_counts=list(counts),
                    explicit_bounds=self.bounds,
                    min=low,
                    max=high,
                )
                for counts, total, count, low, high, mapping in self.series.values()
            ]


class OTLPExporter:
    """The agent's OTLP metrics sink: export on a period, flush, shutdown (idempotent, bounded).

    Each export is built from the agent state as it is then (:meth:`collect`): a gauge, counter or up-down counter of
    the catalog is a metric of the series the state holds, a counter's points cumulative since the exporter started.
    The SDK kept an aggregation per series for the same values (~2.4 MB of objects with everything on at 10 models,
    docs/benchmarks.md "Where everything-on's megabytes go"); what is kept here is one attributes mapping per series
    of the last export, which the encoder recognises (:class:`~exporters.otlp_encode.MetricsEncoder`).
    """

    def __init__(
        self,
        state: AgentState,
        resource: Resource,
        exporter: MetricExporter | None = None,
        export_interval_ms: int | None = None,
        ttft_extra_buckets_s: tuple[float, ...] = (),
    ) -> None:
        self.state = state
        self.resource = resource
        self.scope = InstrumentationScope("inferwatch.agent", __version__)
        self._start_ns = time.time_ns()
        self._genai = {
            name: _GenAIHistogram(genai.buckets(name, ttft_extra_buckets_s))
            for name in (genai.TTFT, genai.TPOT, genai.DURATION)
            if name in catalog.CATALOG
        }
        self._mappings: dict[Any, dict[str, Any]] = {}  # a series' attributes -> its mapping, as of the last export
        self.exports_ok = 0
        self.exports_failed = 0
        self.state_reads = 0  # how many times an export read the state (tests: once per collection)
        self._lock = threading.Lock()
        self._collect_lock = threading.Lock()
        self._closed = False
        self._exporter: _StateLoggingExporter | None = None
        self._thread: threading.Thread | None = None
        self._stop = threading.Event()
        if exporter is not None:
            interval = export_interval_ms or int(
                os.environ.get("OTEL_METRIC_EXPORT_INTERVAL", DEFAULT_EXPORT_INTERVAL_MS)
            )
            self._timeout_ms = min(
                int(os.environ.get("OTEL_METRIC_EXPORT_TIMEOUT", DEFAULT_EXPORT_TIMEOUT_MS)), SHUTDOWN_TIMEOUT_MS - 1000
            )
            for name in _SDK_LOGGERS:  # we log transitions ourselves; the SDK logs every retry
                logging.getLogger(name).setLevel(logging.CRITICAL)
            self._exporter = _StateLoggingExporter(exporter, self._count)
            self._thread = threading.Thread(
                target=self._run, args=(interval / 1000.0,), name="otlp-export", daemon=True
            )
            self._thread.start()

    def _count(self, ok: bool) -> None:
        with self._lock:
            if ok:
                self.exports_ok += 1
            else:
                self.exports_failed += 1

    def _run(self, interval_s: float) -> None:
        while not self._stop.wait(interval_s):
            self._export()

    def _export(self) -> bool:
        exporter = self._exporter
        if exporter is None:
            return False
        try:
            data = self.collect()
        except Exception:  # a state that cannot be read this time: the next export tries again
            log.warning("OTLP export: the agent state could not be read", exc_info=True)
            return False
        return exporter.export(data, timeout_millis=self._timeout_ms) is MetricExportResult.SUCCESS

    def collect(self) -> MetricsData:
        """The export of now: the catalog's gauges and sums from the state (read once), a series once (its first
        sample in the state's order), and the ``gen_ai.server.*`` histograms."""
        with self._collect_lock:
            self.state_reads += 1
            index: dict[str, list[Sample]] = {}
            seen: set[tuple[str, Any]] = set()
            for s in self.state.samples():
                if isinstance(s, Sample) and (s.name, s.attributes) not in seen:
                    seen.add((s.name, s.attributes))
                    index.setdefault(s.name, []).append(s)
            now = time.time_ns()
            start = self._start_ns
            kept, mappings = self._mappings, {}
            metrics: list[Metric] = []
            for spec in catalog.CATALOG.values():
                if spec.kind is Kind.HISTOGRAM:
                    histogram = self._genai.get(spec.name)
                    hpoints = histogram.points(start, now) if histogram is not None else []
                    if hpoints:
                        data: Any = Histogram(hpoints, AggregationTemporality.CUMULATIVE)
                        metrics.append(Metric(spec.name, spec.description, spec.unit, data))
                    # Other histograms are Prometheus-only (and reach a Collector through its Prometheus receiver).
                    continue
                samples = index.get(spec.name)
                if not samples:
                    continue
                gauge = spec.kind is Kind.GAUGE
                points = []
                for sample in samples:
                    mapping = kept.get(sample.attributes)
                    if mapping is None:
                        mapping = dict(sample.attributes)
                    mappings[sample.attributes] = mapping
                    points.append(NumberDataPoint(mapping, None if gauge else start, now, float(sample.value)))  # type: ignore[arg-type]
                if gauge:
                    data = Gauge(points)
                else:
                    data = Sum(points, AggregationTemporality.CUMULATIVE, spec.kind is Kind.COUNTER)
                metrics.append(Metric(spec.name, spec.description, spec.unit, data))
            self._mappings = mappings  # the series gone since the last export are let go
            scope = ScopeMetrics(self.scope, metrics, self.scope.schema_url or "")
            return MetricsData([ResourceMetrics(self.resource, [scope], self.resource.schema_url)])

    def record_genai(self, name: str, value_s: float, attributes: dict[str, str]) -> None:
        """Record one request's ``gen_ai.server.*`` measurement; an empty attribute (no error) is left out."""
        histogram = self._genai.get(name)
        if histogram is not None and not self._closed:
            histogram.record(value_s, {k: v for k, v in attributes.items() if v})

    def force_flush(self, timeout_ms: int = SHUTDOWN_TIMEOUT_MS) -> bool:
        return self._export()

    def shutdown(self, timeout_ms: int = SHUTDOWN_TIMEOUT_MS) -> None:
        """Stop the period, export once more (what changed since the last export), then close the exporter."""
        with self._lock:
            if self._closed:
                return
            self._closed = True
        self._stop.set()
        if self._thread is not None:
            self._thread.join(timeout_ms / 1000.0)
        if self._exporter is None:
            return
        try:
            self._export()
            self._exporter.shutdown(timeout_millis=timeout_ms)
        except Exception:
            log.warning("OTLP shutdown incomplete", exc_info=True)
