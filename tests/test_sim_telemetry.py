"""The simulator's telemetry read by real consumers: Prometheus scrapes it, OTLP receivers get its spans."""

from __future__ import annotations

import threading
import time
from concurrent import futures
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path

import grpc
import httpx
import pytest
from opentelemetry.proto.collector.trace.v1 import trace_service_pb2, trace_service_pb2_grpc

from tests.conftest import PYTHON, ROOT, free_port
from tests.procs import running, wait_http

pytestmark = pytest.mark.integration
MODEL = "meta-llama/Llama-3.1-8B-Instruct"
TTFT_P90 = "histogram_quantile(0.9, sum by (le) (rate(vllm:time_to_first_token_seconds_bucket[15s])))"
CHAT = {"model": MODEL, "messages": [{"role": "user", "content": "hello"}], "max_tokens": 4}


def _traffic(url: str, stop: threading.Event) -> None:
    with httpx.Client(timeout=10) as c:
        while not stop.is_set():
            c.post(url + "/v1/chat/completions", json=CHAT)
            time.sleep(0.05)


def test_prometheus_scrapes_the_simulator_and_computes_ttft_quantiles(tmp_path: Path):
    sim_port, prom_port = free_port(), free_port()
    cfg = tmp_path / "prometheus.yml"
    cfg.write_text(
        "global: {scrape_interval: 1s, evaluation_interval: 1s}\n"
        f"scrape_configs:\n  - job_name: engine\n    static_configs: [{{targets: ['127.0.0.1:{sim_port}']}}]\n"
    )
    sim_cmd = [PYTHON, "-m", "inferwatch.agent", "simulate", "--port", str(sim_port), "--engines", "2"]
    prom_cmd = ["prometheus", f"--config.file={cfg}", f"--storage.tsdb.path={tmp_path / 'data'}",
                f"--web.listen-address=127.0.0.1:{prom_port}"]  # fmt: skip
    with running(sim_cmd, tmp_path / "sim.log", cwd=ROOT) as sim, running(prom_cmd, tmp_path / "prom.log") as prom:
        sim_url, prom_url = f"http://127.0.0.1:{sim_port}", f"http://127.0.0.1:{prom_port}"
        wait_http(sim_url + "/health", proc=sim)
        wait_http(prom_url + "/-/ready", proc=prom)
        stop = threading.Event()
        t = threading.Thread(target=_traffic, args=(sim_url, stop), daemon=True)
        t.start()
        try:
            value = None
            deadline = time.monotonic() + 40
            while value is None and time.monotonic() < deadline:
                time.sleep(1)
                res = httpx.get(prom_url + "/api/v1/query", params={"query": TTFT_P90}).json()
                assert res["status"] == "success"
                if res["data"]["result"] and res["data"]["result"][0]["value"][1] not in ("NaN",):
                    value = float(res["data"]["result"][0]["value"][1])
            up = httpx.get(prom_url + "/api/v1/query", params={"query": 'up{job="engine"}'}).json()
            engines = httpx.get(prom_url + "/api/v1/query", params={"query": "count(vllm:num_requests_running)"}).json()
        finally:
            stop.set()
            t.join(15)
    assert value is not None and 0 < value < 5, value
    assert up["data"]["result"][0]["value"][1] == "1"
    assert engines["data"]["result"][0]["value"][1] == "2"  # one series per data-parallel engine


class _GrpcReceiver(trace_service_pb2_grpc.TraceServiceServicer):
    def __init__(self) -> None:
        self.requests: list[trace_service_pb2.ExportTraceServiceRequest] = []

    def Export(self, request, context):
        self.requests.append(request)
        return trace_service_pb2.ExportTraceServiceResponse()


def _spans(requests) -> list:
    return [s for r in requests for rs in r.resource_spans for ss in rs.scope_spans for s in ss.spans]


def _attrs(span) -> dict:
    out = {}
    for kv in span.attributes:
        v = kv.value
        out[kv.key] = (
            v.int_value if v.HasField("int_value") else v.double_value if v.HasField("double_value") else v.string_value
        )
    return out


