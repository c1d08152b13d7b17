"""Hang detection per model and data-parallel rank: requests in the engine, no progress, still answering.

Fed one :class:`~inferwatch.agent.node.engine.adapters.EngineReading` per engine scrape (by the engine collector, with
the scrape's wall time in seconds). For every ``(model, rank)`` it tracks when the rank last made **progress** — a
change of its prompt or generation token counters (a counter going down is a restart: progress too) — and since
when it has been **busy** (requests running or waiting > 0). The **stall** is the time since the later of the two
while busy, 0 while idle or progressing.

A stall is a hang once it passes the rank's **allowance**: the longest silence a working engine can show. A
single prefill emits nothing until it completes (vLLM counts prompt tokens of *completed* prefills), so the
allowance is ``max(floor, prefill_safety × max_model_len × prefill seconds per token)``, capped at
``max_stall_s``, where the floor is ``fast_stall_s`` (``min_stall_s`` with the fast path off): the per-token
prefill time comes from the engine's own numbers (the prefill-phase histogram's sum over the prompt token counter, or
llama.cpp's prompt seconds over its prompt tokens). ``max_model_len`` is
the configured one, else what the engine reports (:meth:`HangDetector.learn`, fed by the collector from vLLM's
``GET /v1/models`` or llama.cpp's ``GET /props``); while neither is known only ``min_stall_s`` applies. Idle
engines, restarts and a full KV cache that still admits and finishes requests are never stalled: the first has
nothing in it, the others move a counter.

**Fast path** (``fast_stall_s``, 6 s by default; 0 turns it off): a rank is stalled sooner than its allowance when it
cannot be in the one case the allowance covers, a long prefill. That case leaves one request running with no token
(the prefill's) and others, if any, waiting behind the token budget; it never leaves two requests running with no
token, because a chunked prefill is scheduled after the running decodes (vLLM v1, SGLang and the simulator put the
decodes first in each step's token budget), so with two or more running the counters move at every step. So: no
token for ``fast_stall_s`` while the rank has **two or more requests running**, **requests waiting and none
running** (nothing admitted at all), or **the requests that were decoding at its last progress still running** (the
same number running, and no request of the model finished or preempted since; at that progress the generation
counter rose with the same requests in: a decoding request, not a prefill) is a hang. A pause shorter than
``fast_stall_s`` (a GC pause, a slow step) is not one; an idle rank never is.

**Step signal**: one request running that may be a prefill is told apart by a figure the engine moves at every step,
a partial prefill's included (:data:`~inferwatch.agent.node.engine.adapters.STEP_SIGNALS`: vLLM V1's KV-cache usage,
which rises with each chunk's blocks). Where the rank has one, no token and no step for the **step window** with a
request running is a hang: ``max(fast_stall_s, prefill_safety × STEP_TOKENS × prefill seconds per token)`` (the longest
step, a full token budget of prefill, at the engine's own speed), capped at the allowance; while the prefill speed
is unknown the allowance applies. Where the engine has no step signal (vLLM V0 and Ray Serve's copies, SGLang, TGI,
llama.cpp, TensorRT-LLM), one request running that may be a prefill stays on the allowance.

**When to read next** (:attr:`HangDetector.next_at`): after each update, the earliest time at which a busy rank
that stays silent reaches its window (the fast path's from its last progress, the step window from its last step,
else the allowance). A stall is judged only when a reading comes, so at a fixed cadence a rank whose window ends just
after a read waits a whole interval more (a cadence stretched by costly reads, or jitter, makes that most of the
time); the collector asks its scheduler for a reading at ``next_at`` instead, so the verdict comes at the window's
end. The window itself and what counts as progress are unchanged: the extra reading judges with the same rules.

**Progress passes.** Between two full readings the collector may feed a reading of the progress families alone
(:mod:`inferwatch.agent.node.engine.progress`: the rank quantities, finished and preempted requests, no histogram):
``update(t, reading, full=False)`` judges it with the same rules, each model's prefill speed being the one its last
full reading gave (a mean since the engine started, which a few seconds do not move).

Pure and clock-free: :meth:`HangDetector.update` takes the time. The ``/health`` probe is the collector's.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass

from inferwatch.agent.config import DEFAULT_HANG_FAST_STALL_S, DEFAULT_HANG_MAX_STALL_S, DEFAULT_HANG_MIN_STALL_S
from inferwatch.agent.node.engine.adapters import STEP_SIGNALS, EngineReading, ModelReading
from inferwatch.agent.node.engine.histogram import sum_histograms

DEFAULT_PREFILL_SAFETY = 2.0  # the per-token estimate is a mean; a long prompt's attention costs more
# Tokens of the longest engine step: vLLM's largest default token budget per step (max_num_batched_tokens, 8192 on
# big GPUs; 2048 elsewhere), a chunk of a long prefill.
STEP_TOKENS = 8192


@dataclass(frozen=True, slots=True)
class RankVerdict:
    """One rank's state after a scrape. Times in seconds; ``stalled``: ``stall_s >= allowance_s``, or the fast path
    (``fast``: ``stall_s >= fast_stall_s`` with a request mix a long prefill cannot explain, see the module);
    ``max_model_len`` (tokens) is the one the allowance used, 0 while unknown."""

    model: str
    rank: str
    running: float
    waiting: float
    stall_s: float
    allowance_s: float
    stalled: bool
    prefill_s_per_token: float | None
    max_model_len: int = 0
    fast: bool = False
    step_stall_s: float | None = None  # since the last step (token or step signal) while busy; None: no step signal


@dataclass
class _Track:
    tokens: tuple[float, float]
    progress_at: float
    busy_since: float | None
    running: float = 0.0  # at the last reading
    events: float = 0.0  # the model's requests finished + preempted, at the last reading
    decoding: tuple[float, float] | None = None  # (running, events) at the last progress, if those were decoding
    step: float | None = None  # the step signal at the last reading (None: the engine has none)
    step_at: float = 0.0  # when the step signal last moved


def prefill_seconds_per_token(m: ModelReading) -> float | None:
    """Mean prefill time per prompt token since the engine started, from its own counters (None if unknown)."""
    prompt = sum(m.counters.get("prompt_tokens", {}).values())
    if prompt <= 0:
        return None
    series = m.histograms.get("prefill")
    total = sum_histograms(series.values()) if series else None
    if total is not None and total.sum == total.sum and total.sum > 0:
        return float(total.sum) / prompt
    seconds = sum(m.counters.get("prompt_seconds", {}).values())
    return seconds / prompt if seconds > 0 else None


class HangDetector:
    """Per ``(model, rank)`` progress tracks; see the module docstring."""

    def __init__(
        self,
        min_stall_s: float = DEFAULT_HANG_MIN_STALL_S,
        max_model_len: int = 0,
        prefill_safety: float = DEFAULT_PREFILL_SAFETY,
        max_stall_s: float = DEFAULT_HANG_MAX_STALL_S,
        fast_stall_s: float = DEFAULT_HANG_FAST_STALL_S,
    ) -> None:
        self.min_stall_s = min_stall_s
        self.fast_stall_s = fast_stall_s  # 0: off
        self.max_model_len = max_model_len  # configured (tokens); 0: the engine's own, once learnt
        self.learnt: dict[str, int] = {}
        self.prefill_safety = prefill_safety
        self.max_stall_s = max(max_stall_s, min_stall_s)
        self._tracks: dict[tuple[str, str], _Track] = {}
        self._per_token: dict[str, float | None] = {}  # each model's prefill s/token at the last full reading
        self.next_at: float | None = None  # after update(): when a silent busy rank reaches its window (None: none)

    def learn(self, lens: Mapping[str, int]) -> None:
        """The engine's maximum model length in tokens per model, as its API reports it (replaces what was learnt).

        Key ``""``: a length for no model in particular (llama.cpp's per-slot context). A configured
        ``max_model_len`` wins over anything learnt.
        """
        self.learnt = {model: n for model, n in lens.items() if n > 0}

    def model_len(self, model: str) -> int:
        """Tokens: the configured length, else the learnt one of ``model``, else the longest learnt (a model the
        engine did not list cannot hold a longer prompt than the engine allows any), else 0 (unknown)."""
        if self.max_model_len > 0:
            return self.max_model_len
        return self.learnt.get(model) or max(self.learnt.values(), default=0)

    def allowance(self, per_token_s: float | None, model: str = "") -> float:
        """Seconds: ``min_stall_s`` while the length or the prefill speed is unknown; once both are known, the
        longest prefill itself (at least ``fast_stall_s`` when the fast path is on, else ``min_stall_s``)."""
        max_model_len = self.model_len(model)
        if per_token_s is None or max_model_len <= 0:
            return self.min_stall_s
        prefill = self.prefill_safety * max_model_len * per_token_s
        floor = min(self.fast_stall_s, self.min_stall_s) if self.fast_stall_s > 0 else self.min_stall_s
        return min(self.max_stall_s, max(floor, prefill))

    def step_window(self, per_token_s: float | None, allowance_s: float) -> float:
        """Seconds without a step that a rank with a request running and a step signal may show: the longest step
        (``STEP_TOKENS`` of prefill at ``prefill_safety`` × the engine's speed), at least ``fast_stall_s``, at most
        the allowance; the allowance while the speed is unknown or the fast path is off."""
        if per_token_s is None or self.fast_stall_s <= 0:
            return allowance_s
        return min(allowance_s, max(self.fast_stall_s, self.prefill_safety * STEP_TOKENS * per_token_s))

    def fast(self, stall_s: float, running: float, waiting: float, decoding: bool = False) -> bool:
        """The fast path: no token for ``fast_stall_s`` with two or more running, some waiting and none running, or
        the requests that were decoding still in (``decoding``)."""
        if self.fast_stall_s <= 0 or stall_s < self.fast_stall_s:
            return False
        return running >= 2 or (running <= 0 and waiting > 0) or (decoding and running >= 1)

    def update(self, t: float, reading: EngineReading, full: bool = True) -> list[RankVerdict]:
        """Judge every rank of ``reading`` taken at ``t`` (seconds); ``full`` False: a progress pass's reading (see
        the module), whose prefill speeds are the last full reading's."""
        out: list[RankVerdict] = []
        live: set[tuple[str, str]] = set()
        due: list[float] = []
        if full:
            self._per_token = {model: prefill_seconds_per_token(m) for model, m in reading.models.items()}
        for model, m in sorted(reading.models.items()):
            per_token = self._per_token.get(model)
            events = sum(m.counters.get("finished", {}).values()) + sum(m.counters.get("preemptions", {}).values())
            allowance = self.allowance(per_token, model)
            window = self.step_window(per_token, allowance)
            max_model_len = self.model_len(model)
            signal = STEP_SIGNALS.get(reading.kind)
            step_q = signal[0] if signal is not None and m.sources.get(signal[0]) in signal[1] else None
            for rank, q in sorted(m.ranks.items()):
                if "generation_tokens" not in q and "prompt_tokens" not in q:
                    continue  # no progress counter: nothing to judge
                key = (model, rank)
                live.add(key)
                tokens = (q.get("prompt_tokens", 0.0), q.get("generation_tokens", 0.0))
                running, waiting = q.get("running", 0.0), q.get("waiting", 0.0)
                step = q.get(step_q) if step_q is not None else None
                busy = running > 0 or waiting > 0
                track = self._tracks.get(key)
                if track is None:
                    track = self._tracks[key] = _Track(tokens, t, t if busy else None, running, events, None, step, t)
                elif tokens != track.tokens:  # moved (up: progress; down: a restart)
                    same = running >= 1 and running == track.running and events == track.events
                    track.decoding = (running, events) if same and tokens[1] > track.tokens[1] else None
                    track.tokens, track.progress_at = tokens, t
                if step != track.step or track.progress_at == t:
                    track.step, track.step_at = step, t
                track.running, track.events = running, events
                if not busy:
                    track.busy_since = None
                elif track.busy_since is None:
                    track.busy_since = t
                stall = t - max(track.progress_at, track.busy_since) if track.busy_since is not None else 0.0
                step_stall = None
                if step is not None:
                    step_stall = t - max(track.step_at, track.busy_since) if track.busy_since is not None else 0.0
                fast = self.fast(stall, running, waiting, track.decoding == (running, events)) or (
                    self.fast_stall_s > 0 and step_stall is not None and running >= 1 and step_stall >= window
                )
                stalled = stall >= allowance or fast
                if track.busy_since is not None and not stalled:
                    due.append(self._due(track, allowance, window, running, waiting, events, step is not None))
                out.append(
                    RankVerdict(
                        model,
                        rank,
                        running,
                        waiting,
                        stall,
                        allowance,
                        stalled,
                        per_token,
                        max_model_len,
                        fast,
                        step_stall,
                    )
                )
        for key in set(self._tracks) - live:  # the model or rank is gone (restart with other flags)
            del self._tracks[key]
        self.next_at = min(due, default=None)
        return out

    def _due(
        self, track: _Track, allowance: float, window: float, running: float, waiting: float, events: float, step: bool
    ) -> float:
        """When this busy rank's stall reaches its window if nothing moves and its request mix stays as it is."""
        assert track.busy_since is not None
        start = max(track.progress_at, track.busy_since)
        out = start + allowance
        if self.fast_stall_s > 0:
            if self.fast(self.fast_stall_s, running, waiting, track.decoding == (running, events)):
                out = min(out, start + self.fast_stall_s)
            if step and running >= 1:
                out = min(out, max(track.step_at, track.busy_since) + window)
        return out
