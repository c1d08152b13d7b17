"""Cumulative histograms: sums over series, reset-aware deltas, and Prometheus's ``histogram_quantile``.

A :class:`Histogram` holds cumulative bucket counts keyed by upper bound (seconds; ``+Inf`` last),
the ``_sum`` (seconds) and the ``_count`` (observations), as an engine exposes them.

:func:`bucket_quantile` reproduces ``histogram_quantile`` of Prometheus (``promql/quantile.go``,
``BucketQuantile``) step by step: buckets sorted by bound, equal bounds coalesced, counts forced
monotonic (a bucket lower than its predecessor takes the predecessor's count; differences below a
relative 1e-12 are treated as float noise), NaN without a ``+Inf`` bucket, with fewer than two buckets
or no observations; a rank in the ``+Inf`` bucket returns the highest finite bound; the lowest bucket
interpolates from 0 (or returns its bound when that bound is <= 0); otherwise linear interpolation
inside the bucket that holds the rank.
"""

from __future__ import annotations

import bisect
import math
from collections.abc import Iterable, Mapping
from dataclasses import dataclass

INF = math.inf
SMALL_DELTA_TOLERANCE = 1e-12  # promql/quantile.go smallDeltaTolerance


@dataclass(frozen=True, slots=True)
class Histogram:
    """Cumulative buckets ``((upper_bound_s, count), ...)`` sorted by bound, ``+Inf`` last; sum in seconds."""

    buckets: tuple[tuple[float, float], ...]
    sum: float
    count: float

    @property
    def bounds(self) -> tuple[float, ...]:
        return tuple(b for b, _ in self.buckets)

    def as_map(self) -> dict[float, float]:
        return dict(self.buckets)

    def mean(self) -> float | None:
        return self.sum / self.count if self.count > 0 else None

    def quantile(self, q: float) -> float:
        return bucket_quantile(q, self.buckets)

    def quantiles(self, qs: Iterable[float]) -> list[float]:
        return bucket_quantiles(qs, self.buckets)


def from_maps(buckets: Mapping[float, float], total: float, count: float) -> Histogram:
    return Histogram(tuple(sorted(buckets.items())), total, count)


def sum_histograms(hists: Iterable[Histogram]) -> Histogram | None:
    """``sum by (le)`` over series: counts of equal bounds add up (bounds missing in a series add nothing)."""
    acc: dict[float, float] = {}
    total = count = 0.0
    seen = False
    for h in hists:
        seen = True
        for bound, c in h.buckets:
            acc[bound] = acc.get(bound, 0.0) + c
        total += h.sum
        count += h.count
    return from_maps(acc, total, count) if seen else None


def counter_increase(prev: float, cur: float) -> float:
    """Increase of a counter between two scrapes; a decrease is a reset (the new value is the increase)."""
    return cur - prev if cur >= prev else cur


def histogram_increase(prev: Histogram, cur: Histogram) -> Histogram:
    """Per-series increase, each bucket, ``_sum`` and ``_count`` its own counter, as Prometheuss ``increase``."""
    before = prev.as_map()
    # A bound the previous scrape did not have is a new series: its first value is not an increase.
    buckets = tuple((bound, counter_increase(before[bound], c)) for bound, c in cur.buckets if bound in before)
    return Histogram(buckets, counter_increase(prev.sum, cur.sum), counter_increase(prev.count, cur.count))


def _almost_equal(a: float, b: float, epsilon: float) -> bool:
    min_normal = 2.2250738585072014e-308
    if a == b:
        return True
    abs_sum = abs(a) + abs(b)
    diff = abs(a - b)
    if a == 0 or b == 0 or abs_sum < min_normal:
        return diff < epsilon * min_normal
    return diff / min(abs_sum, 1.7976931348623157e308) < epsilon


def bucket_quantile(q: float, buckets: Iterable[tuple[float, float]]) -> float:
    """Prometheus ``histogram_quantile(q, ...)`` over cumulative ``(upper_bound, count)`` buckets."""
    return bucket_quantiles((q,), buckets)[0]


def bucket_quantiles(qs: Iterable[float], buckets: Iterable[tuple[float, float]]) -> list[float]:
    """:func:`bucket_quantile` of each of ``qs`` over the same buckets, which are prepared (sorted, coalesced, made
    monotonic) once for all of them: an engine's latency stats ask four quantiles of every window."""
    out: list[float] = []
    prepared: tuple[list[float], list[float]] | None = None
    ready = False  # prepared (on the first quantile in 0..1: the buckets are not read for the others)
    for q in qs:
        if math.isnan(q):
            out.append(math.nan)
        elif q < 0:
            out.append(-INF)
        elif q > 1:
            out.append(INF)
        else:
            if not ready:
                prepared, ready = _prepared(buckets), True
            out.append(math.nan if prepared is None else _rank_quantile(q, *prepared))
    return out


def _prepared(buckets: Iterable[tuple[float, float]]) -> tuple[list[float], list[float]] | None:
    """(bounds, counts) of the buckets as ``histogram_quantile`` reads them, or None when every quantile is NaN."""
    ordered = sorted(buckets, key=lambda b: b[0])
    if not ordered or not math.isinf(ordered[-1][0]) or ordered[-1][0] < 0:
        return None
    # coalesce equal bounds
    bounds: list[float] = []
    counts: list[float] = []
    for bound, c in ordered:
        if bounds and bounds[-1] == bound:
            counts[-1] += c
        else:
            bounds.append(bound)
            counts.append(c)
    # ensure monotonic, ignoring float noise
    prev = counts[0]
    for i in range(1, len(counts)):
        cur = counts[i]
        if cur == prev:
            continue
        if _almost_equal(prev, cur, SMALL_DELTA_TOLERANCE) or cur < prev:
            counts[i] = prev
            continue
        prev = cur
    if len(bounds) < 2:
        return None
    observations = counts[-1]
    if observations == 0 or math.isnan(observations):
        return None
    return bounds, counts


def _rank_quantile(q: float, bounds: list[float], counts: list[float]) -> float:
    """The quantile ``q`` (0..1) of prepared buckets (:func:`_prepared`)."""
    rank = q * counts[-1]
    b = bisect.bisect_left(counts, rank, 0, len(counts) - 1)
    if b == len(counts) - 1:
        return bounds[-2]
    if b == 0 and bounds[0] <= 0:
        return bounds[0]
    start = 0.0
    end = bounds[b]
    count = counts[b]
    if b > 0:
        start = bounds[b - 1]
        count -= counts[b - 1]
        rank -= counts[b - 1]
    if count == 0:  # only for q == 0 over an empty lowest bucket; Go computes 0/0 = NaN
        return math.nan
    return start + (end - start) * (rank / count)
