"""Client-side TTFT reconciled with the engine's: client spans (the load generator's, the httpx/openai middleware's)
whose child is the engine span, joined by the agent's receiver, set beside the engine TTFT by the explainer."""

from __future__ import annotations

import json
import os
import random
import subprocess
import time

import httpx
import pytest
from opentelemetry.proto.collector.trace.v1.trace_service_pb2 import ExportTraceServiceRequest
from opentelemetry.proto.common.v1.common_pb2 import AnyValue, KeyValue
from opentelemetry.proto.resource.v1.resource_pb2 import Resource
from opentelemetry.proto.trace.v1.trace_pb2 import ResourceSpans, ScopeSpans, Span

from inferwatch.agent.clienttrace import TTFT_KEY, ClientSpans, httpx_event_hooks
from inferwatch.agent.config import ReceiverSettings
from inferwatch.agent.node.analytics.explain import RecordingSink, TailExplainer
from inferwatch.agent.node.analytics.explaintext import render_text
from inferwatch.agent.node.analytics.latency import LatencyAnalytics
from inferwatch.agent.node.analytics.tailrecords import HORIZON_S, ClientTTFTs
from inferwatch.agent.node.receiver import Receiver
from tests.conftest import PYTHON, ROOT, free_port
from tests.procs import agent_beside_simulator, running, wait_http
from tests.trace_receiver import http_trace_receiver

NS = 1_000_000_000


def _kv(key: str, v: float | str) -> KeyValue:
    if isinstance(v, str):
        return KeyValue(key=key, value=AnyValue(string_value=v))
    return KeyValue(key=key, value=AnyValue(double_value=v))


def _pair(rng: random.Random, i: int, network: float, frontend: float) -> tuple[Span, Span]:
    """An engine span (frontend, queue, prefill, decode) and its client span (client TTFT = network + engine TTFT)."""
    queue, prefill, decode = rng.uniform(0, 0.004), 0.03 * rng.uniform(0.9, 1.1), 0.5
    ttft = frontend + queue + prefill
    trace, client_id = os.urandom(16), os.urandom(8)
    t0 = (1_780_000_000 + i) * NS
    engine = Span(
        trace_id=trace,
        span_id=os.urandom(8),
        parent_span_id=client_id,
        name="llm_request",
        kind=Span.SpanKind.SPAN_KIND_SERVER,
        start_time_unix_nano=t0 + int(network * NS),
        end_time_unix_nano=t0 + int((network + ttft + decode) * NS),
        attributes=[
            _kv("gen_ai.request.id", f"cmpl-{i}"),
            _kv("gen_ai.latency.time_in_queue", queue),
            _kv("gen_ai.latency.time_to_first_token", ttft),
            _kv("gen_ai.latency.e2e", ttft + decode),
            _kv("gen_ai.latency.time_in_model_prefill", prefill),
            _kv("gen_ai.latency.time_in_model_decode", decode),
        ],
    )
    client = Span(
        trace_id=trace,
        span_id=client_id,
        name="chat m",
        kind=Span.SpanKind.SPAN_KIND_CLIENT,
        start_time_unix_nano=t0,
        end_time_unix_nano=engine.end_time_unix_nano + int(network * NS),
        attributes=[_kv("gen_ai.operation.name", "chat"), _kv(TTFT_KEY, network + ttft)],
    )
    return engine, client


def _explain_pairs(pairs: list[tuple[Span, Span]]) -> dict:
    explainer = TailExplainer()
    receiver = Receiver(
        ReceiverSettings(enabled=True, grpc_endpoint=None, http_endpoint="127.0.0.1:0"),
        RecordingSink(LatencyAnalytics(), explainer),
    )
    receiver.start()
    try:
        # engine spans first, then the clients' (a client's span ends after the engine's): the join is by trace id
        for spans in ([e for e, _ in pairs], [c for _, c in pairs]):
            req = ExportTraceServiceRequest(
                resource_spans=[
                    ResourceSpans(
                        resource=Resource(attributes=[_kv("gen_ai.request.model", "m")]),
                        scope_spans=[ScopeSpans(spans=spans)],
                    )
                ]
            )
            r = httpx.post(
                f"http://127.0.0.1:{receiver.http_port}/v1/traces",
                content=req.SerializeToString(),
                headers={"Content-Type": "application/x-protobuf"},
                timeout=10,
            )
            assert r.status_code == 200
    finally:
        receiver.stop()
    report = explainer.explain("m", 60.0)
    assert report is not None
    return report


@pytest.mark.integration
def test_a_gap_before_the_engine_and_one_in_its_front_end_are_told_apart() -> None:
    rng = random.Random(5)
    # 10 % of the requests lose 0.5 s between the client and the engine (a gateway), the rest 1-3 ms
    network = [_pair(rng, i, 0.5 if i % 10 == 0 else rng.uniform(0.001, 0.003), 0.003) for i in range(300)]
    report = _explain_pairs(network)
    client = report["client"]
    assert client["requests"] == 300 and client["driver"] == "client_gap" and client["shares"]["client_gap"] > 0.9
    assert "network, gateway or proxy" in client["headline"]
    # the engine alone saw no tail: its own verdict cannot name what happened before it
    assert report["quantities"]["ttft"]["driver"] == "none"
    row = report["slowest"][0]
    assert row["client_gap_s"] == pytest.approx(row["client_ttft_s"] - row["ttft_s"], abs=1e-6)
    text = render_text(report)
    assert text.split("\n\n")[1].startswith("CLIENT TTFT:") and "client" in text.splitlines()[-11]
    # the same tail in the engine's front end (tokenizer, API server) is named as that, not as the network
    front = [_pair(rng, i, 0.002, 0.5 if i % 10 == 0 else 0.003) for i in range(300)]
    client = _explain_pairs(front)["client"]
    assert client["driver"] == "frontend" and "tokenizer" in client["headline"]
    # without client spans the report has no client part
    assert "client" not in _explain_pairs([(e, Span()) for e, _ in front[:60]])


