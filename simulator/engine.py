"""The engine core: a synchronous continuous-batching scheduler, driven in real time or virtual time.

Each call to :meth:`EngineCore.plan` builds one step the way vLLM v1's scheduler does: every running
sequence that finished its prefill decodes one token, the rest of the token budget
(``max_num_batched_tokens``) goes to prefill chunks, and waiting requests are admitted first-come
first-served while there are sequence slots (``max_num_seqs``) and free KV-cache blocks. When a
decoding sequence needs a block and none is free, the most recently admitted sequence is preempted
(recompute, as vLLM v1 does) and goes back to the head of the queue. :meth:`complete` advances the
step's requests and reports tokens, steps and finished requests to an :class:`EngineListener`.

Timestamps follow vLLM: ``arrival`` (frontend), ``queued`` (engine), ``scheduled`` (most recent),
``first_token``, ``last_token``; all in seconds of the driver's clock.

Ground truth (benchmarks only; no span or metric carries it, and it changes no timing or RNG draw): each request's
``causes`` holds the seconds of its time to first token that an injected effect added, by effect:

* ``frontend_delay``, ``page_cache_pressure``: the scenario's own extra seconds for this request (exact);
* ``slow_rank``: on the slow engine, (1 - 1/factor) of every second the request spent waiting or in a prefill step;
* ``kv_blocks``: seconds waiting while admission stopped for want of free KV blocks, and the prefill steps that
  recompute a request preempted before its first token;
* ``arrival_burst``: seconds waiting while admission stopped for want of slots or token budget with a request of an
  injected burst (``injected="arrival_burst"``, set by the load) in the queue; and for every request waiting or
  prefilling, the share of the tokens of each step it waited or prefilled through that the burst's other requests'
  prefills took (a burst admitted at once lengthens the steps it shares);
* ``long_prompt``: an injected long prompt's (``injected="long_prompt"``) own prefill steps, and for every other
  request waiting or prefilling, the long prompts' share of the tokens of each step it waited or prefilled through.

Waiting is accounted per engine as running integrals (one rate per effect between two :meth:`EngineCore.plan` calls),
so the cost is O(1) per step and per request. Seconds no effect claims (the frontend's base time, base prefill,
queueing under the traffic's own load, waiting for budget after a stall) are nobody's.
"""

from __future__ import annotations

import heapq
import itertools
import math
import random
import zlib
from collections import OrderedDict, deque
from dataclasses import dataclass, field
from typing import Any, Protocol

from inferwatch.simulator.profiles import Deployment
from inferwatch.simulator.scenarios import ScenarioSet
from inferwatch.simulator.timing import TimingModel

PREFIX_CACHE_ENTRIES = 4096
SPEC_ACCEPTANCE = 0.8  # healthy per-position acceptance probability of a draft token (EAGLE-like drafts)
KV_TRANSFER_BASE_S = 0.002  # NIXL handshake/post time of one transfer
KV_TRANSFER_BYTES_PER_S = 25e9  # RDMA bandwidth of the P/D pair (200 Gb/s)
SOURCES = ("local_compute", "local_cache_hit", "external_kv_transfer")  # vLLM's prompt_tokens_by_source


@dataclass(frozen=True, slots=True)
class Features:
    """vLLM features a deployment was started with (flags of ``inferwatch simulate``), as vLLM's own flags.

    ``num_speculative_tokens``: draft tokens per step (``--num-speculative-tokens``; 0: no speculative decoding).
    The simulator counts drafts and acceptances as vLLM does but keeps one token per step in its timing model.
    ``max_loras``: adapter slots per batch (``--max-loras``; 0: LoRA off); ``lora_adapters``: distinct adapters
    in the traffic mix (0: as many as slots), each request is given one by its id. ``kv_connector``: this is the
    decode side of a P/D pair (``--kv-transfer-config`` with the NIXL connector): every prompt's KV is pulled
    from the prefill instance before the first token instead of computed.
    """

    num_speculative_tokens: int = 0
    max_loras: int = 0
    lora_adapters: int = 0
    kv_connector: bool = False