def _run_and_collect(tmp_path: Path, endpoint: str, received: list, n: int = 3) -> list:
    port = free_port()
    cmd = [PYTHON, "-m", "inferwatch.agent", "simulate", "--port", str(port), "--otlp-traces-endpoint", endpoint]
    with running(cmd, tmp_path / "sim.log", cwd=ROOT, env={"OTEL_BSP_SCHEDULE_DELAY": "100"}) as proc:
        url = f"http://127.0.0.1:{port}"
        wait_http(url + "/health", proc=proc)
        parent = "00-0af7651916cd43dd8448eb211c80319c-b7ad6b7169203331-01"
        for i in range(n):
            headers = {"traceparent": parent} if i == 0 else {}
            assert httpx.post(url + "/v1/chat/completions", json=CHAT, headers=headers, timeout=10).status_code == 200
        deadline = time.monotonic() + 120  # bounds a hang (CI's load 10-17 on 2 cores)
        while len(_spans(received)) < n and time.monotonic() < deadline:
            time.sleep(0.1)
    return _spans(received)


def _check_spans(spans: list, n: int = 3) -> None:
    assert len(spans) == n
    for s in spans:
        assert s.name == "llm_request" and s.kind == s.SPAN_KIND_SERVER
        a = _attrs(s)
        # vLLM v1 names no model on its spans (vllm/v1/engine/output_processor.py), nor num_sequences
        assert "gen_ai.response.model" not in a and "gen_ai.usage.num_sequences" not in a
        assert a["gen_ai.usage.prompt_tokens"] == 5 and a["gen_ai.request.n"] == 1
        assert 1 <= a["gen_ai.usage.completion_tokens"] <= 4 and a["gen_ai.request.max_tokens"] == 4
        for key in ("time_to_first_token", "e2e", "time_in_queue", "time_in_model_prefill",
                    "time_in_model_decode", "time_in_model_inference"):  # fmt: skip
            assert a[f"gen_ai.latency.{key}"] >= 0
        assert a["gen_ai.latency.e2e"] >= a["gen_ai.latency.time_to_first_token"]
        assert s.end_time_unix_nano - s.start_time_unix_nano == pytest.approx(a["gen_ai.latency.e2e"] * 1e9, rel=1e-3)
    parented = [s for s in spans if s.trace_id.hex() == "0af7651916cd43dd8448eb211c80319c"]
    assert len(parented) == 1 and parented[0].parent_span_id.hex() == "b7ad6b7169203331"


def test_llm_request_spans_over_otlp_grpc(tmp_path: Path):
    receiver = _GrpcReceiver()
    server = grpc.server(futures.ThreadPoolExecutor(max_workers=2))
    trace_service_pb2_grpc.add_TraceServiceServicer_to_server(receiver, server)
    port = free_port()
    server.add_insecure_port(f"127.0.0.1:{port}")
    server.start()
    try:
        spans = _run_and_collect(tmp_path, f"http://127.0.0.1:{port}", receiver.requests)
    finally:
        server.stop(0)
    _check_spans(spans)


def test_llm_request_spans_over_otlp_http(tmp_path: Path):
    received: list = []

    class Handler(BaseHTTPRequestHandler):
        def do_POST(self):
            body = self.rfile.read(int(self.headers["Content-Length"]))
            if self.path == "/v1/traces":
                received.append(trace_service_pb2.ExportTraceServiceRequest.FromString(body))
            self.send_response(200)
            self.send_header("Content-Type", "application/x-protobuf")
            self.end_headers()

        def log_message(self, *args):
            pass

    httpd = ThreadingHTTPServer(("127.0.0.1", free_port()), Handler)
    threading.Thread(target=httpd.serve_forever, daemon=True).start()
    try:
        spans = _run_and_collect(tmp_path, f"http://127.0.0.1:{httpd.server_port}/v1/traces", received)
    finally:
        httpd.shutdown()
    _check_spans(spans)
