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
from array import array
from collections.abc import Mapping

from inferwatch.agent.node.engine.histogram import Histogram, counter_increase, sum_histograms
from inferwatch.agent.node.engine.textformat import Labels

WINDOWS_S: dict[str, float] = {"1m": 60.0, "5m": 300.0}
HORIZON_S = max(WINDOWS_S.values())
EDGE_S = 1e-6  # a sample exactly on the window's start is inside it, whatever the float rounding of T - W


class HistogramWindow:
    """Reset-aware increments of one model's per-series cumulative histogram (one timing quantity).

    Internally the per-scrape increments are accumulated into a running total that never resets
    (bound → increase since the first scrape, plus ``_sum`` and ``_count``), and a copy is kept per
    scrape time; a window's increase is then one subtraction of two of them, whatever its length.

    The copies are one flat array, a row per scrape time (``_count``, then one column per bound in the order
    the bounds first came), and the ``_sum`` of each in an array of doubles: ~90 bytes a scrape for vLLM's
    buckets, where a dict per scrape took ~1.2 kB (a model's 7 quantities at a 5 s interval keep 61 scrapes
    each). The rows are single-precision floats while every value stored is one exactly (counts below 2**24),
    else doubles from then on: a value read back is always the double that was computed.
    """

    def __init__(self, horizon_s: float = HORIZON_S) -> None:
        self.horizon_s = horizon_s
        # the last scrape per series: (bounds, counts, sum, count), the bounds one tuple for the series that share them
        self._last: dict[Labels, _Last] = {}
        self._last_t: float | None = None
        # bound → its column (after _sum and _count), in the order the bounds first came: one dict shared by
        # every window whose bounds came in the same order (see _columns), never changed once made
        self._cols: dict[float, int] = _NO_COLUMNS
        self._since = array("q")  # per column: the number of the first scrape whose total holds the bound
        self._times = array("d")  # the time of each scrape kept, oldest first
        # per scrape kept: its running total (count, then a value per column; the sum in _sums); the last row is
        # the running total itself (the increase since the first scrape), which the next scrape's increase is added to
        self._rows = array("f")
        self._sums = array("d")
        self._first = 0  # the number of the oldest scrape kept (scrapes are numbered from 0)

    @property
    def last_time(self) -> float | None:
        return self._last_t

    def update(self, t: float, series: Mapping[Labels, Histogram]) -> None:
        """Add the scrape taken at ``t`` (seconds, increasing; an older or equal ``t`` is ignored)."""
        if self._last_t is not None and t <= self._last_t:
            return
        step = None
        if self._last_t is not None:
            last = self._last
            step = sum_histograms([_increase(last[k], h) for k, h in series.items() if k in last])
        self._mark(t, step)
        self._last = self._keep(series)
        self._last_t = t
        width = 1 + len(self._cols)
        while len(self._times) > 1 and self._times[0] < t - self.horizon_s - EDGE_S:
            del self._times[0]
            del self._sums[0]
            del self._rows[:width]
            self._first += 1

    def _mark(self, t: float, step: Histogram | None) -> None:
        """Keep the running total as of the scrape at ``t``: the last one plus ``step`` (a new bound adds a
        column, 0 in the older rows)."""
        cols = self._cols
        number = self._first + len(self._times)
        if step is not None and any(bound not in cols for bound, _ in step.buckets):  # bounds met for the first time
            old = 1 + len(cols)
            order = [*cols, *(bound for bound, _ in step.buckets if bound not in cols)]
            cols = self._cols = _columns(tuple(order))
            self._since.extend([number] * (len(cols) + 1 - old))
            width = 1 + len(cols)
            zeros = bytes(self._rows.itemsize * width * len(self._times))
            wider = array("f", zeros) if self._rows.typecode == "f" else array("d", zeros)
            for i in range(len(self._times)):
                wider[i * width : i * width + old] = self._rows[i * old : (i + 1) * old]
            self._rows = wider
        width = 1 + len(cols)
        rows = self._rows
        total = rows[-width:].tolist() if self._times else [0.0] * width  # the running total so far
        total_sum = self._sums[-1] if self._times else 0.0
        if step is not None:
            total_sum += step.sum
            total[0] += step.count
            for bound, c in step.buckets:
                total[1 + cols[bound]] += c
        if rows.typecode == "f" and not _single(total):  # from now on, doubles (the values stay as computed)
            rows = self._rows = array("d", rows)
        rows.extend(total)
        self._sums.append(total_sum)
        self._times.append(t)

    def window(self, window_s: float, at: float | None = None) -> Histogram | None:
        """Summed increase over ``[at - window_s, at]`` (default: the latest scrape); None without two scrapes."""
        if self._last_t is None:
            return None
        at = self._last_t if at is None else at
        times = self._times
        end = bisect.bisect_right(times, at + EDGE_S) - 1
        begin = bisect.bisect_left(times, at - window_s - EDGE_S)
        if end < 0 or begin >= end:
            return None
        width = 1 + len(self._cols)
        row_end, row_begin = end * width, begin * width
        rows, since, present = self._rows, self._since, self._first + end
        buckets = tuple(
            sorted(
                (b, rows[row_end + 1 + i] - rows[row_begin + 1 + i])
                for b, i in self._cols.items()
                if since[i] <= present
            )
        )
        if not buckets:
            return None
        sums = self._sums
        return Histogram(buckets, sums[end] - sums[begin], rows[row_end] - rows[row_begin])

    def current(self) -> Histogram | None:
        """The latest cumulative histogram summed over series."""
        return sum_histograms(
            Histogram(tuple(zip(bounds, counts, strict=True)), total, count)
            for bounds, counts, total, count in self._last.values()
        )

    def _keep(self, series: Mapping[Labels, Histogram]) -> dict[Labels, _Last]:
        """The scrape's histograms as the next update needs them: ~250 bytes a series instead of ~1.6 kB."""
        out: dict[Labels, _Last] = {}
        shared: tuple[float, ...] | None = None
        for k, h in series.items():
            bounds = tuple(b for b, _ in h.buckets)
            if bounds == shared:
                bounds = shared
            elif shared is None:
                shared = bounds
            out[k] = (bounds, array("d", [c for _, c in h.buckets]), h.sum, h.count)
        return out


