"""Leak test: canaries planted in every sensitive field of a runtime profile and in the runtime process's
environment and command line must not appear in any sink of a real agent process: Prometheus /metrics,
OTLP (metrics and logs, to a real OTLP/HTTP receiver decoded with opentelemetry-proto), the JSON API,
the on-disk snapshot ring, and the agent's own log.
"""

from __future__ import annotations

import threading
import time
from collections.abc import Iterator
from contextlib import contextmanager
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path
from typing import Any

import httpx
from google.protobuf.json_format import MessageToJson
from opentelemetry.proto.collector.logs.v1.logs_service_pb2 import ExportLogsServiceRequest
from opentelemetry.proto.collector.metrics.v1.metrics_service_pb2 import ExportMetricsServiceRequest

from tests.conftest import PYTHON, ROOT, free_port
from tests.fake_runtime import fake_runtime
from tests.procs import running, stop, wait_http

CANARY = "LEAKCANARY"
TOKEN = "leak-test-token-0123456789abcdef"


def canary_profile() -> dict[str, Any]:
    """A runtime profile with a canary in every field the denylist covers (and one value-shaped secret)."""
    c = iter(f"{CANARY}{i:02d}" for i in range(100))
    return {
        "engine": "leakcheck-engine",
        "gpu_memory_used_bytes": 4242,
        "cpu_affinity_mask": next(c),
        "api_key": next(c),
        "hf_token": next(c),
        "access_token": next(c),
        "client_secret": next(c),
        "password": next(c),
        "db_passwd": next(c),
        "Authorization": f"Bearer {next(c)}",
        "cookie": next(c),
        "set_cookie": [next(c)],
        "session_id": next(c),
        "credentials": {"user": next(c), "pass": next(c)},
        "environment": {"HF_TOKEN": next(c), "PATH": next(c)},
        "env": [f"OPENAI_API_KEY={next(c)}"],
        "environment_variables": {"AWS_SECRET_ACCESS_KEY": next(c)},
        "private_key": next(c),
        "config": {"served_model_name": "m", "note": f"Bearer {next(c)}", "nested": {"secret_key": next(c)}},
        "workers": [{"rank": 0, "token": next(c)}, {"rank": 1, "auth": next(c)}],
    }


def otlp_http_env(endpoint: str) -> dict[str, str]:
    """An agent's environment for OTLP/HTTP export to ``endpoint``, metrics every 0.5 s."""
    return {
        "OTEL_EXPORTER_OTLP_ENDPOINT": endpoint,
        "OTEL_EXPORTER_OTLP_PROTOCOL": "http/protobuf",
        "OTEL_METRIC_EXPORT_INTERVAL": "500",
    }


def assert_absent(needle: str, rec: _Receiver, **sinks: list[str]) -> None:
    """``needle`` is in none of the sinks' texts nor in what the OTLP receiver got (decoded and raw)."""
    sinks |= {"otlp_decoded": rec.decoded, "otlp_raw": [b.decode("latin-1") for b in rec.raw]}
    leaks = {
        name: [t[max(0, t.find(needle) - 80) : t.find(needle) + 30] for t in texts if needle in t]
        for name, texts in sinks.items()
    }
    assert not any(leaks.values()), leaks


class _Receiver:
    def __init__(self) -> None:
        self.raw: list[bytes] = []
        self.decoded: list[str] = []
        self.paths: list[str] = []
        self.log_bodies: list[str] = []


@contextmanager
def otlp_http_receiver() -> Iterator[tuple[_Receiver, int]]:
    rec = _Receiver()

    class Handler(BaseHTTPRequestHandler):
        def log_message(self, *args: Any) -> None:
            pass

        def do_POST(self) -> None:
            body = self.rfile.read(int(self.headers.get("Content-Length", "0")))
            rec.raw.append(body)
            rec.paths.append(self.path)
            if self.path == "/v1/logs":
                msg: Any = ExportLogsServiceRequest()
                msg.ParseFromString(body)
                for rl in msg.resource_logs:
                    for sl in rl.scope_logs:
                        rec.log_bodies += [lr.body.string_value for lr in sl.log_records]
            else:
                msg = ExportMetricsServiceRequest()
                msg.ParseFromString(body)
            rec.decoded.append(MessageToJson(msg))
            self.send_response(200)
            self.send_header("Content-Type", "application/x-protobuf")
            self.send_header("Content-Length", "0")
            self.end_headers()

    server = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
    thread = threading.Thread(target=server.serve_forever, kwargs={"poll_interval": 0.1}, daemon=True)
    thread.start()
    try:
        yield rec, server.server_address[1]
    finally:
        server.shutdown()
        server.server_close()


