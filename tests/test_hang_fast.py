"""The hang detector's fast path at the engine collector's cadence (2 s), on the simulator's scheduler in virtual time.

A hang is found within 10 s of its start: a rank with two or more requests running, or requests waiting and none
running, and no token for ``fast_stall_s`` (6 s). The look-alikes give **0** hang verdicts, each checked to really
look like one to a naive rule (no token for longer than the detection window, or a queue that never empties):
a saturated engine (queue deep, tokens advancing), a single 100k-token prefill longer than the window (alone,
with requests queued behind it, and beside decoding requests), a pause shorter than the window (a GC pause) and a
model load (the engine down, then back with a burst), and an idle engine (no requests: nothing to be hung on).
"""

from __future__ import annotations

import math
from dataclasses import dataclass, field

import httpx
import pytest

from inferwatch.agent.config import (
    DEFAULT_ENGINE_INTERVAL_S,
    DEFAULT_HANG_FAST_STALL_S,
    DEFAULT_INTERVAL_S,
    Settings,
)
from inferwatch.agent.node.collectors import schedule
from inferwatch.agent.node.collectors.engine import FULL_READ_DUE, READ_AGAIN_MARGIN_S, EngineCollector
from inferwatch.agent.node.engine.adapters import EngineReading
from inferwatch.agent.node.engine.hang import HangDetector
from inferwatch.agent.node.engine.progress import ProgressReader
from inferwatch.agent.node.wiring import collect_context
from tests.hang_sim import Scraper, VirtualEngine

EVERY_S = DEFAULT_ENGINE_INTERVAL_S
FULL_EVERY_S = DEFAULT_INTERVAL_S  # the engine collector reads in full once per agent interval, progress passes between
DETECT_S = 10.0  # issue 34: the agent knows within 10 s of the hang's start


@dataclass
class _AgentScraper(Scraper):
    """Reads as the engine collector does (agent/node/collectors/engine.py): a full read once per agent interval, a
    progress pass (agent/node/engine/progress.py) between, judged with the last full read's prefill speed."""

    progress: ProgressReader = field(default_factory=lambda: ProgressReader("vllm"))
    full_at: float = -math.inf
    reads: list[str] = field(default_factory=list)

    def scrape(self) -> EngineReading:
        body, now = self.engine.exposition(), self.engine.now
        reading = self.progress.read(body) if now - self.full_at < FULL_READ_DUE * FULL_EVERY_S else None
        full = reading is None
        if reading is None:
            reading, self.full_at = self.parser.parse(body), now
        self.reads.append("full" if full else "progress")
        self.history.append((now, self.detector.update(now, reading, full=full)))
        return reading


def _scraper(e: VirtualEngine, **kw: float) -> _AgentScraper:
    return _AgentScraper(e, HangDetector(**kw))  # type: ignore[arg-type]


def _run(s: Scraper, seconds: float) -> None:
    s.run(seconds, every_s=EVERY_S, deadline_reads=True)  # as the agent's runner reads (read_again_in)


def _stalled(s: Scraper, since: float = 0.0) -> list[tuple[float, str]]:
    return [(t, v.rank) for t, vs in s.history for v in vs if v.stalled and t >= since]


def test_the_engine_collector_runs_every_2_s_by_default() -> None:
    settings = Settings.from_values({"engine": {"metrics_url": "http://e:8000/metrics"}})
    assert schedule("engine", settings).interval_s == 2.0
    assert DEFAULT_HANG_FAST_STALL_S + EVERY_S <= DETECT_S


@pytest.mark.parametrize("phase", [0.0, 0.7, 1.3, 1.9])  # where in the 2 s cycle the hang starts
def test_a_busy_hang_is_found_within_10_s(phase: float) -> None:
    e = VirtualEngine("h100", 8.0)
    s = _scraper(e)
    for _ in range(24):
        e.submit(512, 4000)
    _run(s, 30)
    e.advance(e.now + phase)
    e.hung.add(0)
    start = e.now
    _run(s, 30)
    found = _stalled(s, start)
    assert found, "never stalled"
    assert found[0][0] - start <= DETECT_S
    assert all(v.fast for _t, vs in s.history if _t >= found[0][0] for v in vs if v.stalled)
    assert 2 * s.reads.count("full") <= s.reads.count("progress")  # one full read in three, or fewer


