"""Why is the tail slow? The slowest requests, the phase that accounts for P99 − P50, and who is in the tail.

Input: the per-request records the span analytics keep (:class:`RequestRecords`, fed by
:meth:`~inferwatch.agent.node.analytics.latency.LatencyAnalytics.record` from the receiver's spans). Output: an
explanation (:func:`explain`, a JSON-ready dict) for one model and window, and from it the agent metric
``inferwatch.engine.tail.driver`` (:func:`driver_samples`) that the tail-latency alerts quote.

**Phases.** vLLM's span gives TTFT, e2e, queue, prefill and decode per request; TTFT = frontend + queue + prefill
and e2e = TTFT + decode, where frontend = TTFT − (queue + prefill) is the time before the engine queued the
request (API server, tokenisation, a proxy). Decode is split into ``output_length`` = (generated tokens − 1) ×
the window's median inter-token latency (a long answer, the workload) and ``decode`` = the rest (slower tokens:
preemptions and recomputation, big batches, a slow rank). Every split is exact per request, so the parts add up.

**Decomposition of the tail.** Requests are ranked by the quantity (TTFT or e2e). The *tail band* is the top
:data:`TAIL_BAND` (2 %) of the window, at least :data:`MIN_TAIL` requests; the *median band* the ranks 40-60 %.
A phase's share is (its mean in the tail band − its mean in the median band) / (the quantity's mean in the
tail band − its mean in the median band); the shares add to 1 (a negative share is a phase shorter in the tail).
That gap of band means stands for P99 − P50, which is also reported.

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
of the gap is queue; dp_rank=1 is 49 % of requests and 100 % of the tail" is a queue burst that one rank took).
``output_length`` is reported as the workload, never as a fault driver. Otherwise the answer is ``none`` ("no
dominant driver"). The thresholds and their measured accuracy are in docs/explain.md (benchmarks/tail_explain.py).

**Bounded records.** :class:`RequestRecords` keeps at most :data:`CAPACITY` requests for all models together,
in columns (about :data:`RECORD_BYTES_MAX` bytes each at most: 7.8 MB in all; request ids are cut to
:data:`MAX_REQUEST_ID_CHARS`), for :data:`HORIZON_S` (the 5m window). Sampling rule above the bound: each 10 s
sub-window may keep :data:`SUB_WINDOW_BUDGET` requests (115 req/s); when the previous sub-window received more,
a request is kept 1 in k (k = ceil(received / budget), systematic by arrival order) with weight k, except that a
request at or above its model's last published P95 TTFT or e2e is always kept, with weight 1, so the slowest
requests are never sampled away. When even that overflows, the oldest records go first (the report says how many
seconds the window really covers). Quantiles and band means are weighted.

Without spans (no records for the model) :func:`explain_histograms` gives a coarser answer from the engine's own
histogram quantiles (queue, prefill, decode, TTFT, e2e; ``source="histogram"``), and says so: quantile
differences do not add, no requests can be named, and no attribute can be tested.
"""

from __future__ import annotations

import heapq
import math
import threading
import time
from array import array
from bisect import bisect_left as _bisect_left
from collections import Counter
from collections.abc import Callable, Iterable, Mapping, Sequence
from dataclasses import dataclass
from functools import partial
from itertools import compress, repeat
from operator import and_, ge, gt, itemgetter, le, sub
from typing import Any, Protocol

from inferwatch.agent.catalog.engine import MODEL
from inferwatch.agent.common.samples import UNKNOWN_MODEL, RequestTiming, Sample, attrs
from inferwatch.agent.node.analytics.failures import ModelFailures

