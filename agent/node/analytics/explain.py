"""Why is the tail slow? The slowest requests, the phase that accounts for P99 − P50, and who is in the tail.

Input: the last 5 minutes of finished requests
(:class:`~inferwatch.agent.node.analytics.tailrecords.RequestRecords`, fed beside the span analytics by
:class:`RecordingSink` from the receiver's spans). Output: an explanation (:func:`explain`, a JSON-ready dict) for one
model and window, and from it the agent metric ``inferwatch.engine.tail.driver`` (:func:`driver_samples`) that the
tail-latency alerts quote. :class:`TailExplainer` is what the processor, the API and the metrics call; the report
as a terminal table is :mod:`inferwatch.agent.node.analytics.explaintext`.

**Phases.** vLLM's span gives TTFT, e2e, queue, prefill and decode per request; TTFT = frontend + queue + prefill
and e2e = TTFT + decode, where frontend = TTFT − (queue + prefill) is the time before the engine queued the
request (API server, tokenisation, a proxy). Decode is split into ``output_length`` = (generated tokens − 1) ×
the window's median inter-token latency (a long answer, the workload) and ``decode`` = the rest (slower tokens:
preemptions and recomputation, big batches, a slow rank). Every split is exact per request, so the parts add up.

**Decomposition of the tail.** Requests are ranked by the quantity (TTFT or e2e). The *tail band* is the top
2 % of the window, at least 5 requests; the *median band* the ranks 40-60 %
(:mod:`~inferwatch.agent.node.analytics.tailstats`). A phase's share is (its mean in the tail band − its mean in
the median band) / (the quantity's mean in the tail band − its mean in the median band); the shares add to 1 (a
negative share is a phase shorter in the tail). That gap of band means stands for P99 − P50, which is also reported.

**Who is in the tail.** For each attribute (prompt-length band, ``dp_rank``, ``lora``, ``tenant``, and whether
the request was preempted), each value's share of the requests and of the tail band. A value *separates* the
tail when it holds at least :data:`SEPARATOR_TAIL_SHARE` of the tail, at least :data:`SEPARATOR_LIFT` times its
share of the requests, and the excess is significant: a binomial z of at least :data:`SEPARATOR_Z`.

**Verdict.** Only when the tail is a tail: at least :data:`MIN_REQUESTS` requests with the phases, P99/P50 of
at least :data:`TAIL_RATIO_MIN` and P99 − P50 of at least :data:`TAIL_GAP_MIN_S`. When the largest phase is an
engine phase (queue, prefill, decode), first a *slow placement*: a ``dp_rank`` / ``lora`` / ``tenant`` value whose
requests' median ITL is at least :data:`SLOW_PLACEMENT_FACTOR` times the others' is the driver (a sick rank is
slower per token; one that took a burst is not); then *preemption*: with at least :data:`PREEMPTED_MIN_SHARE` of
the requests preempted, a queue tail in flight beside them or a prefill/decode tail over-representing them is the
KV cache's (vLLM preempts only when no block is free, and admits nothing while blocks are short). Then the driver
is the separating placement attribute (``dp_rank``, ``lora``, ``tenant``) if there is one and either no phase holds
:data:`PHASE_OVER_PLACEMENT` (90 %) of the gap or the value's share of the tail is at least :data:`STRONG_LIFT` (3)
times its share of the requests (a slow rank the balancer already avoids: 24 % of requests, 93 % of the tail);
else the phase with at least :data:`DOMINANT_SHARE` of the gap, the separating attribute named beside it ("100 %
of the gap is queue; dp_rank=1 is 49 % of requests and 100 % of the tail" is a queue burst that one rank took) —
except a queue tail that did not arrive in a burst while the engine's own series say its KV cache ran out (a
preemption counted, or usage of :data:`~inferwatch.agent.node.analytics.tailcauses.KV_FULL_USAGE` or more: nothing
waiting is admitted then), which is the cache's (``preemption``).
``output_length`` is reported as the workload, never as a fault driver. Otherwise the answer is ``none`` ("no
dominant driver"), unless a cause is seen in its own phase (:mod:`~inferwatch.agent.node.analytics.tailcauses`: a
prefill stall, a front-end delay), which is also named first over a queue tail that is neither a burst nor
saturation (the load's). Beside the first driver, every cause with evidence of its own is listed (``drivers``); where
two of them show on each request (a slow rank, a prefill stall or long prompts, a front-end delay), the one holding
the larger part of the tail's excess is named first (:func:`~inferwatch.agent.node.analytics.tailcauses.tail_parts`,
the report's ``tail_parts``). The
thresholds and their measured accuracy are in docs/explain.md (benchmarks/tail_explain.py).

**Sampled windows.** Above their bound the records keep 1 request in k with weight k, and always the slowest
(:mod:`~inferwatch.agent.node.analytics.tailrecords`); a sampled window's quantiles and band means are weighted, and
the report says how many seconds the window really covers.

Without spans (no records for the model) :func:`explain_histograms` gives a coarser answer from the engine's own
histogram quantiles (queue, prefill, decode, TTFT, e2e; ``source="histogram"``), and says so: quantile
differences do not add, no requests can be named, and no attribute can be tested.
"""

from __future__ import annotations

import heapq
import math
import time
from bisect import bisect_left as _bisect_left
from collections import Counter
from collections.abc import Callable, Iterable, Mapping, Sequence
from functools import partial
from itertools import compress, repeat
from operator import ge, gt, sub
from typing import Any, Protocol

from inferwatch.agent.catalog.engine import MODEL
from inferwatch.agent.common.samples import UNKNOWN_MODEL, RequestTiming, Sample, attrs
from inferwatch.agent.node.analytics.failures import ModelFailures
from inferwatch.agent.node.analytics.tailcauses import (
    BURST_TAIL_SHARE,
    HEAD_OF_LINE_SHARE,
    LEAD_FACTOR,
    LONG_PROMPT_FACTOR,
    LONG_PROMPT_WORKLOAD,
    OWN_TAIL_SAMPLE,
    PROMPT_PART_OF_PREFILL,
    SATURATED_MIN_S,
    SATURATED_QUEUE_SHARE,
    SECOND_SHARE,
    EngineCounters,
    EngineSignals,
    burst,
    frontend_delay,
    kv_ran_out,
    long_prompt_share,
    own_spreads,
    own_tails,
    prefill_stall,
    prompt_workload,
    slow_rank_from_signals,
    tail_parts,
)
from inferwatch.agent.node.analytics.tailrecords import (
    HORIZON_S,
    SUB_WINDOW_S,
    ClientTTFTs,
    RequestRecords,
    Window,
    code_keys,
)
from inferwatch.agent.node.analytics.tailstats import bands, bands_by_value, gather, mean, mean_of, quantile

MIN_REQUESTS = 50
TAIL_RATIO_MIN = 3.0
TAIL_GAP_MIN_S = 0.02
DOMINANT_SHARE = 0.5
ITL_SAMPLE = 4_096  # the window's median inter-token latency is read from at most this many requests
PHASE_OVER_PLACEMENT = 0.9  # a phase with 90 % of the gap is the driver even where one rank holds the tail ...
STRONG_LIFT = 3.0  # ... unless the tail is 3x more concentrated on that value than its share of requests
BEYOND_MIN = 0.25  # e2e beyond output length: a tail gap under a quarter of the e2e median is not material
SLOW_PLACEMENT_FACTOR = 1.5  # a rank (adapter, tenant) whose median ITL is 1.5x the rest's is slow hardware ...
SLOW_PLACEMENT_MIN = 20  # ... judged on at least 20 requests with tokens on each side,
SLOW_PLACEMENT_SAMPLE = 1_024  # read from at most ~1,024 of the window's requests (every k-th)
ENGINE_PHASES = ("queue", "prefill", "decode")  # what a slow rank or a full KV cache can lengthen (not the frontend)
PREEMPTED_MIN_SHARE = 0.01  # preemptions explain an engine phase when >= 1 % of the window's requests were preempted,
PREEMPTED_MIN = 3  # at least 3 of them, ...
PREEMPT_IN_FLIGHT = 0.5  # ... and (queue) half the tail band was in flight beside a preempted request, or
PREEMPT_LIFT = 1.8  # (prefill, decode) preempted requests are 1.8x more common in the tail
SEPARATOR_TAIL_SHARE = 0.6
SEPARATOR_LIFT = 1.8
SEPARATOR_Z = 3.0
DEFAULT_TOP = 10
MAX_TOP = 100
PLACEMENT = ("dp_rank", "lora", "tenant")
QUANTITIES = ("ttft", "e2e")
PHASES = {"ttft": ("frontend", "queue", "prefill"), "e2e": ("frontend", "queue", "prefill", "decode", "output_length")}
NONE = "none"
# Client TTFT = client_gap + frontend + queue + prefill: where a client's (gateway's) own TTFT went, per part.
CLIENT_PARTS = ("client_gap", "frontend", "queue", "prefill")
CLIENT_PART_NAMES = {
    "client_gap": "before the engine saw the request (network, gateway or proxy: client TTFT - engine TTFT)",
    "frontend": "the engine's front end (API server, tokenizer, front-end queue) before its scheduler queue",
    "queue": "the engine's scheduler queue",
    "prefill": "prefill",
}
PREEMPTION = "preemption"  # the driver named when KV-cache preemptions explain an engine phase
METRIC_WINDOW = "5m"  # the window of inferwatch.engine.tail.driver (the alerts' window)
WINDOW_SECONDS = {"1m": 60.0, "5m": 300.0}
_NAN = math.nan