@dataclass(slots=True, eq=False)
class SimRequest:
    """One request as the engine sees it (mutable: the scheduler advances it)."""

    request_id: str
    prompt_tokens: int
    max_tokens: int
    arrival: float
    ignore_eos: bool = False
    prefix_key: int = 0  # hash of a shared prefix (system prompt); 0 = none
    prefix_tokens: int = 0
    max_tokens_param: int | None = None
    params: dict[str, Any] = field(default_factory=dict)
    # set by the engine
    engine_index: int = 0
    target_tokens: int = 0
    queued: float = 0.0
    scheduled: float | None = None
    first_scheduled: float | None = None
    first_token: float | None = None
    last_token: float | None = None
    stall_until: float = 0.0
    cached_tokens: int = 0
    to_prefill: int = 0  # tokens still to compute before the next token comes out
    generated: int = 0
    blocks: int = 0
    preemptions: int = 0
    adapter: str = ""  # LoRA adapter ("" = base model)
    sources_counted: bool = False
    finish_reason: str | None = None
    finished_at: float | None = None
    sink: Any = None  # the runtime's token stream
    injected: str = ""  # set by a load that injects a fault through its requests: "arrival_burst", "long_prompt"
    causes: dict[str, float] = field(default_factory=dict)  # ground truth: TTFT seconds per injected effect
    wait_mark: dict[str, float] | None = None  # the engine's waiting integrals when this request began to wait

    @property
    def prefill_done(self) -> bool:
        return self.to_prefill == 0 and self.scheduled is not None


class EngineListener(Protocol):
    def on_token(self, req: SimRequest, now: float, itl: float | None) -> None: ...

    def on_finish(self, req: SimRequest) -> None: ...

    def on_step(self, core: EngineCore, prompt_tokens: int, generation_tokens: int, preempted: int) -> None: ...


@dataclass(slots=True)
class Step:
    start: float
    duration: float
    prefill: list[tuple[SimRequest, int]]
    decode: list[SimRequest]
    slow: float = 1.0  # slow_rank's factor on this engine (ground truth)
    long_share: float = 0.0  # the injected long prompts' share of the step's tokens (ground truth)
    burst_tokens: int = 0  # prefill tokens of the step from an injected burst's requests (ground truth)
    tokens: int = 0  # the step's prefill tokens plus decoding sequences


