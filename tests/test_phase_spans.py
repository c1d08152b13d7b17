"""Phase child spans: the real receiver forwards each engine request span unchanged, then its queue → prefill →
decode children, to a real downstream OTLP receiver on 127.0.0.1 (gRPC and HTTP)."""

from __future__ import annotations

import itertools
import os
import subprocess

import grpc
import httpx
import pytest
from opentelemetry.proto.collector.trace.v1.trace_service_pb2 import ExportTraceServiceRequest
from opentelemetry.proto.common.v1.common_pb2 import AnyValue, KeyValue
from opentelemetry.proto.resource.v1.resource_pb2 import Resource
from opentelemetry.proto.trace.v1.trace_pb2 import ResourceSpans, ScopeSpans, Span

from inferwatch.agent.config import ReceiverSettings
from inferwatch.agent.node.analytics.latency import LatencyAnalytics
from inferwatch.agent.node.receiver import Receiver
from inferwatch.agent.node.receiver.forward import GRPC_METHOD
from inferwatch.agent.node.receiver.phases import PHASE_ATTRIBUTE, SCOPE_NAME, phase_spans
from tests.conftest import PYTHON, ROOT, free_port
from tests.procs import running, wait_http
from tests.trace_receiver import grpc_trace_receiver, http_trace_receiver

NS = 1_000_000_000
T0 = 1_780_000_000 * NS


def _kv(key: str, v: object) -> KeyValue:
    if isinstance(v, str):
        return KeyValue(key=key, value=AnyValue(string_value=v))
    if isinstance(v, int):
        return KeyValue(key=key, value=AnyValue(int_value=v))
    return KeyValue(key=key, value=AnyValue(double_value=float(v)))  # type: ignore[arg-type]


def engine_span(i: int, kv_transfer: float | None = None) -> Span:
    """vLLM v1's llm_request span: start = arrival, end = arrival + e2e, the phases as attributes."""
    frontend, queue, prefill, decode = 0.004 + 0.001 * i, 0.010 * i, 0.250, 1.5 + 0.1 * i
    ttft = frontend + queue + prefill
    attrs = {
        "gen_ai.request.id": f"cmpl-{i}",
        "gen_ai.usage.prompt_tokens": 512,
        "gen_ai.usage.completion_tokens": 101,
        "gen_ai.latency.time_in_queue": queue,
        "gen_ai.latency.time_to_first_token": ttft,
        "gen_ai.latency.e2e": ttft + decode,
        "gen_ai.latency.time_in_model_prefill": prefill,
        "gen_ai.latency.time_in_model_decode": decode,
        "gen_ai.latency.time_in_model_inference": prefill + decode,
        "vllm.num_preemptions": i % 2,
    }
    if kv_transfer is not None:
        attrs["vllm.kv_transfer_time"] = kv_transfer
    start = T0 + i * NS
    return Span(
        trace_id=os.urandom(16),
        span_id=os.urandom(8),
        name="llm_request",
        kind=Span.SpanKind.SPAN_KIND_SERVER,
        start_time_unix_nano=start,
        end_time_unix_nano=start + int((ttft + decode) * NS),
        attributes=[_kv(k, v) for k, v in attrs.items()],
    )


def export_request(n: int) -> bytes:
    spans = [engine_span(i) for i in range(n)]
    spans.append(Span(trace_id=os.urandom(16), span_id=os.urandom(8), name="unrelated"))  # no children
    resource = Resource(attributes=[_kv("service.name", "vllm")])
    req = ExportTraceServiceRequest(
        resource_spans=[ResourceSpans(resource=resource, scope_spans=[ScopeSpans(spans=spans)])]
    )
    return req.SerializeToString()


def post(receiver: Receiver, payload: bytes) -> None:
    r = httpx.post(
        f"http://127.0.0.1:{receiver.http_port}/v1/traces",
        content=payload,
        headers={"Content-Type": "application/x-protobuf"},
        timeout=10,
    )
    assert r.status_code == 200


def _attr(span: Span, key: str) -> float:
    (kv,) = [kv for kv in span.attributes if kv.key == key]
    return kv.value.double_value or float(kv.value.int_value)


