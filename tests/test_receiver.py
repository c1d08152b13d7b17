"""The OTLP trace receiver with real senders: the OpenTelemetry SDK's exporters, raw HTTP and gRPC."""

from __future__ import annotations

import gzip
import time
from collections.abc import Iterator

import grpc
import httpx
import pytest
from google.rpc import status_pb2
from opentelemetry.exporter.otlp.proto.grpc.trace_exporter import OTLPSpanExporter as GrpcSpanExporter
from opentelemetry.exporter.otlp.proto.http.trace_exporter import OTLPSpanExporter as HttpSpanExporter
from opentelemetry.proto.collector.trace.v1.trace_service_pb2 import (
    ExportTraceServiceRequest,
    ExportTraceServiceResponse,
)
from opentelemetry.proto.common.v1.common_pb2 import AnyValue, KeyValue
from opentelemetry.proto.trace.v1.trace_pb2 import ResourceSpans, ScopeSpans, Span
from opentelemetry.sdk.resources import Resource
from opentelemetry.sdk.trace import TracerProvider
from opentelemetry.sdk.trace.export import BatchSpanProcessor
from opentelemetry.trace import SpanKind
from prometheus_client.parser import text_string_to_metric_families

from inferwatch.agent.config import ReceiverSettings
from inferwatch.agent.node.analytics.latency import LatencyAnalytics
from inferwatch.agent.node.receiver import Receiver
from inferwatch.agent.node.receiver.forward import GRPC_METHOD
from tests.conftest import PYTHON, ROOT, free_port
from tests.procs import running, wait_http

MAX_BYTES = 64 * 1024


def vllm_attributes(i: int, model: str = "Qwen/Qwen3-8B") -> dict[str, object]:
    """The attributes vLLM v1's do_tracing sets on its llm_request span."""
    return {
        "gen_ai.response.model": model,
        "gen_ai.request.id": f"cmpl-{i}",
        "gen_ai.request.temperature": 0.7,
        "gen_ai.request.top_p": 1.0,
        "gen_ai.request.max_tokens": 256,
        "gen_ai.request.n": 1,
        "gen_ai.usage.prompt_tokens": 512,
        "gen_ai.usage.completion_tokens": 101,
        "gen_ai.latency.time_in_queue": 0.010,
        "gen_ai.latency.time_to_first_token": 0.380 if i % 5 else 0.850,
        "gen_ai.latency.e2e": 2.5,
        "gen_ai.latency.time_in_model_prefill": 0.300,
        "gen_ai.latency.time_in_model_decode": 2.0,
        "gen_ai.latency.time_in_model_inference": 2.3,
    }


def send_with_sdk(exporter, n: int, model: str = "Qwen/Qwen3-8B") -> None:
    provider = TracerProvider(resource=Resource.create({"service.name": "vllm"}))
    provider.add_span_processor(BatchSpanProcessor(exporter, max_export_batch_size=128))
    tracer = provider.get_tracer("vllm.tracing")
    for i in range(n):
        with tracer.start_as_current_span("llm_request", kind=SpanKind.SERVER) as span:
            span.set_attributes(vllm_attributes(i, model))
        with tracer.start_as_current_span("unrelated"):  # spans without gen_ai.latency.* are not requests
            pass
    assert provider.force_flush(10_000)
    provider.shutdown()


def raw_request(n: int, model: str = "m") -> bytes:
    spans = []
    for i in range(n):
        attrs = [KeyValue(key="gen_ai.response.model", value=AnyValue(string_value=model))]
        attrs += [
            KeyValue(key=k, value=AnyValue(double_value=float(v)))
            for k, v in vllm_attributes(i).items()
            if k.startswith("gen_ai.latency.")
        ]
        attrs.append(KeyValue(key="gen_ai.usage.completion_tokens", value=AnyValue(int_value=101)))
        spans.append(Span(name="llm_request", trace_id=b"\x01" * 16, span_id=b"\x02" * 8, attributes=attrs))
    req = ExportTraceServiceRequest(resource_spans=[ResourceSpans(scope_spans=[ScopeSpans(spans=spans)])])
    return req.SerializeToString()


