"""The running agent's log: no line per engine fetch or API request from libraries; one line per failure start and end.

A real agent (``python -m inferwatch.agent run``, the CLI's logging setup) scrapes a real engine stub on 127.0.0.1 every
0.5 s for many cycles, answers API requests, sees the engine fail for a while and recover; its log is
counted line by line afterwards.
"""

from __future__ import annotations

import time
from pathlib import Path

import httpx

from tests import engine_server as es
from tests.conftest import PYTHON, ROOT, free_port
from tests.procs import running, wait_http

EXPOSITION = (ROOT / "tests/fixtures/engines/vllm-v1-dp2-synthetic.prom").read_text()
CYCLES = 12  # engine fetches per phase


def wait_fetches(srv: es.EngineServer, count: int, timeout_s: float = 60.0) -> None:
    deadline = time.monotonic() + timeout_s
    while len(srv.requests) < count:
        assert time.monotonic() < deadline, f"only {len(srv.requests)} engine fetches of {count}"
        time.sleep(0.05)


def test_libraries_log_no_line_per_fetch_and_a_failure_is_two_lines(tmp_path: Path) -> None:
    port = free_port()
    base = f"http://127.0.0.1:{port}"
    log = tmp_path / "agent.log"
    with es.EngineServer({"/metrics": es.body(EXPOSITION)}) as srv:
        env = {"INFERWATCH_ENGINE__METRICS_URL": srv.url("/metrics"), "INFERWATCH_LOG_LEVEL": "info"}
        cmd = [PYTHON, "-m", "inferwatch.agent", "run", "--port", str(port), "--interval", "0.5"]
        with running(cmd, log, cwd=ROOT, env={**env, "INFERWATCH_SNAPSHOTS__DIR": str(tmp_path / "s")}) as proc:
            wait_http(f"{base}/metrics", ok=lambda r: "inferwatch_engine_up 1" in r.text, proc=proc)
            start = len(srv.requests)
            wait_fetches(srv, start + CYCLES)
            for _ in range(10):
                assert httpx.get(f"{base}/metrics").status_code == 200
            healthy = len(log.read_text().splitlines())  # start-up is over: the first runs may be slow on CI
            # Each phase counts from its own start: the scrapes above may pull collections forward, so the
            # healthy phase can hold more than CYCLES fetches (under load a failing phase counted from `start`
            # was over before it began, and nothing failed).
            srv.routes["/metrics"] = es.status(500)
            wait_fetches(srv, len(srv.requests) + CYCLES)
            srv.routes["/metrics"] = es.body(EXPOSITION)
            wait_fetches(srv, len(srv.requests) + CYCLES)
            wait_http(f"{base}/metrics", ok=lambda r: "inferwatch_engine_up 1" in r.text, proc=proc)
    lines = log.read_text().splitlines()
    fetches = len(srv.requests)
    library = [ln for ln in lines if any(f" {n}" in ln for n in ("httpx:", "httpcore", "uvicorn.access"))]
    assert library == [], library[:5]
    assert not [ln for ln in lines if "HTTP Request:" in ln or '"GET /metrics' in ln]
    engine = [ln for ln in lines[healthy:] if "engine" in ln and ("failing" in ln or "recovered" in ln)]
    assert len(engine) == 2, engine
    assert "failing" in engine[0] and "recovered" in engine[1]
    assert len(lines) < 40, f"{len(lines)} log lines for {fetches} engine fetches:\n" + "\n".join(lines)
