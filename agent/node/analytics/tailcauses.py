"""What the tail explainer weighs beside the phase shares: the prompt-length workload, saturation, the engine's own
signals, and a second cause beside the first (:mod:`inferwatch.agent.node.analytics.explain` calls these).

**Prompt length.** Prefill grows with the prompt. The body's cost of a prompt token is read from the median band
(its prefill over its prompt tokens); a request's *prompt-length prefill* is its prompt times that. When that part
holds at least half of the prefill's share of the tail gap, the prefill tail is the prompt mix (the workload): it
is named ``prefill`` (long prompts) only when the tail's prompts are at least :data:`LONG_PROMPT_FACTOR` times the
median band's, a distinct long-prompt workload; a lognormal mix as wide as σ 0.8 puts its P98 at ~5x its median, the
ordinary spread of a mix, named no driver. A prefill tail the prompt length does not explain (a stall before
prefill: page-cache pressure, a slow disk or remote KV) is named ``prefill``.

**Saturation.** When the median request itself waited (queue at least :data:`SATURATED_QUEUE_SHARE` of the median
band's TTFT), P99/P50 shrinks however bad the cause: the whole window is the tail. The verdict then comes from the
engine's evidence (a rank slower per token, KV-cache preemptions), then from the prefills (a stall, a long-prompt
workload: :func:`prefill_stall`, :func:`long_prompt_share`), else the queue (arrivals above capacity).

**Engine signals** (:class:`EngineSignals`). Stock vLLM spans carry no data-parallel rank and no preemption count.
The engine's per-rank series (mean inter-token latency per rank over the window, from its per-engine histograms) and
its preemption counter (increase over the window) stand in: a rank whose mean ITL is at least
``SLOW_PLACEMENT_FACTOR`` times the other ranks' median is named, and preemptions counted on at least
``PREEMPTED_MIN_SHARE`` of the window's requests (at least ``PREEMPTED_MIN``) name the KV cache. Fewer preemptions
still say the cache ran out (vLLM preempts only then), as does a KV-cache usage of :data:`KV_FULL_USAGE` or more:
while it is out, no waiting request is admitted, so a queue tail that did not arrive in a burst is then the cache's.

**Prefill stalls** (:func:`prefill_stall`). A share of requests whose prefill took many times what their prompt
needs waited before prefill (page cache, disk, remote KV): named ``prefill`` beside any other cause, and first
where a saturated window has no engine evidence (it was otherwise read as arrivals above capacity, ``queue``).

**Front-end delays** (:func:`frontend_delay`). A share of requests that spent tens of milliseconds more than the
median between arrival and the engine's queue: named ``frontend`` beside any other cause.

**Second causes.** Beside the first driver, every cause with its own evidence is listed (``drivers``): a rank slower
per token, preemptions, a front end holding at least :data:`SECOND_SHARE` of the gap, a prefill stall or long
prompts holding that much, and a queue holding that much whose tail arrived in a burst (arrivals in the
:data:`BURST_S` before a tail request at least :data:`BURST_FACTOR` times the window's mean rate): queueing behind a
slow rank, a full cache or long prompts is theirs, not a second cause.
"""

from __future__ import annotations

import math
import threading
from bisect import bisect_left, bisect_right
from collections import deque
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from operator import sub
from typing import Any

LONG_PROMPT_FACTOR = 8.0  # the tail's prompts an order of magnitude over the median band's: a long-prompt workload
PROMPT_PART_OF_PREFILL = 0.5  # prompt length holds at least half of prefill's share: the prefill tail is the mix
SATURATED_QUEUE_SHARE = 0.5  # the median band waited in the queue for at least half its TTFT: saturated
SATURATED_MIN_S = 0.2  # ... and at least this long (a 10 ms wait at a 15 ms TTFT is not saturation)
SECOND_SHARE = 0.2  # a second phase cause holds at least a fifth of the gap
BURST_S = 5.0  # arrivals in the 5 s before a tail request ...
BURST_FACTOR = 1.5  # ... at least 1.5x the window's mean arrival rate: the tail arrived in a burst
BURST_TAIL_SHARE = 0.5  # ... for at least half of the tail band
HEAD_OF_LINE_SHARE = 0.5  # half the queue tail waited while a long prompt was prefilled: the long prompts' tail


