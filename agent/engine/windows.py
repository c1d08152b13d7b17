"""Sliding windows over cumulative engine counters and histograms.

Each scrape is a snapshot of cumulative values per series (one series per data-parallel rank).
Between two consecutive scrapes every series' increase is computed as Prometheus's ``increase``
computes it between two samples: a value lower than the previous one is a counter reset (engine
restart), so the increase is the new value; a series (or bucket bound) seen for the first time
contributes nothing until its second scrape (its first value is history, not an increase); a series
that disappears stops contributing. The per-series increases are summed (``sum by (le)``) into one
step per scrape interval. A window of ``W`` seconds ending at the latest scrape ``T`` sums the steps
whose *both* samples lie in ``[T - W, T]`` — the samples a Prometheus range selector ``[W]``
evaluated at ``T`` sees — so its quantiles equal
``histogram_quantile(q, sum by (le) (rate(x_bucket[W])))`` (rate's extrapolation scales every bucket
by the same factor, which a quantile ignores).
"""

from __future__ import annotations

import bisect
from collections import deque
from collections.abc import Mapping
from dataclasses import dataclass

from agent.engine.exposition import Labels
from agent.engine.histogram import Histogram, counter_increase, histogram_increase, sum_histograms

WINDOWS_S: dict[str, float] = {"1m": 60.0, "5m": 300.0}
HORIZON_S = max(WINDOWS_S.values())
EDGE_S = 1e-6  # a sample exactly on the window's start is inside it, whatever the float rounding of T - W


@dataclass(frozen=True, slots=True)
class _Step:
    start: float  # timestamp of the earlier scrape (seconds)
    end: float
    hist: Histogram | None
    values: Mapping[str, float]


class HistogramWindow:
    """Reset-aware increments of one model's per-series cumulative histogram (one timing quantity).

    Internally the per-scrape increments are accumulated into a running total that never resets
    (bound → increase since the first scrape, plus ``_sum`` and ``_count``), and a copy is kept per
    scrape time; a window's increase is then one subtraction of two of them, whatever its length.
    """

    def __init__(self, horizon_s: float = HORIZON_S) -> None:
        self.horizon_s = horizon_s
        self._last: dict[Labels, Histogram] = {}
        self._last_t: float | None = None
        self._acc: dict[float, float] = {}
        self._acc_sum = 0.0
        self._acc_count = 0.0
        self._marks: deque[tuple[float, dict[float, float], float, float]] = deque()  # (t, acc, sum, count)

    @property
    def last_time(self) -> float | None:
        return self._last_t

    def update(self, t: float, series: Mapping[Labels, Histogram]) -> None:
        """Add the scrape taken at ``t`` (seconds, increasing; an older or equal ``t`` is ignored)."""
        if self._last_t is not None and t <= self._last_t:
            return
        if self._last_t is not None:
            increases = [histogram_increase(self._last[k], h) for k, h in series.items() if k in self._last]
            step = sum_histograms(increases)
            if step is not None:
                acc = self._acc
                for bound, c in step.buckets:
                    acc[bound] = acc.get(bound, 0.0) + c
                self._acc_sum += step.sum
                self._acc_count += step.count
        self._marks.append((t, dict(self._acc), self._acc_sum, self._acc_count))
        self._last = dict(series)
        self._last_t = t
        while len(self._marks) > 1 and self._marks[0][0] < t - self.horizon_s - EDGE_S:
            self._marks.popleft()

    def window(self, window_s: float, at: float | None = None) -> Histogram | None:
        """Summed increase over ``[at - window_s, at]`` (default: the latest scrape); None without two scrapes."""
        if self._last_t is None:
            return None
        at = self._last_t if at is None else at
        times = [m[0] for m in self._marks]
        end = bisect.bisect_right(times, at + EDGE_S) - 1
        begin = bisect.bisect_left(times, at - window_s - EDGE_S)
        if end < 0 or begin >= end:
            return None
        _, acc_end, sum_end, count_end = self._marks[end]
        _, acc_begin, sum_begin, count_begin = self._marks[begin]
        buckets = tuple(sorted((b, c - acc_begin.get(b, 0.0)) for b, c in acc_end.items()))
        if not buckets:
            return None
        return Histogram(buckets, sum_end - sum_begin, count_end - count_begin)

    def current(self) -> Histogram | None:
        """The latest cumulative histogram summed over series."""
        return sum_histograms(self._last.values())


class CounterWindow:
    """Reset-aware increments of named cumulative counters (llama.cpp's seconds and token totals)."""

    def __init__(self, horizon_s: float = HORIZON_S) -> None:
        self.horizon_s = horizon_s
        self._last: dict[str, float] = {}
        self._last_t: float | None = None
        self._steps: deque[_Step] = deque()

    def update(self, t: float, values: Mapping[str, float]) -> None:
        if self._last_t is not None and t > self._last_t:
            inc = {k: counter_increase(self._last[k], v) for k, v in values.items() if k in self._last}
            self._steps.append(_Step(self._last_t, t, None, inc))
        if self._last_t is None or t > self._last_t:
            self._last = dict(values)
            self._last_t = t
        _expire(self._steps, t - self.horizon_s)

    def increase(self, name: str, window_s: float, at: float | None = None) -> float | None:
        """Increase of ``name`` over ``[at - window_s, at]``; None when no step in the window has it."""
        at = self._last_t if at is None else at
        if at is None:
            return None
        start = at - window_s - EDGE_S
        found = [s.values[name] for s in self._steps if s.start >= start and s.end <= at and name in s.values]
        return sum(found) if found else None


def _expire(steps: deque[_Step], oldest: float) -> None:
    while steps and steps[0].start < oldest:
        steps.popleft()
