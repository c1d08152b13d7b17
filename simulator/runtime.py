"""The live runtime: engine cores driven in real time on the asyncio loop, and token delivery.

One task per engine runs the step loop (the shared ticker: one timer per engine step, not per token
or per request). A step's tokens go to each request's :class:`TokenStream`, which the HTTP handler
drains and writes as SSE chunks. Steps are scheduled on a deadline chain (next step starts when the
previous one was due, if the loop is only slightly late), so timer granularity does not inflate the
simulated latencies, and a host that briefly deschedules the process delays token delivery without
changing the engine's timestamps (the vLLM phase histograms stay the model's).
"""

from __future__ import annotations

import asyncio
import contextlib
import threading
import time
from collections import deque
from collections.abc import Callable
from dataclasses import dataclass, field

from inferwatch.simulator.config import SimConfig
from inferwatch.simulator.engine import EngineCore, SimRequest
from inferwatch.simulator.metrics import VllmMetrics, _PerEngine
from inferwatch.simulator.profiles import Deployment, deploy
from inferwatch.simulator.scenarios import ScenarioSet
from inferwatch.simulator.tracing import SpanEmitter

HANG_POLL_S = 0.25
_NO_PEER = threading.Event()  # never set: the peer rank of a hung collective never arrives


def wait_for_collective(still_hung: Callable[[], bool], each_poll: Callable[[], None]) -> None:
    """Where a hung engine step blocks: like a rank in an NCCL all-reduce whose peer never arrives.

    Runs in a worker thread (the event loop keeps answering /health and /metrics), so a py-spy dump of a hung
    simulator names this function, as one of a wedged vLLM names the collective it waits in. It returns only when
    the hang is cleared (polled every HANG_POLL_S in this thread): were it to return to the event loop between
    polls, a dump on a starved machine could land while the thread sat idle in the executor's queue and name
    nothing. ``each_poll`` lets the engine publish the stall (arrivals queue up) while the thread waits.
    """
    while still_hung():
        each_poll()
        _NO_PEER.wait(HANG_POLL_S)


LAG_PROBE_INTERVAL_S = 0.01
LAG_WINDOW = 60_000
DEADLINE_SLACK_S = 0.25  # a loop this late still follows the model's timeline (it catches up)


class TokenStream:
    """Tokens produced for one request so far; the handler awaits ``event``."""

    __slots__ = ("count", "done", "event")

    def __init__(self) -> None:
        self.count = 0
        self.done = False
        self.event = asyncio.Event()

    def push(self) -> None:
        self.count += 1
        self.event.set()

    def finish(self) -> None:
        self.done = True
        self.event.set()


class _Listener:
    def __init__(self, metrics: _PerEngine, spans: SpanEmitter | None) -> None:
        self.metrics = metrics
        self.spans = spans

    def on_token(self, req: SimRequest, now: float, itl: float | None) -> None:
        self.metrics.token(req, now, itl)
        if req.sink is not None:
            req.sink.push()

    def on_finish(self, req: SimRequest) -> None:
        self.metrics.finish(req)
        if self.spans is not None:
            self.spans.emit(req)
        if req.sink is not None:
            req.sink.finish()

    def on_step(self, core: EngineCore, prompt_tokens: int, generation_tokens: int, preempted: int) -> None:
        self.metrics.step(core, prompt_tokens, generation_tokens, preempted)


class EngineLoop:
    def __init__(self, core: EngineCore, scenarios: ScenarioSet) -> None:
        self.core = core
        self.scenarios = scenarios
        self.wakeup = asyncio.Event()
        self.steps = 0
        self._stopping = threading.Event()

    def submit(self, req: SimRequest) -> None:
        self.core.add(req)
        self.wakeup.set()

    def _hung(self) -> bool:
        if self._stopping.is_set():
            return False
        hang = self.scenarios.get("hang")
        return hang is not None and hang.get("engine") in (-1, self.core.index)

    async def run(self) -> None:
        loop = asyncio.get_running_loop()
        clock = time.monotonic
        due: float | None = None
        core = self.core
        while True:
            block = self.scenarios.get("loop_block")
            if block is not None:  # deliberately blocks the event loop: a blocking call in the API server's loop
                self.scenarios.disable("loop_block")
                time.sleep(block.get("seconds"))
                due = None
                continue
            if self._hung():
                due = None

                def publish_stall() -> None:  # from the waiting thread: the engine's state stays the loop's
                    with contextlib.suppress(RuntimeError):  # the loop closed under it: nothing left to publish to
                        loop.call_soon_threadsafe(lambda: core.stalled(clock()))

                try:
                    await asyncio.to_thread(wait_for_collective, self._hung, publish_stall)
                except asyncio.CancelledError:  # shutting down: the waiting thread must end too, or exit waits on it
                    self._stopping.set()
                    raise
                continue
            now = clock()
            start = due if due is not None and 0 <= now - due < DEADLINE_SLACK_S else now
            step = core.plan(start)
            if step is None:
                due = None
                wake = core.next_wakeup()
                self.wakeup.clear()
                handle = loop.call_later(max(0.0, wake - now), self.wakeup.set) if wake is not None else None
                await self.wakeup.wait()
                if handle is not None:
                    handle.cancel()
                continue
            due = step.start + step.duration
            delay = due - clock()
            if delay > 0:
                await asyncio.sleep(delay)
            core.complete(step, due)
            self.steps += 1