CAPACITY = 36_864
HORIZON_S = 300.0
SUB_WINDOW_S = 10.0
SUB_WINDOW_BUDGET = 1_152  # 30 sub-windows x 1152 = 34 560, the rest of CAPACITY is for the always-kept slow ones
MAX_REQUEST_ID_CHARS = 64
MAX_LABEL_SETS = 4_096  # distinct (dp_rank, lora, tenant) combinations kept; beyond that they read "other"
RECORD_BYTES_MAX = 211  # 7 doubles + 3 int32 + 16-byte trace id + uint16 + uint32 + a list slot + a 64-char str
TAIL_BAND = 0.02
MIN_TAIL = 5
MEDIAN_BAND = (0.40, 0.60)
EXACT_SORT_MAX = 8_192  # above this many records a quantity is not fully sorted: ...
QUANTILE_SAMPLE = 4_096  # ... its middle quantiles come from a sample of this many
MEDIAN_BAND_SAMPLE = 1_024  # above this many records in the median band, its means come from every k-th record
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
PROMPT_BANDS = (1024, 4096, 16384)  # prompt tokens: <=1k, 1k-4k, 4k-16k, >16k
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
# client TTFTs kept by trace id, waiting for (or beside) their engine record: ~3.1 MB when full (measured 6.9 MB for
# 36,864), so at 100 req/s the last ~160 s of requests can be reconciled, all of the 5-minute window below 55 req/s
CLIENT_CAPACITY = 16_384
PREEMPTION = "preemption"  # the driver named when KV-cache preemptions explain an engine phase
METRIC_WINDOW = "5m"  # the window of inferwatch.engine.tail.driver (the alerts' window)
WINDOW_SECONDS = {"1m": 60.0, "5m": 300.0}
_NAN = math.nan


class _Sink(Protocol):
    def record(self, timings: Iterable[RequestTiming]) -> int: ...


def _band_names() -> tuple[str, ...]:
    return (*(prompt_band(b) for b in PROMPT_BANDS), prompt_band(PROMPT_BANDS[-1] + 1))


def prompt_band(tokens: int) -> str:
    if tokens < 0:
        return "unknown"
    lo = 0
    for hi in PROMPT_BANDS:
        if tokens <= hi:
            return f"{_k(lo)}-{_k(hi)}" if lo else f"<={_k(hi)}"
        lo = hi
    return f">{_k(lo)}"


def _k(n: int) -> str:
    return f"{n // 1024}k" if n % 1024 == 0 else str(n)


_BAND_NAMES = _band_names()