def test_no_canary_in_any_sink(tmp_path: Path) -> None:
    runtime_cmd = [
        PYTHON, "-c", "import time\nwhile True:\n    time.sleep(0.05)\n",
        "--api-key", f"{CANARY}ARG1", f"--hf-token={CANARY}ARG2", f"SECRET={CANARY}ARG3", "--model", "m",
    ]  # fmt: skip
    import subprocess

    runtime_proc = subprocess.Popen(
        runtime_cmd,
        env={"PATH": "/usr/bin:/bin", "HF_TOKEN": f"{CANARY}ENV1", "API_KEY": f"{CANARY}ENV2"},
        start_new_session=True,
    )
    snap_dir = tmp_path / "snap"
    log_path = tmp_path / "agent.log"
    try:
        with fake_runtime() as rt, otlp_http_receiver() as (rec, otlp_port):
            rt.profile = canary_profile()
            port = free_port()
            env = {
                "INFERWATCH_RUNTIME_PROFILE__URL": f"{rt.url}/debug/runtime_profile",
                "INFERWATCH_RUNTIME_PROFILE__INTERVAL_S": "0.5",
                "INFERWATCH_PROBE__URL": rt.url,
                "INFERWATCH_PROBE__INTERVAL_S": "1",
                "INFERWATCH_RUNTIME__PID": str(runtime_proc.pid),
                "INFERWATCH_PROFILING__ENABLED": "true",
                "INFERWATCH_SNAPSHOTS__DIR": str(snap_dir),
                "INFERWATCH_LOG_LEVEL": "debug",
                "INFERWATCH_API__TOKENS": f'[{{"token": "{TOKEN}", "scopes": ["read", "snapshots", "profile"]}}]',
                **otlp_http_env(f"http://127.0.0.1:{otlp_port}"),
            }
            cmd = [PYTHON, "-m", "inferwatch.agent", "run", "--port", str(port), "--interval", "0.5"]
            auth = {"Authorization": f"Bearer {TOKEN}"}
            with running(cmd, log_path, cwd=ROOT, env=env) as proc:
                base = f"http://127.0.0.1:{port}"
                wait_http(f"{base}/readyz", ok=lambda r: r.status_code == 200, proc=proc, timeout_s=60)
                captured = httpx.post(f"{base}/api/v1/snapshots", headers=auth, timeout=30)
                assert captured.status_code == 201 and captured.json()["outcome"] == "available"
                deadline = time.monotonic() + 120  # bounds a hang (CI's load 10-17 on 2 cores)
                while time.monotonic() < deadline and not (rec.log_bodies and "/v1/metrics" in rec.paths):
                    time.sleep(0.2)
                api_texts = [
                    httpx.get(f"{base}{p}", headers=auth).text
                    for p in ("/api/v1/status", "/api/v1/findings", "/api/v1/binary")
                ]
                listing = httpx.get(f"{base}/api/v1/snapshots", headers=auth).json()["snapshots"]
                api_texts += [httpx.get(f"{base}/api/v1/snapshots/{s['id']}", headers=auth).text for s in listing]
                metrics = httpx.get(f"{base}/metrics").text
    finally:
        stop(runtime_proc)

    ring_texts = [p.read_bytes().decode("utf-8", "replace") for p in snap_dir.iterdir() if p.suffix == ".json"]
    log_text = log_path.read_text(errors="replace")
    # The data did flow through every sink (so the absence below means something):
    assert listing and ring_texts and rec.log_bodies and "/v1/metrics" in rec.paths
    # The py-spy dump enrichment runs at most once per runtime_profile interval: take a snapshot that has it.
    with_dump = [t for t in api_texts[3:] if '"py_spy_dump": [' in t]
    assert with_dump, "no snapshot carries the py-spy dump enrichment"
    snapshot = with_dump[0]
    assert "leakcheck-engine" in snapshot and "[REDACTED hmac:" in snapshot
    assert '"runtime_process"' in snapshot and "--api-key" in snapshot
    assert '"py_spy_dump": [' in snapshot and '"owns_gil"' in snapshot  # the dump enrichment really ran
    assert any("leakcheck-engine" in b and "[REDACTED hmac:" in b for b in rec.log_bodies)
    assert 'inferwatch_runtime_profile_value{field="gpu_memory_used_bytes"} 4242.0' in metrics
    # ... and no canary anywhere:
    assert_absent(CANARY, rec, metrics=[metrics], api=api_texts, ring=ring_texts, log=[log_text])
