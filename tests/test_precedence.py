"""Requests first (agent/common/precedence.py): background work waits while a young request is in flight."""

from __future__ import annotations

import asyncio
import gc
import itertools
import sys
import threading
import time
from typing import Any

from inferwatch.agent.common.precedence import Gate, ServingFirst


class FakeClock:
    def __init__(self) -> None:
        self.now = 100.0

    def __call__(self) -> float:
        return self.now


def test_no_request_no_wait() -> None:
    gate = Gate()
    assert gate.step_aside() == 0.0
    assert gate.waits == 0


def test_waits_until_the_request_is_answered() -> None:
    gate = Gate(priority_s=5.0)
    token = gate.enter()
    threading.Timer(0.1, gate.leave, args=(token,)).start()
    began = time.monotonic()
    waited = gate.step_aside()
    took = time.monotonic() - began
    assert 0.05 <= waited <= took < 4.0  # released by the answer, long before the request's priority ran out
    assert gate.waits == 1 and gate.waited_s == waited


def test_an_old_request_holds_nothing_back() -> None:
    clock = FakeClock()
    gate = Gate(priority_s=0.25, clock=clock)
    gate.enter()
    clock.now += 0.3  # a slow client: its request is past its priority
    assert gate.step_aside() == 0.0


def test_a_request_holds_back_for_at_most_its_priority() -> None:
    gate = Gate(priority_s=0.2)
    gate.enter()  # never answered
    began = time.monotonic()
    gate.step_aside()
    assert 0.15 <= time.monotonic() - began < 2.0
    assert gate.step_aside() == 0.0  # once old, at once


def test_work_done_for_the_request_never_waits_for_it() -> None:
    gate = Gate(priority_s=5.0)
    seen: dict[str, Any] = {}

    async def app(scope: dict[str, Any], receive: Any, send: Any) -> None:
        # a sync route runs in a worker thread that inherits the request's context
        seen["waited"] = await asyncio.to_thread(gate.step_aside)
        with gate.waiting_on_background():
            seen["in_flight_while_waiting"] = len(gate._started)
        seen["in_flight_after"] = len(gate._started)

    asyncio.run(ServingFirst(app, gate)({"type": "http"}, None, None))
    assert seen == {"waited": 0.0, "in_flight_while_waiting": 0, "in_flight_after": 1}
    assert gate._started == {}  # left when the response was sent


def test_background_work_pauses_while_the_middleware_serves() -> None:
    gate = Gate(priority_s=5.0)
    steps: list[tuple[str, float]] = []
    answering = threading.Event()

    def background() -> None:
        answering.wait(5)
        gate.step_aside()
        steps.append(("background", time.monotonic()))

    async def app(scope: dict[str, Any], receive: Any, send: Any) -> None:
        answering.set()
        await asyncio.sleep(0.2)  # the request's own work
        steps.append(("answered", time.monotonic()))

    worker = threading.Thread(target=background)
    worker.start()
    asyncio.run(ServingFirst(app, gate)({"type": "http"}, None, None))
    worker.join(10)
    assert [name for name, _ in steps] == ["answered", "background"]
    asyncio.run(ServingFirst(app, gate)({"type": "lifespan"}, None, None))  # not a request: not counted
    assert gate._started == {}


def _counted_read(models: int) -> tuple[int, list[int]]:
    """A full read in steady state by the real engine collector: its Python calls, and the count at each step aside."""
    from inferwatch.agent.common import precedence
    from inferwatch.agent.config import Settings
    from inferwatch.agent.node.collectors.engine import EngineCollector
    from inferwatch.agent.node.wiring import collect_context
    from tests import engine_server as es
    from tests.engine_expo import VllmLike

    gen = VllmLike([f"org/model-{i:03d}" for i in range(models)], engines=2, seed=7)
    gen.observe(5)
    calls = 0
    steps: list[int] = []

    def count(frame: object, event: str, arg: object) -> None:
        nonlocal calls
        if event in ("call", "c_call"):
            calls += 1

    def step() -> float:
        steps.append(calls)
        return 0.0

    with es.EngineServer() as srv:
        srv.routes["/metrics"] = es.body(gen.text())
        engine = {"metrics_url": srv.url("/metrics"), "kind": "vllm", "max_models": 1000, "max_series": 10**6}
        settings = Settings.from_values({"engine": engine})
        collector = EngineCollector(collect_context(settings), settings.engine)
        try:
            collector.collect()  # the next read has windows to report: every step of a read in steady state
            gen.observe(5)
            srv.routes["/metrics"] = es.body(gen.text())
            precedence.GATE.step_aside = step  # type: ignore[method-assign]
            gc.disable()
            sys.setprofile(count)
            try:
                collector.collect()
            finally:
                sys.setprofile(None)
                gc.enable()
                del precedence.GATE.step_aside
        finally:
            collector.close()
    return calls, steps


def test_an_engine_read_steps_aside_all_through_it() -> None:
    """Counted, not timed: in a full read by the real engine collector (32 and 64 vLLM models x 2 ranks from a real
    HTTP server on 127.0.0.1), the longest run of Python calls between two steps aside is a small part of the read
    (2.3-2.5 % on 2026-12-07; the whole read, ~100 %, with no step in it), and there is a step per model or more."""
    for models in (32, 64):
        calls, steps = _counted_read(models)
        marks = [0, *steps, calls]
        longest = max(b - a for a, b in itertools.pairwise(marks))
        assert len(steps) >= models, (models, len(steps))
        assert longest <= 0.05 * calls, (models, longest, calls)


def test_the_seconds_stepped_aside_are_a_counter_of_the_agent() -> None:
    gate = Gate(priority_s=5.0)
    assert [(s.name, s.value) for s in gate.samples()] == [("inferwatch.collector.stepped_aside", 0.0)]
    token = gate.enter()
    threading.Timer(0.05, gate.leave, args=(token,)).start()
    waited = gate.step_aside()
    assert gate.samples()[0].value == waited > 0