class RequestRecords:
    """The last :data:`HORIZON_S` of finished requests, in a fixed ring of columns (thread-safe)."""

    def __init__(self, capacity: int = CAPACITY, budget: int = SUB_WINDOW_BUDGET) -> None:
        self.capacity = capacity
        self.budget = budget
        self._lock = threading.Lock()
        z = [0.0] * capacity
        self._f = {c: array("d", z) for c in ("t", "ttft", "e2e", "queue", "prefill", "decode", "weight")}
        self._i = {c: array("i", [-1] * capacity) for c in ("prompt", "completion", "preemptions")}
        self._model = array("H", [0] * capacity)
        self._code = array("I", [0] * capacity)  # attribute code (:func:`_code`): label set, band, preempted
        self._trace = bytearray(16 * capacity)
        self._request: list[str | None] = [None] * capacity
        self._models: dict[str, int] = {}
        self._model_names: list[str] = []
        self._labels: dict[tuple[tuple[str, str], ...], int] = {(): 0}
        self._label_sets: list[tuple[tuple[str, str], ...]] = [()]
        self._next = 0  # the slot the next record goes to
        self._size = 0
        self._slot = -1  # the current sub-window
        self._received = 0  # requests received in the current sub-window
        self._received_prev = 0
        self._skip = 0
        self.slow: dict[str, tuple[float, float]] = {}  # model -> (P95 TTFT, P95 e2e): always kept
        self.sampled_out = 0
        self.overwritten = 0

    def stride(self) -> int:
        """1 in how many ordinary requests is kept now (1: all)."""
        return max(1, math.ceil(self._received_prev / self.budget)) if self._received_prev > self.budget else 1

    def add(self, timings: Iterable[RequestTiming], now: float) -> None:
        with self._lock:
            self._expire(now)
            slot = math.floor(now / SUB_WINDOW_S)
            if slot != self._slot:
                self._received_prev = self._received if slot == self._slot + 1 else 0
                self._slot, self._received = slot, 0
            for t in timings:
                self._received += 1
                k = self.stride()
                s = t.seconds
                ttft, e2e = s.get("ttft", _NAN), s.get("e2e", _NAN)
                weight = 1.0
                if k > 1:
                    p95 = self.slow.get(t.model)
                    if p95 is None or not (ttft >= p95[0] or e2e >= p95[1]):
                        self._skip += 1
                        if self._skip % k:
                            self.sampled_out += 1
                            continue
                        weight = float(k)
                self._put(t, now, ttft, e2e, weight)

    def _put(self, t: RequestTiming, now: float, ttft: float, e2e: float, weight: float) -> None:
        i = self._next
        if self._size == self.capacity:
            self.overwritten += 1
        else:
            self._size += 1
        self._next = (i + 1) % self.capacity
        f, s = self._f, t.seconds
        f["t"][i] = now
        f["ttft"][i] = ttft
        f["e2e"][i] = e2e
        f["queue"][i] = s.get("queue", _NAN)
        f["prefill"][i] = s.get("prefill", _NAN)
        f["decode"][i] = s.get("decode", _NAN)
        f["weight"][i] = weight
        ints = self._i
        ints["prompt"][i] = t.prompt_tokens if t.prompt_tokens is not None and t.prompt_tokens < 2**31 else -1
        ints["completion"][i] = (
            t.completion_tokens if t.completion_tokens is not None and t.completion_tokens < 2**31 else -1
        )
        ints["preemptions"][i] = t.preemptions if t.preemptions is not None else -1
        m = self._models.get(t.model)
        if m is None:
            if len(self._model_names) >= 65_535:
                return
            m = self._models[t.model] = len(self._model_names)
            self._model_names.append(t.model)
        self._model[i] = m
        lab = self._labels.get(t.labels)
        if lab is None:
            if len(self._label_sets) < MAX_LABEL_SETS:
                lab = self._labels[t.labels] = len(self._label_sets)
                self._label_sets.append(t.labels)
            else:
                lab = self._labels.setdefault((("labels", "other"),), len(self._label_sets))
                if lab == len(self._label_sets):
                    self._label_sets.append((("labels", "other"),))
        p = ints["prompt"][i]
        self._code[i] = _code(_bisect_left(PROMPT_BANDS, p) if p >= 0 else -1, ints["preemptions"][i], lab)
        tid = bytes.fromhex(t.trace_id) if t.trace_id and len(t.trace_id) == 32 else bytes(16)
        self._trace[16 * i : 16 * i + 16] = tid
        self._request[i] = t.request_id[:MAX_REQUEST_ID_CHARS] if t.request_id else None

    def _expire(self, now: float) -> None:
        """Let go of the records older than :data:`HORIZON_S` (their request id strings): at a low request rate the
        ring would otherwise be overwritten only after hours, its memory growing until then."""
        n, cap, t, requests = self._size, self.capacity, self._f["t"], self._request
        start, cut = (self._next - n) % cap, now - HORIZON_S
        while n and t[start] < cut:
            requests[start] = None
            start = start + 1 if start + 1 < cap else 0
            n -= 1
        self._size = n

    def models(self) -> list[str]:
        """The models with records kept (any age up to the horizon)."""
        with self._lock:
            present: set[int] = set()
            for lo, hi in self._segments(-math.inf):  # the live slots: one or two runs of the ring
                present.update(self._model[lo:hi])
            return sorted(self._model_names[m] for m in present if m < len(self._model_names))

    def _segments(self, cut: float) -> list[tuple[int, int]]:
        """The ring slots (one or two [start, end) runs) of the records stamped at or after ``cut``."""
        n, cap, t = self._size, self.capacity, self._f["t"]
        start = (self._next - n) % cap
        lo, hi = 0, n
        while lo < hi:  # records are in stamp order: binary search for the first one inside the window
            mid = (lo + hi) // 2
            if t[(start + mid) % cap] < cut:
                lo = mid + 1
            else:
                hi = mid
        first, count = (start + lo) % cap, n - lo
        if first + count <= cap:
            return [(first, first + count)]
        return [(first, cap), (0, first + count - cap)]

    def window(self, models: Iterable[str], window_s: float, now: float) -> Window:
        """The records of ``models`` stamped in the last ``window_s``: a copy (C-speed slices), no lock held after."""
        with self._lock:
            wanted = {self._models[m] for m in models if m in self._models}
            cut = now - window_s
            segs = self._segments(cut)
            n, cap = self._size, self.capacity
            oldest = self._f["t"][(self._next - n) % cap] if n else now
            # the ring is full and its oldest record is inside the window: older requests were overwritten
            covered = window_s if n < cap or oldest < cut else now - oldest

            def take(col: Any) -> list[Any]:
                out: list[Any] = []
                for lo, hi in segs:
                    out.extend(col[lo:hi])
                return out

            def copy(col: array[Any]) -> array[Any]:  # a memcpy
                out = col[0:0]
                for lo, hi in segs:
                    out += col[lo:hi]
                return out

            # arrays, not lists: a float is boxed again on each pass, but the passes then touch a quarter of the
            # memory (8 bytes a value, not a pointer and a 24-byte object), which is faster measured where the
            # agent runs it, beside other work (benchmarks/tail_explain.py --previous: ~20 % less CPU)
            f: dict[str, Sequence[float]] = {c: copy(a) for c, a in self._f.items()}
            ints: dict[str, Sequence[int]] = {c: copy(a) for c, a in self._i.items()}
            codes: Sequence[int] = copy(self._code)
            requests = take(self._request)
            traces = b"".join(bytes(self._trace[16 * lo : 16 * hi]) for lo, hi in segs)
            model = copy(self._model)
            label_sets = list(self._label_sets)
        if not wanted:
            keep: list[int] | None = []
        elif set(model) <= wanted:
            keep = None
        else:
            keep = [j for j, m in enumerate(model) if m in wanted]
        if keep is not None:
            f = {c: [v[j] for j in keep] for c, v in f.items()}
            ints = {c: [v[j] for j in keep] for c, v in ints.items()}
            codes = [codes[j] for j in keep]
            requests = [requests[j] for j in keep]
            traces = b"".join(traces[16 * j : 16 * j + 16] for j in keep)
        return Window(f, ints, codes, label_sets, traces, requests, now, covered, window_s)

    def memory_bytes(self) -> int:
        """What the ring's columns hold, in bytes (request id strings counted as stored)."""
        columns: list[array[Any]] = [*self._f.values(), *self._i.values(), self._model, self._code]
        fixed = sum(a.itemsize * len(a) for a in columns)
        ids = sum(49 + len(r) for r in self._request if r is not None)
        return fixed + len(self._trace) + 8 * self.capacity + ids