class EngineCore:
    """One data-parallel engine (vLLM ``EngineCore``) with its own scheduler, KV cache and RNG."""

    def __init__(
        self,
        index: int,
        deployment: Deployment,
        scenarios: ScenarioSet,
        listener: EngineListener,
        seed: int = 0,
        features: Features | None = None,
    ) -> None:
        self.index = index
        self.dep = deployment
        self.features = features or Features()
        self.scenarios = scenarios
        self.listener = listener
        self.rng = random.Random(seed * 1_000_003 + index)
        self.model = TimingModel(deployment, scenarios, self.rng, index)
        self.total_blocks = deployment.num_gpu_blocks
        self.free_blocks = self.total_blocks
        self.pending: list[tuple[float, int, SimRequest]] = []  # not yet through the frontend
        self.waiting: deque[SimRequest] = deque()
        self.running: list[SimRequest] = []
        self.prefix_cache: OrderedDict[int, None] = OrderedDict()
        self.prefix_queries = 0
        self.prefix_hits = 0
        self.prompt_by_source = dict.fromkeys(SOURCES, 0)
        self.prompt_cached = 0
        self.external_queries = 0  # KV-connector lookups (vLLM's external_prefix_cache_*), tokens
        self.external_hits = 0
        self.reserved_blocks = 0  # taken away by kv_saturation
        k = self.features.num_speculative_tokens
        self.spec_drafts = 0
        self.spec_draft_tokens = 0
        self.spec_accepted = 0
        self.spec_accepted_per_pos = [0] * k
        self.kv_transfers: list[tuple[float, int]] = []  # (seconds, bytes) not yet reported; drained by listeners
        self._seq = itertools.count()
        # Ground truth (module docstring): waiting seconds per effect integrated since start, their rates now.
        self._wait_t: float | None = None
        self._wait_cum: dict[str, float] = {}
        self._wait_rate: dict[str, float] = {}
        self._bursts_waiting = 0

    # -- intake ----------------------------------------------------------------------------------
    def add(self, req: SimRequest) -> None:
        """Take a request that arrived at ``req.arrival``; it reaches the queue after the frontend."""
        req.engine_index = self.index
        f = self.features
        if f.max_loras > 0 and not req.adapter:
            sc = self.scenarios.get("lora_slot_exhaustion")
            n = int(sc.get("adapters")) if sc is not None else (f.lora_adapters or f.max_loras)
            req.adapter = f"lora-{zlib.crc32(req.request_id.encode()) % n}"
        limit = max(1, self.dep.size.max_model_len - req.prompt_tokens)
        req.target_tokens = self.model.output_tokens(min(req.max_tokens, limit), req.ignore_eos)
        req.queued = req.arrival + self.model.frontend_seconds(req.prompt_tokens)
        if self.model.last_frontend_extra > 0:
            req.causes["frontend_delay"] = self.model.last_frontend_extra
        heapq.heappush(self.pending, (req.queued, next(self._seq), req))

    def abort(self, req: SimRequest, now: float) -> None:
        """Client went away: drop the request wherever it is and report it finished (``abort``)."""
        if req.finish_reason is not None:
            return
        if req in self.running:
            self.running.remove(req)
            self._free(req)
        elif req in self.waiting:
            self.waiting.remove(req)
            self._bursts_waiting -= req.injected == "arrival_burst"
        else:
            self.pending = [p for p in self.pending if p[2] is not req]
            heapq.heapify(self.pending)
        req.finish_reason = "abort"
        req.finished_at = now
        self.listener.on_finish(req)

    @property
    def num_waiting(self) -> int:
        return len(self.waiting)

    @property
    def kv_usage(self) -> float:
        """The fraction of blocks holding computed tokens, as vLLM V1 publishes it: V1 allocates a prefill's blocks
        chunk by chunk (each step's new tokens), so its usage rises at every chunk of a long prefill and stands still
        only when no step runs. The simulator reserves a request's blocks at admission (its admission check); the
        blocks of prompt tokens not yet computed are counted free here."""
        if not self.total_blocks:
            return 0.0
        ahead = sum(
            max(0, r.blocks - self._blocks_for(r.prompt_tokens + r.generated - r.to_prefill))
            for r in self.running
            if r.to_prefill > 0
        )
        return min(1.0, max(0.0, 1.0 - (self.free_blocks + ahead) / self.total_blocks))

    def lora_state(self) -> tuple[list[str], list[str]]:
        """Adapters with requests running and waiting (vLLM's running/waiting_lora_adapters), sorted."""
        running = sorted({r.adapter for r in self.running if r.adapter})
        waiting = sorted({r.adapter for r in self.waiting if r.adapter})
        return running, waiting

    def _reserve(self) -> None:
        """kv_saturation: keep only a fraction of the blocks usable, at most ``blocks`` of them (free blocks may go
        below zero). The cap makes the fault at any load: 5 % of an H100's cache still holds dozens of compose's
        requests, so without it a light load never queues or preempts, as a saturated vLLM does."""
        sc = self.scenarios.get("kv_saturation")
        want = 0
        if sc is not None:
            usable = max(1, int(self.total_blocks * sc.get("fraction")))
            if sc.get("blocks") > 0:
                usable = min(usable, int(sc.get("blocks")))
            want = self.total_blocks - usable
        if want != self.reserved_blocks:
            self.free_blocks -= want - self.reserved_blocks
            self.reserved_blocks = want

    def _speculate(self, req: SimRequest) -> None:
        """One draft of k tokens for a decoding sequence: position i is accepted when all before it were."""
        k = self.features.num_speculative_tokens
        if k <= 0:
            return
        sc = self.scenarios.get("spec_decode_collapse")
        p = sc.get("acceptance") if sc is not None else SPEC_ACCEPTANCE
        accepted = 0
        while accepted < k and self.rng.random() < p:
            self.spec_accepted_per_pos[accepted] += 1
            accepted += 1
        self.spec_drafts += 1
        self.spec_draft_tokens += k
        self.spec_accepted += accepted

    @property
    def load(self) -> int:
        """Data-parallel balancing score (vLLM weighs waiting requests 4×)."""
        return 4 * (len(self.waiting) + len(self.pending)) + len(self.running)

    def busy(self) -> bool:
        return bool(self.pending or self.waiting or self.running)

    def next_wakeup(self) -> float | None:
        """Earliest time something becomes schedulable when :meth:`plan` found nothing to do."""
        times = [self.pending[0][0]] if self.pending else []
        times += [r.stall_until for r in self.running if not r.prefill_done]
        return min(times) if times else None

    # -- ground truth (module docstring): nothing here changes a timing or draws a random number ------
    def _advance(self, now: float) -> None:
        """Integrate the waiting rates of the interval since the last plan up to ``now``."""
        if self._wait_t is not None and now > self._wait_t:
            dt = now - self._wait_t
            for k, rate in self._wait_rate.items():
                self._wait_cum[k] = self._wait_cum.get(k, 0.0) + rate * dt
        self._wait_t = now if self._wait_t is None else max(self._wait_t, now)

    def _start_waiting(self, req: SimRequest, since: float) -> None:
        """``req`` waits from ``since`` (<= the last plan's time, within the interval whose rates are current)."""
        back = (self._wait_t or since) - since
        req.wait_mark = {k: v - self._wait_rate.get(k, 0.0) * back for k, v in self._wait_cum.items()}
        self._bursts_waiting += req.injected == "arrival_burst"

    def _stop_waiting(self, req: SimRequest) -> None:
        mark = req.wait_mark or {}
        for k, v in self._wait_cum.items():
            d = v - mark.get(k, 0.0)
            if d > 1e-12 and req.first_token is None:
                req.causes[k] = req.causes.get(k, 0.0) + d
        req.wait_mark = None
        self._bursts_waiting -= req.injected == "arrival_burst"

    def _slow_factor(self) -> float:
        slow = self.scenarios.get("slow_rank")
        return max(1.0, slow.get("factor")) if slow and int(slow.get("engine")) == self.index else 1.0

    def _set_wait_rates(self, slow: float, long_share: float, burst_share: float, kv_blocked: bool) -> None:
        """Which effect each second of waiting belongs to until the next plan."""
        rate: dict[str, float] = {}
        rest = 1.0
        if slow > 1.0:
            rate["slow_rank"] = 1.0 - 1.0 / slow
            rest = 1.0 / slow
        if long_share > 0:
            rate["long_prompt"] = rest * long_share
        if burst_share > 0:
            rate["arrival_burst"] = rest * burst_share
        rest *= 1.0 - long_share - burst_share
        if self.waiting and kv_blocked:
            rate["kv_blocks"] = rest
        elif self.waiting and self._bursts_waiting > 0:
            rate["arrival_burst"] = rate.get("arrival_burst", 0.0) + rest
        self._wait_rate = rate

    # -- scheduling ------------------------------------------------------------------------------
    def _blocks_for(self, tokens: int) -> int:
        return math.ceil(tokens / self.dep.block_size)

    def _free(self, req: SimRequest) -> None:
        self.free_blocks += req.blocks
        req.blocks = 0

    def _preempt_newest(self) -> bool:
        victim = self.running.pop()
        self._free(victim)
        victim.to_prefill = victim.prompt_tokens + victim.generated
        victim.scheduled = None
        victim.preemptions += 1
        self.waiting.appendleft(victim)
        self._start_waiting(victim, self._wait_t if self._wait_t is not None else 0.0)
        return True

    def _lookup_prefix(self, req: SimRequest) -> int:
        self.prefix_queries += req.prompt_tokens
        if not req.prefix_key:
            return 0
        bust = self.scenarios.get("prefix_cache_collapse")
        if bust is not None and self.rng.random() < bust.get("fraction"):
            return 0  # a prompt whose prefix changes per request (a timestamp in the system prompt): a miss
        cached = 0
        if req.prefix_key in self.prefix_cache:
            self.prefix_cache.move_to_end(req.prefix_key)
            cached = (min(req.prefix_tokens, req.prompt_tokens - 1) // self.dep.block_size) * self.dep.block_size
        else:
            self.prefix_cache[req.prefix_key] = None
            if len(self.prefix_cache) > PREFIX_CACHE_ENTRIES:
                self.prefix_cache.popitem(last=False)
        self.prefix_hits += cached
        return cached

    def _count_sources(self, req: SimRequest) -> None:
        """vLLM's prompt_tokens_by_source: cache hits, then pulled over the KV connector or computed here."""
        if req.sources_counted:  # looked up again after a step that had no room for it
            return
        req.sources_counted = True
        rest = req.prompt_tokens - req.cached_tokens
        self.prompt_by_source["local_cache_hit"] += req.cached_tokens
        self.prompt_cached += req.cached_tokens
        if self.features.kv_connector:  # the prefill instance has every prompt's KV: the connector finds it all
            self.prompt_by_source["external_kv_transfer"] += rest
            self.prompt_cached += rest
            self.external_queries += rest
            self.external_hits += rest
        else:
            self.prompt_by_source["local_compute"] += rest

    def _pull_kv(self, req: SimRequest) -> float:
        """Decode side of a P/D pair: seconds to pull the prompt's KV (recorded for the NIXL histograms); the
        last prompt token is still computed here, as vLLM's decode instance does."""
        if not self.features.kv_connector or req.to_prefill <= 1:
            return 0.0
        nbytes = (req.to_prefill - 1) * self.dep.size.kv_bytes_per_token()
        seconds = KV_TRANSFER_BASE_S + nbytes / KV_TRANSFER_BYTES_PER_S
        slow = self.scenarios.get("slow_kv_transfer")
        if slow is not None:
            seconds *= slow.get("factor")
        seconds *= 1 + 0.1 * (self.rng.random() - 0.5)
        req.to_prefill = 1
        if len(self.kv_transfers) < 10_000:  # bounded: drained at every step
            self.kv_transfers.append((seconds, int(nbytes)))
        return seconds

    def stalled(self, now: float) -> None:
        """A hung step: arrivals still reach the queue and the gauges are published, no token is produced.

        Like a vLLM engine stuck in a forward pass (a wedged collective or GPU): the batch it was running
        stays running, new requests pile up waiting, and the token counters stop.
        """
        self._advance(now)
        while self.pending and self.pending[0][0] <= now:
            req = heapq.heappop(self.pending)[2]
            self.waiting.append(req)
            self._start_waiting(req, req.queued)
        self.listener.on_step(self, 0, 0, 0)

    def plan(self, now: float) -> Step | None:
        """Build the next step at ``now``; None when nothing can run yet (see :meth:`next_wakeup`)."""
        self._advance(now)
        while self.pending and self.pending[0][0] <= now:
            req = heapq.heappop(self.pending)[2]
            self.waiting.append(req)
            self._start_waiting(req, req.queued)
        self._reserve()
        budget = self.dep.batched_tokens
        preempted = 0
        decode: list[SimRequest] = []
        for req in list(self.running):
            if req not in self.running or not req.prefill_done:
                continue
            ctx = req.prompt_tokens + req.generated
            while ctx % self.dep.block_size == 0 and self.free_blocks <= 0 and self.running:
                preempted += self._preempt_newest()
                if req not in self.running:
                    break
            if req not in self.running:
                continue
            if ctx % self.dep.block_size == 0:
                self.free_blocks -= 1
                req.blocks += 1
            decode.append(req)
            self._speculate(req)
        budget -= len(decode)
        prefill: list[tuple[SimRequest, int]] = []
        for req in self.running:
            if budget <= 0:
                break
            if not req.prefill_done and req.stall_until <= now:
                chunk = min(req.to_prefill, budget)
                prefill.append((req, chunk))
                budget -= chunk
        max_loras = self.features.max_loras
        adapters = {r.adapter for r in self.running} if max_loras else set()
        skipped: list[SimRequest] = []  # waiting for a LoRA slot: vLLM's scheduler skips them, keeping their order
        kv_blocked = False
        while self.waiting and budget > 0 and len(self.running) < self.dep.seqs:
            req = self.waiting[0]
            if max_loras and req.adapter not in adapters and len(adapters) >= max_loras:
                skipped.append(self.waiting.popleft())
                continue
            if req.preemptions == 0 and req.scheduled is None and req.first_scheduled is None:
                req.cached_tokens = self._lookup_prefix(req)
                req.to_prefill = req.prompt_tokens - req.cached_tokens
                self._count_sources(req)
            need = self._blocks_for(req.prompt_tokens + req.generated)
            if need > self.free_blocks and self.running:  # alone, a request always fits (vLLM sizes the cache so)
                kv_blocked = True
                break
            self.waiting.popleft()
            self._stop_waiting(req)
            adapters.add(req.adapter)
            self.free_blocks -= need
            req.blocks = need
            req.scheduled = now
            if req.first_scheduled is None:
                req.first_scheduled = now
                stall = self.model.slow_path_seconds()
                if stall > 0:
                    req.causes["page_cache_pressure"] = stall
                req.stall_until = now + stall + self._pull_kv(req)
            self.running.append(req)
            if req.stall_until <= now:
                chunk = min(req.to_prefill, budget)
                prefill.append((req, chunk))
                budget -= chunk
        self.waiting.extendleft(reversed(skipped))
        if preempted:
            self.listener.on_step(self, 0, 0, preempted)
        slow = self._slow_factor()
        if not prefill and not decode:
            self._set_wait_rates(slow, 0.0, 0.0, kv_blocked)
            return None
        prefill_tokens = sum(c for _, c in prefill)
        context = sum(r.prompt_tokens + r.generated for r in decode)
        duration = self.model.step_seconds(prefill_tokens, len(decode), context)
        tokens = prefill_tokens + len(decode)
        long_tokens = sum(c for r, c in prefill if r.injected == "long_prompt")
        burst_tokens = sum(c for r, c in prefill if r.injected == "arrival_burst")
        self._set_wait_rates(slow, long_tokens / tokens, burst_tokens / tokens, kv_blocked)
        return Step(now, duration, prefill, decode, slow, long_tokens / tokens, burst_tokens, tokens)

    @staticmethod
    def _attribute_prefill(step: Step, req: SimRequest, chunk: int, seconds: float) -> None:
        """A prefill step's seconds for a request before its first token, by effect (module docstring)."""
        c = req.causes
        rest = seconds
        if step.slow > 1.0:
            c["slow_rank"] = c.get("slow_rank", 0.0) + seconds * (1.0 - 1.0 / step.slow)
            rest = seconds / step.slow
        if req.injected == "long_prompt":
            c["long_prompt"] = c.get("long_prompt", 0.0) + rest
            return
        if step.long_share > 0:
            c["long_prompt"] = c.get("long_prompt", 0.0) + rest * step.long_share
        others = step.burst_tokens - (chunk if req.injected == "arrival_burst" else 0)  # the burst's other requests
        burst_share = others / step.tokens if step.tokens else 0.0
        if burst_share > 0:
            c["arrival_burst"] = c.get("arrival_burst", 0.0) + rest * burst_share
        rest *= 1.0 - step.long_share - burst_share
        if req.preemptions:
            c["kv_blocks"] = c.get("kv_blocks", 0.0) + rest

    def complete(self, step: Step, end: float) -> None:
        """Apply ``step`` as finished at ``end``: emit tokens, finish requests, report the step."""
        prompt_done = 0
        emitted: list[SimRequest] = []
        for req, chunk in step.prefill:
            if req.finish_reason is not None:
                continue
            if req.first_token is None:
                self._attribute_prefill(step, req, chunk, end - step.start)
            req.to_prefill -= chunk
            if req.to_prefill == 0:
                if req.generated == 0:
                    prompt_done += req.prompt_tokens
                emitted.append(req)
        emitted.extend(r for r in step.decode if r.finish_reason is None)
        for req in emitted:
            req.generated += 1
            itl = None if req.last_token is None else end - req.last_token
            if req.first_token is None:
                req.first_token = end
            req.last_token = end
            self.listener.on_token(req, end, itl)
            if req.generated >= req.target_tokens:
                req.finish_reason = "length" if req.target_tokens >= req.max_tokens else "stop"
                req.finished_at = end
                self.running.remove(req)
                self._free(req)
                self.listener.on_finish(req)
        self.listener.on_step(self, prompt_done, len(emitted), 0)


class Recorder:
    """An :class:`EngineListener` that keeps finished requests and every ITL (offline runs, tests)."""

    def __init__(self) -> None:
        self.finished: list[SimRequest] = []
        self.itls: list[float] = []
        self.preemptions = 0

    def on_token(self, req: SimRequest, now: float, itl: float | None) -> None:
        if itl is not None:
            self.itls.append(itl)

    def on_finish(self, req: SimRequest) -> None:
        self.finished.append(req)

    def on_step(self, core: EngineCore, prompt_tokens: int, generation_tokens: int, preempted: int) -> None:
        self.preemptions += preempted


def run_offline(core: EngineCore, requests: list[SimRequest], max_steps: int = 10_000_000) -> float:
    """Drive ``core`` in virtual time over ``requests`` (sorted by arrival); return the end time.

    The same scheduler and timing model as the live server, without sleeping: n = 10 000 requests
    take a second or two, so statistical checks run on large samples deterministically.
    """
    now = 0.0
    i = 0
    n = len(requests)
    for _ in range(max_steps):
        while i < n and requests[i].arrival <= now:
            core.add(requests[i])
            i += 1
        step = core.plan(now)
        if step is None:
            candidates = [t for t in (core.next_wakeup(), requests[i].arrival if i < n else None) if t is not None]
            if not candidates:
                return now
            now = max(now, min(candidates))
            continue
        now = step.start + step.duration
        core.complete(step, now)
    raise RuntimeError(f"offline run did not finish within {max_steps} steps")


def poisson_requests(
    n: int,
    rate_per_s: float,
    prompt_tokens: int,
    max_tokens: int,
    seed: int = 0,
    ignore_eos: bool = True,
) -> list[SimRequest]:
    """``n`` requests with Poisson arrivals at ``rate_per_s`` (for offline runs and benchmarks)."""
    rng = random.Random(seed)
    t = 0.0
    out = []
    for k in range(n):
        t += rng.expovariate(rate_per_s)
        out.append(SimRequest(f"req-{k}", prompt_tokens, max_tokens, t, ignore_eos=ignore_eos))
    return out