@pytest.fixture
def receiver() -> Iterator[Receiver]:
    r = Receiver(
        ReceiverSettings(
            enabled=True, grpc_endpoint="127.0.0.1:0", http_endpoint="127.0.0.1:0", max_message_bytes=MAX_BYTES
        ),
        LatencyAnalytics(),
    )
    r.start()
    try:
        yield r
    finally:
        r.stop()


def counter(r: Receiver, name: str, **labels: str) -> float:
    want = tuple(sorted(labels.items()))
    return sum(s.value for s in r.samples() if s.name == name and s.attributes == want)


@pytest.mark.integration
def test_sdk_grpc_and_http_exporters_feed_the_analytics(receiver: Receiver) -> None:
    send_with_sdk(GrpcSpanExporter(endpoint=f"127.0.0.1:{receiver.grpc_port}", insecure=True), 250)
    send_with_sdk(HttpSpanExporter(endpoint=f"http://127.0.0.1:{receiver.http_port}/v1/traces"), 250)
    assert counter(receiver, "inferwatch.receiver.requests", transport="grpc") == 250
    assert counter(receiver, "inferwatch.receiver.requests", transport="http") == 250
    assert counter(receiver, "inferwatch.receiver.spans", transport="grpc") == 500
    a = receiver.analytics
    assert a.models() == ["Qwen/Qwen3-8B"]
    ttft = a.window_stats("Qwen/Qwen3-8B", "ttft", "1m")
    assert ttft is not None and ttft.count == 500
    assert ttft.quantiles[0.5] == pytest.approx(0.38, rel=0.006)
    assert ttft.quantiles[0.99] == pytest.approx(0.85, rel=0.006)
    itl = a.window_stats("Qwen/Qwen3-8B", "itl", "5m")  # decode / (completion_tokens − 1) = 2.0 / 100
    assert itl is not None and itl.quantiles[0.5] == pytest.approx(0.02, rel=0.006)
    assert a.frontend_gap("Qwen/Qwen3-8B", "1m") == pytest.approx(0.38 * 0.8 + 0.85 * 0.2 - 0.31)


@pytest.mark.integration
def test_sdk_exporters_with_gzip_compression(receiver: Receiver) -> None:
    from opentelemetry.exporter.otlp.proto.grpc.exporter import Compression as GrpcCompression
    from opentelemetry.exporter.otlp.proto.http import Compression as HttpCompression

    send_with_sdk(
        GrpcSpanExporter(endpoint=f"127.0.0.1:{receiver.grpc_port}", insecure=True, compression=GrpcCompression.Gzip),
        20,
    )
    send_with_sdk(
        HttpSpanExporter(endpoint=f"http://127.0.0.1:{receiver.http_port}/v1/traces", compression=HttpCompression.Gzip),
        30,
    )
    assert counter(receiver, "inferwatch.receiver.requests", transport="grpc") == 20
    assert counter(receiver, "inferwatch.receiver.requests", transport="http") == 30