@dataclass(frozen=True)
class EngineSignals:
    """The engine's own series over the explained window, for spans that lack them (stock vLLM).

    ``preemptions``: the preemption counter's increase over the window (``vllm:num_preemptions_total``), None when
    unknown. ``rank_itl_s``: per data-parallel rank (vLLM's ``engine`` label) its mean inter-token latency over the
    window (the per-engine ITL histogram's sum over count increase). ``kv_usage_max``: the highest KV-cache usage
    (0..1, the model's mean over its ranks) the engine reported in the window, None when unknown.
    """

    preemptions: float | None = None
    rank_itl_s: Mapping[str, float] = field(default_factory=dict)
    kv_usage_max: float | None = None


def slow_rank_from_signals(signals: EngineSignals | None, factor: float) -> dict[str, Any] | None:
    """The rank whose mean ITL is at least ``factor`` times the other ranks' median (the slowest such), or None."""
    if signals is None or len(signals.rank_itl_s) < 2:
        return None
    found: dict[str, Any] | None = None
    for rank, itl in signals.rank_itl_s.items():
        others = sorted(v for r, v in signals.rank_itl_s.items() if r != rank and v == v and v > 0)
        if not others or itl != itl:
            continue
        theirs = others[len(others) // 2]
        if itl >= factor * theirs and (found is None or itl / theirs > found["itl_ratio"]):
            found = {
                "attribute": "dp_rank",
                "value": str(rank),
                "itl_ratio": round(itl / theirs, 2),
                "median_itl_s": itl,
                "others_median_itl_s": theirs,
                "source": "engine per-rank series",
            }
    return found


def prompt_workload(
    prompts: Sequence[int], prefill: Sequence[float], tail: list[int], mid: list[int], gap: float
) -> dict[str, Any] | None:
    """The prompt-length part of the prefill gap and how much longer the tail's prompts are than the median band's.

    None when prompt counts are missing. ``share``: (prompt-length prefill in the tail band − in the median band) /
    the gap, where a request's prompt-length prefill is its prompt tokens times the median band's prefill per token.
    """
    mid_p = [prompts[j] for j in mid if prompts[j] > 0]
    tail_p = [prompts[j] for j in tail if prompts[j] > 0]
    if not mid_p or not tail_p or gap <= 0:
        return None
    mid_tokens = math.fsum(mid_p) / len(mid_p)
    mid_prefill = [prefill[j] for j in mid if prompts[j] > 0 and prefill[j] == prefill[j]]
    if not mid_prefill or mid_tokens <= 0:
        return None
    per_token = math.fsum(mid_prefill) / len(mid_prefill) / mid_tokens
    tail_tokens = math.fsum(tail_p) / len(tail_p)
    return {
        "share": round(per_token * (tail_tokens - mid_tokens) / gap, 4),
        "tail_prompt_tokens": round(tail_tokens),
        "median_band_prompt_tokens": round(mid_tokens),
        "factor": round(tail_tokens / mid_tokens, 2),
    }


def burst(arrivals_sorted: Sequence[float], tail_arrivals: Sequence[float], covered_s: float) -> float:
    """The share of tail requests that arrived in a burst: at least :data:`BURST_FACTOR` x the window's mean
    arrival rate over the :data:`BURST_S` before them (``arrivals_sorted``: every record's arrival, sorted)."""
    if not tail_arrivals or covered_s <= BURST_S or len(arrivals_sorted) < 2:
        return 0.0
    rate = len(arrivals_sorted) / covered_s
    need = BURST_FACTOR * rate * BURST_S
    hits = 0
    for a in tail_arrivals:
        n = bisect_right(arrivals_sorted, a) - bisect_left(arrivals_sorted, a - BURST_S)
        hits += n >= need
    return hits / len(tail_arrivals)


OWN_TAIL_SAMPLE = 2_048  # a phase's own spread is read from at most ~2,048 of the window's requests (every k-th)
LONG_PROMPT_MIN_SHARE = 0.005  # long prompts (LONG_PROMPT_FACTOR x the median) on at least 1 request in 200


def _spread(values: list[float]) -> float:
    """P99 − P50 of ``values`` (NaN dropped); 0 when there are none."""
    vals = sorted(v for v in values if v == v)
    if not vals:
        return 0.0
    return vals[min(len(vals) - 1, math.ceil(0.99 * len(vals)) - 1)] - vals[(len(vals) - 1) // 2]


def own_spreads(f: Mapping[str, Sequence[float]], prompts: Sequence[int]) -> dict[str, float]:
    """Each phase cause's own spread over a sample of the window (seconds), whatever holds the tail.

    ``frontend``: P99 − P50 of TTFT − queue − prefill. ``prefill``: P99 − P50 of prefill beyond prompt length
    (prefill − prompt tokens x the window's median prefill per token: a stall, not the mix); where that is small,
    the long prompts' (:data:`LONG_PROMPT_FACTOR` x the median prompt, at least :data:`LONG_PROMPT_MIN_SHARE` of
    requests) mean TTFT over the median TTFT. :func:`own_tails` compares them with the TTFT's spread.
    """
    n = len(prompts)
    if n == 0:
        return {}
    step = max(1, n // OWN_TAIL_SAMPLE)
    ttft, queue, prefill = f["ttft"][::step], f["queue"][::step], f["prefill"][::step]
    toks = prompts[::step]
    out = {"frontend": _spread([t - q - p for t, q, p in zip(ttft, queue, prefill, strict=True)])}
    rates = sorted(p / k for p, k in zip(prefill, toks, strict=True) if k > 0 and p == p)
    if rates:
        rate = rates[len(rates) // 2]
        out["prefill"] = _spread([p - rate * k for p, k in zip(prefill, toks, strict=True) if k > 0])
    known = sorted(k for k in toks if k > 0)
    if known:
        median = known[len(known) // 2]
        long_t = [t for t, k in zip(ttft, toks, strict=True) if k >= LONG_PROMPT_FACTOR * median and t == t]
        body = sorted(t for t in ttft if t == t)
        if len(long_t) >= max(1, LONG_PROMPT_MIN_SHARE * len(toks)) and body:
            out["long_prompts"] = math.fsum(long_t) / len(long_t) - body[len(body) // 2]
    return out


def own_tails(spreads: Mapping[str, float], ttft_spread: float) -> list[str]:
    """The phase causes whose own spread (:func:`own_spreads`) is at least :data:`SECOND_SHARE` of the TTFT's
    P99 − P50: a cause of their own even where another cause's tail hides them in the slowest requests (long
    prompts count as ``prefill``)."""
    if ttft_spread <= 0:
        return []
    out = [p for p in ("frontend", "prefill") if spreads.get(p, 0.0) >= SECOND_SHARE * ttft_spread]
    if "prefill" not in out and spreads.get("long_prompts", 0.0) >= SECOND_SHARE * ttft_spread:
        out.append("prefill")
    return out


STALL_MIN_S = 0.1  # a prefill at least 100 ms over its prompt's own prefill time ...
STALL_FACTOR = 3.0  # ... and at least 3x it is *stalled* (a slow rank or a full batch stretches prefill 3-6x)
STALL_MIN_SHARE = 0.08  # a prefill stall: at least 8 % of requests stalled ...
STALL_RATIO = 7.0  # ... by a median 7x their prompt's prefill time or more: waiting (disk, page cache), not computing


def prefill_stall(prefill: Sequence[float], prompts: Sequence[int]) -> dict[str, Any] | None:
    """A stall before prefill seen in the prefills themselves, whatever holds the TTFT tail, or None.

    A request's *expected* prefill is its prompt tokens times the window's median prefill per token. A request is
    stalled when its prefill is at least :data:`STALL_MIN_S` over that and :data:`STALL_FACTOR` times it. When at least
    :data:`STALL_MIN_SHARE` of the requests are, and their median prefill is :data:`STALL_RATIO` times what their
    prompts need or more, the prefills waited for something (a page-cache miss reading weights or a KV block from
    disk, a remote KV fetch): a cause of its own. Slower compute does not look like that: a slow rank, a batch full
    of decodes, or KV-cache recomputation stretch prefill in proportion to the prompt (3-5x in the development
    episodes, up to 6x under bursts of 3x capacity), and a long-prompt mix is prefill that follows its prompts. Such
    a stall hides under a saturating cause's tail (a queue of tens of seconds beside a 0.3 s stall), so it is read
    from the prefills, not the TTFT.
    Read from a systematic sample of at most :data:`OWN_TAIL_SAMPLE` requests.
    """
    step = max(1, len(prompts) // OWN_TAIL_SAMPLE)
    pairs = [(p, k) for p, k in zip(prefill[::step], prompts[::step], strict=True) if k > 0 and p == p]
    if len(pairs) < 50:
        return None
    rates = sorted(p / k for p, k in pairs)
    rate = rates[len(rates) // 2]
    if rate <= 0:
        return None
    ratios = sorted(p / (rate * k) for p, k in pairs if p - rate * k >= STALL_MIN_S and p >= STALL_FACTOR * rate * k)
    share = len(ratios) / len(pairs)
    if share < STALL_MIN_SHARE or ratios[len(ratios) // 2] < STALL_RATIO:
        return None
    excess = sorted(p - rate * k for p, k in pairs if p - rate * k >= STALL_MIN_S and p >= STALL_FACTOR * rate * k)
    return {
        "share_of_requests": round(share, 4),
        "median_stall_s": round(excess[len(excess) // 2], 4),
        "prefill_over_prompt": round(ratios[len(ratios) // 2], 2),
    }


LONG_PROMPT_WORKLOAD = 0.01  # prompts LONG_PROMPT_FACTOR x the median on 1 request in 100: a long-prompt workload


def long_prompt_share(prompts: Sequence[int]) -> float:
    """The share of requests whose prompt is at least :data:`LONG_PROMPT_FACTOR` times the window's median prompt
    (a systematic sample of at most :data:`OWN_TAIL_SAMPLE`). An ordinary lognormal mix, as wide as σ 0.8, puts
    about 0.5 % there; :data:`LONG_PROMPT_WORKLOAD` or more is a distinct long-prompt workload, whose prefills take
    8x the median's and hold the step budget while they run (head-of-line blocking)."""
    known = [k for k in prompts[:: max(1, len(prompts) // OWN_TAIL_SAMPLE)] if k > 0]
    if len(known) < 50:
        return 0.0
    floor = LONG_PROMPT_FACTOR * sorted(known)[len(known) // 2]
    return sum(k >= floor for k in known) / len(known)


FRONT_MIN_S = 0.05  # a request 50 ms or more over the window's median front-end gap waited in the front end ...
FRONT_MIN_SHARE = 0.02  # ... and 1 request in 50 doing so is a front-end delay of its own


def frontend_delay(ttft: Sequence[float], queue: Sequence[float], prefill: Sequence[float]) -> dict[str, Any] | None:
    """A front-end delay seen in the front-end gaps themselves (TTFT − queue − prefill: API server, tokenizer, a
    proxy), whatever holds the TTFT tail, or None: at least :data:`FRONT_MIN_SHARE` of the requests spent
    :data:`FRONT_MIN_S` or more over the window's median gap there. The engine's queue and prefill do not enter the
    gap, so a saturated engine does not make one (in the development episodes no window without a front-end fault
    had a request 50 ms over the median), while its queue of seconds hides a 0.2-0.9 s delay from the TTFT's own
    tail. Read from a systematic sample of at most :data:`OWN_TAIL_SAMPLE` requests."""
    step = max(1, len(ttft) // OWN_TAIL_SAMPLE)
    gaps = sorted(g for g in map(sub, map(sub, ttft[::step], queue[::step]), prefill[::step]) if g == g)
    if len(gaps) < 50:
        return None
    median = gaps[len(gaps) // 2]
    late = [g - median for g in gaps if g - median >= FRONT_MIN_S]
    if len(late) < FRONT_MIN_SHARE * len(gaps):
        return None
    return {"share_of_requests": round(len(late) / len(gaps), 4), "median_delay_s": round(late[len(late) // 2], 4)}


KV_FULL_USAGE = 0.9  # a KV-cache usage reading this high: the blocks ran out around it (readings are seconds apart)


def kv_ran_out(signals: EngineSignals | None) -> dict[str, Any] | None:
    """The engine's evidence that its KV cache ran out in the window (:class:`EngineSignals`): a preemption counted,
    or a usage reading of at least :data:`KV_FULL_USAGE`; None without either."""
    if signals is None:
        return None
    preempted = signals.preemptions or 0.0
    usage = signals.kv_usage_max
    if preempted < 1 and (usage is None or usage < KV_FULL_USAGE):
        return None
    return {
        "attribute": "kv_cache",
        "value": "ran out",
        "preemptions": preempted,
        "kv_usage_max": usage,
        "source": "engine preemption counter and KV-cache usage",
    }


LEAD_FACTOR = 1.5  # a cause holding 1.5x the first-named cause's part of the tail's excess is named first


def tail_parts(
    f: Mapping[str, Sequence[float]],
    prompts: Sequence[int],
    comp: Sequence[int],
    tail: Sequence[int],
    p50: float,
    slow: Mapping[str, Any] | None,
    long_prompts: bool = False,
) -> dict[str, float]:
    """The part of the tail band's TTFT excess over P50 each cause seen request by request holds (0..1 each).

    Three causes show on the request itself: a front-end delay (its front-end gap over the window's median gap, at
    least :data:`FRONT_MIN_S`), a prefill stall (its prefill over what its prompt needs at the window's median
    prefill per token, at least :data:`STALL_MIN_S` and :data:`STALL_FACTOR` times it) or, with ``long_prompts`` (a
    long-prompt workload), a long prompt (at least :data:`LONG_PROMPT_FACTOR` times the window's median prompt: its
    prefill over the median prompt's), both ``prefill``, and a rank slower per token
    (``slow``, from the engine's per-rank series or the spans: a request whose own ITL is past the geometric middle of
    the slow rank's and the others' is on it; its queue and expected prefill ran ``itl_ratio`` times slower, so
    ``1 - 1/itl_ratio`` of them are the rank's, and its expected prefill is the slow rank's). Each request's excess is
    split between its causes, pro rata where they claim more than it. Which of two causes seen in the window holds
    the tail is read here, not from which is seen at all: a page-cache stall on a fifth of the requests and a rank
    1.5x slower are both seen, and the tail is the stall's."""
    prefill, queue, ttft, decode = f["prefill"], f["queue"], f["ttft"], f["decode"]
    step = max(1, len(prompts) // OWN_TAIL_SAMPLE)
    rates = sorted(p / k for p, k in zip(prefill[::step], prompts[::step], strict=True) if k > 0 and p == p)
    gaps = sorted(g for g in map(sub, map(sub, ttft[::step], queue[::step]), prefill[::step]) if g == g)
    rate = rates[len(rates) // 2] if rates else 0.0
    known = sorted(k for k in prompts[::step] if k > 0)
    median_prompt = known[len(known) // 2] if known else 0
    long_floor = LONG_PROMPT_FACTOR * median_prompt if long_prompts and known else math.inf
    gap_median = gaps[len(gaps) // 2] if gaps else 0.0
    factor, cut, rank = 1.0, math.inf, ""
    if slow is not None and slow.get("itl_ratio", 0) > 1:
        factor = float(slow["itl_ratio"])
        cut = math.sqrt(float(slow["median_itl_s"]) * float(slow["others_median_itl_s"]))
        rank = str(slow["attribute"])
    parts: dict[str, float] = {}
    total = 0.0
    for j in tail:
        t, q, p = ttft[j], queue[j], prefill[j]
        excess = t - p50
        if excess <= 0 or t != t or q != q or p != p:
            continue
        total += excess
        mine: dict[str, float] = {}
        front = t - q - p - gap_median
        if front >= FRONT_MIN_S:
            mine["frontend"] = front
        on_slow = comp[j] > 1 and decode[j] == decode[j] and decode[j] / (comp[j] - 1) >= cut
        expected = rate * max(0, prompts[j]) * (factor if on_slow else 1.0)
        if p - expected >= STALL_MIN_S and p >= STALL_FACTOR * expected:
            mine["prefill"] = p - expected
        if prompts[j] >= long_floor:
            mine["prefill"] = max(mine.get("prefill", 0.0), p - rate * median_prompt * (factor if on_slow else 1.0))
        if on_slow:
            mine[rank] = (q + min(p, expected)) * (1.0 - 1.0 / factor)
        claimed = math.fsum(mine.values())
        scale = min(1.0, excess / claimed) if claimed > 0 else 0.0
        for cause, seconds in mine.items():
            parts[cause] = parts.get(cause, 0.0) + seconds * scale
    return {c: round(v / total, 4) for c, v in parts.items()} if total > 0 else {}


COUNTER_HISTORY = 64  # readings kept per model: 5 minutes at the agent's 5 s interval, with room


class EngineCounters:
    """The engine's cumulative counters per model, as the engine collector read them, over time: their increase over
    an explained window is the :class:`EngineSignals` for spans without a rank or a preemption count.

    Kept: the preemption counter, and per data-parallel rank its ITL histogram's sum (seconds) and count (the
    collection's ``details["rank_itl"]``, :mod:`inferwatch.agent.node.engine.rankitl`). A reset (the engine
    restarted: a counter went down) starts that history again.
    """

    def __init__(self) -> None:
        self._lock = threading.Lock()
        self._seen: dict[str, deque[tuple[float, float]]] = {}
        self._ranks: dict[str, deque[tuple[float, Mapping[str, Sequence[float]]]]] = {}
        self._kv: dict[str, deque[tuple[float, float]]] = {}

    def observe(self, model: str, preemptions: float, now: float) -> None:
        with self._lock:
            hist = self._seen.setdefault(model, deque(maxlen=COUNTER_HISTORY))
            if hist and preemptions < hist[-1][1]:
                hist.clear()
            hist.append((now, preemptions))

    def observe_kv(self, model: str, usage: float, now: float) -> None:
        """One reading of the model's KV-cache usage (0..1)."""
        with self._lock:
            self._kv.setdefault(model, deque(maxlen=COUNTER_HISTORY)).append((now, usage))

    def observe_ranks(self, model: str, ranks: Mapping[str, Sequence[float]], now: float) -> None:
        """One reading of ``rank -> (ITL sum s, ITL count)``, cumulative."""
        with self._lock:
            hist = self._ranks.setdefault(model, deque(maxlen=COUNTER_HISTORY))
            if hist:
                last = hist[-1][1]
                if set(last) != set(ranks) or any(ranks[r][1] < last[r][1] for r in ranks):
                    hist.clear()  # a restart, or another set of ranks
            hist.append((now, dict(ranks)))

    def signals(self, models: Sequence[str], window_s: float, now: float) -> EngineSignals | None:
        """The counters' increase over the last ``window_s`` (from the last reading at or before its start, else
        the first kept): preemptions summed over ``models``, each rank's mean ITL (the first of ``models`` with
        per-rank readings), and the highest KV-cache usage read in the window; None when there is none of them."""
        total, found = 0.0, False
        rank_itl: dict[str, float] = {}
        with self._lock:
            for model in models:
                hist = self._seen.get(model)
                if not hist or len(hist) < 2:
                    continue
                start = next((v for t, v in reversed(hist) if t <= now - window_s), hist[0][1])
                total += hist[-1][1] - start
                found = True
            for model in models:
                ranks = self._ranks.get(model)
                if not ranks or len(ranks) < 2:
                    continue
                first = next((v for t, v in reversed(ranks) if t <= now - window_s), ranks[0][1])
                last = ranks[-1][1]
                for rank, (itl_sum, count) in last.items():
                    n = count - first[rank][1]
                    if n > 0:
                        rank_itl[rank] = (itl_sum - first[rank][0]) / n
                break
            usage = [u for model in models for t, u in self._kv.get(model, ()) if t > now - window_s and u == u]
        if not found and not rank_itl and not usage:
            return None
        return EngineSignals(
            preemptions=total if found else None, rank_itl_s=rank_itl, kv_usage_max=max(usage) if usage else None
        )