@pytest.mark.parametrize("phase", [0.0, 1.3])
def test_the_engine_collector_finds_a_busy_hang_within_10_s_on_its_progress_passes(phase: float) -> None:
    """The real collector (HTTP to the virtual engine at virtual time), at its 2 s cadence and the reads its runner
    adds (``read_again_in``): full reads once per agent interval, progress passes between, the verdict within 10 s."""
    e = VirtualEngine("h100", 8.0)

    def answer(req: httpx.Request) -> httpx.Response:
        if req.url.path != "/metrics":
            return httpx.Response(404)
        return httpx.Response(200, content=e.exposition(), headers={"content-type": "text/plain"})

    settings = Settings.from_values(dict(engine={"metrics_url": "http://engine:8000/metrics", "health_url": ""}))
    client = httpx.Client(transport=httpx.MockTransport(answer))
    c = EngineCollector(collect_context(settings, engine_http=client), settings.engine, FULL_EVERY_S, lambda: e.now)
    history: list[tuple[float, dict[str, object]]] = []

    def run(seconds: float) -> None:
        end, grid = e.now + seconds, e.now + EVERY_S
        while True:
            sooner = c.read_again_in()
            at = e.now + sooner if sooner is not None and e.now + sooner < grid else grid
            if at > end + 1e-9:
                return
            e.advance(at)
            history.append((e.now, dict(c.collect().details)))
            if at == grid:
                grid += EVERY_S

    try:
        for _ in range(24):
            e.submit(512, 4000)
        run(30)
        e.advance(e.now + phase)
        e.hung.add(0)
        start = e.now
        run(30)
    finally:
        c.close()
    found = [t for t, d in history if t >= start and any(v["stalled"] for v in d["hang"])]  # type: ignore[attr-defined]
    assert found and found[0] - start <= DETECT_S
    kinds = [d["read"]["kind"] for _t, d in history]  # type: ignore[index]
    assert kinds[0] == "full" and kinds.count("progress") >= 2 * kinds.count("full") - 2, kinds
    assert c.read_counts["fallback"] == 0


@pytest.mark.parametrize("every_s", [2.0, 3.1, 4.3])  # the default cadence, and stretched by costly reads
@pytest.mark.parametrize("phase", [0.0, 0.5, 1.0, 1.5, 1.99])  # x half the cadence: where in it the hang starts
def test_the_verdict_comes_at_the_window_end_not_at_the_next_read(every_s: float, phase: float) -> None:
    """From the last reading that saw a token, the fast window (6 s) ends between two reads of the cadence; the read
    the detector asks for at its end (``next_at``) gives the verdict then. At most ``every_s`` (the last token fell
    just after a read) + the window + the margin after the hang's start, where reads on the cadence alone take up to
    a whole interval more: found no later, and no sooner than the window after the last reading that saw a token."""
    found_at = {}
    for deadline_reads in (True, False):
        e = VirtualEngine("h100", 8.0)
        s = _scraper(e)
        for _ in range(24):
            e.submit(512, 4000)
        s.run(30, every_s=every_s, deadline_reads=deadline_reads)
        last_read = e.now
        e.advance(e.now + phase * every_s / 2.0)
        e.hung.add(0)
        start = e.now
        s.run(40, every_s=every_s, deadline_reads=deadline_reads, grid_from=last_read)
        found = _stalled(s, start)
        assert found, "never stalled"
        last_token = max(t for t, vs in s.history if t <= found[0][0] and any(v.stall_s == 0 for v in vs))
        assert found[0][0] - last_token >= DEFAULT_HANG_FAST_STALL_S  # the window is not shortened
        found_at[deadline_reads] = found[0][0] - start
    assert found_at[True] <= every_s + DEFAULT_HANG_FAST_STALL_S + READ_AGAIN_MARGIN_S + 1e-6
    assert found_at[True] <= found_at[False]


