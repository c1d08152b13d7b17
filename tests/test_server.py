"""The agent as a real process: /metrics, /healthz, /readyz and /api/v1/status over HTTP."""

from __future__ import annotations

import httpx
from prometheus_client.parser import text_string_to_metric_families

from tests.conftest import FIXTURES, PYTHON, ROOT, free_port
from tests.procs import running, wait_http


def test_agent_serves_metrics_on_this_host(tmp_path) -> None:
    port = free_port()
    cmd = [PYTHON, "-m", "agent", "run", "--port", str(port), "--interval", "0.5"]
    with running(cmd, tmp_path / "agent.log", cwd=ROOT) as proc:
        base = f"http://127.0.0.1:{port}"
        wait_http(f"{base}/readyz", ok=lambda r: r.status_code == 200, proc=proc)
        assert httpx.get(f"{base}/healthz").json() == {"status": "alive"}
        r = httpx.get(f"{base}/metrics")
        assert r.status_code == 200 and r.headers["content-type"].startswith("text/plain")
        names = {f.name for f in text_string_to_metric_families(r.text)}
        assert {
            "system_memory_limit_bytes",
            "inferwatch_memory_file_lru_bytes",
            "inferwatch_collector_success",
        } <= names
        status = httpx.get(f"{base}/api/v1/status").json()
        assert {c["name"] for c in status["collectors"]} >= {"pagecache"}
        assert status["node"]["os.type"] == "linux"


def test_readyz_waits_for_first_run_and_bad_procfs_does_not_kill_agent(tmp_path) -> None:
    port = free_port()
    cmd = [PYTHON, "-m", "agent", "run", "--port", str(port), "--path.procfs", str(tmp_path / "none")]
    (tmp_path / "none").mkdir()
    with running(cmd, tmp_path / "agent.log", cwd=ROOT) as proc:
        base = f"http://127.0.0.1:{port}"
        wait_http(f"{base}/readyz", ok=lambda r: r.status_code == 200, proc=proc)
        status = httpx.get(f"{base}/api/v1/status").json()
        pc = next(c for c in status["collectors"] if c["name"] == "pagecache")
        assert pc["state"] == "absent" and "--path.procfs" in pc["hint"]
        assert httpx.get(f"{base}/metrics").status_code == 200
    assert FIXTURES.is_dir()