@dataclass(frozen=True, slots=True)
class Window:
    """One model's records over one window, as columns (NaN / -1 where the span had no value)."""

    f: dict[str, Sequence[float]]  # t (stamp), ttft, e2e, queue, prefill, decode, weight
    i: dict[str, Sequence[int]]  # prompt, completion, preemptions
    codes: Sequence[int]  # per record its attribute code (:func:`_code`); code >> 5 indexes label_sets
    label_sets: list[tuple[tuple[str, str], ...]]
    traces: bytes  # 16 bytes a record
    requests: list[str | None]
    now: float
    covered_s: float
    window_s: float

    def __len__(self) -> int:
        return len(self.requests)

    def trace_id(self, j: int) -> str | None:
        raw = self.traces[16 * j : 16 * j + 16]
        return raw.hex() if any(raw) else None


def _gather(idx: Sequence[int], col: Sequence[Any]) -> list[Any]:
    """``[col[j] for j in idx]`` at C speed (``itemgetter`` takes no empty index list)."""
    if len(idx) <= 1:
        return [col[idx[0]]] if idx else []
    return list(itemgetter(*idx)(col))


def _quantile(order: list[int], weights: list[float] | None, total: float, q: float) -> int:
    """The record at weighted rank ``q`` of ``order`` (ascending)."""
    if weights is None:
        return order[min(len(order) - 1, max(0, math.ceil(q * len(order)) - 1))]
    target, acc = q * total, 0.0
    for j in order:
        acc += weights[j]
        if acc >= target:
            return j
    return order[-1]


def _bands(order: list[int], weights: list[float] | None, total: float) -> tuple[list[int], list[int]]:
    """(tail band, median band) of ``order`` (ascending) by weighted rank."""
    if weights is None:
        n = len(order)
        k = max(MIN_TAIL, math.ceil(TAIL_BAND * n))
        first = int(MEDIAN_BAND[0] * n)
        return order[max(0, n - k) :], order[first : max(int(MEDIAN_BAND[1] * n), first + 1)]
    tail: list[int] = []
    acc = 0.0
    for j in reversed(order):
        if acc >= TAIL_BAND * total and len(tail) >= MIN_TAIL:
            break
        tail.append(j)
        acc += weights[j]
    lo, hi = MEDIAN_BAND[0] * total, MEDIAN_BAND[1] * total
    mid: list[int] = []
    acc = 0.0
    for j in order:
        w = weights[j]
        if acc + w > lo and acc < hi:
            mid.append(j)
        acc += w
        if acc >= hi:
            break
    return tail, mid


