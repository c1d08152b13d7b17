"""``inferwatch loadgen`` against the simulator, and ``inferwatch demo`` start/stop hygiene."""

from __future__ import annotations

import json
import os
import random
import re
import signal
import subprocess
import time
from pathlib import Path

import httpx
import pytest

from inferwatch.simulator.loadgen import Dist, LoadSpec, load_failed, percentile
from tests.conftest import PYTHON, ROOT, free_port
from tests.procs import running, wait_http

pytestmark = pytest.mark.integration


def test_distributions_and_bounds():
    rng = random.Random(0)
    assert Dist.parse("128").sample(rng) == 128
    u = [Dist.parse("uniform:10:20").sample(rng) for _ in range(500)]
    assert min(u) >= 10 and max(u) <= 20
    ln = sorted(Dist.parse("lognormal:100:0.5").sample(rng) for _ in range(2001))
    assert 85 < ln[1000] < 115
    for bad in ("x", "uniform:5", "uniform:9:1", "gamma:1:2", "normal:-1:2"):
        with pytest.raises(ValueError):
            Dist.parse(bad)
    with pytest.raises(ValueError, match="bound"):
        LoadSpec(url="http://x", count=None, duration_s=None)
    assert percentile([1.0, 2.0, 3.0, 4.0], 50) == 2.0 and percentile([], 99) is None


def _loadgen(url: str, *args: str, code: int = 0) -> dict:
    out = subprocess.run(
        [PYTHON, "-m", "inferwatch.agent", "loadgen", "--url", url, "--json", *args],
        cwd=ROOT, capture_output=True, text=True, timeout=120, check=False,
    )  # fmt: skip
    assert out.returncode == code and "Traceback" not in out.stderr, out.stderr[-2000:]
    return json.loads(out.stdout)


def test_loadgen_fails_when_every_request_failed() -> None:
    """Nothing answered (a closed port): the summary still prints, and the exit status says the run failed."""
    r = subprocess.run(
        [PYTHON, "-m", "inferwatch.agent", "loadgen", "--url", f"http://127.0.0.1:{free_port()}", "--count", "4",
         "--rate", "50",
         "--timeout", "5", "--no-progress"],
        cwd=ROOT, capture_output=True, text=True, timeout=120, check=False,
    )  # fmt: skip
    assert r.returncode == 1, r.stdout + r.stderr
    assert "ok 0  errors 4" in r.stdout and "inferwatch loadgen: every request failed (4: " in r.stderr, r.stderr
    assert "Traceback" not in r.stderr


def test_load_failed_rule() -> None:
    def summary(ok: int, errors: int) -> dict:
        return {
            "requests": ok + errors,
            "ok": ok,
            "errors": errors,
            "error_types": {"http_500": errors} if errors else {},
        }

    assert load_failed(summary(0, 9)) == "every request failed (9: http_500 9)"
    assert load_failed(summary(0, 0)) == ""  # nothing sent: nothing failed
    assert load_failed(summary(1, 9)) == ""  # default: only a run with no success fails
    assert "above --max-error-ratio 0.5" in load_failed(summary(4, 6), 0.5)
    assert load_failed(summary(5, 5), 0.5) == "" and load_failed(summary(10, 0), 0.0) == ""


@pytest.mark.parametrize("protocol", ["chat", "completions", "messages"])
def test_loadgen_measures_client_side_latency(tmp_path: Path, protocol: str):
    port = free_port()
    cmd = [PYTHON, "-m", "inferwatch.agent", "simulate", "--port", str(port), "--control-token", "t"]
    with running(cmd, tmp_path / "sim.log", cwd=ROOT) as proc:
        url = f"http://127.0.0.1:{port}"
        wait_http(url + "/health", proc=proc)
        s = _loadgen(url, "--protocol", protocol, "--rate", "40", "--count", "30", "--output-tokens", "8",
                     "--prompt-tokens", "uniform:20:60")  # fmt: skip
        assert s["requests"] == 30 and s["ok"] == 30 and s["errors"] == 0
        assert 0 < s["ttft_s"]["p50"] <= s["ttft_s"]["p95"] <= s["ttft_s"]["p99"] < s["e2e_s"]["p99"]
        assert s["itl_s"]["p50"] > 0
        if protocol == "chat":
            httpx.post(
                url + "/control/scenario", json={"enable": "hardware_mismatch"}, headers={"Authorization": "Bearer t"}
            )
            bad = _loadgen(url, "--rate", "50", "--count", "5", code=1)
            assert bad["ok"] == 0 and bad["error_types"] == {"http_400:hardware_mismatch": 5}
            httpx.post(
                url + "/control/scenario",
                json={"scenarios": ["stream_usage_only"]},
                headers={"Authorization": "Bearer t"},
            )
            empty = _loadgen(url, "--rate", "50", "--count", "5", "--output-tokens", "3", code=1)
            assert empty["error_types"] == {"empty_stream": 5}