class _Sink(Protocol):
    def record(self, timings: Iterable[RequestTiming]) -> int: ...


class _Phases:
    """A window's phases, computed only for the records asked for (the bands), not for the whole window."""

    BASE = {  # the span values a phase is made of (a record without one of them has no such phase)
        "frontend": ("ttft", "queue", "prefill"),
        "queue": ("queue",),
        "prefill": ("prefill",),
        "decode": ("decode",),
        "output_length": ("decode",),
    }

    def __init__(self, win: Window, signals: EngineSignals | None = None) -> None:
        self.win = win
        self.signals = signals  # the engine's own series over the window (for spans without rank or preemptions)
        self.f, self.comp = win.f, win.i["completion"]
        self._clean: dict[str, bool] = {}
        decode, comp = self.f["decode"], self.comp
        step = max(1, len(comp) // ITL_SAMPLE)  # median ITLs from at most ~ITL_SAMPLE requests
        itls = sorted([d / (c - 1) for d, c in zip(decode[::step], comp[::step], strict=True) if c > 1 and d == d])
        self.itl_med = itls[len(itls) // 2] if itls else None
        self._slow: list[dict[str, Any] | None] = []  # computed once, on first use
        self._preempted: tuple[list[float], list[float]] | None = None
        self._spreads: dict[str, float] | None = None  # each phase cause's own spread (tailcauses.own_spreads)
        self._queue_tail: tuple[float, float] | None = None  # the queue's own spread and its burst share
        self._arrivals: list[float] | None = None  # every record's arrival (stamp - e2e), sorted, on first use
        self._long: tuple[list[float], list[float], float] | None = None  # long prompts' prefills (ends, starts)
        self._stall: list[dict[str, Any] | None] = []  # tailcauses.prefill_stall, computed once, on first use
        self._front: list[dict[str, Any] | None] = []  # tailcauses.frontend_delay, likewise
        self._long_share: list[float] = []  # tailcauses.long_prompt_share, likewise
        self.tails: dict[str, list[int]] = {}  # quantity -> its tail band, when that band is over every record

    def slow_placement(self) -> dict[str, Any] | None:
        """The placement value (``dp_rank``, ``lora``, ``tenant``) whose requests' median ITL is at least
        :data:`SLOW_PLACEMENT_FACTOR` times the other requests' (the slowest such), or None.

        Service speed, not queueing: a rank that took a burst queues, but its tokens come at the others' pace; a
        slow GPU (throttled, a bad link, a noisy neighbour) is slower per token for every request it serves.
        """
        if self._slow:
            return self._slow[0]
        win, step = self.win, max(1, len(self.comp) // SLOW_PLACEMENT_SAMPLE)
        found: dict[str, Any] | None = None
        labels = [c >> 5 for c in win.codes[::step]]
        if len(set(labels)) > 1:
            by: dict[int, list[float]] = {}
            for d, c, lab in zip(self.f["decode"][::step], self.comp[::step], labels, strict=True):
                if c > 1 and d == d:
                    by.setdefault(lab, []).append(d / (c - 1))
            values: dict[tuple[str, str], list[int]] = {}
            for lab in by:
                for key in win.label_sets[lab]:
                    if key[0] in PLACEMENT:
                        values.setdefault(key, []).append(lab)
            for (attr, value), labs in values.items():
                inside = sorted(x for lab in labs for x in by[lab])
                rest = sorted(x for lab in by if lab not in labs for x in by[lab])
                if len(inside) < SLOW_PLACEMENT_MIN or len(rest) < SLOW_PLACEMENT_MIN:
                    continue
                mine, theirs = inside[len(inside) // 2], rest[len(rest) // 2]
                slower = theirs > 0 and mine >= SLOW_PLACEMENT_FACTOR * theirs
                if slower and (found is None or mine / theirs > found["itl_ratio"]):
                    found = {
                        "attribute": attr,
                        "value": value,
                        "itl_ratio": round(mine / theirs, 2),
                        "median_itl_s": mine,
                        "others_median_itl_s": theirs,
                    }
        self._slow.append(found)
        return found

    def stall(self) -> dict[str, Any] | None:
        """A stall before prefill on a share of the window's requests (:func:`tailcauses.prefill_stall`), or None."""
        if not self._stall:
            self._stall.append(prefill_stall(self.f["prefill"], self.win.i["prompt"]))
        return self._stall[0]

    def front(self) -> dict[str, Any] | None:
        """A front-end delay on a share of the window's requests (:func:`tailcauses.frontend_delay`), or None."""
        if not self._front:
            clean = self.clean("ttft") and self.clean("queue") and self.clean("prefill")
            f = self.f
            self._front.append(frontend_delay(f["ttft"], f["queue"], f["prefill"]) if clean else None)
        return self._front[0]

    def long_share(self) -> float:
        """The share of requests with a long prompt (:func:`tailcauses.long_prompt_share`)."""
        if not self._long_share:
            self._long_share.append(long_prompt_share(self.win.i["prompt"]))
        return self._long_share[0]

    def in_flight_with_preempted(self, idx: list[int]) -> float:
        """The share of records ``idx`` in flight (arrival to end) while some preempted request was.

        A record's end is its intake stamp and its arrival that minus its e2e; records are in stamp order, so the
        preempted ones' ends are sorted and the earliest arrival from each one on answers an overlap by bisection.
        """
        if self._preempted is None:
            win = self.win
            t, e2e, pre = win.f["t"], win.f["e2e"], win.i["preemptions"]
            mine = list(compress(range(len(pre)), map(gt, pre, repeat(0))))
            ends = gather(mine, t) if mine else []
            lasted = gather(mine, e2e) if mine else []
            starts = [end - (d if d == d else 0.0) for end, d in zip(ends, lasted, strict=True)]
            for k in range(len(starts) - 2, -1, -1):  # earliest arrival from k on
                starts[k] = min(starts[k], starts[k + 1])
            self._preempted = (ends, starts)
        ends, earliest = self._preempted
        if not ends or not idx:
            return 0.0
        t, e2e = self.win.f["t"], self.win.f["e2e"]
        hits = 0
        for j in idx:
            start = t[j] - (e2e[j] if e2e[j] == e2e[j] else 0.0)
            k = _bisect_left(ends, start)
            hits += k < len(ends) and earliest[k] <= t[j]
        return hits / len(idx)

    def behind_long_prompts(self, idx: list[int]) -> float:
        """The share of records ``idx`` that are long prompts or waited while a long prompt was being prefilled
        (arrival to first token; long: :data:`LONG_PROMPT_FACTOR` x the window's median prompt): head-of-line
        blocking, where one long prefill takes the engine's token budget and the requests behind it queue."""
        if self._long is None:
            prompts = self.win.i["prompt"]
            known = sorted(prompts[:: max(1, len(prompts) // ITL_SAMPLE)])
            known = [k for k in known if k > 0]
            floor = LONG_PROMPT_FACTOR * known[len(known) // 2] if known else math.inf
            t, e2e, ttft = self.f["t"], self.f["e2e"], self.f["ttft"]
            longs = compress(range(len(prompts)), map(ge, prompts, repeat(floor)))  # C speed: few are long
            spans = sorted(
                (t[j] - e2e[j] + ttft[j], t[j] - e2e[j]) for j in longs if e2e[j] == e2e[j] and ttft[j] == ttft[j]
            )
            ends = [e for e, _ in spans]
            starts = [a for _, a in spans]
            for k in range(len(starts) - 2, -1, -1):  # earliest arrival from k on
                starts[k] = min(starts[k], starts[k + 1])
            self._long = (ends, starts, floor)
        ends, earliest, floor = self._long
        if not ends or not idx:
            return 0.0
        t, e2e, prompts = self.f["t"], self.f["e2e"], self.win.i["prompt"]
        hits = 0
        for j in idx:
            start = t[j] - (e2e[j] if e2e[j] == e2e[j] else 0.0)
            k = _bisect_left(ends, start)
            hits += prompts[j] >= floor or (k < len(ends) and earliest[k] <= t[j] - e2e[j] + self.f["ttft"][j])
        return hits / len(idx)

    def at(self, name: str, idx: list[int]) -> list[float]:
        f = self.f
        if name in ("queue", "prefill"):
            return gather(idx, f[name])
        if name == "frontend":
            return list(map(sub, map(sub, gather(idx, f["ttft"]), gather(idx, f["queue"])), gather(idx, f["prefill"])))
        itl = self.itl_med
        comp = gather(idx, self.comp)
        length = [0.0] * len(idx) if itl is None else [(c - 1) * itl if c > 1 else 0.0 for c in comp]
        if name == "output_length":
            return length
        return list(map(sub, gather(idx, f["decode"]), length))  # decode beyond length

    def clean(self, column: str) -> bool:
        """Whether a span column has no NaN (no record lacks it), summed once per window."""
        got = self._clean.get(column)
        if got is None:
            got = self._clean[column] = (t := sum(self.f[column])) == t
        return got

    def beyond_length(self, values: Sequence[float]) -> list[float]:
        """``values`` less each record's output length ((generated tokens - 1) x the median ITL; 0 for <= 1 token)."""
        itl = self.itl_med
        if itl is None:
            return list(values)
        return [v - (c - 1) * itl if c > 1 else v for v, c in zip(values, self.comp, strict=True)]


_Groups = tuple[Sequence[int], dict[int, tuple[tuple[str, str], ...]], dict[str, dict[int, float]]]


def _group_keys(win: Window) -> _Groups:
    """Per record its attribute code (kept in the records) and each code's (key, value)s."""
    codes = win.codes
    keys = {code: code_keys(code, win.label_sets) for code in set(codes)}
    return codes, keys, {}


def _separators(
    groups: _Groups,
    idx: list[int],
    tail: list[int],
    weights: list[float] | None,
) -> list[dict[str, Any]]:
    """Every attribute value's share of the requests and of the tail band, best separator first."""
    per_record, key_sets, cache = groups
    every: dict[int, float] = {}
    in_tail: dict[int, float] = {}
    if weights is None:
        full = len(idx) == len(per_record)  # every record: the same counts for each quantity, counted once
        if not full or "every" not in cache:
            every = {k: float(c) for k, c in Counter(per_record if full else gather(idx, per_record)).items()}
            if full:
                cache["every"] = every
        every = cache["every"] if full else every
        in_tail = {k: float(c) for k, c in Counter(gather(tail, per_record)).items()}
    else:
        for j in idx:
            k = per_record[j]
            every[k] = every.get(k, 0.0) + weights[j]
        for j in tail:
            k = per_record[j]
            in_tail[k] = in_tail.get(k, 0.0) + weights[j]
    total_w, tail_w = sum(every.values()), sum(in_tail.values())
    shares: dict[tuple[str, str], list[float]] = {}
    for k, w in every.items():
        for key in key_sets[k]:
            g = shares.setdefault(key, [0.0, 0.0])
            g[0] += w
            g[1] += in_tail.get(k, 0.0)
    n_tail = len(tail)
    out: list[dict[str, Any]] = []
    for (attr, value), (w, wt) in shares.items():
        share, tshare = w / total_w, wt / tail_w if tail_w else 0.0
        if share >= 1.0:
            continue
        z = (tshare - share) * math.sqrt(n_tail) / math.sqrt(share * (1 - share)) if 0 < share < 1 else 0.0
        lift = tshare / share if share else 0.0
        separates = tshare >= SEPARATOR_TAIL_SHARE and lift >= SEPARATOR_LIFT and z >= SEPARATOR_Z
        out.append(
            {
                "attribute": attr,
                "value": value,
                "share_of_requests": round(share, 4),
                "share_of_tail": round(tshare, 4),
                "lift": round(lift, 2),
                "z": round(z, 2),
                "separates": separates,
            }
        )
    out.sort(key=lambda s: (not s["separates"], -s["z"]))
    return out


def _decompose(
    quantity: str,
    values: Sequence[float],
    names: tuple[str, ...],
    phases: _Phases,
    weights: list[float] | None,
    groups: _Groups,
) -> dict[str, Any] | None:
    base = sorted({k for p in names for k in _Phases.BASE[p]})
    cols = [values, *(phases.f[k] for k in base)]
    if (t := sum(values)) == t and all(phases.clean(k) for k in base):  # no NaN anywhere (NaN != NaN): every record
        idx = list(range(len(values)))
    else:
        idx = [j for j, total in enumerate(map(sum, zip(*cols, strict=True))) if total == total]
    if not idx:
        return None
    if weights is None:  # unweighted: thresholds from the sorted values (a plain float sort, no key), then filters
        total = float(len(idx))
        tail, mid, p50, p99 = bands_by_value(idx, values)
    else:
        order = sorted(idx, key=values.__getitem__)
        total = math.fsum(weights[j] for j in idx)
        p50 = values[quantile(order, weights, total, 0.5)]
        p99 = values[quantile(order, weights, total, 0.99)]
        tail, mid = bands(order, weights, total)
    if len(idx) == len(values):  # every record is ranked: the tail band holds the slowest ones (ties included)
        phases.tails[quantity] = tail
    gap = mean(tail, values, weights) - mean(mid, values, weights)
    shares = {
        p: (mean_of(phases.at(p, tail), tail, weights) - mean_of(phases.at(p, mid), mid, weights)) / gap
        if gap > 0
        else 0.0
        for p in names
    }
    separators = _separators(groups, idx, tail, weights)
    ratio = p99 / p50 if p50 > 0 else math.inf
    reasons = []
    if total < MIN_REQUESTS:
        reasons.append(f"{total:.0f} requests < {MIN_REQUESTS}")
    if ratio < TAIL_RATIO_MIN:
        reasons.append(f"P99/P50 {ratio:.2f} < {TAIL_RATIO_MIN:g}")
    if p99 - p50 < TAIL_GAP_MIN_S:
        reasons.append(f"P99 - P50 {1000 * (p99 - p50):.0f} ms < {1000 * TAIL_GAP_MIN_S:.0f} ms")
    top_phase = max(shares, key=shares.__getitem__)
    placement = next((s for s in separators if s["separates"] and s["attribute"] in PLACEMENT), None)
    separator = next((s for s in separators if s["separates"]), None)
    signals = phases.signals
    saturated = _saturated(phases, mid, weights) if reasons and total >= MIN_REQUESTS else None
    if saturated is not None:  # the median request waited: the whole window is the tail, P99/P50 says little
        reasons = []
    enough = total >= MIN_REQUESTS
    slow = (phases.slow_placement() or slow_rank_from_signals(signals, SLOW_PLACEMENT_FACTOR)) if enough else None
    evidence = _preemption_evidence(phases, separators, tail, total, signals) if enough else None
    engine = (top_phase in ENGINE_PHASES and not reasons) or saturated is not None
    preemption = _preemption(evidence, top_phase, shares[top_phase]) if engine else None
    if saturated is not None and evidence is not None:
        preemption = evidence
    named_phase = top_phase
    workload = (
        prompt_workload(phases.win.i["prompt"], phases.f["prefill"], tail, mid, gap)
        if "prefill" in shares and not reasons
        else None
    )
    prefill_is_mix = (
        workload is not None
        and workload["share"] >= PROMPT_PART_OF_PREFILL * shares["prefill"]
        and workload["factor"] < LONG_PROMPT_FACTOR
    )
    driver = NONE
    gated = bool(reasons)  # no tail to explain (too few requests, P99/P50 or P99 - P50 too small)
    if reasons:
        pass
    elif top_phase == "output_length" and shares[top_phase] >= DOMINANT_SHARE:
        reasons.append(f"{shares[top_phase]:.0%} of the gap is output length (the workload, not a fault)")
    elif slow is not None and engine:  # slower per token on one rank: the rank, whichever engine phase its tail shows
        key = (slow["attribute"], slow["value"])
        seen = next((s for s in separators if (s["attribute"], s["value"]) == key), None)
        placement = {"share_of_requests": 0.0, "share_of_tail": 0.0, **(seen or {}), **slow}
        driver = placement["attribute"]
    elif preemption is not None:  # the KV cache is full: requests wait for blocks or are recomputed
        driver = PREEMPTION
    elif saturated is not None and (phases.stall() is not None or phases.long_share() >= LONG_PROMPT_WORKLOAD):
        # prefills stalled, or long prompts took the step budget: they held the engine back
        driver = "prefill"
        named_phase = "queue" if "queue" in shares else top_phase
    elif saturated is not None:  # no engine evidence: arrivals above what the engine serves
        driver = "queue"
        named_phase = "queue" if "queue" in shares else top_phase
    elif placement is not None and (shares[top_phase] < PHASE_OVER_PLACEMENT or placement["lift"] >= STRONG_LIFT):
        driver = placement["attribute"]
    elif (
        top_phase == "queue"
        and shares[top_phase] >= DOMINANT_SHARE
        and phases.behind_long_prompts(tail) >= HEAD_OF_LINE_SHARE
        and _burst_share(phases, tail) < BURST_TAIL_SHARE
    ):  # the queue tail waited behind long prefills: the long prompts are the cause
        driver = "prefill"
    elif (
        top_phase in ("queue", "prefill")
        and shares["queue"] + shares["prefill"] >= DOMINANT_SHARE
        and shares["queue"] >= SECOND_SHARE
        and _burst_share(phases, tail) >= BURST_TAIL_SHARE
    ):  # the tail arrived in a burst: queue and prefill both stretch when arrivals pass capacity
        driver = named_phase = "queue"
    elif top_phase == "prefill" and prefill_is_mix and shares[top_phase] >= DOMINANT_SHARE:
        assert workload is not None
        reasons.append(
            f"{shares[top_phase]:.0%} of the gap is prefill that follows prompt length: the tail's prompts are "
            f"{workload['factor']:.1f}x the median band's (under {LONG_PROMPT_FACTOR:g}x: the prompt mix's own "
            "spread, the workload)"
        )
    elif (
        top_phase == "queue"
        and shares[top_phase] >= DOMINANT_SHARE
        and (ran_out := kv_ran_out(signals)) is not None
        and not _counts_preemptions(phases)  # spans that count preemptions say so themselves
    ):  # a queue tail neither saturated nor in a burst while the cache ran out: admission waited for KV blocks
        driver = PREEMPTION
        preemption = evidence = ran_out
    elif shares[top_phase] >= DOMINANT_SHARE:
        driver = top_phase
    else:
        parts = _phase_causes(shares, phases, tail, prefill_is_mix, workload)
        engine_cause = (slow or {}).get("attribute") or (PREEMPTION if evidence is not None else None)
        if engine_cause is not None and "queue" not in parts and shares.get("queue", 0.0) >= SECOND_SHARE:
            parts.append("queue")  # the queue share is the rank's or the cache's: it waits behind them
        if len(parts) >= 2 and sum(shares[p] for p in parts) >= DOMINANT_SHARE:
            parts.sort(key=lambda p: -shares[p])
            driver = named_phase = parts[0]
            if engine_cause is not None and driver == "queue":
                driver = engine_cause
        else:
            reasons.append(
                f"no phase holds {DOMINANT_SHARE:.0%} of the gap (largest: {top_phase} {shares[top_phase]:.0%})"
            )
    if driver == NONE and not gated and top_phase != "output_length":
        # the tail's phases name no cause (the prompt mix's spread, no phase at half the gap), but one is seen in its
        # own phase: front-end delays, prefill stalls
        own = [d for d, seen in (("frontend", phases.front()), ("prefill", phases.stall())) if seen is not None]
        if own:
            driver, reasons = own[0], []
    drivers = [] if driver == NONE else [driver]
    if driver != NONE:
        contended = slow is not None or evidence is not None or driver == "queue"
        for d in _second_causes(shares, phases, tail, slow, evidence, prefill_is_mix, workload, p99 - p50, contended):
            if d not in drivers:
                drivers.append(d)
    if driver == "queue" and saturated is None and _burst_share(phases, tail) < BURST_TAIL_SHARE:
        # a queue tail neither in a burst nor saturated is the load's: a cause seen in its own phase comes first
        own = [d for d in drivers if (d == "frontend" and phases.front()) or (d == "prefill" and phases.stall())]
        if own:
            driver = own[0]
            drivers = own + [d for d in drivers if d not in own and d != "queue"]
    split: dict[str, float] | None = None
    if quantity == "ttft" and len(drivers) >= 2 and _own_part(driver, slow, phases):
        # two causes seen request by request: the one holding the tail's excess comes first (tailcauses.tail_parts)
        long_prompts = phases.long_share() >= LONG_PROMPT_WORKLOAD
        split = tail_parts(phases.f, phases.win.i["prompt"], phases.comp, tail, p50, slow, long_prompts)
        lead = max((d for d in drivers if _own_part(d, slow, phases)), key=lambda d: split.get(d, 0.0))
        if lead != driver and split.get(lead, 0.0) >= max(SECOND_SHARE, LEAD_FACTOR * split.get(driver, 0.0)):
            drivers = [lead, *(d for d in drivers if d != lead)]
            driver = lead
            placement = placement if lead in PLACEMENT else None
            separator = None
    shown = placement or separator
    if driver == PREEMPTION and preemption is not None:
        shown = preemption
    return {
        "requests": round(total),
        "p50_s": p50,
        "p99_s": p99,
        "tail_ratio": ratio if math.isfinite(ratio) else None,
        "tail_band_requests": len(tail),
        "median_band_requests": len(mid),
        "band_gap_s": gap,
        "shares": {p: round(v, 4) for p, v in shares.items()},
        "dominant_phase": top_phase,
        "dominant_share": round(shares[top_phase], 4),
        "separators": separators[:8],
        "driver": driver,
        "drivers": drivers,
        "phase": named_phase if driver != NONE else NONE,
        "attribute": _attr_text(shown) if driver != NONE else NONE,
        "confident": driver != NONE,
        "why_not": "; ".join(reasons) if driver == NONE else None,
        "slow_placement": slow,
        "preemption": preemption,
        "saturated": saturated,
        "prompt_workload": workload,
        "prefill_stall": phases.stall() if "prefill" in drivers else None,
        "tail_parts": split,
        "headline": _headline(
            quantity,
            p50,
            p99,
            shares,
            named_phase,
            driver,
            shown,
            reasons,
            placement,
            phases.stall(),
            phases.front(),
            phases.long_share(),
        )
        + _also(drivers[1:], shares, slow, evidence, phases.stall(), phases.front(), phases.long_share()),
    }


def _e2e(
    win: Window,
    phases: _Phases,
    weights: list[float] | None,
    groups: _Groups,
) -> dict[str, Any] | None:
    """e2e by phase; when output length holds most of its gap, the verdict is the one on the e2e beyond it."""
    e2e = win.f["e2e"]
    raw = _decompose("e2e", e2e, PHASES["e2e"], phases, weights, groups)
    if raw is None or raw["dominant_phase"] != "output_length" or raw["dominant_share"] < DOMINANT_SHARE:
        return raw
    excess = phases.beyond_length(e2e)
    beyond = _decompose("e2e beyond output length", excess, PHASES["e2e"][:-1], phases, weights, groups)
    raw["beyond_output_length"] = beyond
    if beyond is not None:
        floor = BEYOND_MIN * raw["p50_s"]
        if beyond["confident"] and beyond["band_gap_s"] < floor:
            beyond["why_not"] = (
                f"its tail gap {_ms(beyond['band_gap_s'])} is under {BEYOND_MIN:.0%} of the e2e median ({_ms(floor)})"
            )
            beyond["driver"] = beyond["phase"] = beyond["attribute"] = NONE
            beyond["confident"] = False
            beyond["headline"] = beyond["headline"].split(": ", 1)[0] + f": no dominant driver ({beyond['why_not']})"
        for key in ("driver", "phase", "attribute", "confident", "why_not"):
            raw[key] = beyond[key]
        head = raw["headline"].split(": ", 1)[0]
        raw["headline"] = (
            f"{head}: {raw['dominant_share']:.0%} of the gap is output length (the workload); "
            f"e2e beyond output length {beyond['headline'].split(': ', 1)[1]}"
        )
    return raw


def _own_part(cause: str, slow: Mapping[str, Any] | None, phases: _Phases) -> bool:
    """Whether ``cause`` shows on each request (:func:`tailcauses.tail_parts`): a slow rank, a front-end delay, a
    prefill stall or a long-prompt workload."""
    if cause in PLACEMENT:
        return slow is not None and slow["attribute"] == cause
    if cause == "frontend":
        return phases.front() is not None
    return cause == "prefill" and (phases.stall() is not None or phases.long_share() >= LONG_PROMPT_WORKLOAD)


def _counts_preemptions(phases: _Phases) -> bool:
    """Whether the window's spans count preemptions (``vllm.num_preemptions``; stock vLLM spans do not)."""
    return any(v >= 0 for v in phases.win.i["preemptions"][:: max(1, len(phases.win) // 64)])


def _preemption_evidence(
    phases: _Phases,
    separators: list[dict[str, Any]],
    tail: list[int],
    total: float,
    signals: EngineSignals | None,
) -> dict[str, Any] | None:
    """Enough preemptions in the window for the KV cache to explain a tail, with the tests' figures, or None.

    From the spans (``preempted=yes``) when they count preemptions, else from the engine's preemption counter over
    the window (:class:`~inferwatch.agent.node.analytics.tailcauses.EngineSignals`): at least
    :data:`PREEMPTED_MIN_SHARE` of the window's requests, and at least :data:`PREEMPTED_MIN`.
    """
    yes = next((s for s in separators if s["attribute"] == "preempted" and s["value"] == "yes"), None)
    if yes is not None:
        if yes["share_of_requests"] < PREEMPTED_MIN_SHARE or yes["share_of_requests"] * total < PREEMPTED_MIN:
            return None
        return {**yes, "tail_in_flight_with_preempted": round(phases.in_flight_with_preempted(tail), 4)}
    if _counts_preemptions(phases) or signals is None or signals.preemptions is None or total <= 0:
        return None
    n = signals.preemptions
    if n < PREEMPTED_MIN or n / total < PREEMPTED_MIN_SHARE:
        return None
    return {
        "attribute": "preemptions",
        "value": f"{n:.0f}",
        "share_of_requests": round(min(1.0, n / total), 4),
        "source": "engine preemption counter",
    }


def _preemption(evidence: dict[str, Any] | None, top: str, share: float) -> dict[str, Any] | None:
    """The evidence that KV-cache preemptions explain an engine phase holding the gap, or None.

    vLLM preempts a running request only when no KV block is free (it is recomputed from the head of the queue),
    and while blocks are short no waiting request is admitted. So with enough preemptions
    (:func:`_preemption_evidence`): a *queue* tail is explained when at least :data:`PREEMPT_IN_FLIGHT` of the tail
    band was in flight beside a preempted request (waiting for blocks, or behind the re-queued); a *prefill* or
    *decode* tail (the recomputation is charged to the preempted request itself) when preempted requests are at
    least :data:`PREEMPT_LIFT` times more common in the tail than in the window. From the engine's counter alone
    (no request marked) the count is the evidence: an engine phase holding the gap while blocks ran out.
    """
    if evidence is None or share < DOMINANT_SHARE:
        return None
    if "lift" not in evidence:
        return evidence
    if top == "queue":
        return evidence if evidence["tail_in_flight_with_preempted"] >= PREEMPT_IN_FLIGHT else None
    return evidence if evidence["lift"] >= PREEMPT_LIFT else None


def _saturated(phases: _Phases, mid: list[int], weights: list[float] | None) -> dict[str, Any] | None:
    """The median band's queue wait and TTFT when the median request itself waited (saturation), else None."""
    if not mid or not phases.clean("queue") or not phases.clean("ttft"):
        return None
    queue, ttft = mean(mid, phases.f["queue"], weights), mean(mid, phases.f["ttft"], weights)
    if ttft <= 0 or queue < SATURATED_QUEUE_SHARE * ttft or queue < SATURATED_MIN_S:
        return None
    return {"median_band_queue_s": round(queue, 4), "median_band_ttft_s": round(ttft, 4)}


def _phase_cause(
    p: str, shares: Mapping[str, float], phases: _Phases, tail: list[int], mix: bool, workload: Any
) -> bool:
    """Whether phase ``p`` holds at least :data:`SECOND_SHARE` of the gap as a cause of its own."""
    if shares.get(p, 0.0) < SECOND_SHARE:
        return False
    if p == "prefill":
        return not mix
    if p == "queue":
        win = phases.win
        return _burst_share(phases, tail) >= BURST_TAIL_SHARE if len(win) else False
    return p == "frontend"


def _phase_causes(shares: Mapping[str, float], phases: _Phases, tail: list[int], mix: bool, workload: Any) -> list[str]:
    """The phases holding at least :data:`SECOND_SHARE` of the gap each as a cause of its own, largest first."""
    names = sorted((p for p in ("frontend", "queue", "prefill") if p in shares), key=lambda p: -shares[p])
    return [p for p in names if _phase_cause(p, shares, phases, tail, mix, workload)]


def _second_causes(
    shares: Mapping[str, float],
    phases: _Phases,
    tail: list[int],
    slow: Mapping[str, Any] | None,
    evidence: Mapping[str, Any] | None,
    mix: bool,
    workload: Any,
    ttft_spread: float,
    contended: bool = False,
) -> list[str]:
    """Every cause with evidence of its own beside the first driver (module tailcauses): a rank slower per token,
    preemptions, then the phases that hold :data:`SECOND_SHARE` of the gap as causes of their own.

    ``contended``: a slow rank, KV-cache preemptions or arrivals above capacity are named; they stretch prefill too
    (the slow rank's prefills run at its pace, recomputation and full batches share the steps), so prefill is then a
    cause of its own only with its own evidence: a stall (:func:`tailcauses.prefill_stall`) or long prompts."""
    out = []
    if slow is not None:
        out.append(str(slow["attribute"]))
    if evidence is not None and (
        "lift" not in evidence
        or evidence["lift"] >= PREEMPT_LIFT
        or evidence["tail_in_flight_with_preempted"] >= PREEMPT_IN_FLIGHT
    ):
        out.append(PREEMPTION)
    out += _phase_causes(shares, phases, tail, mix, workload)
    if contended and "prefill" in out:
        out.remove("prefill")  # its share of the gap is the contention's
    if phases.stall() is not None:
        out.append("prefill")
    if contended and phases.long_share() >= LONG_PROMPT_WORKLOAD:
        out.append("prefill")  # long prompts, whose own tail the contention's hides
    if phases.front() is not None:
        out.append("frontend")
    if phases.clean("queue") and phases.clean("prefill") and phases.clean("ttft"):
        if phases._spreads is None:
            phases._spreads = own_spreads(phases.f, phases.win.i["prompt"])
        own = own_tails(phases._spreads, ttft_spread)
        if contended and "prefill" in own and phases._spreads.get("long_prompts", 0.0) < SECOND_SHARE * ttft_spread:
            own.remove("prefill")  # prefill beyond prompt length spreads under contention too
        out += own
        if "queue" not in out and _queue_burst(phases, ttft_spread):
            out.append("queue")
    return out


def _queue_burst(phases: _Phases, ttft_spread: float) -> bool:
    """Whether the queue's own tail (the longest waits, on a sample of the window) is at least :data:`SECOND_SHARE`
    of the TTFT's spread and arrived in a burst: queueing from arrivals, even where another cause holds the tail."""
    if phases._queue_tail is None:
        queue = phases.f["queue"]
        n = len(queue)
        if n < MIN_REQUESTS:
            phases._queue_tail = (0.0, 0.0)
        else:
            idx = range(0, n, max(1, n // OWN_TAIL_SAMPLE))
            top = heapq.nlargest(max(5, len(idx) // 50), idx, key=queue.__getitem__)
            waits = sorted(queue[j] for j in idx)
            phases._queue_tail = (queue[top[-1]] - waits[len(waits) // 2], _burst_share(phases, top))
    spread, share = phases._queue_tail
    return spread >= SECOND_SHARE * ttft_spread and share >= BURST_TAIL_SHARE


def _burst_share(phases: _Phases, tail: list[int]) -> float:
    """The share of the tail band that arrived in a burst (:func:`tailcauses.burst`), arrivals computed once."""
    t, e2e = phases.f["t"], phases.f["e2e"]
    step = max(1, len(t) // OWN_TAIL_SAMPLE)  # the rate around an arrival from a systematic sample of the window
    if phases._arrivals is None:
        phases._arrivals = sorted(a - d for a, d in zip(t[::step], e2e[::step], strict=True) if d == d)
    mine = [t[j] - e2e[j] for j in tail if e2e[j] == e2e[j]]
    return burst(phases._arrivals, mine, phases.win.covered_s)


def _stall_text(stall: Mapping[str, Any]) -> str:
    return (
        f"prefill stalls: {stall['share_of_requests']:.0%} of requests waited a median {_ms(stall['median_stall_s'])} "
        f"before prefill ({stall['prefill_over_prompt']:.0f}x their prompt's prefill time)"
    )


def _long_text(long_share: float) -> str:
    return f"long prompts ({long_share:.1%} of requests at {LONG_PROMPT_FACTOR:g}x the median prompt)"


def _front_text(front: Mapping[str, Any]) -> str:
    return (
        f"front-end delays: {front['share_of_requests']:.0%} of requests waited a median "
        f"{_ms(front['median_delay_s'])} more in the front end"
    )


def _also(
    more: list[str],
    shares: Mapping[str, float],
    slow: Mapping[str, Any] | None,
    evidence: Mapping[str, Any] | None,
    stall: Mapping[str, Any] | None = None,
    front: Mapping[str, Any] | None = None,
    long_share: float = 0.0,
) -> str:
    """The headline's tail naming the second causes with their evidence."""
    parts = []
    for d in more:
        if d == "prefill" and stall is not None:
            parts.append(_stall_text(stall))
        elif d == "prefill" and long_share >= LONG_PROMPT_WORKLOAD:
            parts.append(_long_text(long_share))
        elif d == "frontend" and front is not None:
            parts.append(_front_text(front))
        elif d in PLACEMENT and slow is not None:
            parts.append(f"{slow['attribute']}={slow['value']} {slow['itl_ratio']:.1f}x slower per output token")
        elif d == PREEMPTION and evidence is not None:
            parts.append(f"KV-cache preemptions on {evidence['share_of_requests']:.0%} of requests")
        elif d in shares:
            parts.append(f"{d} {shares[d]:.0%} of the gap")
    return f"; also {', '.join(parts)}" if parts else ""


def _attr_text(sep: Mapping[str, Any] | None) -> str:
    return f"{sep['attribute']}={sep['value']}" if sep else NONE


def _ms(s: float) -> str:
    return f"{s:.2f} s" if s >= 1 else f"{1000 * s:.0f} ms"


def _headline(
    quantity: str,
    p50: float,
    p99: float,
    shares: Mapping[str, float],
    top: str,
    driver: str,
    sep: Mapping[str, Any] | None,
    reasons: list[str],
    placement: Mapping[str, Any] | None = None,
    stall: Mapping[str, Any] | None = None,
    front: Mapping[str, Any] | None = None,
    long_share: float = 0.0,
) -> str:
    q = {"ttft": "TTFT", "e2e": "e2e"}.get(quantity, quantity)
    head = f"P99 {q} {_ms(p99)} vs P50 {_ms(p50)}: "
    if driver == NONE:
        return head + f"no dominant driver ({'; '.join(reasons)})"
    if driver == "prefill" and top != "prefill" and stall is not None:
        return head + f"{shares[top]:.0%} of the gap is {top} behind {_stall_text(stall)}"
    if driver == "prefill" and sep is None and stall is not None:
        return head + f"{shares[top]:.0%} of the gap is {top}; {_stall_text(stall)}"
    if driver == "prefill" and top != "prefill" and long_share >= LONG_PROMPT_WORKLOAD:
        return head + f"{shares[top]:.0%} of the gap is {top} behind {_long_text(long_share)}"
    if driver == "frontend" and top != "frontend" and front is not None:
        return head + f"{_front_text(front)}; {shares[top]:.0%} of the gap is {top}"
    if driver in PLACEMENT and sep is not None and sep.get("source") and not sep.get("share_of_requests"):
        return head + (
            f"{sep['attribute']}={sep['value']} is {sep['itl_ratio']:.1f}x slower per output token than the other "
            f"ranks (mean ITL {_ms(sep['median_itl_s'])} vs {_ms(sep['others_median_itl_s'])}, the {sep['source']}; "
            f"{shares[top]:.0%} of the gap is {top})"
        )
    if driver in PLACEMENT and sep is not None:
        slow = (
            f" and {sep['itl_ratio']:.1f}x slower per output token (median ITL {_ms(sep['median_itl_s'])} vs "
            f"{_ms(sep['others_median_itl_s'])})"
            if "itl_ratio" in sep
            else ""
        )
        return head + (
            f"{sep['attribute']}={sep['value']} is {sep['share_of_requests']:.0%} of requests and "
            f"{sep['share_of_tail']:.0%} of the tail{slow} ({shares[top]:.0%} of the gap is {top})"
        )
    if driver == PREEMPTION and sep is not None and sep.get("value") == "ran out":
        usage = f", KV-cache usage up to {sep['kv_usage_max']:.0%}" if sep.get("kv_usage_max") is not None else ""
        return head + (
            f"{shares[top]:.0%} of the gap is {top} while the KV cache ran out ({sep['preemptions']:.0f} "
            f"preemptions{usage}, the engine's series): waiting requests were not admitted for want of blocks"
        )
    if driver == PREEMPTION and sep is not None and "lift" not in sep:
        return head + (
            f"{shares[top]:.0%} of the gap is {top} under KV-cache preemptions: {sep['value']} preemptions in the "
            f"window ({sep['share_of_requests']:.0%} of its requests, the {sep['source']})"
        )
    if driver == PREEMPTION and sep is not None:
        text = head + (
            f"{shares[top]:.0%} of the gap is {top} under KV-cache preemptions: {sep['share_of_requests']:.0%} of "
            f"requests were preempted, {sep['share_of_tail']:.0%} of the tail, and "
            f"{sep['tail_in_flight_with_preempted']:.0%} of the tail was in flight beside a preempted request"
        )
        if placement is not None:
            text += (
                f"; {placement['attribute']}={placement['value']} is {placement['share_of_requests']:.0%} of"
                f" requests and {placement['share_of_tail']:.0%} of the tail"
            )
        return text
    text = head + f"{shares[top]:.0%} of the gap is {top}"
    if sep is not None:
        text += (
            f"; {sep['attribute']}={sep['value']} is {sep['share_of_requests']:.0%} of requests"
            f" and {sep['share_of_tail']:.0%} of the tail"
        )
    return text


def explain(
    records: RequestRecords,
    model: str,
    window_s: float,
    now: float,
    top: int = DEFAULT_TOP,
    by: str = "ttft",
    aliases: Iterable[str] = (),
    client: Mapping[str, float] | None = None,
    signals: EngineSignals | None = None,
) -> dict[str, Any] | None:
    """The explanation of ``model``'s tail over the last ``window_s`` (None: no record of it in the window).

    ``aliases`` are the names its spans may carry instead (``unknown`` when vLLM's spans name no model).
    ``client`` maps a trace id to the TTFT a client saw (its CLIENT span): with it the report gains ``client``
    (:func:`_client`) and each slow request its client TTFT and client − engine TTFT. ``signals``: the engine's
    preemption counter and per-rank ITL over the same window, for spans that carry neither (stock vLLM).
    """
    if by not in QUANTITIES:
        raise ValueError(f"by must be one of {', '.join(QUANTITIES)}, got {by!r}")
    win = records.window([model, *aliases], window_s, now)
    if not len(win):
        return None
    sampled = win.f["weight"].count(1.0) != len(win)
    weights = list(win.f["weight"]) if sampled else None
    phases = _Phases(win, signals)
    itl_med = phases.itl_med
    groups = _group_keys(win)
    out: dict[str, Any] = {
        "model": model,
        "source": "spans",
        "window_s": window_s,
        "covered_s": round(win.covered_s, 1),
        "requests": len(win),
        "sampled": sampled,
        "median_itl_s": itl_med,
        "engine_signals": _signals_row(signals),
        "quantities": {
            "ttft": _decompose("ttft", win.f["ttft"], PHASES["ttft"], phases, weights, groups),
            "e2e": _e2e(win, phases, weights, groups),
        },
    }
    client_col = _client_column(win, client) if client else None
    if client_col is not None:
        out["client"] = _client(win, phases, client_col, weights)
    values = win.f[by]
    rows = max(0, min(top, MAX_TOP))
    candidates: Sequence[int] = phases.tails.get(by, ())
    if len(candidates) < rows:  # a small window, or records without the phases: rank them all
        candidates = range(len(values)) if (t := sum(values)) == t else [j for j, v in enumerate(values) if v == v]
    slowest = heapq.nlargest(rows, candidates, key=values.__getitem__) if rows else []
    out["slowest_by"] = by
    out["slowest"] = [_request_row(win, phases, j, client_col) for j in slowest]
    return out


def _signals_row(signals: EngineSignals | None) -> dict[str, Any] | None:
    """What the engine's own series said over the window (the verdict weighs them for stock spans), or None."""
    if signals is None:
        return None
    return {
        "preemptions": signals.preemptions,
        "rank_mean_itl_s": dict(signals.rank_itl_s),
        "kv_usage_max": signals.kv_usage_max,
    }


def _client_column(win: Window, client: Mapping[str, float]) -> list[float] | None:
    """Per record the client's TTFT for its trace (NaN where no client span came); None when none matched."""
    col = [client.get(t, _NAN) if (t := win.trace_id(j)) else _NAN for j in range(len(win))]
    return col if any(v == v for v in col) else None


def _client(win: Window, phases: _Phases, client: Sequence[float], weights: list[float] | None) -> dict[str, Any]:
    """Client TTFT reconciled with the engine's: client_gap = client TTFT − engine TTFT per request, and which part
    (:data:`CLIENT_PARTS`) holds the client-TTFT tail gap, with a verdict under the same rules as the engine's
    (enough requests, a real tail, one part with at least :data:`DOMINANT_SHARE` of the gap)."""
    ttft = win.f["ttft"]
    parts = {p: phases.at(p, list(range(len(win)))) for p in CLIENT_PARTS[1:]}
    gap_col = [c - t for c, t in zip(client, ttft, strict=True)]
    idx = [
        j
        for j, c in enumerate(client)
        if c == c and gap_col[j] == gap_col[j] and all(v[j] == v[j] for v in parts.values())
    ]
    out: dict[str, Any] = {"requests": len(idx), "driver": NONE, "confident": False}
    if not idx:
        out["why_not"] = "no client span matched an engine span with the phases"
        out["headline"] = f"client TTFT: {out['why_not']}"
        return out
    parts["client_gap"] = gap_col
    if weights is None:
        total = float(len(idx))
        tail, mid, p50, p99 = bands_by_value(idx, client)
    else:
        order = sorted(idx, key=client.__getitem__)
        total = math.fsum(weights[j] for j in idx)
        p50, p99 = (client[quantile(order, weights, total, q)] for q in (0.5, 0.99))
        tail, mid = bands(order, weights, total)
    gaps = sorted(gap_col[j] for j in idx)
    band_gap = mean(tail, client, weights) - mean(mid, client, weights)
    shares = {
        p: (mean(tail, parts[p], weights) - mean(mid, parts[p], weights)) / band_gap if band_gap > 0 else 0.0
        for p in CLIENT_PARTS
    }
    top = max(shares, key=shares.__getitem__)
    reasons = []
    if total < MIN_REQUESTS:
        reasons.append(f"{total:.0f} requests with a client span < {MIN_REQUESTS}")
    if p50 > 0 and p99 / p50 < TAIL_RATIO_MIN:
        reasons.append(f"client P99/P50 {p99 / p50:.2f} < {TAIL_RATIO_MIN:g}")
    if p99 - p50 < TAIL_GAP_MIN_S:
        reasons.append(f"client P99 - P50 {1000 * (p99 - p50):.0f} ms < {1000 * TAIL_GAP_MIN_S:.0f} ms")
    if not reasons and shares[top] < DOMINANT_SHARE:
        reasons.append(f"no part holds {DOMINANT_SHARE:.0%} of the gap (largest: {top} {shares[top]:.0%})")
    driver = NONE if reasons else top
    head = (
        f"P99 client TTFT {_ms(p99)} vs P50 {_ms(p50)} (client - engine TTFT median {_ms(gaps[len(gaps) // 2])}, "
        f"max {_ms(gaps[-1])}): "
    )
    out.update(
        {
            "p50_s": p50,
            "p99_s": p99,
            "gap_p50_s": gaps[len(gaps) // 2],
            "gap_p99_s": gaps[min(len(gaps) - 1, int(0.99 * len(gaps)))],
            "band_gap_s": band_gap,
            "shares": {p: round(v, 4) for p, v in shares.items()},
            "dominant_part": top,
            "driver": driver,
            "confident": driver != NONE,
            "why_not": "; ".join(reasons) or None,
            "headline": head
            + (
                f"{shares[top]:.0%} of the gap is {top}, {CLIENT_PART_NAMES[top]}"
                if driver != NONE
                else f"no dominant part ({'; '.join(reasons)})"
            ),
        }
    )
    return out


def _num(x: float) -> float | None:
    return round(x, 6) if x == x else None


def _request_row(win: Window, phases: _Phases, j: int, client: Sequence[float] | None = None) -> dict[str, Any]:
    f, i = win.f, win.i
    seen = client[j] if client is not None else _NAN
    return {
        "request_id": win.requests[j],
        "trace_id": win.trace_id(j),
        "age_s": round(win.now - f["t"][j], 1),
        "prompt_tokens": i["prompt"][j] if i["prompt"][j] >= 0 else None,
        "completion_tokens": i["completion"][j] if i["completion"][j] >= 0 else None,
        "queue_s": _num(f["queue"][j]),
        "prefill_s": _num(f["prefill"][j]),
        "decode_s": _num(f["decode"][j]),
        "preemptions": i["preemptions"][j] if i["preemptions"][j] >= 0 else None,
        "ttft_s": _num(f["ttft"][j]),
        "e2e_s": _num(f["e2e"][j]),
        "frontend_gap_s": _num(phases.at("frontend", [j])[0]),
        "client_ttft_s": _num(seen),
        "client_gap_s": _num(seen - f["ttft"][j]),
        "labels": dict(win.label_sets[win.codes[j] >> 5]),
    }


def explain_histograms(
    quantiles: Mapping[tuple[str, float], float], model: str, window: str, requests: float | None
) -> dict[str, Any]:
    """A coarse answer from histogram quantiles (``(quantity, quantile) -> seconds``), without spans.

    Each phase's share is its own P99 − P50 over the sum of the phases' P99 − P50: quantiles do not add, so
    this only ranks the phases; it names no request and tests no attribute.
    """
    out: dict[str, Any] = {
        "model": model,
        "source": "histogram",
        "window": window,
        "requests": requests,
        "note": "no spans for this model: phases ranked by their own histogram P99 - P50 (quantiles do not add; "
        "no request can be named, no attribute tested). Send the engine's OTLP spans to the agent for the "
        "exact decomposition.",
        "quantities": {},
        "slowest": [],
    }
    for q, names in (("ttft", ("queue", "prefill")), ("e2e", ("queue", "prefill", "decode"))):
        p50, p99 = quantiles.get((q, 0.5)), quantiles.get((q, 0.99))
        spreads = {
            p: max(0.0, quantiles[(p, 0.99)] - quantiles[(p, 0.5)])
            for p in names
            if (p, 0.5) in quantiles and (p, 0.99) in quantiles
        }
        if p50 is None or p99 is None or not spreads:
            out["quantities"][q] = None
            continue
        total = sum(spreads.values())
        shares = {p: (v / total if total else 0.0) for p, v in spreads.items()}
        top = max(shares, key=shares.__getitem__)
        ratio = p99 / p50 if p50 > 0 else math.inf
        reasons = []
        if requests is not None and requests < MIN_REQUESTS:
            reasons.append(f"{requests:.0f} requests < {MIN_REQUESTS}")
        if ratio < TAIL_RATIO_MIN:
            reasons.append(f"P99/P50 {ratio:.2f} < {TAIL_RATIO_MIN:g}")
        if shares[top] < DOMINANT_SHARE:
            reasons.append(f"no phase holds {DOMINANT_SHARE:.0%} of the spread")
        driver = NONE if reasons else top
        out["quantities"][q] = {
            "p50_s": p50,
            "p99_s": p99,
            "tail_ratio": ratio if math.isfinite(ratio) else None,
            "shares": {p: round(v, 4) for p, v in shares.items()},
            "dominant_phase": top,
            "dominant_share": round(shares[top], 4),
            "separators": [],
            "driver": driver,
            "phase": top if driver != NONE else NONE,
            "attribute": NONE,
            "confident": driver != NONE,
            "why_not": "; ".join(reasons) or None,
            "headline": _headline(q, p50, p99, shares, top, driver, None, reasons) + " (from histograms)",
        }
    return out


def driver_samples(report: Mapping[str, Any], label: str, window: str) -> list[Sample]:
    """``inferwatch.engine.tail.driver``: one series per quantity, the verdict in its labels, the share as value."""
    out = []
    for q in QUANTITIES:
        d = report["quantities"].get(q)
        if not d:
            continue
        a = attrs(
            {
                MODEL: label,
                "quantity": q,
                "window": window,
                "phase": d["phase"] if d["confident"] else NONE,
                "attribute": d["attribute"] if d["confident"] else NONE,
                "source": report["source"],
            }
        )
        out.append(Sample("inferwatch.engine.tail.driver", float(d["dominant_share"]), a))
    return out


class TailExplainer:
    """The records and the clock they are stamped with; what the processor, the API and the metrics call."""

    def __init__(
        self,
        records: RequestRecords | None = None,
        clock: Callable[[], float] = time.monotonic,
        trace_url: str | None = None,
    ) -> None:
        self.records = records or RequestRecords()
        self.trace_url = trace_url  # a trace's page up to its id (receiver.trace_url): each slow request links there
        self.clock = clock
        self._cached: tuple[tuple[int, tuple[str, ...]], list[Sample]] | None = None
        self.failures = ModelFailures("explain")  # models whose verdict raised: left out, counted
        self.client = ClientTTFTs()
        self.engine = EngineCounters()  # the engine's preemption counter and per-rank ITL: stock spans lack both

    def observe_engine(self, samples: Iterable[Any], rank_itl: Mapping[str, Any] | None = None) -> None:
        """The engine collector's last collection: its ``inferwatch.engine.preemptions`` counter per model and
        (``rank_itl``, its ``details["rank_itl"]``) each data-parallel rank's cumulative ITL sum and count per model,
        kept with the time read, so a window's verdict weighs the preemptions and each rank's mean ITL over that same
        window (stock vLLM spans carry neither a preemption count nor a rank)."""
        now = self.clock()
        for s in samples:
            if isinstance(s, Sample) and s.name == "inferwatch.engine.preemptions":
                self.engine.observe(dict(s.attributes).get(MODEL, ""), float(s.value), now)
            elif isinstance(s, Sample) and s.name == "inferwatch.engine.kv_cache.usage":
                self.engine.observe_kv(dict(s.attributes).get(MODEL, ""), float(s.value), now)
        for model, ranks in (rank_itl or {}).items():
            self.engine.observe_ranks(model, ranks, now)

    def record(self, timings: list[RequestTiming]) -> None:
        self.records.add(timings, self.clock())

    def record_client(self, pairs: Iterable[tuple[str, float]]) -> None:
        """Clients' own TTFTs by trace id (CLIENT spans), set beside the engine records when explaining."""
        self.client.add(pairs, self.clock())

    def names_for(self, model: str, engine_models: Sequence[str] = ()) -> list[str]:
        """The record names that stand for ``model``: itself, and ``unknown`` when it is the engine's one model."""
        names = [model]
        if len(engine_models) == 1 and engine_models[0] == model and model != UNKNOWN_MODEL:
            names.append(UNKNOWN_MODEL)
        return names

    def explain(
        self,
        model: str,
        window_s: float,
        top: int = DEFAULT_TOP,
        by: str = "ttft",
        engine_models: Sequence[str] = (),
    ) -> dict[str, Any] | None:
        first, *aliases = self.names_for(model, engine_models)
        now = self.clock()
        signals = self.engine.signals([model, *engine_models[:1]], window_s, now)
        report = explain(self.records, first, window_s, now, top, by, aliases, self.client.snapshot(now), signals)
        if report is not None:
            for row in report["slowest"]:
                row["trace_url"] = f"{self.trace_url}{row['trace_id']}" if self.trace_url and row["trace_id"] else None
        return report

    def samples(self, engine_models: Sequence[str], published: Mapping[tuple[str, str, str], Any]) -> list[Sample]:
        """``inferwatch.engine.tail.driver`` over :data:`METRIC_WINDOW` for every model with records in it.

        Recomputed at most once per 10 s sub-window (a scrape pulls the processor forward; a 5-minute verdict
        does not change faster), else the last samples are returned.
        """
        now = self.clock()
        slot = math.floor(now / SUB_WINDOW_S)
        key = (slot, tuple(engine_models))
        if self._cached is not None and self._cached[0] == key:
            return list(self._cached[1])
        names = self.records.models()
        out: list[Sample] = []
        for name in names:  # one model at a time: a model whose records break the explainer loses its verdict, alone
            label = name
            if name == UNKNOWN_MODEL and len(engine_models) == 1 and engine_models[0] not in names:
                label = engine_models[0]
            got = self.failures.run(name, partial(self._verdict, name, label, published, now))
            out.extend(got or ())
        self.failures.keep(names)
        self._cached = (key, out)
        return list(out)

    def _verdict(
        self, name: str, label: str, published: Mapping[tuple[str, str, str], Any], now: float
    ) -> list[Sample]:
        ttft, e2e = (published.get((label, q, METRIC_WINDOW)) for q in QUANTITIES)
        if ttft is not None and e2e is not None:
            self.records.slow[name] = (ttft.quantiles[0.95], e2e.quantiles[0.95])
        window_s = WINDOW_SECONDS[METRIC_WINDOW]
        signals = self.engine.signals([label], window_s, now)
        report = explain(self.records, name, window_s, now, top=0, signals=signals)
        return driver_samples(report, label, METRIC_WINDOW) if report is not None else []


class RecordingSink:
    """The receiver's timing sink: the span analytics first, then the explainer's records (same timings)."""

    def __init__(self, analytics: _Sink, explainer: TailExplainer) -> None:
        self.analytics = analytics
        self.explainer = explainer

    def record(self, timings: Iterable[RequestTiming]) -> int:
        batch = list(timings)
        dropped = self.analytics.record(batch)
        self.explainer.record(batch)
        return dropped

    def record_client(self, pairs: Iterable[tuple[str, float]]) -> None:
        self.explainer.record_client(pairs)


def histogram_quantiles(
    samples: Iterable[Any], model: str, window: str
) -> tuple[dict[tuple[str, float], float], float | None]:
    """``(quantity, quantile) -> seconds`` and the TTFT request count from ``source="histogram"`` latency samples."""
    quantiles: dict[tuple[str, float], float] = {}
    requests = None
    for s in samples:
        if s.name not in ("inferwatch.engine.latency", "inferwatch.engine.latency.samples"):
            continue
        a = dict(s.attributes)
        if a.get(MODEL) != model or a.get("window") != window or a.get("source") != "histogram":
            continue
        if s.name == "inferwatch.engine.latency.samples":
            if a.get("quantity") == "ttft":
                requests = float(s.value)
        else:
            quantiles[(a.get("quantity", ""), float(a.get("quantile", "nan")))] = float(s.value)
    return quantiles, requests


def parse_window(text: str) -> float:
    """``30s``, ``1m``, ``5m`` (up to :data:`HORIZON_S`) in seconds; ValueError otherwise."""
    t = text.strip().lower()
    unit = {"s": 1.0, "m": 60.0}.get(t[-1:]) if t else None
    try:
        value = float(t[:-1]) * unit if unit else float("nan")
    except ValueError:
        value = float("nan")
    if not 0 < value <= HORIZON_S:
        raise ValueError(f"window must be like 30s, 1m or 5m (at most {HORIZON_S:.0f}s), got {text!r}")
    return value