def _bands_by_value(idx: list[int], values: Sequence[float]) -> tuple[list[int], list[int], float, float]:
    """(tail band, median band, P50, P99) of unweighted records: rank thresholds from a sort of the values alone.

    Ties at a threshold all join the band (a band may hold a few more records than its share). Above
    :data:`EXACT_SORT_MAX` records only the top of the ranking is exact (the tail band and P99, by a partial
    selection); P50 and the median band's bounds come from a sorted systematic sample of ~:data:`QUANTILE_SAMPLE`
    records (a rank error of about 1 % of the window). Above
    :data:`MEDIAN_BAND_SAMPLE` records in the median band, it is read from every k-th record (systematic, by stamp
    order; the thresholds stay exact): its means are the baseline the tail is compared with, and ~1,000 records
    give them to well under a percent of the gap at a fifth of the cost.
    """
    n = len(idx)
    k = max(MIN_TAIL, math.ceil(TAIL_BAND * n))
    full = len(idx) == len(values)
    tail: list[int] | None = None
    if n > EXACT_SORT_MAX:  # the top k exactly (tail band, P99), the middle from a sorted systematic sample
        every = values if full else _gather(idx, values)
        vals = sorted(every[:: math.ceil(n / QUANTILE_SAMPLE)])
        m = len(vals)
        # every record at or above a guard well below the k-th largest (the sample's top 2k/n, less a margin),
        # then the exact top k among them; should the sample mislead, a full partial selection
        guard = vals[max(0, m - 1 - math.ceil(2 * k * m / n) - 8)]
        cand = list(compress(idx, map(ge, values, repeat(guard)))) if full else []
        above = n - math.ceil(0.99 * n)  # records above P99
        if len(cand) >= k:
            top = sorted(_gather(cand, values))
            tail_from, p99 = top[len(top) - k], top[len(top) - 1 - above]
            tail = [j for j in cand if values[j] >= tail_from]
        else:
            top = heapq.nlargest(k, every)
            tail_from, p99 = top[-1], top[above]
    else:
        vals = sorted(values) if len(idx) == len(values) else sorted(_gather(idx, values))
        tail_from = vals[max(0, n - k)]
        p99 = vals[min(n - 1, max(0, math.ceil(0.99 * n) - 1))]
    m = len(vals)
    # the band's ranks [40 %, 60 %), never empty: with 3 records int(0.4 m) = int(0.6 m) = 1, the middle one
    lo_rank = int(MEDIAN_BAND[0] * m)
    lo, hi = vals[lo_rank], vals[max(int(MEDIAN_BAND[1] * m) - 1, lo_rank)]
    p50 = vals[min(m - 1, max(0, math.ceil(0.5 * m) - 1))]
    if full:  # every record: C-speed filters
        if tail is None:
            tail = list(compress(idx, map(ge, values, repeat(tail_from))))
        step = max(1, math.ceil((MEDIAN_BAND[1] - MEDIAN_BAND[0]) * n / MEDIAN_BAND_SAMPLE))
        some, vs = (idx[::step], values[::step]) if step > 1 else (idx, values)
        mid = list(compress(some, map(and_, map(le, repeat(lo), vs), map(ge, repeat(hi), vs))))
    else:
        tail = [j for j in idx if values[j] >= tail_from]
        mid = [j for j in idx if lo <= values[j] <= hi]
    return tail, mid, p50, p99


def _mean(idx: list[int], col: Sequence[float], weights: list[float] | None) -> float:
    return _mean_of(_gather(idx, col) if idx else [], idx, weights)


def _mean_of(vals: list[float], idx: list[int], weights: list[float] | None) -> float:
    """The (weighted) mean of ``vals``, the values of records ``idx``."""
    if not idx:
        return 0.0
    if weights is None:
        return math.fsum(vals) / len(idx)
    ws = _gather(idx, weights)
    w = math.fsum(ws)
    return math.fsum(v * x for v, x in zip(vals, ws, strict=True)) / w if w else 0.0


