"""The compose stack's trace store, arize-phoenix, for real: the phoenix service's command and environment from
docker-compose.yml (only host, ports and working directory made local), fed as compose feeds it (the agent's
receiver forwards OTLP/HTTP protobuf to the address the Collector's exporter names: the Collector binary cannot run
here, so the receiver sends where the Collector would), one request's trace queried back by id with its phase
children, and the dashboards' default trace link answering for that id."""

from __future__ import annotations

import time

import httpx
import pytest
import yaml
from opentelemetry.proto.collector.trace.v1.trace_service_pb2 import ExportTraceServiceRequest

from inferwatch.agent.config import ReceiverSettings
from inferwatch.agent.node.analytics.latency import LatencyAnalytics
from inferwatch.agent.node.receiver import Receiver
from inferwatch.dashboards.common import TRACE_URL_DEFAULT
from tests import stack
from tests.conftest import free_port
from tests.procs import running, wait_http
from tests.test_phase_spans import NS, export_request, post
from tests.tools import require

PHOENIX_START_S = 180.0  # first start migrates its SQLite database: ~50 s alone on the 2-core VM


@pytest.mark.integration
@pytest.mark.slow
def test_phoenix_holds_the_forwarded_request_and_its_phases(tmp_path) -> None:
    phoenix = require("phoenix")
    service = yaml.safe_load(stack.COMPOSE_FILE.read_text())["services"]["phoenix"]
    assert service["build"]["target"] == "phoenix"
    local = {"0.0.0.0": "127.0.0.1", "6006": str(free_port()), "4317": str(free_port())}
    cmd = [phoenix, *(local.get(str(w), str(w)) for w in service["command"])]
    port = int(local["6006"])
    env = {**{k: str(v) for k, v in service["environment"].items()}, "PHOENIX_WORKING_DIR": str(tmp_path / "phoenix")}
    # Where compose's Collector sends traces (otlphttp appends /v1/traces), with the service's host made local.
    exporter = yaml.safe_load(stack.OTELCOL_CONFIG.read_text())["exporters"]["otlphttp/phoenix"]["endpoint"]
    assert exporter == "http://phoenix:6006"
    with running(cmd, tmp_path / "phoenix.log", env=env) as proc:
        base = f"http://127.0.0.1:{port}"
        wait_http(f"{base}/healthz", timeout_s=PHOENIX_START_S, proc=proc)
        receiver = Receiver(
            ReceiverSettings(
                enabled=True,
                grpc_endpoint=None,
                http_endpoint="127.0.0.1:0",
                forward_endpoint=exporter.replace("phoenix:6006", f"127.0.0.1:{port}") + "/v1/traces",
            ),
            LatencyAnalytics(),
        )
        receiver.start()
        try:
            payload = export_request(3)
            post(receiver, payload)
            engine = [
                s
                for s in ExportTraceServiceRequest.FromString(payload).resource_spans[0].scope_spans[0].spans
                if s.name == "llm_request"
            ]
            want = engine[2]
            trace = want.trace_id.hex()
            deadline = time.monotonic() + 60
            while True:
                r = httpx.get(f"{base}/v1/projects/default/spans/otlpv1", params={"trace_id": trace}, timeout=10)
                spans = r.json().get("data", []) if r.status_code == 200 else []
                if len(spans) >= 5 or time.monotonic() > deadline:
                    break
                time.sleep(0.5)
            forwarder = receiver.intake.forwarder
            assert forwarder is not None and forwarder.failed == 0
            # The dashboards' trace link (compose publishes Phoenix on localhost:6006): the id appended answers.
            link = TRACE_URL_DEFAULT.replace("localhost:6006", f"127.0.0.1:{port}") + trace
            opened = httpx.get(link, timeout=10, follow_redirects=True)
        finally:
            receiver.stop()
    assert r.status_code == 200, r.text
    assert opened.status_code == 200, (link, opened.status_code)
    by_name = {s["name"]: s for s in spans}
    assert sorted(by_name) == ["decode", "frontend", "llm_request", "prefill", "queue"], spans
    original = by_name["llm_request"]
    assert original["span_id"] == want.span_id.hex()
    assert int(original["start_time_unix_nano"]) == want.start_time_unix_nano
    attrs = {a["key"]: a["value"] for a in original["attributes"]}
    sent = {kv.key: kv.value.double_value for kv in want.attributes if kv.key.startswith("gen_ai.latency.")}
    for key, value in sent.items():
        assert attrs[key].get("double_value") == pytest.approx(value), (key, attrs.get(key))
    for name in ("frontend", "queue", "prefill", "decode"):
        assert by_name[name]["parent_span_id"] == want.span_id.hex()
    prefill = by_name["prefill"]
    ttft = (int(prefill["end_time_unix_nano"]) - want.start_time_unix_nano) / NS
    assert ttft == pytest.approx(sent["gen_ai.latency.time_to_first_token"], abs=1e-5)  # the store keeps µs