@dataclass
class ModelServer:
    """One served model: its deployment and its data-parallel engines."""

    name: str
    deployment: Deployment
    loops: list[EngineLoop] = field(default_factory=list)

    def submit(self, req: SimRequest) -> EngineLoop:
        target = min(self.loops, key=lambda lp: lp.core.load)
        target.submit(req)
        return target


class LoopLag:
    """Event-loop lag: how late a 10 ms timer fires (the simulator's own overhead, GET /sim/stats)."""

    def __init__(self) -> None:
        self.samples: deque[float] = deque(maxlen=LAG_WINDOW)

    async def run(self) -> None:
        clock = time.perf_counter
        while True:
            t0 = clock()
            await asyncio.sleep(LAG_PROBE_INTERVAL_S)
            self.samples.append(max(0.0, clock() - t0 - LAG_PROBE_INTERVAL_S))

    def stats(self) -> dict[str, float | int | None]:
        v = sorted(self.samples)
        if not v:
            return {"samples": 0, "p50_s": None, "p99_s": None, "max_s": None}
        pick = lambda q: v[min(len(v) - 1, int(q * len(v)))]  # noqa: E731
        return {"samples": len(v), "p50_s": pick(0.5), "p99_s": pick(0.99), "max_s": v[-1]}


class Runtime:
    def __init__(self, config: SimConfig) -> None:
        self.config = config
        self.scenarios = ScenarioSet(config.scenarios)
        self.deployments = {
            m: deploy(
                m,
                config.hardware,
                params_b=config.params_b,
                quantization=config.quantization,
                tensor_parallel_size=config.tensor_parallel_size,
                max_num_seqs=config.max_num_seqs,
                max_num_batched_tokens=config.max_num_batched_tokens,
                max_model_len=config.max_model_len,
            )
            for m in config.models
        }
        max_len = max(d.size.max_model_len for d in self.deployments.values())
        self.metrics = VllmMetrics(max_len, show_hidden=config.show_hidden_metrics, features=config.features)
        endpoint = config.otlp_traces_endpoint
        several = len(config.models) > 1  # one provider per model, the model on its resource (see tracing.py)
        self.spans: dict[str, SpanEmitter] = (
            {
                m: SpanEmitter(endpoint, resource_model=m if several else None, stock=config.stock_spans)
                for m in config.models
            }
            if endpoint
            else {}
        )
        self.models: dict[str, ModelServer] = {}
        for m, dep in self.deployments.items():
            server = ModelServer(m, dep)
            for i in range(config.engines):
                listener = _Listener(self.metrics.engine(m, i, dep), self.spans.get(m))
                # each engine its own noise (engine 0 keeps the seed it always had)
                seed = config.seed * 7919 + len(self.models) + 104_729 * i
                core = EngineCore(i, dep, self.scenarios, listener, seed=seed, features=config.features)
                server.loops.append(EngineLoop(core, self.scenarios))
            self.models[m] = server
        self._tasks: list[asyncio.Task[None]] = []
        self.started_at = time.time()
        self.lag = LoopLag()

    def start(self) -> None:
        self._tasks.append(asyncio.get_running_loop().create_task(self.lag.run()))
        for server in self.models.values():
            for lp in server.loops:
                self._tasks.append(asyncio.get_running_loop().create_task(lp.run()))

    async def stop(self) -> None:
        for t in self._tasks:
            t.cancel()
        for t in self._tasks:
            with contextlib.suppress(asyncio.CancelledError):
                await t
        self._tasks.clear()
        for emitter in self.spans.values():
            await asyncio.to_thread(emitter.shutdown)

    def abort(self, req: SimRequest) -> None:
        server = self.models.get(req.params.get("model", ""))
        if server is not None:
            server.loops[req.engine_index].core.abort(req, time.monotonic())