def check_children(original: bytes, children: list[Span]) -> int:
    """Check the children of every engine span in ``original``; return how many engine spans there were."""
    req = ExportTraceServiceRequest.FromString(original)
    engine = [s for s in req.resource_spans[0].scope_spans[0].spans if s.name == "llm_request"]
    by_parent: dict[bytes, list[Span]] = {}
    for c in children:
        by_parent.setdefault(c.parent_span_id, []).append(c)
    assert set(by_parent) == {s.span_id for s in engine}  # the unrelated span has none
    for s in engine:
        kids = {c.name: c for c in by_parent[s.span_id]}
        assert list(kids) == ["frontend", "queue", "prefill", "decode"] or list(kids) == [
            "frontend",
            "prefill",
            "decode",
        ]
        for c in kids.values():
            assert c.trace_id == s.trace_id and c.span_id not in (s.span_id, b"\0" * 8)
            assert s.start_time_unix_nano <= c.start_time_unix_nano <= c.end_time_unix_nano <= s.end_time_unix_nano
            assert [kv.value.string_value for kv in c.attributes if kv.key == PHASE_ATTRIBUTE] == [c.name]
        # contiguous: frontend → queue → prefill → decode, and the parts add up to TTFT and e2e (ns rounding)
        order = list(kids.values())
        for a, b in itertools.pairwise(order):
            assert abs(b.start_time_unix_nano - a.end_time_unix_nano) <= 2
        ttft = kids["prefill"].end_time_unix_nano - s.start_time_unix_nano
        assert abs(ttft - _attr(s, "gen_ai.latency.time_to_first_token") * NS) <= 2
        for name, key in (
            ("prefill", "gen_ai.latency.time_in_model_prefill"),
            ("decode", "gen_ai.latency.time_in_model_decode"),
        ):
            assert abs(kids[name].end_time_unix_nano - kids[name].start_time_unix_nano - _attr(s, key) * NS) <= 2
        if "queue" in kids:
            q = kids["queue"]
            assert (
                abs(q.end_time_unix_nano - q.start_time_unix_nano - _attr(s, "gen_ai.latency.time_in_queue") * NS) <= 2
            )
        assert abs(kids["decode"].end_time_unix_nano - s.end_time_unix_nano) <= 2
    return len(engine)


@pytest.mark.integration
@pytest.mark.parametrize("downstream", ["grpc", "http"])
def test_children_follow_the_untouched_original(downstream: str) -> None:
    listen = grpc_trace_receiver if downstream == "grpc" else http_trace_receiver
    with listen() as (received, port):
        target = f"127.0.0.1:{port}" if downstream == "grpc" else f"http://127.0.0.1:{port}"
        receiver = Receiver(
            ReceiverSettings(
                enabled=True, grpc_endpoint="127.0.0.1:0", http_endpoint="127.0.0.1:0", forward_endpoint=target
            ),
            LatencyAnalytics(),
        )
        receiver.start()
        try:
            via_http, via_grpc = export_request(6), export_request(4)
            post(receiver, via_http)
            with grpc.insecure_channel(f"127.0.0.1:{receiver.grpc_port}") as ch:
                ch.unary_unary(GRPC_METHOD)(via_grpc, timeout=10)
            received.wait(lambda rec: len(rec.snapshot()) >= 4)
        finally:
            receiver.stop()
    payloads = received.snapshot()
    assert len(payloads) == 4
    # each original arrives as the exact bytes sent, followed by one request of its children only
    for original in (via_http, via_grpc):
        i = payloads.index(original)
        child_req = ExportTraceServiceRequest.FromString(payloads[i + 1])
        (rs,) = child_req.resource_spans
        assert rs.resource == ExportTraceServiceRequest.FromString(original).resource_spans[0].resource
        (ss,) = rs.scope_spans
        assert ss.scope.name == SCOPE_NAME
        check_children(original, list(ss.spans))