@pytest.mark.integration
def test_openai_client_middleware_makes_the_engine_span_its_child(tmp_path) -> None:
    openai = pytest.importorskip("openai")  # a dev dependency (pyproject [dev]); the agent itself does not need it
    with http_trace_receiver() as (received, port):
        endpoint = f"http://127.0.0.1:{port}/v1/traces"
        sim_port = free_port()
        cmd = [PYTHON, "-m", "inferwatch.agent", "simulate", "--port", str(sim_port), "--seed", "1"]
        cmd += ["--otlp-traces-endpoint", endpoint]
        with running(cmd, tmp_path / "sim.log", cwd=ROOT, env={"OTEL_BSP_SCHEDULE_DELAY": "100"}) as sim:
            wait_http(f"http://127.0.0.1:{sim_port}/health", proc=sim)
            spans = ClientSpans(endpoint, service_name="test-app")
            try:
                with httpx.Client(event_hooks=httpx_event_hooks(spans), timeout=30) as http:
                    client = openai.OpenAI(base_url=f"http://127.0.0.1:{sim_port}/v1", api_key="x", http_client=http)
                    model = client.models.list().data[0].id
                    for _ in range(3):
                        stream = client.chat.completions.create(
                            model=model, messages=[{"role": "user", "content": "hi"}], max_tokens=8, stream=True
                        )
                        assert sum(1 for _ in stream) > 1
            finally:
                spans.shutdown()

            def done(rec) -> bool:
                names = [s.name for s in rec.spans()]
                return names.count("llm_request") >= 3 and names.count(f"chat {model}") >= 3

            received.wait(done)
    by_id = {s.span_id: s for s in received.spans()}
    engines = [s for s in by_id.values() if s.name == "llm_request"]
    assert len(engines) == 3
    for e in engines:
        parent = by_id[e.parent_span_id]
        assert parent.kind == Span.SpanKind.SPAN_KIND_CLIENT and parent.trace_id == e.trace_id
        attrs = {kv.key: kv.value for kv in parent.attributes}
        engine_ttft = next(
            kv.value.double_value for kv in e.attributes if kv.key == "gen_ai.latency.time_to_first_token"
        )
        client_ttft = attrs[TTFT_KEY].double_value
        # the client saw the first chunk after the engine produced it, within its own request's span
        assert engine_ttft <= client_ttft <= (parent.end_time_unix_nano - parent.start_time_unix_nano) / NS
        assert attrs["gen_ai.request.model"].string_value == model and attrs["gen_ai.request.stream"].bool_value
        assert parent.start_time_unix_nano <= e.start_time_unix_nano


@pytest.mark.integration
@pytest.mark.slow
def test_frontend_delay_is_named_from_the_clients_ttft(tmp_path) -> None:
    """Simulator with frontend_delay → spans to the agent; loadgen's client spans to the same receiver; the
    explainer's first verdict is the client TTFT's, and names the engine's front end."""
    count = 200
    sim_args = ["--seed", "4", "--scenario", "frontend_delay"]
    with agent_beside_simulator(tmp_path, sim_args) as (base, sim_port, endpoint):
        out = subprocess.run(
            [PYTHON, "-m", "inferwatch.agent", "loadgen", "--url", f"http://127.0.0.1:{sim_port}", "--json", "--count",
             str(count), "--rate", "20", "--seed", "2", "--output-tokens", "4", "--otlp-traces-endpoint", endpoint],
            cwd=ROOT, capture_output=True, text=True, timeout=120,
        )  # fmt: skip
        assert out.returncode == 0, out.stderr
        assert json.loads(out.stdout)["ok"] == count
        deadline = time.monotonic() + 120  # bounds a hang (CI's load 10-17 on 2 cores)
        while True:
            report = httpx.get(f"{base}/api/v1/explain", params={"window": "5m", "top": 5}, timeout=10).json()
            client = report.get("client") or {}
            if client.get("requests", 0) >= count or time.monotonic() > deadline:
                break
            time.sleep(0.3)
        assert client.get("requests") == count, report
        assert client["driver"] == "frontend", client
        # under the suite's load the client's own scheduling adds to client_gap, never enough to outweigh 0.4 s
        assert client["shares"]["frontend"] >= 0.5 > client["shares"]["client_gap"], client
        assert 0 <= client["gap_p50_s"] < 0.25, client
        for row in report["slowest"]:
            assert row["client_gap_s"] is not None and row["client_gap_s"] > -0.01
        text = httpx.get(f"{base}/api/v1/explain", params={"window": "5m", "format": "text"}, timeout=10).text
        first = next(line for line in text.splitlines() if ": P99" in line)
        assert first.startswith("CLIENT TTFT:") and "front end" in first, text


def test_client_ttfts_are_bounded_in_count_and_age() -> None:
    store = ClientTTFTs(capacity=100)
    store.add(((f"{i:032x}", 0.1) for i in range(250)), now=1000.0)
    assert len(store) == 100 and f"{249:032x}" in store.snapshot(1000.0) and f"{0:032x}" not in store.snapshot(1000.0)
    store.add([(f"{999:032x}", 0.2)], now=1200.0)
    assert len(store.snapshot(1000.0 + HORIZON_S + 1)) == 1  # the first 100 are past the horizon, the last is not