class _Phases:
    """A window's phases, computed only for the records asked for (the bands), not for the whole window."""

    BASE = {  # the span values a phase is made of (a record without one of them has no such phase)
        "frontend": ("ttft", "queue", "prefill"),
        "queue": ("queue",),
        "prefill": ("prefill",),
        "decode": ("decode",),
        "output_length": ("decode",),
    }

    def __init__(self, win: Window) -> None:
        self.win = win
        self.f, self.comp = win.f, win.i["completion"]
        self._clean: dict[str, bool] = {}
        decode, comp = self.f["decode"], self.comp
        step = max(1, len(comp) // ITL_SAMPLE)  # median ITLs from at most ~ITL_SAMPLE requests
        itls = sorted([d / (c - 1) for d, c in zip(decode[::step], comp[::step], strict=True) if c > 1 and d == d])
        self.itl_med = itls[len(itls) // 2] if itls else None
        self._slow: list[dict[str, Any] | None] = []  # computed once, on first use
        self._preempted: tuple[list[float], list[float]] | None = None
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

    def in_flight_with_preempted(self, idx: list[int]) -> float:
        """The share of records ``idx`` in flight (arrival to end) while some preempted request was.

        A record's end is its intake stamp and its arrival that minus its e2e; records are in stamp order, so the
        preempted ones' ends are sorted and the earliest arrival from each one on answers an overlap by bisection.
        """
        if self._preempted is None:
            win = self.win
            t, e2e, pre = win.f["t"], win.f["e2e"], win.i["preemptions"]
            mine = list(compress(range(len(pre)), map(gt, pre, repeat(0))))
            ends = _gather(mine, t) if mine else []
            lasted = _gather(mine, e2e) if mine else []
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

    def at(self, name: str, idx: list[int]) -> list[float]:
        f = self.f
        if name in ("queue", "prefill"):
            return _gather(idx, f[name])
        if name == "frontend":
            return list(
                map(sub, map(sub, _gather(idx, f["ttft"]), _gather(idx, f["queue"])), _gather(idx, f["prefill"]))
            )
        itl = self.itl_med
        comp = _gather(idx, self.comp)
        length = [0.0] * len(idx) if itl is None else [(c - 1) * itl if c > 1 else 0.0 for c in comp]
        if name == "output_length":
            return length
        return list(map(sub, _gather(idx, f["decode"]), length))  # decode beyond length

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


def _code(band: int, preemptions: int, label: int) -> int:
    """A record's attribute values in one int, computed when it is recorded: (band + 1) + 8 x (preempted + 1) +
    32 x label set, band -1 (no prompt count) .. 3, preempted -1 (not known), 0 or 1."""
    return band + 1 + 8 * (min(preemptions, 1) + 1) + 32 * label


def _group_keys(win: Window) -> _Groups:
    """Per record its attribute code (kept in the ring, :func:`_code`) and each code's (key, value)s."""
    codes = win.codes
    keys: dict[int, tuple[tuple[str, str], ...]] = {}
    for code in set(codes):
        lab, rem = divmod(code, 32)
        pre, band = rem // 8 - 1, rem % 8 - 1
        parts = [] if band < 0 else [("prompt_tokens", _BAND_NAMES[band])]
        if pre >= 0:
            parts.append(("preempted", "yes" if pre else "no"))
        keys[code] = (*parts, *win.label_sets[lab])
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
            every = {k: float(c) for k, c in Counter(per_record if full else _gather(idx, per_record)).items()}
            if full:
                cache["every"] = every
        every = cache["every"] if full else every
        in_tail = {k: float(c) for k, c in Counter(_gather(tail, per_record)).items()}
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
        tail, mid, p50, p99 = _bands_by_value(idx, values)
    else:
        order = sorted(idx, key=values.__getitem__)
        total = math.fsum(weights[j] for j in idx)
        p50 = values[_quantile(order, weights, total, 0.5)]
        p99 = values[_quantile(order, weights, total, 0.99)]
        tail, mid = _bands(order, weights, total)
    if len(idx) == len(values):  # every record is ranked: the tail band holds the slowest ones (ties included)
        phases.tails[quantity] = tail
    gap = _mean(tail, values, weights) - _mean(mid, values, weights)
    shares = {
        p: (_mean_of(phases.at(p, tail), tail, weights) - _mean_of(phases.at(p, mid), mid, weights)) / gap
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
    engine = top_phase in ENGINE_PHASES and not reasons
    slow = phases.slow_placement() if engine else None
    preemption = _preemption(phases, separators, top_phase, shares[top_phase], tail, total) if engine else None
    driver = NONE
    if reasons:
        pass
    elif top_phase == "output_length" and shares[top_phase] >= DOMINANT_SHARE:
        reasons.append(f"{shares[top_phase]:.0%} of the gap is output length (the workload, not a fault)")
    elif slow is not None:  # slower per token on one rank: the rank, whichever engine phase its tail shows as
        key = (slow["attribute"], slow["value"])
        seen = next((s for s in separators if (s["attribute"], s["value"]) == key), None)
        placement = {"share_of_requests": 0.0, "share_of_tail": 0.0, **(seen or {}), **slow}
        driver = placement["attribute"]
    elif preemption is not None:  # the KV cache is full: requests wait for blocks or are recomputed
        driver = PREEMPTION
    elif placement is not None and (shares[top_phase] < PHASE_OVER_PLACEMENT or placement["lift"] >= STRONG_LIFT):
        driver = placement["attribute"]
    elif shares[top_phase] >= DOMINANT_SHARE:
        driver = top_phase
    else:
        reasons.append(f"no phase holds {DOMINANT_SHARE:.0%} of the gap (largest: {top_phase} {shares[top_phase]:.0%})")
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
        "phase": top_phase if driver != NONE else NONE,
        "attribute": _attr_text(shown) if driver != NONE else NONE,
        "confident": driver != NONE,
        "why_not": "; ".join(reasons) if driver == NONE else None,
        "slow_placement": slow,
        "preemption": preemption,
        "headline": _headline(quantity, p50, p99, shares, top_phase, driver, shown, reasons, placement),
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


def _preemption(
    phases: _Phases, separators: list[dict[str, Any]], top: str, share: float, tail: list[int], total: float
) -> dict[str, Any] | None:
    """The evidence that KV-cache preemptions explain an engine phase holding the gap, or None.

    vLLM preempts a running request only when no KV block is free (it is recomputed from the head of the queue),
    and while blocks are short no waiting request is admitted. So when at least :data:`PREEMPTED_MIN_SHARE` of
    the window's requests were preempted: a *queue* tail is explained when at least :data:`PREEMPT_IN_FLIGHT` of
    the tail band was in flight beside a preempted request (waiting for blocks, or behind the re-queued); a
    *prefill* or *decode* tail (the recomputation is charged to the preempted request itself) when preempted
    requests are at least :data:`PREEMPT_LIFT` times more common in the tail than in the window.
    """
    if share < DOMINANT_SHARE:
        return None
    yes = next((s for s in separators if s["attribute"] == "preempted" and s["value"] == "yes"), None)
    if yes is None or yes["share_of_requests"] < PREEMPTED_MIN_SHARE:
        return None
    if yes["share_of_requests"] * total < PREEMPTED_MIN:
        return None
    in_flight = phases.in_flight_with_preempted(tail)
    if in_flight < PREEMPT_IN_FLIGHT if top == "queue" else yes["lift"] < PREEMPT_LIFT:
        return None
    return {**yes, "tail_in_flight_with_preempted": round(in_flight, 4)}


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
) -> str:
    q = {"ttft": "TTFT", "e2e": "e2e"}.get(quantity, quantity)
    head = f"P99 {q} {_ms(p99)} vs P50 {_ms(p50)}: "
    if driver == NONE:
        return head + f"no dominant driver ({'; '.join(reasons)})"
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
) -> dict[str, Any] | None:
    """The explanation of ``model``'s tail over the last ``window_s`` (None: no record of it in the window).

    ``aliases`` are the names its spans may carry instead (``unknown`` when vLLM's spans name no model).
    ``client`` maps a trace id to the TTFT a client saw (its CLIENT span): with it the report gains ``client``
    (:func:`_client`) and each slow request its client TTFT and client − engine TTFT.
    """
    if by not in QUANTITIES:
        raise ValueError(f"by must be one of {', '.join(QUANTITIES)}, got {by!r}")
    win = records.window([model, *aliases], window_s, now)
    if not len(win):
        return None
    sampled = win.f["weight"].count(1.0) != len(win)
    weights = list(win.f["weight"]) if sampled else None
    phases = _Phases(win)
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
        tail, mid, p50, p99 = _bands_by_value(idx, client)
    else:
        order = sorted(idx, key=client.__getitem__)
        total = math.fsum(weights[j] for j in idx)
        p50, p99 = (client[_quantile(order, weights, total, q)] for q in (0.5, 0.99))
        tail, mid = _bands(order, weights, total)
    gaps = sorted(gap_col[j] for j in idx)
    band_gap = _mean(tail, client, weights) - _mean(mid, client, weights)
    shares = {
        p: (_mean(tail, parts[p], weights) - _mean(mid, parts[p], weights)) / band_gap if band_gap > 0 else 0.0
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

    def __init__(self, records: RequestRecords | None = None, clock: Callable[[], float] = time.monotonic) -> None:
        self.records = records or RequestRecords()
        self.clock = clock
        self._cached: tuple[tuple[int, tuple[str, ...]], list[Sample]] | None = None
        self.failures = ModelFailures("explain")  # models whose verdict raised: left out, counted
        self.client = ClientTTFTs()

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
        return explain(self.records, first, window_s, now, top, by, aliases, self.client.snapshot(now))

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
        report = explain(self.records, name, WINDOW_SECONDS[METRIC_WINDOW], now, top=0)
        return driver_samples(report, label, METRIC_WINDOW) if report is not None else []


class ClientTTFTs:
    """Client TTFTs by trace id, at most :data:`CLIENT_CAPACITY` (the oldest go first) and :data:`HORIZON_S` old."""

    def __init__(self, capacity: int = CLIENT_CAPACITY) -> None:
        self.capacity = capacity
        self._lock = threading.Lock()
        self._by_trace: dict[str, tuple[float, float]] = {}  # insertion order = arrival order

    def add(self, pairs: Iterable[tuple[str, float]], now: float) -> None:
        with self._lock:
            for trace_id, ttft in pairs:
                self._by_trace.pop(trace_id, None)
                self._by_trace[trace_id] = (ttft, now)
            self._expire(now)

    def _expire(self, now: float) -> None:
        d, cut = self._by_trace, now - HORIZON_S
        while d:
            oldest = next(iter(d))
            if len(d) <= self.capacity and d[oldest][1] >= cut:
                break
            del d[oldest]

    def snapshot(self, now: float) -> dict[str, float]:
        with self._lock:
            self._expire(now)
            return {k: v[0] for k, v in self._by_trace.items()}

    def __len__(self) -> int:
        return len(self._by_trace)


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


def render_text(report: Mapping[str, Any]) -> str:
    """The explanation as a terminal table: the verdicts, the decomposition, the separators, the slowest requests."""
    lines = [f"model {report['model']}  source {report['source']}"]
    if report["source"] == "spans":
        sampled = "  (sampled: weighted)" if report.get("sampled") else ""
        lines[0] += (
            f"  window {report['window_s']:.0f}s (covered {report['covered_s']:.0f}s)  "
            f"{report['requests']} requests{sampled}"
        )
    else:
        lines.append(report["note"])
    client = report.get("client")
    if client:  # what the client saw comes first: the engine's verdicts below explain only the part inside it
        lines.append("")
        lines.append(f"CLIENT TTFT: {client['headline']}")
        if client.get("shares"):
            lines.append("  share of the tail gap: " + "  ".join(f"{p} {v:+.0%}" for p, v in client["shares"].items()))
    for q in QUANTITIES:
        d = report["quantities"].get(q)
        if not d:
            lines.append(f"{q}: no data")
            continue
        lines.append("")
        lines.append(f"{q.upper()}: {d['headline']}")
        shares = "  ".join(f"{p} {v:+.0%}" for p, v in d["shares"].items())
        lines.append(f"  share of the tail gap: {shares}")
        for s in d.get("separators", [])[:3]:
            mark = "separates" if s["separates"] else "does not separate"
            lines.append(
                f"  {s['attribute']}={s['value']}: {s['share_of_requests']:.0%} of requests, "
                f"{s['share_of_tail']:.0%} of the tail (z {s['z']:.1f}, {mark})"
            )
    rows = report.get("slowest") or []
    if rows:
        lines.append("")
        lines.append(f"slowest {len(rows)} by {report.get('slowest_by', 'ttft')}:")
        head = (
            "request_id",
            "trace_id",
            "prompt",
            "gen",
            "queue",
            "prefill",
            "decode",
            "pre",
            "ttft",
            "e2e",
            "front",
            "client",
            "labels",
        )
        table = [head]
        for r in rows:
            table.append(
                (
                    str(r["request_id"] or "-")[:28],
                    str(r["trace_id"] or "-"),
                    _cell(r["prompt_tokens"]),
                    _cell(r["completion_tokens"]),
                    _sec(r["queue_s"]),
                    _sec(r["prefill_s"]),
                    _sec(r["decode_s"]),
                    _cell(r["preemptions"]),
                    _sec(r["ttft_s"]),
                    _sec(r["e2e_s"]),
                    _sec(r["frontend_gap_s"]),
                    _sec(r.get("client_gap_s")),
                    ",".join(f"{k}={v}" for k, v in sorted(r["labels"].items())) or "-",
                )
            )
        widths = [max(len(row[c]) for row in table) for c in range(len(head))]
        lines.extend("  ".join(cell.ljust(w) for cell, w in zip(row, widths, strict=True)).rstrip() for row in table)
    return "\n".join(lines) + "\n"


def _cell(v: object) -> str:
    return "-" if v is None else str(v)


def _sec(v: float | None) -> str:
    return "-" if v is None else f"{v:.3f}"
