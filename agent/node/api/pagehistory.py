"""The status page's history (a state listener, like the snapshot store): an hour of latency lines per model and
the last minutes of the engine's TTFT buckets, so the page can draw what happened, not only what is.

Once per :data:`HISTORY_STEP_S` (sooner for a model the engine shows for the first time) it copies the TTFT/ITL
P50/P95/P99 of every model, one point per :data:`CHART_STEP_S` (each quantile the maximum of the point's copies, so
a spike stays; an hour: :data:`HISTORY_POINTS`), and the engine's cumulative TTFT buckets over the last
:data:`HISTOGRAM_WINDOW_S` (so the page draws the window's histogram, not the one since the engine started). Nothing
else runs on the collection path. Memory is bounded by :data:`MAX_SERIES` and kept in flat arrays of doubles, a
line's whole hour allocated when it starts: an hour of 200 models takes ~2.7 MB (docs/benchmarks.md).
"""

from __future__ import annotations

import math
import threading
import time
from array import array
from collections.abc import Callable

from inferwatch.agent.common.samples import AnySample, Collection, HistogramSample

HISTORY_STEP_S = 10.0  # the quantiles and TTFT buckets are copied once per step (and when a model first shows)
CHART_STEP_S = 30.0  # a line keeps one point per 30 s of the clock: each quantile the slot's maximum (a spike stays)
HISTORY_S = 3600.0  # the hour the line charts show
HISTORY_POINTS = int(HISTORY_S / CHART_STEP_S)  # 120 points a line
HISTOGRAM_WINDOW_S = 300.0  # the TTFT histogram shows the last 5 minutes (the alerts' 5m window)
MAX_SERIES = 256  # (model, quantity, source) line series kept; models past it are not charted
MODEL = "gen_ai.request.model"
TTFT_HISTOGRAM = "gen_ai.server.time_to_first_token"
CHART_QUANTILES = ("0.5", "0.95", "0.99")


def attribute(s: AnySample, key: str) -> str:
    """The value of a sample's attribute ``key`` ("" when it has none)."""
    for k, v in s.attributes:
        if k == key:
            return v
    return ""


class PageHistory:
    """Listener on the state (:meth:`AgentState.add_listener`): a copy per model and step, a chart point per
    ``chart_step_s``, an hour of them."""

    def __init__(
        self,
        clock: Callable[[], float] = time.time,
        step_s: float = HISTORY_STEP_S,
        points: int = HISTORY_POINTS,
        max_series: int = MAX_SERIES,
        chart_step_s: float = CHART_STEP_S,
    ) -> None:
        self._clock = clock
        self.step_s = step_s
        self.points = points
        self.chart_step_s = chart_step_s
        self.max_series = max_series
        self._lock = threading.Lock()
        self._last: dict[str, float] = {}
        self._seen: set[str] = set()  # models of the engine's collections already kept once
        self._lines: dict[tuple[str, str, str], _Line] = {}
        self._buckets: dict[str, _BucketRing] = {}
        self._keep_buckets = int(HISTOGRAM_WINDOW_S / step_s) + 2

    def on_collection(self, name: str, collection: Collection) -> None:
        if name not in ("engine", "spans"):
            return
        now = self._clock()
        with self._lock:
            # Once per step; sooner for a model the engine shows for the first time, so its histogram window
            # starts at its first scrape (the models come from the collection's details: no sample is read).
            models = {str(m) for m in collection.details.get("models", ())} if name == "engine" else set()
            if now - self._last.get(name, -math.inf) < self.step_s and models <= self._seen:
                return
            self._last[name] = now
            if len(self._seen) + len(models) > 4 * self.max_series:
                self._seen.clear()  # bounded: models come and go
            self._seen |= models
        quantiles: dict[tuple[str, str, str], dict[str, float]] = {}
        hists: dict[str, tuple[tuple[float, float], ...]] = {}
        for s in collection.samples:
            if isinstance(s, HistogramSample):
                if s.name == TTFT_HISTOGRAM:
                    hists[attribute(s, MODEL)] = s.buckets
            elif s.name == "inferwatch.engine.latency" and attribute(s, "window") == "1m":
                quantity = attribute(s, "quantity")
                q = attribute(s, "quantile")
                if quantity in ("ttft", "itl") and q in CHART_QUANTILES:
                    key = (attribute(s, MODEL), quantity, attribute(s, "source"))
                    quantiles.setdefault(key, {})[q] = s.value
        with self._lock:
            for key, qs in quantiles.items():
                line = self._lines.get(key)
                if line is None:
                    if len(self._lines) >= self.max_series:
                        continue
                    line = self._lines[key] = _Line(self.points, self.chart_step_s)
                line.append(now, *(qs.get(q) for q in CHART_QUANTILES))
            for model, buckets in hists.items():
                ring = self._buckets.get(model)
                if ring is None:
                    if len(self._buckets) >= self.max_series:
                        continue
                    ring = self._buckets[model] = _BucketRing(self._keep_buckets)
                ring.append(now, buckets)
            horizon = now - self.chart_step_s * self.points
            for stale in [k for k, v in self._lines.items() if v.last_time < horizon]:
                del self._lines[stale]
            for gone in [m for m, v in self._buckets.items() if v.last_time < horizon]:
                del self._buckets[gone]

    def line(
        self, model: str, quantity: str, source: str
    ) -> list[tuple[float, float | None, float | None, float | None]]:
        with self._lock:
            line = self._lines.get((model, quantity, source))
            return line.points_kept() if line is not None else []

    def baseline(self, model: str, now: float) -> tuple[float, tuple[tuple[float, float], ...]] | None:
        """The oldest kept TTFT buckets of ``model`` within :data:`HISTOGRAM_WINDOW_S` of ``now``."""
        with self._lock:
            ring = self._buckets.get(model)
            return ring.oldest_within(now - HISTOGRAM_WINDOW_S) if ring is not None else None