@pytest.mark.integration
def test_hostile_http_payloads_are_rejected_with_otlp_status_and_counted(receiver: Receiver) -> None:
    url = f"http://127.0.0.1:{receiver.http_port}/v1/traces"
    pb = {"Content-Type": "application/x-protobuf"}
    bomb = gzip.compress(b"\x00" * (MAX_BYTES * 20))  # ~1 KiB that inflates to 1.3 MiB
    cases = [
        ("POST", url, {"Content-Type": "application/json"}, b"{}", 415, "bad_content_type"),
        ("POST", url, {}, raw_request(1), 415, "bad_content_type"),
        ("POST", url, pb, b"not a protobuf \xff\xfe", 400, "bad_protobuf"),
        ("POST", url, pb, b"\x0a\xff\xff\xff\xff\x0f", 400, "bad_protobuf"),  # truncated length-delimited field
        ("POST", url, pb, b"\x00" * (MAX_BYTES + 1), 413, "too_large"),
        ("POST", url, {**pb, "Content-Encoding": "gzip"}, bomb, 413, "too_large"),
        ("POST", url, {**pb, "Content-Encoding": "gzip"}, b"\x1f\x8bgarbage", 400, "bad_gzip"),
        ("POST", url, {**pb, "Content-Encoding": "br"}, raw_request(1), 415, "bad_encoding"),
        ("GET", url, {}, b"", 405, "bad_method"),
        ("POST", url.replace("/v1/traces", "/v1/metrics"), pb, raw_request(1), 404, "not_found"),
    ]
    with httpx.Client(timeout=10) as client:
        for method, target, headers, body, status, reason in cases:
            before = counter(receiver, "inferwatch.receiver.exports.rejected", transport="http", reason=reason)
            r = client.request(method, target, headers=headers, content=body)
            assert r.status_code == status, (reason, r.text)
            assert r.headers["content-type"] == "application/x-protobuf"
            assert status_pb2.Status.FromString(r.content).message  # OTLP: a google.rpc.Status body
            after = counter(receiver, "inferwatch.receiver.exports.rejected", transport="http", reason=reason)
            assert after == before + 1, reason

        def chunks() -> Iterator[bytes]:  # no Content-Length: the limit applies while reading
            for _ in range(MAX_BYTES // 1024 + 2):
                yield b"\x00" * 1024

        assert client.post(url, headers=pb, content=chunks()).status_code == 413
        # still serving, and gzip that stays within the limit is fine
        r = client.post(url, headers={**pb, "Content-Encoding": "gzip"}, content=gzip.compress(raw_request(3)))
        assert r.status_code == 200 and ExportTraceServiceResponse.FromString(r.content) is not None
    assert counter(receiver, "inferwatch.receiver.requests", transport="http") == 3
    assert counter(receiver, "inferwatch.receiver.exports.accepted", transport="http") == 1


@pytest.mark.integration
def test_hostile_grpc_payloads_get_invalid_argument_or_resource_exhausted(receiver: Receiver) -> None:
    with grpc.insecure_channel(f"127.0.0.1:{receiver.grpc_port}") as channel:
        export = channel.unary_unary(GRPC_METHOD)  # raw bytes, no serializer
        with pytest.raises(grpc.RpcError) as bad:
            export(b"not a protobuf \xff\xfe", timeout=10)
        assert bad.value.code() is grpc.StatusCode.INVALID_ARGUMENT
        with pytest.raises(grpc.RpcError) as big:
            export(b"\x00" * (MAX_BYTES + 1), timeout=10)
        assert big.value.code() is grpc.StatusCode.RESOURCE_EXHAUSTED
        with pytest.raises(grpc.RpcError) as huge:  # beyond gRPC's own limit (2x): refused by gRPC itself
            export(b"\x00" * (4 * MAX_BYTES), timeout=10)
        assert huge.value.code() is grpc.StatusCode.RESOURCE_EXHAUSTED
        with pytest.raises(grpc.RpcError) as bomb:  # gzip-compressed on the wire: limit on the inflated size
            export(raw_request(1) + b"\x00" * (8 * MAX_BYTES), timeout=10, compression=grpc.Compression.Gzip)
        assert bomb.value.code() is grpc.StatusCode.RESOURCE_EXHAUSTED
        assert ExportTraceServiceResponse.FromString(export(raw_request(2), timeout=10)) is not None
    assert counter(receiver, "inferwatch.receiver.exports.rejected", transport="grpc", reason="bad_protobuf") == 1
    assert counter(receiver, "inferwatch.receiver.exports.rejected", transport="grpc", reason="too_large") == 1
    assert counter(receiver, "inferwatch.receiver.requests", transport="grpc") == 2


@pytest.mark.integration
def test_bad_values_are_left_out_and_counted(receiver: Receiver) -> None:
    span = Span(
        name="llm_request",
        attributes=[
            KeyValue(key="gen_ai.latency.time_to_first_token", value=AnyValue(string_value="fast")),
            KeyValue(key="gen_ai.latency.e2e", value=AnyValue(double_value=float("nan"))),
            KeyValue(key="gen_ai.latency.time_in_queue", value=AnyValue(double_value=-1.0)),
            KeyValue(key="gen_ai.latency.time_in_model_decode", value=AnyValue(double_value=1e300)),
            KeyValue(key="gen_ai.latency.time_in_model_prefill", value=AnyValue(double_value=0.2)),
            KeyValue(key="gen_ai.request.model", value=AnyValue(string_value="x" * 10_000)),
        ],
    )
    body = ExportTraceServiceRequest(
        resource_spans=[ResourceSpans(scope_spans=[ScopeSpans(spans=[span])])]
    ).SerializeToString()
    r = httpx.post(
        f"http://127.0.0.1:{receiver.http_port}/v1/traces",
        content=body,
        headers={"Content-Type": "application/x-protobuf"},
    )
    assert r.status_code == 200
    assert counter(receiver, "inferwatch.receiver.values.rejected", reason="not_a_number") == 2
    assert counter(receiver, "inferwatch.receiver.values.rejected", reason="out_of_range") == 2
    (model,) = receiver.analytics.models()
    assert len(model) == 256
    assert receiver.analytics.window_stats(model, "prefill", "1m") is not None
    assert receiver.analytics.window_stats(model, "ttft", "1m") is None


@pytest.mark.integration
@pytest.mark.parametrize("scheme", ["grpc", "http"])
def test_forwarding_reaches_a_second_receiver_untouched(scheme: str) -> None:
    downstream = Receiver(
        ReceiverSettings(enabled=True, grpc_endpoint="127.0.0.1:0", http_endpoint="127.0.0.1:0"), LatencyAnalytics()
    )
    downstream.start()
    try:
        target = f"127.0.0.1:{downstream.grpc_port}" if scheme == "grpc" else f"http://127.0.0.1:{downstream.http_port}"
        upstream = Receiver(
            ReceiverSettings(
                enabled=True,
                grpc_endpoint="127.0.0.1:0",
                http_endpoint="127.0.0.1:0",
                forward_endpoint=target,
                forward_phase_spans=False,  # the phase children's own requests: tests/test_phase_spans.py
            ),
            LatencyAnalytics(),
        )
        upstream.start()
        try:
            send_with_sdk(GrpcSpanExporter(endpoint=f"127.0.0.1:{upstream.grpc_port}", insecure=True), 40, "a")
            send_with_sdk(HttpSpanExporter(endpoint=f"http://127.0.0.1:{upstream.http_port}/v1/traces"), 60, "b")
            accepted = counter(upstream, "inferwatch.receiver.exports.accepted", transport="grpc") + counter(
                upstream, "inferwatch.receiver.exports.accepted", transport="http"
            )
            deadline = time.monotonic() + 120  # bounds a hang (CI's load 10-17 on 2 cores)
            while (
                counter(downstream, "inferwatch.receiver.requests", transport=scheme) < 100
                or counter(upstream, "inferwatch.receiver.forward", outcome="sent") < accepted
            ):
                assert time.monotonic() < deadline, "forwarded spans did not arrive"
                time.sleep(0.05)
            assert counter(upstream, "inferwatch.receiver.forward", outcome="sent") == accepted
            assert counter(downstream, "inferwatch.receiver.exports.accepted", transport=scheme) == accepted
            assert counter(downstream, "inferwatch.receiver.spans", transport=scheme) == 200  # unrelated spans too
            assert downstream.analytics.models() == ["a", "b"]
            for m in ("a", "b"):
                up = upstream.analytics.window_stats(m, "ttft", "5m")
                down = downstream.analytics.window_stats(m, "ttft", "5m")
                assert up is not None and down is not None and up.quantiles == down.quantiles
        finally:
            upstream.stop()
    finally:
        downstream.stop()


@pytest.mark.integration
def test_forward_queue_is_bounded_and_never_blocks_intake() -> None:
    import socket

    with socket.socket() as blackhole:  # accepts connections (kernel backlog) and never answers
        blackhole.bind(("127.0.0.1", 0))
        blackhole.listen(64)
        r = Receiver(
            ReceiverSettings(
                enabled=True,
                grpc_endpoint=None,
                http_endpoint="127.0.0.1:0",
                forward_endpoint=f"http://127.0.0.1:{blackhole.getsockname()[1]}",
                forward_queue_requests=2,
                forward_timeout_s=1.0,
            ),
            LatencyAnalytics(),
        )
        r.start()
        try:
            with httpx.Client() as client:
                for _ in range(30):
                    resp = client.post(
                        f"http://127.0.0.1:{r.http_port}/v1/traces",
                        content=raw_request(1),
                        headers={"Content-Type": "application/x-protobuf"},
                    )
                    assert resp.status_code == 200
            # a blocking queue would never drop: intake went on while the downstream hung
            assert counter(r, "inferwatch.receiver.forward", outcome="dropped") > 0
            assert counter(r, "inferwatch.receiver.forward.queued") <= 2
        finally:
            r.stop()
    sent = counter(r, "inferwatch.receiver.forward", outcome="sent")
    dropped = counter(r, "inferwatch.receiver.forward", outcome="dropped")
    failed = counter(r, "inferwatch.receiver.forward", outcome="failed")
    assert sent == 0 and failed >= 1 and dropped + failed == 30
    assert counter(r, "inferwatch.receiver.requests", transport="http") == 30
    assert counter(r, "inferwatch.receiver.up", transport="http") == 0


@pytest.mark.integration
def test_agent_process_serves_span_analytics_on_metrics(tmp_path) -> None:
    port, grpc_port, http_port = free_port(), free_port(), free_port()
    env = {
        "INFERWATCH_RECEIVER__ENABLED": "true",
        "INFERWATCH_RECEIVER__GRPC_ENDPOINT": f"127.0.0.1:{grpc_port}",
        "INFERWATCH_RECEIVER__HTTP_ENDPOINT": f"127.0.0.1:{http_port}",
    }
    cmd = [PYTHON, "-m", "inferwatch.agent", "run", "--port", str(port), "--interval", "0.5"]
    with running(cmd, tmp_path / "agent.log", cwd=ROOT, env=env) as proc:
        base = f"http://127.0.0.1:{port}"
        wait_http(f"{base}/readyz", ok=lambda r: r.status_code == 200, proc=proc)
        send_with_sdk(GrpcSpanExporter(endpoint=f"127.0.0.1:{grpc_port}", insecure=True), 100)
        text = httpx.get(f"{base}/metrics").text
        fams = {f.name: f for f in text_string_to_metric_families(text)}
        lat = fams["inferwatch_engine_latency_seconds"]
        p99 = [
            s.value
            for s in lat.samples
            if s.labels
            == {
                "gen_ai_request_model": "Qwen/Qwen3-8B",
                "quantity": "ttft",
                "window": "1m",
                "source": "spans",
                "quantile": "0.99",
            }
        ]
        assert p99 and p99[0] == pytest.approx(0.85, rel=0.006)
        assert "inferwatch_engine_latency_bimodal" in fams and "inferwatch_engine_frontend_gap_seconds" in fams
        requests = fams["inferwatch_receiver_requests"].samples
        assert any(s.labels == {"transport": "grpc"} and s.value == 100 for s in requests)
    assert b"Traceback" not in (tmp_path / "agent.log").read_bytes()


@pytest.mark.integration
def test_agent_exits_2_when_the_receiver_port_is_taken(tmp_path) -> None:
    import socket
    import subprocess

    with socket.socket() as taken:
        taken.bind(("127.0.0.1", 0))
        taken.listen(1)
        env = {
            "INFERWATCH_RECEIVER__ENABLED": "true",
            "INFERWATCH_RECEIVER__GRPC_ENDPOINT": f"127.0.0.1:{free_port()}",
            "INFERWATCH_RECEIVER__HTTP_ENDPOINT": f"127.0.0.1:{taken.getsockname()[1]}",
        }
        import os

        done = subprocess.run(
            [PYTHON, "-m", "inferwatch.agent", "run", "--port", str(free_port())],
            cwd=ROOT,
            env={**os.environ, **env},
            capture_output=True,
            timeout=60,
        )
    assert done.returncode == 2
    assert b"receiver" in done.stderr and b"Traceback" not in done.stderr


@pytest.mark.integration
def test_slow_body_gets_408_and_the_receiver_keeps_serving(receiver: Receiver, monkeypatch) -> None:
    import socket

    from inferwatch.agent.node.receiver import http_server

    monkeypatch.setattr(http_server, "BODY_TIMEOUT_S", 0.5)
    with socket.create_connection(("127.0.0.1", receiver.http_port), timeout=10) as s:
        s.sendall(
            b"POST /v1/traces HTTP/1.1\r\nHost: x\r\nContent-Type: application/x-protobuf\r\n"
            b"Content-Length: 1000\r\n\r\n" + b"\x0a" * 10
        )  # ...and the rest never comes
        reply = s.recv(4096)
    assert reply.startswith(b"HTTP/1.1 408")
    assert counter(receiver, "inferwatch.receiver.exports.rejected", transport="http", reason="timeout") == 1
    r = httpx.post(
        f"http://127.0.0.1:{receiver.http_port}/v1/traces",
        content=raw_request(1),
        headers={"Content-Type": "application/x-protobuf"},
    )
    assert r.status_code == 200
