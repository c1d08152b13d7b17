"""Requests first (agent/common/precedence.py): background work waits while a young request is in flight."""

from __future__ import annotations

import asyncio
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
