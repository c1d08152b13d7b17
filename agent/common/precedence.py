"""Requests first: background work steps aside while the agent's HTTP API answers.

The agent's threads share one interpreter lock. A large collection (an engine of 200 models x 2 ranks: half a second
or more of Python work) holds it in 5 ms turns against a request's thread, and a request that takes and releases the
lock many times (the event loop, the worker thread a route runs in, the socket writes) waits up to a turn each time.
Stepping aside instead took a third off the status page's p90 (18.7-21.5 against 27.6-30.5 ms) and a fifth or more
off ``/metrics``' p99 at that size (docs/benchmarks.md, "`/metrics` and the API while a 200-model engine is read").

:data:`GATE` counts the API's requests in flight (:class:`ServingFirst`, the ASGI middleware the composition root puts
in front of the agent's app; the OTLP receiver's span intake is not counted: it is background work too). Long-running
work calls :func:`step_aside` at its natural boundaries (a chunk of an engine's body, a collector's run): while a
request younger than :data:`PRIORITY_S` is in flight it waits, the lock free for the request, until the request is
done or no longer young. A request that takes longer (a slow client, a capture action) stops holding the work back
once it is :data:`PRIORITY_S` old, so background work is delayed by at most that much per request.
"""

from __future__ import annotations

import contextlib
import contextvars
import threading
import time
from collections.abc import Callable, Iterator
from typing import Any

from inferwatch.agent.common.samples import AnySample, Sample

PRIORITY_S = 0.25  # a request holds background work back for at most this long
# The request the current context serves (ServingFirst sets it; a sync route's worker thread inherits it): work done
# for a request never steps aside for it.
_SERVING: contextvars.ContextVar[int | None] = contextvars.ContextVar("inferwatch_serving", default=None)


class Gate:
    """Requests in flight (their start times) and the waits of the work that stepped aside for them."""

    def __init__(self, priority_s: float = PRIORITY_S, clock: Callable[[], float] = time.monotonic) -> None:
        self.priority_s = priority_s
        self.clock = clock
        self._cond = threading.Condition(threading.Lock())
        self._started: dict[int, float] = {}
        self._next = 0
        self.waits = 0  # times background work stepped aside
        self.waited_s = 0.0

    def enter(self) -> int:
        with self._cond:
            self._next += 1
            self._started[self._next] = self.clock()
            return self._next

    def leave(self, token: int) -> None:
        with self._cond:
            self._started.pop(token, None)
            self._cond.notify_all()

    def step_aside(self) -> float:
        """Wait while a young request is in flight; the seconds waited (0.0 at once when none is: one dict read).

        Work done for a request (in its context) never waits."""
        if not self._started or _SERVING.get() is not None:
            return 0.0
        began = self.clock()
        stepped = False
        with self._cond:
            while self._started:
                left = max(self._started.values()) + self.priority_s - self.clock()  # the youngest's turn
                if left <= 0:
                    break
                stepped = True
                self._cond.wait(left)
            if not stepped:
                return 0.0
            waited = self.clock() - began
            self.waits += 1
            self.waited_s += waited
        return waited

    def samples(self) -> list[AnySample]:
        """``inferwatch.collector.stepped_aside``: the seconds waited so far (a state source)."""
        with self._cond:
            waited = self.waited_s
        return [Sample("inferwatch.collector.stepped_aside", waited, ())]

    @contextlib.contextmanager
    def waiting_on_background(self) -> Iterator[None]:
        """The current request, while it waits for background work (a collection it asked for), holds nothing back."""
        token = _SERVING.get()
        if token is None:
            yield
            return
        self.leave(token)
        try:
            yield
        finally:
            with self._cond:
                self._started[token] = self.clock()


GATE = Gate()


def step_aside() -> float:
    """:meth:`Gate.step_aside` on the process's :data:`GATE`."""
    return GATE.step_aside()


class ServingFirst:
    """ASGI middleware: each HTTP request counts in ``gate`` from its start until its response is sent."""

    def __init__(self, app: Any, gate: Gate = GATE) -> None:
        self.app = app
        self.gate = gate

    async def __call__(self, scope: dict[str, Any], receive: Any, send: Any) -> None:
        if scope["type"] != "http":
            await self.app(scope, receive, send)
            return
        token = self.gate.enter()
        marked = _SERVING.set(token)
        try:
            await self.app(scope, receive, send)
        finally:
            _SERVING.reset(marked)
            self.gate.leave(token)