def test_phase_spans_can_be_turned_off() -> None:
    with http_trace_receiver() as (received, port):
        receiver = Receiver(
            ReceiverSettings(
                enabled=True,
                grpc_endpoint=None,
                http_endpoint="127.0.0.1:0",
                forward_endpoint=f"http://127.0.0.1:{port}",
                forward_phase_spans=False,
            ),
            LatencyAnalytics(),
        )
        receiver.start()
        try:
            payload = export_request(3)
            post(receiver, payload)
            received.wait(lambda rec: len(rec.snapshot()) >= 1)
            forwarder = receiver.intake.forwarder
            assert forwarder is not None
            received.wait(lambda _: forwarder.queued() == 0)
        finally:
            receiver.stop()
    assert (forwarder.sent, forwarder.dropped, forwarder.failed) == (1, 0, 0)
    assert received.snapshot() == [payload]


def test_kv_transfer_and_missing_values() -> None:
    kids = phase_spans(engine_span(2, kv_transfer=0.05))
    assert [k.name for k in kids] == ["frontend", "queue", "prefill", "kv_transfer", "decode"]
    kv = kids[3]
    assert kv.start_time_unix_nano == kids[2].end_time_unix_nano
    assert kv.end_time_unix_nano - kv.start_time_unix_nano == int(0.05 * NS)
    assert [kv.value.int_value for kv in kids[4].attributes if kv.key == "vllm.num_preemptions"] == [0]
    # no TTFT, or a NaN/negative one: no children (nothing to time them from)
    s = engine_span(1)
    for bad in (float("nan"), -1.0):
        t = Span()
        t.CopyFrom(s)
        del t.attributes[:]
        t.attributes.extend(
            _kv(kv.key, bad) if kv.key == "gen_ai.latency.time_to_first_token" else kv for kv in s.attributes
        )
        assert phase_spans(t) == []
    # an unknown start (0) is read from the end minus e2e
    t = Span()
    t.CopyFrom(s)
    t.start_time_unix_nano = 0
    assert [k.start_time_unix_nano for k in phase_spans(t)] == [k.start_time_unix_nano for k in phase_spans(s)]


@pytest.mark.integration
def test_the_simulators_spans_get_children_that_add_up(tmp_path) -> None:
    """Spans as the simulator (vLLM's do_tracing) sends them, over OTLP/gRPC, forwarded to a downstream receiver."""
    with grpc_trace_receiver() as (received, port):
        receiver = Receiver(
            ReceiverSettings(
                enabled=True, grpc_endpoint="127.0.0.1:0", http_endpoint=None, forward_endpoint=f"127.0.0.1:{port}"
            ),
            LatencyAnalytics(),
        )
        receiver.start()
        try:
            sim_port = free_port()
            cmd = [PYTHON, "-m", "inferwatch.agent", "simulate", "--port", str(sim_port), "--seed", "2"]
            cmd += ["--otlp-traces-endpoint", f"http://127.0.0.1:{receiver.grpc_port}"]
            with running(cmd, tmp_path / "sim.log", cwd=ROOT, env={"OTEL_BSP_SCHEDULE_DELAY": "100"}) as sim:
                wait_http(f"http://127.0.0.1:{sim_port}/health", proc=sim)
                out = subprocess.run(
                    [PYTHON, "-m", "inferwatch.agent", "loadgen", "--url", f"http://127.0.0.1:{sim_port}", "--json",
                     "--count", "20", "--rate", "20", "--output-tokens", "8"],
                    cwd=ROOT, capture_output=True, text=True, timeout=120,
                )  # fmt: skip
                assert out.returncode == 0, out.stderr
                received.wait(lambda rec: sum(s.name == "llm_request" for s in rec.spans()) >= 20)
                received.wait(lambda rec: sum(s.name == "decode" for s in rec.spans()) >= 20)
        finally:
            receiver.stop()
    spans = received.spans()
    originals = [p for p in received.snapshot() if b"llm_request" in p]
    children = [s for s in spans if s.parent_span_id and s.name != "llm_request"]
    checked = sum(check_children(p, [c for c in children if c.trace_id in p]) for p in originals)
    assert checked == 20
