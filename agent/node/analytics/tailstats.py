"""Weighted quantiles and the two bands the tail explainer compares (:mod:`inferwatch.agent.node.analytics.explain`).

Records are ranked by one quantity (TTFT, e2e, a client's TTFT). The *tail band* is the top :data:`TAIL_BAND` (2 %)
of them, at least :data:`MIN_TAIL` records; the *median band* the ranks :data:`MEDIAN_BAND` (40-60 %). The gap of the
two bands' means stands for P99 − P50. A sampled window's records carry weights (kept 1 in k: weight k), so ranks,
quantiles and means are weighted when weights are given (:func:`bands`, :func:`quantile`, :func:`mean`); an
unweighted window takes the faster path of :func:`bands_by_value` (thresholds from a plain sort, then C-speed
filters). A record is an index into the window's columns (:func:`gather`).
"""

from __future__ import annotations

import heapq
import math
from collections.abc import Sequence
from itertools import compress, repeat
from operator import and_, ge, itemgetter, le
from typing import Any

TAIL_BAND = 0.02
MIN_TAIL = 5
MEDIAN_BAND = (0.40, 0.60)
EXACT_SORT_MAX = 8_192  # above this many records a quantity is not fully sorted: ...
QUANTILE_SAMPLE = 4_096  # ... its middle quantiles come from a sample of this many
MEDIAN_BAND_SAMPLE = 1_024  # above this many records in the median band, its means come from every k-th record


def gather(idx: Sequence[int], col: Sequence[Any]) -> list[Any]:
    """``[col[j] for j in idx]`` at C speed (``itemgetter`` takes no empty index list)."""
    if len(idx) <= 1:
        return [col[idx[0]]] if idx else []
    return list(itemgetter(*idx)(col))


def quantile(order: list[int], weights: list[float] | None, total: float, q: float) -> int:
    """The record at weighted rank ``q`` of ``order`` (ascending)."""
    if weights is None:
        return order[min(len(order) - 1, max(0, math.ceil(q * len(order)) - 1))]
    target, acc = q * total, 0.0
    for j in order:
        acc += weights[j]
        if acc >= target:
            return j
    return order[-1]


def bands(order: list[int], weights: list[float] | None, total: float) -> tuple[list[int], list[int]]:
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


def bands_by_value(idx: list[int], values: Sequence[float]) -> tuple[list[int], list[int], float, float]:
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
        every = values if full else gather(idx, values)
        vals = sorted(every[:: math.ceil(n / QUANTILE_SAMPLE)])
        m = len(vals)
        # every record at or above a guard well below the k-th largest (the sample's top 2k/n, less a margin),
        # then the exact top k among them; should the sample mislead, a full partial selection
        guard = vals[max(0, m - 1 - math.ceil(2 * k * m / n) - 8)]
        cand = list(compress(idx, map(ge, values, repeat(guard)))) if full else []
        above = n - math.ceil(0.99 * n)  # records above P99
        if len(cand) >= k:
            top = sorted(gather(cand, values))
            tail_from, p99 = top[len(top) - k], top[len(top) - 1 - above]
            tail = [j for j in cand if values[j] >= tail_from]
        else:
            top = heapq.nlargest(k, every)
            tail_from, p99 = top[-1], top[above]
    else:
        vals = sorted(values) if len(idx) == len(values) else sorted(gather(idx, values))
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


def mean(idx: list[int], col: Sequence[float], weights: list[float] | None) -> float:
    return mean_of(gather(idx, col) if idx else [], idx, weights)


def mean_of(vals: list[float], idx: list[int], weights: list[float] | None) -> float:
    """The (weighted) mean of ``vals``, the values of records ``idx``."""
    if not idx:
        return 0.0
    if weights is None:
        return math.fsum(vals) / len(idx)
    ws = gather(idx, weights)
    w = math.fsum(ws)
    return math.fsum(v * x for v, x in zip(vals, ws, strict=True)) / w if w else 0.0
