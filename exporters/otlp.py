"""OTLP metric export through the OpenTelemetry SDK.

Endpoint, protocol (``grpc`` or ``http/protobuf``), headers, timeout and extra resource attributes
come from the standard ``OTEL_*`` variables, read by the SDK. Each catalog metric becomes an
observable instrument whose callback reads the agent state, so OTLP and Prometheus show the same
values; the state is read once per collection, not once per instrument (the collection's first
callback indexes its samples by name, the others read the index). When the collector endpoint is
unreachable the SDK drops the batch (cumulative temporality: the next success carries full totals),
memory stays bounded, and we log once when export starts failing and once when it recovers.

The GenAI semantic-convention histograms (``gen_ai.server.*``, agent/catalog/genai.py) are synchronous SDK
histograms with the conventions' bucket advice (``explicit_bucket_boundaries_advisory``), fed one measurement per
finished request by the span analytics (:meth:`OTLPExporter.record_genai`): the SDK has no observable histogram,
and a cumulative bucket count cannot be replayed into one exactly. Other histograms are Prometheus-only.

The exporters are the SDK's (gRPC or HTTP), encoding each collection with :class:`~exporters.otlp_encode.MetricsEncoder`
(the same request as the SDK's encoder, a sixth of its CPU).
"""

from __future__ import annotations

import logging
import os
import threading
from collections.abc import Callable, Iterable, Sequence
from typing import Any

from opentelemetry.metrics import CallbackOptions, Observation
from opentelemetry.sdk.metrics import MeterProvider
from opentelemetry.sdk.metrics.export import (
    MetricExporter,
    MetricExportResult,
    MetricReader,
    MetricsData,
    PeriodicExportingMetricReader,
)
from opentelemetry.sdk.resources import Resource

from inferwatch.agent import __version__, catalog
from inferwatch.agent.catalog import genai
from inferwatch.agent.catalog.spec import Kind, MetricSpec
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


class OTLPExporter:
    """The agent's OTLP metrics sink: export on a period, flush, shutdown (idempotent, bounded)."""

    def __init__(
        self,
        state: AgentState,
        resource: Resource,
        exporter: MetricExporter | None = None,
        readers: Sequence[MetricReader] = (),
        export_interval_ms: int | None = None,
        ttft_extra_buckets_s: tuple[float, ...] = (),
    ) -> None:
        self.state = state
        self._ttft_extra_buckets_s = ttft_extra_buckets_s
        self._genai: dict[str, Any] = {}
        self.exports_ok = 0
        self.exports_failed = 0
        self._lock = threading.Lock()
        self._closed = False
        # The state's samples by name, read by one collection's callbacks: a callback whose metric was already
        # served from this index belongs to the next collection, and reads the state again.
        self._index_lock = threading.Lock()
        self._index: dict[str, list[Sample]] | None = None
        self._served: set[str] = set()
        self.state_reads = 0  # how many times the callbacks read the state (tests: once per collection)
        all_readers: list[MetricReader] = list(readers)  # non-network readers first (shutdown order)
        if exporter is not None:
            interval = export_interval_ms or int(
                os.environ.get("OTEL_METRIC_EXPORT_INTERVAL", DEFAULT_EXPORT_INTERVAL_MS)
            )
            timeout = min(
                int(os.environ.get("OTEL_METRIC_EXPORT_TIMEOUT", DEFAULT_EXPORT_TIMEOUT_MS)), SHUTDOWN_TIMEOUT_MS - 1000
            )
            for name in _SDK_LOGGERS:  # we log transitions ourselves; the SDK logs every retry
                logging.getLogger(name).setLevel(logging.CRITICAL)
            all_readers.append(
                PeriodicExportingMetricReader(
                    _StateLoggingExporter(exporter, self._count),
                    export_interval_millis=interval,
                    export_timeout_millis=timeout,
                )
            )
        self.provider = MeterProvider(resource=resource, metric_readers=all_readers)
        meter = self.provider.get_meter("inferwatch.agent", __version__)
        for spec in catalog.CATALOG.values():
            self._instrument(meter, spec)

    def _count(self, ok: bool) -> None:
        with self._lock:
            if ok:
                self.exports_ok += 1
            else:
                self.exports_failed += 1

    def _callback(self, spec: MetricSpec) -> Callable[[CallbackOptions], Iterable[Observation]]:
        name = spec.name

        def observe(_options: CallbackOptions) -> Iterable[Observation]:
            return [Observation(float(s.value), dict(s.attributes)) for s in self._samples_of(name)]

        return observe

    def _samples_of(self, name: str) -> list[Sample]:
        """This collection's samples of ``name``, a series once (its first sample in the state's order)."""
        with self._index_lock:
            if self._index is None or name in self._served:
                self._index = self._read_state()
                self._served = set()
            self._served.add(name)
            return self._index.get(name, [])

    def _read_state(self) -> dict[str, list[Sample]]:
        self.state_reads += 1
        index: dict[str, list[Sample]] = {}
        seen: set[tuple[str, Any]] = set()
        for s in self.state.samples():
            if isinstance(s, Sample) and (s.name, s.attributes) not in seen:
                seen.add((s.name, s.attributes))
                index.setdefault(s.name, []).append(s)
        return index

    def _instrument(self, meter: Any, spec: MetricSpec) -> None:
        cb = [self._callback(spec)]
        if spec.kind is Kind.GAUGE:
            meter.create_observable_gauge(spec.name, callbacks=cb, unit=spec.unit, description=spec.description)
        elif spec.kind is Kind.COUNTER:
            meter.create_observable_counter(spec.name, callbacks=cb, unit=spec.unit, description=spec.description)
        elif spec.kind is Kind.UPDOWNCOUNTER:
            meter.create_observable_up_down_counter(
                spec.name, callbacks=cb, unit=spec.unit, description=spec.description
            )
        elif spec.name in (genai.TTFT, genai.TPOT, genai.DURATION):
            self._genai[spec.name] = meter.create_histogram(
                spec.name,
                unit=spec.unit,
                description=spec.description,
                explicit_bucket_boundaries_advisory=list(genai.buckets(spec.name, self._ttft_extra_buckets_s)),
            )
        # Other histograms: the SDK has no observable histogram; they are exported through Prometheus (and the
        # Collector's Prometheus receiver).

    def record_genai(self, name: str, value_s: float, attributes: dict[str, str]) -> None:
        """Record one request's ``gen_ai.server.*`` measurement; an empty attribute (no error) is left out."""
        instrument = self._genai.get(name)
        if instrument is not None and not self._closed:
            instrument.record(value_s, {k: v for k, v in attributes.items() if v})

    def force_flush(self, timeout_ms: int = SHUTDOWN_TIMEOUT_MS) -> bool:
        return bool(self.provider.force_flush(timeout_millis=timeout_ms))

    def shutdown(self, timeout_ms: int = SHUTDOWN_TIMEOUT_MS) -> None:
        with self._lock:
            if self._closed:
                return
            self._closed = True
        try:
            self.provider.shutdown(timeout_millis=timeout_ms)
        except Exception:
            log.warning("OTLP shutdown incomplete", exc_info=True)
