"""A source that fails logs one error line when the failure starts and one line when it ends (issue 31).

A slow engine body used to make the engine collector's failure flap between the fetch's own deadline
(``engine.timeout_s``, 1.5 s: reason ``timeout``, outcome ``exception``) and the runner's collector timeout
(2 s: outcome ``timeout``, then ``hung`` while the abandoned call still runs): 7 error lines in 40 s. Here a
real server on 127.0.0.1 sends its body slowly, longer than any deadline the fetch takes (``engine.timeout_s`` 0.5 s,
growing to 8x after a timeout: 4 s; the runner's timeout 4 + 5 s), the real runner runs the real engine collector,
and the log lines are counted over a bounded period.
"""

from __future__ import annotations

import logging
import random
import time
from collections.abc import Callable
from http.server import BaseHTTPRequestHandler
from typing import ClassVar

import pytest

from inferwatch.agent.common.samples import Collection
from inferwatch.agent.config import Settings
from inferwatch.agent.node.collectors import Schedule, schedules
from inferwatch.agent.node.collectors.base import BaseCollector, CollectContext
from inferwatch.agent.node.collectors.engine import EngineCollector
from inferwatch.agent.node.engine.fetch import EngineScrapeError
from inferwatch.agent.node.runner import Runner, failure_cause
from inferwatch.agent.node.state import AgentState
from inferwatch.agent.node.wiring import collect_context
from tests import engine_server as es
from tests.conftest import FIXTURES

VLLM = (FIXTURES / "engines" / "vllm-v1-dp2-synthetic.prom").read_bytes()
INTERVAL_S = 2.5  # a run every 2.5 s instead of 5 s
ENGINE_TIMEOUT_S = 0.5  # the fetch deadline: 0.5 s, then 4 s (8x) after a timeout; the body takes 6 s


def slow_body(seed: int) -> es.Route:
    """A line of exposition at uneven gaps (0.3 to 1.4 s) for 6 s: the fetch sees its deadline passed when a line
    comes after it (at ~0.5 s, then ~4 s), at a time that varies from read to read."""
    rng = random.Random(seed)

    def send(h: BaseHTTPRequestHandler) -> None:
        h.send_response(200)
        h.send_header("Content-Type", "text/plain; version=0.0.4")
        h.send_header("Connection", "close")
        h.end_headers()
        deadline = time.monotonic() + 6.0
        try:
            while time.monotonic() < deadline:
                h.wfile.write(b"vllm:num_requests_running 1\n")
                h.wfile.flush()
                time.sleep(rng.uniform(0.3, 1.4))
        except OSError:
            pass  # the agent gave up, as it should
        h.close_connection = True

    return send


def _wait(pred: Callable[[], bool], timeout_s: float) -> bool:
    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline:
        if pred():
            return True
        time.sleep(0.05)
    return pred()


def _lines(caplog: pytest.LogCaptureFixture, level: int) -> list[str]:
    return [
        r.getMessage()
        for r in caplog.records
        if r.name == "inferwatch.agent.node.runner" and r.levelno == level and "collector engine" in r.getMessage()
    ]


@pytest.mark.integration
@pytest.mark.slow
def test_a_slow_engine_body_logs_one_line_when_it_starts_and_one_when_it_ends(
    caplog: pytest.LogCaptureFixture,
) -> None:
    caplog.set_level(logging.INFO, logger="inferwatch.agent.node.runner")
    with es.EngineServer({"/metrics": es.body(VLLM)}) as srv:
        engine = {"metrics_url": srv.url("/metrics"), "timeout_s": ENGINE_TIMEOUT_S}
        settings = Settings.from_values({"interval_s": INTERVAL_S, "engine": engine})
        state = AgentState()
        collectors = [EngineCollector(collect_context(settings), settings.engine)]
        runner = Runner(state, collectors, schedules(collectors, settings))
        runner.start()
        try:
            assert _wait(lambda: state.health()["engine"].state == "ok", 30)
            runs = state.health()["engine"].runs
            srv.routes["/metrics"] = slow_body(31)
            # at least 8 failed runs (~30 s at 4 s), whichever timeout cut each one
            assert _wait(lambda: state.health()["engine"].errors >= 8, 90), state.health()["engine"]
            failed = state.health()["engine"]
            assert failed.state == "failed" and failed.runs - runs >= 8
            errors = _lines(caplog, logging.ERROR)
            assert len(errors) == 1, errors
            assert "timeout" in errors[0]
            srv.routes["/metrics"] = es.body(VLLM)
            assert _wait(lambda: state.health()["engine"].state == "ok", 60)
            assert _wait(lambda: len(_lines(caplog, logging.INFO)) >= 1, 10)
            time.sleep(2 * INTERVAL_S)  # a few good runs more: nothing else is logged
        finally:
            runner.stop()
    assert len(_lines(caplog, logging.ERROR)) == 1, _lines(caplog, logging.ERROR)
    recovered = _lines(caplog, logging.INFO)
    assert len(recovered) == 1 and "recovered" in recovered[0], recovered


class Scripted(BaseCollector):
    """Fails, run after run, with the causes it is given (an error with a ``reason``, as every source's errors
    carry one), then succeeds; ``runs`` counts its calls."""

    name: ClassVar[str] = "scripted"

    def __init__(self, ctx: CollectContext, causes: list[str]) -> None:
        super().__init__(ctx)
        self.causes = causes
        self.runs = 0

    def collect(self) -> Collection:
        self.runs += 1
        if self.runs <= len(self.causes):
            cause = self.causes[self.runs - 1]
            raise EngineScrapeError(cause, f"run {self.runs} failed")
        return Collection()


def test_a_flapping_cause_logs_once_a_new_cause_once_and_the_end_once(caplog: pytest.LogCaptureFixture) -> None:
    caplog.set_level(logging.INFO, logger="inferwatch.agent.node.runner")
    causes = ["timeout", "timeout", "connect", "timeout", "connect", "timeout", "http_status", "timeout"]
    settings = Settings()
    collector = Scripted(collect_context(settings), causes)
    state = AgentState()
    # a run every 0.2-1 s (the scheduler wakes for the next run at the last one's deadline at the latest)
    runner = Runner(state, [collector], {"scripted": Schedule(0.2, 1.0, "host")})
    runner.start()
    try:
        assert _wait(lambda: state.health()["scripted"].state == "ok", 60)
    finally:
        runner.stop()
    lines = [(r.levelno, r.getMessage()) for r in caplog.records if r.name == "inferwatch.agent.node.runner"]
    assert [level for level, _ in lines] == [logging.ERROR] * 3 + [logging.INFO], lines
    assert lines[0][1].startswith("collector scripted failing (timeout): EngineScrapeError: run 1 failed"), lines
    assert lines[1][1].startswith("collector scripted still failing, now also (connect): "), lines
    assert lines[2][1].startswith("collector scripted still failing, now also (http_status): "), lines
    assert lines[3][1].startswith("collector scripted recovered after 8 failed runs in "), lines
    assert lines[3][1].endswith("(connect, http_status, timeout)"), lines
    assert failure_cause(EngineScrapeError("timeout", "x")) == "timeout"
    assert failure_cause(OSError("x")) == "OSError"