def test_one_rank_of_a_data_parallel_engine_is_found_within_10_s_and_only_it() -> None:
    e = VirtualEngine("h100", 8.0, engines=2)
    s = _scraper(e)
    for _ in range(40):
        e.submit(512, 4000)
    _run(s, 30)
    e.hung.add(1)
    start = e.now
    _run(s, 30)
    found = _stalled(s, start)
    assert found and found[0][0] - start <= DETECT_S
    assert {rank for _t, rank in found} == {"1"}


def test_a_hang_that_begins_idle_is_found_within_10_s_of_the_first_request() -> None:
    e = VirtualEngine("h100", 8.0)
    s = _scraper(e)
    _run(s, 20)
    e.hung.add(0)
    e.submit(128, 16)
    start = e.now
    _run(s, 30)
    found = _stalled(s, start)
    assert found and found[0][0] - start <= DETECT_S


def test_saturation_queue_deep_tokens_advancing_is_not_a_hang() -> None:
    e = VirtualEngine("l40s", 8.0)
    s = _scraper(e)
    for _ in range(800):
        e.submit(2000, 800)
    _run(s, 300)
    waiting = [v.waiting for _t, vs in s.history for v in vs]
    assert min(waiting) > 100  # the look-alike: a queue that never empties for 5 minutes
    assert _stalled(s) == []


@pytest.mark.parametrize("queued", [0, 6])
def test_a_single_100k_token_prefill_longer_than_the_window_is_not_a_hang(queued: int) -> None:
    """On a CPU profile the prefill takes minutes: one running, ``queued`` waiting behind its token budget, no token
    — what a hang of one request looks like. The allowance (2 x the maximum length at the engine's own prefill
    speed) covers it; the fast path does not apply to one running request."""
    e = VirtualEngine("graviton3-cpu", 8.0, max_model_len=131072)
    s = _scraper(e, max_model_len=131072)
    for _ in range(3):
        e.submit(256, 8)  # a little history: the engine's prefill seconds per token
    _run(s, 30)
    e.submit(100_000, 4)
    e.advance(e.now + 1.0)
    for _ in range(queued):
        e.submit(256, 64)
    _run(s, 240)
    assert s.max_stall() > 10 * DETECT_S  # the look-alike: no token for minutes with requests in
    assert max(v.waiting for _t, vs in s.history for v in vs) == queued
    assert _stalled(s) == []


class _NoStepSignal(VirtualEngine):
    """The same engine publishing no step signal (vLLM V0's gauge name, as SGLang, TGI, ... publish none)."""

    def exposition(self) -> bytes:
        return super().exposition().replace(b"vllm:kv_cache_usage_perc", b"vllm:gpu_cache_usage_perc")


def _long_prefill(cls: type[VirtualEngine], hang_after_s: float | None) -> tuple[Scraper, float]:
    """On an L40S a 100k-token prompt prefills for ~10 s in 2048-token chunks, alone: no token for longer than the
    fast window, one request running. Hung ``hang_after_s`` into the prefill, if given; returns the hang's start."""
    e = cls("l40s", 8.0, max_model_len=131072)
    s = _scraper(e, max_model_len=131072)
    for _ in range(3):
        e.submit(256, 8)  # a little history: the engine's prefill seconds per token
    _run(s, 30)
    e.submit(100_000, 4)
    start = -1.0
    if hang_after_s is not None:
        _run(s, hang_after_s)
        e.hung.add(0)
        start = e.now
    _run(s, 60)
    return s, start


def test_a_lone_prefill_that_hangs_is_found_within_10_s_by_the_step_signal() -> None:
    """One request running, no token yet (the look-alike of a long prefill): vLLM V1's KV usage rose at each chunk
    and stands still once the engine stops stepping."""
    s, start = _long_prefill(VirtualEngine, 2.0)
    found = _stalled(s, start)
    assert found and found[0][0] - start <= DETECT_S
    last = s.history[-1][1][0]
    assert last.running == 1 and last.fast and last.step_stall_s is not None
    assert found[0][0] - start < last.allowance_s  # sooner than the prefill allowance


def test_a_long_chunked_prefill_alone_moves_the_step_signal_and_is_not_a_hang() -> None:
    s, _ = _long_prefill(VirtualEngine, None)
    assert s.max_stall() > DEFAULT_HANG_FAST_STALL_S  # the look-alike: no token for longer than the fast window
    assert all(v.step_stall_s is not None and v.step_stall_s < DEFAULT_HANG_FAST_STALL_S for _t, vs in s.history
               for v in vs)  # fmt: skip
    assert _stalled(s) == []