_Last = tuple[tuple[float, ...], "array[float]", float, float]  # a series' last scrape: bounds, counts, sum, count


def _single(values: list[float]) -> bool:
    """Every value is one a single-precision float holds exactly (read back, the same double)."""
    try:
        return array("f", values).tolist() == values
    except OverflowError:
        return False


# Column maps by the order their bounds came in: every window of an engine's quantity has the same (at 200 models
# x 7 quantities, 1,400 windows share a handful). Bounded: past MAX_SHARED_COLUMNS orders, a window keeps its own.
MAX_SHARED_COLUMNS = 256
_NO_COLUMNS: dict[float, int] = {}
_COLUMNS: dict[tuple[float, ...], dict[float, int]] = {}


def _columns(order: tuple[float, ...]) -> dict[float, int]:
    """bound → its column, for bounds in ``order``: one shared dict per order (never changed by its users)."""
    cols = _COLUMNS.get(order)
    if cols is None:
        cols = {bound: i for i, bound in enumerate(order)}
        if len(_COLUMNS) < MAX_SHARED_COLUMNS:
            cols = _COLUMNS.setdefault(order, cols)
    return cols


def _increase(prev: _Last, cur: Histogram) -> Histogram:
    """``histogram_increase`` (:mod:`~inferwatch.agent.node.engine.histogram`) from a series' last scrape as the window
    keeps it."""
    bounds, counts, total, count = prev
    before = dict(zip(bounds, counts, strict=True))
    # A bound the previous scrape did not have is a new series: its first value is not an increase.
    buckets = tuple((bound, counter_increase(before[bound], c)) for bound, c in cur.buckets if bound in before)
    return Histogram(buckets, counter_increase(total, cur.sum), counter_increase(count, cur.count))


class CounterWindow:
    """Reset-aware increments of named cumulative counters (llama.cpp's seconds and token totals).

    The steps are arrays (their start and end times, and per name its increase in each step, with whether the step
    has it): ~50 bytes a step for vLLM's token counters, where an object and a dict per step took ~440 bytes (at 200
    models x 61 scrapes in a 5 m window ~5 MB). A window sums the steps' increases in the same order as before.
    """

    def __init__(self, horizon_s: float = HORIZON_S) -> None:
        self.horizon_s = horizon_s
        self._last: dict[str, float] = {}
        self._last_t: float | None = None
        self._starts = array("d")  # per step kept, oldest first: the time of its earlier scrape
        self._ends = array("d")
        self._values: dict[str, array[float]] = {}  # name → its increase per step (0 where the step has none)
        self._has: dict[str, bytearray] = {}  # name → per step: 1 if the step has an increase of it

    def update(self, t: float, values: Mapping[str, float]) -> None:
        if self._last_t is not None and t > self._last_t:
            inc = {k: counter_increase(self._last[k], v) for k, v in values.items() if k in self._last}
            self._step(self._last_t, t, inc)
        if self._last_t is None or t > self._last_t:
            self._last = dict(values)
            self._last_t = t
        self._expire(t - self.horizon_s)

    def _step(self, start: float, end: float, inc: dict[str, float]) -> None:
        n = len(self._starts)
        self._starts.append(start)
        self._ends.append(end)
        for name in inc:
            if name not in self._values:  # a name met for the first time: no increase in the older steps
                self._values[name] = array("d", bytes(8 * n))
                self._has[name] = bytearray(n)
        for name, column in self._values.items():
            v = inc.get(name)
            column.append(0.0 if v is None else v)
            self._has[name].append(1 if name in inc else 0)

    def _expire(self, oldest: float) -> None:
        starts = self._starts
        drop = 0
        while drop < len(starts) and starts[drop] < oldest:
            drop += 1
        if not drop:
            return
        del starts[:drop]
        del self._ends[:drop]
        for name in list(self._values):
            del self._values[name][:drop]
            has = self._has[name]
            del has[:drop]
            if 1 not in has:  # no step in the window has it any more
                del self._values[name], self._has[name]

    def increase(self, name: str, window_s: float, at: float | None = None) -> float | None:
        """Increase of ``name`` over ``[at - window_s, at]``; None when no step in the window has it."""
        at = self._last_t if at is None else at
        if at is None:
            return None
        values = self._values.get(name)
        if values is None:
            return None
        has, starts, ends = self._has[name], self._starts, self._ends
        start = at - window_s - EDGE_S
        found = [values[i] for i in range(len(starts)) if starts[i] >= start and ends[i] <= at and has[i]]
        return sum(found) if found else None