def _stored(v: float | None) -> float:
    return math.nan if v is None else v


def _read(v: float) -> float | None:
    return None if v != v else v


class _Line:
    """One chart line: a point per ``slot_s`` of the clock, its last ``points`` of them, each the time of the slot's
    last copy and P50, P95, P99 each the maximum of the slot's copies (so a spike stays), in a ring of doubles
    allocated whole when the line is made; a missing quantile (and a NaN, which a chart cannot draw either) kept as NaN
    and read back as None. 32 bytes a point, 120 points an hour, all taken at once (an agent's size after its first
    minutes is its size after an hour)."""

    __slots__ = ("_count", "_next", "_points", "_slot_s", "_values")

    def __init__(self, points: int, slot_s: float) -> None:
        self._values = array("d", bytes(32 * points))
        self._points = points
        self._slot_s = slot_s
        self._next = 0  # the slot the next point goes to
        self._count = 0

    def __len__(self) -> int:
        return self._count

    @property
    def last_time(self) -> float:
        return self._values[4 * ((self._next - 1) % self._points)] if self._count else math.inf

    def append(self, t: float, p50: float | None, p95: float | None, p99: float | None) -> None:
        values = self._values
        new = (_stored(p50), _stored(p95), _stored(p99))
        last = self.last_time
        if self._count and math.floor(t / self._slot_s) == math.floor(last / self._slot_s) and t >= last:
            i = 4 * ((self._next - 1) % self._points)  # the same slot: merged into its point
            values[i] = t
            for k, v in enumerate(new, start=i + 1):
                if v == v and not values[k] >= v:  # NaN (missing) never wins; the larger value does
                    values[k] = v
            return
        i = 4 * self._next
        values[i : i + 4] = array("d", (t, *new))
        self._next = (self._next + 1) % self._points
        self._count = min(self._count + 1, self._points)

    def points_kept(self) -> list[tuple[float, float | None, float | None, float | None]]:
        """Oldest first."""
        v, n = self._values, self._points
        first = (self._next - self._count) % n
        slots = (4 * ((first + k) % n) for k in range(self._count))
        return [(v[i], _read(v[i + 1]), _read(v[i + 2]), _read(v[i + 3])) for i in slots]


class _BucketRing:
    """A model's cumulative TTFT buckets at its last ``keep`` steps: the bounds once, the counts of each step in one
    flat array of doubles (8 bytes a bucket a step). Bounds that
    change (the engine restarted with others) start the ring again: counts under other bounds are no baseline."""

    __slots__ = ("_bounds", "_counts", "_keep", "_times")

    def __init__(self, keep: int) -> None:
        self._keep = keep
        self._bounds: tuple[float, ...] = ()
        self._times = array("d")
        self._counts = array("d")

    @property
    def last_time(self) -> float:
        return self._times[-1] if self._times else math.inf

    def append(self, t: float, buckets: tuple[tuple[float, float], ...]) -> None:
        bounds = tuple(b for b, _ in buckets)
        if bounds != self._bounds:
            self._bounds = bounds
            del self._times[:], self._counts[:]
        self._times.append(t)
        self._counts.extend(c for _, c in buckets)
        if len(self._times) > self._keep:
            del self._times[0], self._counts[: len(bounds)]

    def oldest_within(self, since: float) -> tuple[float, tuple[tuple[float, float], ...]] | None:
        """The oldest step at or after ``since``, as (time, buckets); None if there is none."""
        width = len(self._bounds)
        for i, t in enumerate(self._times):
            if t >= since:
                return t, tuple(zip(self._bounds, self._counts[i * width : (i + 1) * width], strict=True))
        return None
