"""The simulator's uvicorn loop / HTTP parser choice: explicit, with a fallback when not installed."""

from __future__ import annotations

import importlib.util
import subprocess
from pathlib import Path

import httpx
import pytest

from inferwatch.simulator.serve import server_impl
from tests.conftest import PYTHON, ROOT, free_port
from tests.procs import running, wait_http

FAST = importlib.util.find_spec("uvloop") is not None and importlib.util.find_spec("httptools") is not None


def test_explicit_choices_and_bad_names() -> None:
    assert server_impl("asyncio", "h11") == ("asyncio", "h11")
    loop, http = server_impl()
    assert (loop, http) == (("uvloop", "httptools") if FAST else ("asyncio", "h11"))
    for bad in (("tokio", "auto"), ("auto", "h2")):
        with pytest.raises(ValueError, match="--loop must be"):
            server_impl(*bad)


@pytest.mark.skipif(FAST, reason="uvloop and httptools are installed here")
def test_asking_for_a_missing_uvloop_is_a_usage_error() -> None:
    with pytest.raises(ValueError, match="not installed"):
        server_impl("uvloop", "auto")
    out = subprocess.run(
        [PYTHON, "-m", "inferwatch.agent", "simulate", "--port", str(free_port()), "--loop", "uvloop"],
        cwd=ROOT, capture_output=True, text=True, timeout=60,
    )  # fmt: skip
    assert out.returncode == 2 and "uvloop is not installed" in out.stderr


@pytest.mark.integration
def test_the_server_reports_and_serves_with_its_choice(tmp_path: Path) -> None:
    port = free_port()
    cmd = [PYTHON, "-m", "inferwatch.agent", "simulate", "--port", str(port)]
    with running(cmd, tmp_path / "sim.log", cwd=ROOT) as proc:
        url = f"http://127.0.0.1:{port}"
        wait_http(url + "/health", proc=proc)
        loop, http = server_impl()
        assert httpx.get(url + "/sim/stats", timeout=5).json()["server"] == {"loop": loop, "http": http}
        body = {"model": "meta-llama/Llama-3.1-8B-Instruct", "messages": [{"role": "user", "content": "hi"}],
                "max_tokens": 3, "ignore_eos": True, "stream": True}  # fmt: skip
        with httpx.stream("POST", url + "/v1/chat/completions", json=body, timeout=10) as r:
            lines = [line for line in r.iter_lines() if line.startswith("data: ")]
        assert r.status_code == 200 and lines[-1] == "data: [DONE]" and len(lines) >= 4
