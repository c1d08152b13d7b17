"""The agent on this machine, as a real process: CPU, memory and runtime-process metrics on /metrics,
expected absence (no GPU here) with its hint in the status API, collector switches."""

from __future__ import annotations

import time
import uuid
from pathlib import Path

import httpx
import psutil
from prometheus_client.parser import text_string_to_metric_families

from tests.conftest import PYTHON, ROOT, free_port
from tests.procs import running, wait_http


def _series(text: str) -> dict[str, list[tuple[dict[str, str], float]]]:
    out: dict[str, list[tuple[dict[str, str], float]]] = {}
    for fam in text_string_to_metric_families(text):
        for s in fam.samples:
            out.setdefault(s.name, []).append((s.labels, s.value))
    return out


def test_agent_reports_cpu_memory_and_runtime_process(tmp_path: Path) -> None:
    marker = uuid.uuid4().hex
    runtime = [PYTHON, "-c", "import time; time.sleep(900)", f"fake-runtime-{marker}"]  # outlives the test
    port = free_port()
    agent = [PYTHON, "-m", "inferwatch.agent", "run", "--port", str(port), "--interval", "0.5"]
    env = {"INFERWATCH_RUNTIME__CMDLINE_PATTERN": f"fake-runtime-{marker}", "INFERWATCH_RUNTIME__NAME": "vllm"}
    with running(runtime, tmp_path / "rt.log") as rt, running(agent, tmp_path / "agent.log", cwd=ROOT, env=env) as proc:
        base = f"http://127.0.0.1:{port}"
        wait_http(f"{base}/readyz", ok=lambda r: r.status_code == 200, proc=proc)
        deadline = time.monotonic() + 120  # bounds a hang (CI's load 10-17 on 2 cores)
        series: dict[str, list[tuple[dict[str, str], float]]] = {}
        while time.monotonic() < deadline:
            series = _series(httpx.get(f"{base}/metrics").text)
            if "process_memory_usage_bytes" in series:
                break
            time.sleep(0.2)
        assert series["inferwatch_runtime_up"] == [({"runtime": "vllm"}, 1.0)]
        rss = series["process_memory_usage_bytes"][0][1]
        assert abs(rss - psutil.Process(rt.pid).memory_info().rss) < 50e6
        assert {"inferwatch_node_info", "inferwatch_cpu_feature_present", "system_cpu_logical_count"} <= set(series)
        assert {"system_memory_limit_bytes", "inferwatch_memory_file_lru_bytes"} <= set(series)
        info = series["inferwatch_node_info"][0][0]
        assert info["arch"] in ("x86_64", "aarch64") and info["kernel_release"]
        status = httpx.get(f"{base}/api/v1/status").json()
        by = {c["name"]: c for c in status["collectors"]}
        assert by["cpu"]["state"] == "ok" and by["process"]["state"] == "ok"
        if by["gpu"]["state"] == "absent":  # this machine has no NVIDIA driver
            assert "libnvidia-ml" in by["gpu"]["hint"]
            gpu_absent = [v for labels, v in series["inferwatch_collector_data_absent"] if labels["collector"] == "gpu"]
            assert gpu_absent == [1.0]
        assert status["node"]["host.cpu.model.name"]
        assert any(f["id"] == "cpu.features" for f in status["findings"])


def test_collector_switches(tmp_path: Path) -> None:
    port = free_port()
    agent = [
        PYTHON,
        "-m",
        "inferwatch.agent",
        "run",
        "--port",
        str(port),
        "--no-collector.gpu",
        "--no-collector.process",
    ]
    with running(agent, tmp_path / "agent.log", cwd=ROOT) as proc:
        wait_http(f"http://127.0.0.1:{port}/readyz", ok=lambda r: r.status_code == 200, proc=proc)
        names = {c["name"] for c in httpx.get(f"http://127.0.0.1:{port}/api/v1/status").json()["collectors"]}
        assert {"pagecache", "cpu"} <= names and not names & {"gpu", "process"}