def test_loadgen_duration_bound_and_table(tmp_path: Path):
    port = free_port()
    with running(
        [PYTHON, "-m", "inferwatch.agent", "simulate", "--port", str(port)], tmp_path / "sim.log", cwd=ROOT
    ) as proc:
        url = f"http://127.0.0.1:{port}"
        wait_http(url + "/health", proc=proc)
        t0 = time.monotonic()
        out = subprocess.run(
            [PYTHON, "-m", "inferwatch.agent", "loadgen", "--url", url, "--rate", "20", "--duration", "1.5",
             "--no-progress"],
            cwd=ROOT, capture_output=True, text=True, timeout=60, check=True,
        )  # fmt: skip
        assert time.monotonic() - t0 < 30
        for word in ("TTFT", "ITL", "e2e", "p50", "p95", "p99", "requests", "errors 0"):
            assert word in out.stdout, out.stdout


def _alive(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    stat = Path(f"/proc/{pid}/stat")
    return not (stat.exists() and stat.read_text().rsplit(")", 1)[1].split()[0] == "Z")


def test_demo_serves_then_sigint_leaves_no_child_behind(tmp_path: Path):
    sim_port, agent_port, grpc_port, http_port = (free_port() for _ in range(4))
    cmd = [PYTHON, "-m", "inferwatch.agent", "demo", "--sim-port", str(sim_port), "--agent-port", str(agent_port),
           "--otlp-port", str(grpc_port), "--otlp-http-port", str(http_port), "--rate", "20",
           "--log-dir", str(tmp_path / "logs")]  # fmt: skip
    log = tmp_path / "demo.log"
    with running(cmd, log, cwd=ROOT) as demo:
        started = time.monotonic()
        deadline = time.monotonic() + 60
        while "children" not in log.read_text() and time.monotonic() < deadline:
            assert demo.poll() is None, log.read_text()
            time.sleep(0.2)
        banner = log.read_text()
        pids = {name: int(pid) for name, pid in re.findall(r"(\w+)=(\d+)", banner.split("children", 1)[1])}
        assert set(pids) == {"simulator", "agent", "loadgen"}
        assert all(_alive(p) for p in pids.values())
        assert httpx.get(f"http://127.0.0.1:{agent_port}/healthz", timeout=5).status_code == 200
        # the status page's URL comes first, and the page answers (loopback, no token: anonymous read)
        first = banner.strip().splitlines()[0]
        assert f"http://127.0.0.1:{agent_port}/ " in first, first
        page = httpx.get(f"http://127.0.0.1:{agent_port}/", timeout=10)
        assert page.status_code == 200 and "inferwatch status" in page.text
        sim = f"http://127.0.0.1:{sim_port}"
        deadline = time.monotonic() + 30
        served = 0.0
        while served < 3 and time.monotonic() < deadline:  # the load generator is driving the simulator
            time.sleep(0.5)
            text = httpx.get(sim + "/metrics", timeout=5).text
            served = sum(float(v) for v in re.findall(r"^vllm:request_success_total\{[^}]*\} (\S+)", text, re.M))
        assert served >= 3
        # The agent shows the engine's timing from both sources within ~30 s of the demo's start:
        # histogram quantiles (two engine scrapes with traffic between them) and span quantiles (the
        # simulator's spans reached the agent's OTLP receiver). Engine state and receiver counters too.
        agent = f"http://127.0.0.1:{agent_port}/metrics"
        need = {
            "histogram": re.compile(r'^inferwatch_engine_latency_seconds\{[^}]*source="histogram"[^}]*\} \S+', re.M),
            "spans": re.compile(r'^inferwatch_engine_latency_seconds\{[^}]*source="spans"[^}]*\} \S+', re.M),
            "engine_up": re.compile(r'^inferwatch_engine_up\{engine="vllm"\} 1\.0$', re.M),
            "running": re.compile(r"^inferwatch_engine_requests_running\{", re.M),
            "spans_in": re.compile(r'^inferwatch_receiver_requests_total\{transport="grpc"\} [1-9]', re.M),
        }
        seen: set[str] = set()
        deadline = started + 45  # ~30 s is the target; margin for a loaded 2-core machine
        while seen != set(need) and time.monotonic() < deadline:
            text = httpx.get(agent, timeout=5).text
            seen = {name for name, rx in need.items() if rx.search(text)}
            if seen != set(need):
                time.sleep(1)
        print(f"demo: agent /metrics complete {time.monotonic() - started:.1f} s after start")
        assert seen == set(need), sorted(set(need) - seen)
        # The demo hands the simulator's PID to its agent: the process collector watches that runtime.
        status = httpx.get(f"http://127.0.0.1:{agent_port}/api/v1/status", timeout=10).json()
        process = next(c for c in status["collectors"] if c["name"] == "process")
        assert process["state"] == "ok", process
        assert re.search(r"^inferwatch_runtime_up\{[^}]*\} 1\.0$", text, re.M), "the runtime is not up"
        assert "no runtime process configured" not in (tmp_path / "logs" / "agent.log").read_text()
        os.kill(demo.pid, signal.SIGINT)
        assert demo.wait(30) == 0
    assert not [name for name, pid in pids.items() if _alive(pid)], pids
    assert "stopped" in log.read_text()
