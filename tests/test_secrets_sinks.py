"""No credential in any sink (issue 14): a real agent process whose every URL carries a password or a
token — ``engine.metrics_url``, ``probe.url``, ``runtime_profile.url``, the OTLP endpoint — against real
servers on 127.0.0.1, and a runtime profile holding secrets only a value detector finds. The password
must appear in none of: the agent's log (its own lines, httpx's, uvicorn's), the JSON API, the snapshot
files on disk, the OTLP metric and log records (decoded), ``/metrics``. Each sink is first shown to carry
the redacted URL or profile, so the absence means something.
"""

from __future__ import annotations

import threading
import time
from http.server import BaseHTTPRequestHandler
from pathlib import Path

import httpx

from tests.conftest import PYTHON, ROOT, free_port
from tests.engine_server import EngineServer, body, status
from tests.fake_runtime import fake_runtime
from tests.procs import running, wait_http
from tests.test_diag_leak import assert_absent, otlp_http_env, otlp_http_receiver

SECRET = "s3cretpw"
TOKEN = "sinks-test-token-0123456789abcdef"
EXPOSITION = (
    "# TYPE vllm:num_requests_running gauge\n"
    'vllm:num_requests_running{model_name="m",engine="0"} 2\n'
    "# TYPE vllm:num_requests_waiting gauge\n"
    'vllm:num_requests_waiting{model_name="m",engine="0"} 0\n'
)


def failing_then_ok(failures: int) -> object:
    """Answer 503 ``failures`` times (the agent logs the failure, naming the URL), then the exposition."""
    lock = threading.Lock()
    seen = [0]
    ok, bad = body(EXPOSITION), status(503)

    def send(h: BaseHTTPRequestHandler) -> None:
        with lock:
            seen[0] += 1
            n = seen[0]
        (bad if n <= failures else ok)(h)

    return send


def secret_profile() -> dict[str, object]:
    """A profile whose secrets sit under ordinary keys: only the value detectors find them."""
    return {
        "engine": "sinks-engine",
        "gpu_memory_used_bytes": 777,
        "max_num_batched_tokens": 8192,
        "tokenizer_mode": "auto",
        "config": {
            "kv_transfer_url": f"redis://:{SECRET}@cache:6379/0",
            "db": f"postgres://app:{SECRET}@db:5432/serving",
            "weights": f"https://b.s3.amazonaws.com/w?X-Amz-Credential=AK&X-Amz-Signature={SECRET}",
            "note": f"Authorization: Bearer {SECRET}",
            "tls": f"-----BEGIN PRIVATE KEY-----\nMII{SECRET}\n-----END PRIVATE KEY-----",
            "argv": ["vllm", "serve", "m", "--api-key", SECRET, "-k", SECRET, "--db-url", f"mysql://u:{SECRET}@h/d"],
            "env": [{"name": "OPENAI_API_KEY", "value": SECRET}, {"name": "VLLM_PORT", "value": "8000"}],
            "pass": SECRET,
            "pw": SECRET,
        },
    }


def test_no_credential_reaches_any_sink(tmp_path: Path) -> None:
    snap_dir = tmp_path / "snap"
    log_path = tmp_path / "agent.log"
    engine = EngineServer({"/metrics": failing_then_ok(2)})  # type: ignore[dict-item]
    with engine, fake_runtime() as rt, otlp_http_receiver() as (rec, otlp_port):
        rt.profile = secret_profile()
        port = free_port()
        env = {
            "INFERWATCH_ENGINE__METRICS_URL": f"http://user:{SECRET}@127.0.0.1:{engine.port}/metrics",
            "INFERWATCH_PROBE__URL": f"http://probe:{SECRET}@127.0.0.1:{rt.port}",
            "INFERWATCH_PROBE__INTERVAL_S": "1",
            "INFERWATCH_RUNTIME_PROFILE__URL": (
                f"http://u:{SECRET}@127.0.0.1:{rt.port}/debug/runtime_profile?token={SECRET}&v=1"
            ),
            "INFERWATCH_RUNTIME_PROFILE__INTERVAL_S": "0.5",
            "INFERWATCH_SNAPSHOTS__DIR": str(snap_dir),
            "INFERWATCH_LOG_LEVEL": "debug",  # every library's lines, httpx's "HTTP Request: GET <url>" too
            "INFERWATCH_API__TOKENS": f'[{{"token": "{TOKEN}", "scopes": ["read", "snapshots"]}}]',
            **otlp_http_env(f"http://otlp:{SECRET}@127.0.0.1:{otlp_port}"),
        }
        cmd = [PYTHON, "-m", "inferwatch.agent", "run", "--port", str(port), "--interval", "0.5"]
        auth = {"Authorization": f"Bearer {TOKEN}"}
        base = f"http://127.0.0.1:{port}"
        with running(cmd, log_path, cwd=ROOT, env=env) as proc:
            wait_http(f"{base}/readyz", ok=lambda r: r.status_code == 200, proc=proc, timeout_s=60)
            assert httpx.post(f"{base}/api/v1/snapshots", headers=auth, timeout=30).status_code == 201
            deadline = time.monotonic() + 120  # bounds a hang (CI's load 10-17 on 2 cores)
            metrics = ""
            while time.monotonic() < deadline:
                metrics = httpx.get(f"{base}/metrics").text
                engine_ok = 'inferwatch_engine_requests_running{gen_ai_request_model="m"} 2' in metrics
                if engine_ok and rec.log_bodies and "/v1/metrics" in rec.paths:
                    break
                time.sleep(0.2)
            api = {
                p: httpx.get(f"{base}{p}", headers=auth).text
                for p in ("/api/v1/status", "/api/v1/findings", "/api/v1/snapshots")
            }
            listing = httpx.get(f"{base}/api/v1/snapshots", headers=auth).json()["snapshots"]
            for s in listing:
                api[s["id"]] = httpx.get(f"{base}/api/v1/snapshots/{s['id']}", headers=auth).text
    ring = [p.read_text(errors="replace") for p in snap_dir.iterdir() if p.suffix == ".json"]
    log = log_path.read_text(errors="replace")
    engine_url = f"http://user:REDACTED@127.0.0.1:{engine.port}/metrics"
    # Every sink carried what it should, redacted:
    assert engine_url in log, "the engine's failure is logged with the URL, its password replaced"
    assert f"http://probe:REDACTED@127.0.0.1:{rt.port}/v1/chat/completions" in api["/api/v1/findings"]
    profile_url = f"http://u:REDACTED@127.0.0.1:{rt.port}/debug/runtime_profile?token=REDACTED&v=1"
    assert ring and all(profile_url in t for t in ring)
    assert any("sinks-engine" in t and '"max_num_batched_tokens": 8192' in t for t in ring)
    assert any("postgres://app:[REDACTED hmac:" in t for t in ring)  # only the password went
    assert any(profile_url in b and "sinks-engine" in b for b in rec.log_bodies)
    assert 'inferwatch_runtime_profile_value{field="gpu_memory_used_bytes"} 777.0' in metrics
    assert "/v1/metrics" in rec.paths
    # ... and the secret in none:
    assert_absent(SECRET, rec, log=[log], api=list(api.values()), ring=ring, metrics=[metrics])