def test_without_a_step_signal_a_lone_prefill_keeps_the_allowance() -> None:
    """No per-step figure: a lone request that may be a prefill is judged on the allowance, both ways."""
    quiet, _ = _long_prefill(_NoStepSignal, None)
    assert quiet.max_stall() > DEFAULT_HANG_FAST_STALL_S and _stalled(quiet) == []
    assert all(v.step_stall_s is None for _t, vs in quiet.history for v in vs)
    s, start = _long_prefill(_NoStepSignal, 2.0)
    found = _stalled(s, start)
    allowance = s.history[-1][1][0].allowance_s
    assert found and allowance > DETECT_S
    assert allowance <= found[0][0] - start <= allowance + 2 * EVERY_S and not s.history[-1][1][0].fast


def test_a_100k_token_prefill_beside_decoding_requests_is_not_a_hang() -> None:
    e = VirtualEngine("l40s", 8.0, max_model_len=131072)
    s = _scraper(e, max_model_len=131072)
    for _ in range(4):
        e.submit(256, 6000)  # decoding for minutes
    _run(s, 20)
    e.submit(100_000, 4)
    _run(s, 120)
    assert max(v.running for _t, vs in s.history for v in vs) >= 2
    assert _stalled(s) == []


def test_a_pause_shorter_than_the_window_is_not_a_hang() -> None:
    """A GC pause (or one slow step) with the batch running: 4 s without a token, then it goes on."""
    e = VirtualEngine("h100", 8.0)
    s = _scraper(e)
    for _ in range(24):
        e.submit(512, 4000)
    _run(s, 20)
    for _ in range(5):
        e.hung.add(0)
        e.advance(e.now + 1.0)  # off the 2 s grid: the pause spans scrapes
        _run(s, 4)
        e.hung.discard(0)
        _run(s, 10)
    assert s.max_stall() >= 2 * EVERY_S  # the look-alike: scrapes in a row without a token while busy
    assert _stalled(s) == []


def test_a_model_load_is_not_a_hang() -> None:
    """The engine restarts: down while it loads (no reading), then back with a burst queued at once."""
    e = VirtualEngine("h100", 8.0, engines=2)
    s = _scraper(e)
    for _ in range(40):
        e.submit(512, 2000)
    _run(s, 20)
    e.advance(e.now + 90)  # loading: every read fails, the detector is fed nothing
    e.restart()
    for _ in range(200):
        e.submit(512, 2000)
    _run(s, 120)
    assert _stalled(s) == []


def test_an_idle_engine_is_not_hung() -> None:
    """Idle is told apart by the engine's own gauges: nothing running and nothing waiting is never stalled, however
    long no token comes."""
    e = VirtualEngine("h100", 8.0)
    s = _scraper(e)
    _run(s, 600)
    assert all(v.running == 0 and v.waiting == 0 for _t, vs in s.history for v in vs)
    assert _stalled(s) == [] and s.max_stall() == 0


def test_fast_path_off_keeps_the_allowance() -> None:
    e = VirtualEngine("h100", 8.0)
    s = _scraper(e, fast_stall_s=0)
    for _ in range(24):
        e.submit(512, 4000)
    _run(s, 20)
    e.hung.add(0)
    start = e.now
    _run(s, 60)
    found = _stalled(s, start)
    assert found and 30.0 <= found[0][0] - start <= 30.0 + EVERY_S


def test_a_lone_decoding_request_that_stops_is_found_within_10_s() -> None:
    """One request running, mid-stream: at its last progress the same request was in and decoding (the generation
    counter rose, nothing finished or was preempted), so it is no prefill and the fast path applies."""
    e = VirtualEngine("h100", 8.0)
    s = _scraper(e)
    e.submit(256, 8000)
    _run(s, 20)
    e.hung.add(0)
    start = e.now
    _run(s, 30)
    found = _stalled(s, start)
    assert found and found[0][0] - start <= DETECT_S
    assert s.history[-1][1][0].running == 1 and s.history[-1][1][0].fast
