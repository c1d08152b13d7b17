"""exporters/otlp_encode.py: the agent's OTLP metrics request is the SDK encoder's, message for message.

Every kind the SDK produces goes through it: observable gauges (float and integer values), monotonic and
non-monotonic sums, histograms (the SDK's encoding), points with exemplars (the SDK's encoding), a metric whose
attribute the SDK cannot encode, repeated collections (the kept attribute bytes), and both exporters the agent
builds (gRPC, HTTP) as a real receiver decodes their requests.
"""

from __future__ import annotations

import copy
from collections.abc import Iterable, Iterator
from typing import Any

import pytest
from opentelemetry import trace
from opentelemetry.exporter.otlp.proto.common.metrics_encoder import encode_metrics
from opentelemetry.metrics import CallbackOptions, Observation
from opentelemetry.sdk.metrics import MeterProvider
from opentelemetry.sdk.metrics.export import InMemoryMetricReader, MetricExportResult, MetricsData
from opentelemetry.sdk.resources import Resource
from opentelemetry.trace import NonRecordingSpan, SpanContext, TraceFlags

from inferwatch.exporters import otlp_encode
from inferwatch.exporters.otlp import make_exporter
from inferwatch.exporters.otlp_encode import MetricsEncoder
from tests.conftest import free_port
from tests.otlp_receiver import grpc_receiver, http_receiver

ROUNDS = 3


@pytest.fixture
def collections() -> Iterator[list[MetricsData]]:
    """Three collections of a provider with every instrument kind, values changing between them."""
    reader = InMemoryMetricReader()
    provider = MeterProvider(
        resource=Resource.create({"service.name": "t", "k8s.pod.name": "p"}), metric_readers=[reader]
    )
    meter = provider.get_meter("inferwatch.test", "1.0")
    step = [0]

    def gauge(_options: CallbackOptions) -> Iterable[Observation]:
        n = step[0]
        return [Observation(0.5 + n, {"model": f"m{i}", "quantile": "0.99"}) for i in range(50)] + [
            Observation(7 + n, {"model": "int"}),  # an integer value: as_int
            Observation(0.0, {}),  # no attributes
        ]

    def counter(_options: CallbackOptions) -> Iterable[Observation]:
        return [Observation(10.0 * (step[0] + 1), {"transport": t}) for t in ("grpc", "http")]

    def updown(_options: CallbackOptions) -> Iterable[Observation]:
        return [Observation(-3.0 - step[0], {"a": "x", "b": "y"}), Observation(2 << 40, {"a": "z"})]

    meter.create_observable_gauge("g", callbacks=[gauge], unit="s", description="a gauge")
    meter.create_observable_counter("c", callbacks=[counter], unit="1", description="a counter")
    meter.create_observable_up_down_counter("u", callbacks=[updown])
    meter.create_observable_gauge("odd", callbacks=[lambda _o: [Observation(1.0, {"list": ["a", "b"], "n": 3})]])
    histogram = meter.create_histogram("h", unit="s", explicit_bucket_boundaries_advisory=[0.1, 1.0])
    with_exemplars = meter.create_counter("e")
    sampled = trace.set_span_in_context(
        NonRecordingSpan(SpanContext(0x1234, 0x5678, is_remote=False, trace_flags=TraceFlags(TraceFlags.SAMPLED)))
    )
    out = []
    try:
        for n in range(ROUNDS):
            step[0] = n
            histogram.record(0.05 * (n + 1), {"model": "m"})
            with_exemplars.add(n + 1, {"model": "m"}, context=sampled)  # a sampled span: the point has an exemplar
            data = reader.get_metrics_data()
            assert data is not None
            out.append(data)
        yield out
    finally:
        provider.shutdown()


def test_every_collection_encodes_as_the_sdk_encodes_it(collections: list[MetricsData]) -> None:
    encode = MetricsEncoder()
    for data in collections:
        ours, sdk = encode(data), encode_metrics(data)
        assert ours == sdk
        assert ours.SerializeToString() == sdk.SerializeToString()  # the same bytes, not only the same message
    kinds = {
        m.name: m.WhichOneof("data") for rm in ours.resource_metrics for sm in rm.scope_metrics for m in sm.metrics
    }
    assert kinds == {"g": "gauge", "c": "sum", "u": "sum", "odd": "gauge", "h": "histogram", "e": "sum"}
    points = {
        m.name: m for rm in ours.resource_metrics for sm in rm.scope_metrics for m in sm.metrics
    }  # the fast path was taken where it applies, and wrote what it should
    assert points["e"].sum.data_points[0].exemplars  # the SDK's encoding, exemplar included
    assert {p.as_int for p in points["g"].gauge.data_points if p.WhichOneof("value") == "as_int"} == {7 + ROUNDS - 1}
    assert points["c"].sum.is_monotonic and not points["u"].sum.is_monotonic
    assert all(p.start_time_unix_nano and p.time_unix_nano for p in points["c"].sum.data_points)


def test_the_kept_attribute_bytes_are_bounded(collections: list[MetricsData], monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(otlp_encode, "MIN_KEPT", 0)
    encode = MetricsEncoder()
    points = sum(
        len(m.data.data_points) for rm in collections[0].resource_metrics for sm in rm.scope_metrics for m in sm.metrics
    )
    for data in collections:
        assert encode(data) == encode_metrics(data)
    assert len(encode._attributes) <= points  # the SDK's mappings are the same objects every collection: kept once
    for _ in range(4):  # a reader that hands new mappings every time: the same request, and what is kept is bounded
        fresh = copy.deepcopy(collections[-1])
        assert encode(fresh) == encode_metrics(fresh)
        assert len(encode._attributes) <= 3 * points


def test_an_integer_outside_int64_is_left_to_the_sdk(collections: list[MetricsData]) -> None:
    data = collections[0]
    metric = next(m for rm in data.resource_metrics for sm in rm.scope_metrics for m in sm.metrics if m.name == "u")
    point = metric.data.data_points[0]
    object.__setattr__(point, "value", 1 << 70)  # what the SDK's encoder does with it, ours does too
    with pytest.raises(Exception) as sdk:
        encode_metrics(data)
    with pytest.raises(Exception) as ours:
        MetricsEncoder()(data)
    assert type(ours.value) is type(sdk.value)


@pytest.mark.parametrize("protocol", ["grpc", "http/protobuf"])
def test_the_agents_exporters_send_the_sdk_request(
    collections: list[MetricsData], protocol: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    port = free_port()
    monkeypatch.setenv("OTEL_EXPORTER_OTLP_METRICS_PROTOCOL", protocol)
    endpoint = f"127.0.0.1:{port}" if protocol == "grpc" else f"http://127.0.0.1:{port}/v1/metrics"
    monkeypatch.setenv("OTEL_EXPORTER_OTLP_METRICS_ENDPOINT", endpoint)
    monkeypatch.setenv("OTEL_EXPORTER_OTLP_METRICS_INSECURE", "true")
    receiver: Any = grpc_receiver if protocol == "grpc" else http_receiver
    with receiver(port) as received:
        exporter = make_exporter()
        try:
            assert exporter.export(collections[-1], timeout_millis=5_000) is MetricExportResult.SUCCESS
            assert type(exporter)._encode._attributes  # type: ignore[attr-defined]  # encoded by MetricsEncoder
            got = received.wait(lambda reqs: len(reqs) >= 1, timeout_s=10)
        finally:
            exporter.shutdown()
    assert got[0] == encode_metrics(collections[-1])
