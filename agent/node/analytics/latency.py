"""Per-model latency analytics from per-request timings (OTLP spans).

Input: :class:`RequestTiming` values (one per finished request, seconds). Output: catalog samples with
``source="spans"``, per model (``gen_ai.request.model``), quantity and window (1m, 5m):

- ``inferwatch.engine.latency`` P50/P90/P95/P99 from the window's merged DDSketch (≤ 0.5 % relative error);
- ``inferwatch.engine.latency.samples`` requests in the window;
- ``inferwatch.engine.latency.tail_ratio`` P99 / P50;
- ``inferwatch.engine.latency.bimodal`` / ``.bimodality`` (see :mod:`inferwatch.agent.node.analytics.bimodality`), from
  :data:`~inferwatch.agent.node.analytics.bimodality.MIN_SAMPLES` requests on, fitted again when the window's input
  changed materially since the last fit (its shape by :data:`REFIT_SHAPE`, or its request count enough to flip the
  verdict) and at least once per window length;
- ``inferwatch.engine.goodput``: the exact share of requests with TTFT and time per output token both within the
  catalog's goodput targets (``GOODPUT_*_TARGET_S``);
- ``inferwatch.engine.frontend_gap``: mean of TTFT − (queue + prefill) over requests that carry all three,
  only for a (model, window) where the engine collector does not emit it from its histograms (the
  metric has no ``source`` attribute, so one producer per series);
- optionally (``receiver.emit_histograms``) the cumulative ``gen_ai.server.*`` histograms exactly as the GenAI
  semantic conventions define them (:mod:`inferwatch.agent.node.analytics.genai`), for engines that have none of their
  own; each request's measurements also go to the observer (:meth:`LatencyAnalytics.set_observer`: the OTLP sink's
  synchronous histograms, the SDK having no observable histogram);
- optionally (``receiver.prompt_band_histograms``) TTFT and time per output token per prompt-length band
  (:mod:`inferwatch.agent.node.analytics.promptband`), for the conformance band per prompt band (Prometheus only).

What the analytics need from the engine collector (the models it sees, the frontend_gap series it emits)
comes in as :class:`EngineSeries`, read from the engine's last collection in the state; the two producers
share no object. The quantile samples are built by :func:`~inferwatch.agent.node.engine.board.latency_samples`, so both
export the same shape; the last computation's stats are kept in :attr:`LatencyAnalytics.published`.

Thread-safe: intake threads call :meth:`LatencyAnalytics.record`; the runner calls
:meth:`LatencyAnalytics.compute` on its schedule (:class:`inferwatch.agent.node.analytics.processor.SpanAnalytics`),
never a sink.
"""

from __future__ import annotations

import threading
import time
from bisect import bisect_right
from collections.abc import Callable, Iterable
from dataclasses import dataclass
from functools import partial
from itertools import accumulate
from typing import Any

from inferwatch.agent.catalog.engine import GOODPUT_TPOT_TARGET_S, GOODPUT_TTFT_TARGET_S, MODEL, QUANTITIES
from inferwatch.agent.common.samples import UNKNOWN_MODEL, AnySample, Collection, RequestTiming, Sample, attrs
from inferwatch.agent.node.analytics import bimodality, genai
from inferwatch.agent.node.analytics.failures import ModelFailures
from inferwatch.agent.node.analytics.promptband import PromptBandHistograms
from inferwatch.agent.node.analytics.windows import (
    WINDOWS_S,
    Bins,
    WindowedSketch,
    WindowedSum,
    add_values,
    log_bins,
    positive_bins,
    shape_distance,
    slot_of,
    slots_in,
)
from inferwatch.agent.node.engine.board import Key, LatencyStats, latency_samples

QUANTILES = (0.5, 0.9, 0.95, 0.99)
SOURCE = "spans"
DEFAULT_MAX_MODELS = 64
# A bimodality verdict is kept while its window's input is materially what it was fitted on: the runner computes
# every cycle, but a fit (EM, 1–13 ms) of an unchanged distribution gives the same verdict. A series is fitted again
# when its shape moved (the Kolmogorov–Smirnov distance of the sketch bins above REFIT_SHAPE: a new mode of 5 %
# weight, the least the test flags, moves it by ~0.05), when the fit rescaled to the
# window's request count says the verdict could flip (bimodality.rescaled: exact for the same shape, so a burst's
# verdict is re-examined as the burst grows, without a fit per step), and at least once per window length.
REFIT_SHAPE = 0.05
# Called with (metric, seconds, attributes including the model) for each semantic-convention measurement.
Observer = Callable[[str, float, dict[str, str]], None]


@dataclass(frozen=True, slots=True)
class EngineSeries:
    """What the engine collector's last collection says that the span analytics use."""

    models: tuple[str, ...] = ()  # every model of the engine's last scrape
    gaps: frozenset[tuple[str, str]] = frozenset()  # (model, window) the engine emits frontend_gap for

    @classmethod
    def of(cls, collection: Collection | None) -> EngineSeries:
        if collection is None:
            return cls()
        models = collection.details.get("models", ())
        gaps = frozenset(
            (dict(s.attributes).get(MODEL, ""), dict(s.attributes).get("window", ""))
            for s in collection.samples
            if s.name == "inferwatch.engine.frontend_gap"
        )
        return cls(tuple(sorted(str(m) for m in models)), gaps)


@dataclass(frozen=True, slots=True)
class WindowStats:
    """What one window says about one quantity of one model (seconds)."""

    count: float
    quantiles: dict[float, float]
    tail_ratio: float | None
    bimodality: bimodality.Bimodality | None
    mean_s: float | None = None


def good(t: RequestTiming) -> float | None:
    """1.0 when the request met both goodput targets (TTFT, time per output token), 0.0 when not, None when its
    span lacks TTFT, or decode time for a request with more than one output token (not counted)."""
    s = t.seconds
    ttft = s.get("ttft")
    if ttft is None:
        return None
    n = t.completion_tokens
    if n is not None and n <= 1:
        tpot = 0.0  # no token after the first: nothing to be slow at
    elif n is None or "decode" not in s:
        return None
    else:
        tpot = s["decode"] / (n - 1)
    return 1.0 if ttft <= GOODPUT_TTFT_TARGET_S and tpot <= GOODPUT_TPOT_TARGET_S else 0.0


class _Model:
    __slots__ = ("banded", "gap", "good", "histograms", "sketches")

    def __init__(self, histograms: genai.GenAIOptions | None, banded: PromptBandHistograms | None = None) -> None:
        self.sketches = {q: WindowedSketch() for q in QUANTITIES}
        self.gap = WindowedSum()
        self.good = WindowedSum()  # per request: 1 met both goodput targets, 0 not
        self.histograms = genai.ModelHistograms(histograms) if histograms is not None else None
        self.banded = banded  # TTFT and TPOT per prompt band (receiver.prompt_band_histograms)


class LatencyAnalytics:
    """Windowed per-model latency sketches and what the catalog derives from them."""

    def __init__(
        self,
        clock: Callable[[], float] = time.monotonic,
        max_models: int = DEFAULT_MAX_MODELS,
        histograms: bool = False,
        genai_options: genai.GenAIOptions | None = None,
        prompt_bands: bool = False,
    ) -> None:
        self._clock = clock
        self._max_models = max_models
        self._histograms = (genai_options or genai.GenAIOptions()) if histograms else None
        self._ttft_extra = (genai_options or genai.GenAIOptions()).ttft_extra_buckets_s
        self._prompt_bands = prompt_bands
        self._observer: Observer | None = None
        self._engine_models: tuple[str, ...] = ()  # the engine collector's models at the last compute
        self._lock = threading.Lock()
        self._models: dict[str, _Model] = {}
        # (model, quantity, window) → (sub-window of the fit, the bins it was fitted on, its verdict)
        self._bimodal_cache: dict[tuple[str, str, str], tuple[int, Bins, bimodality.Bimodality | None]] = {}
        self.bimodality_fits = 0  # fits run (other cycles reuse one; tests/test_cost_counts_spans.py counts them)
        self.rejected_models = 0  # requests dropped because max_models distinct models were already tracked
        self.published: dict[Key, LatencyStats] = {}  # the last computation's stats (source="spans")
        self.failures = ModelFailures("latency")  # models whose step raised: left out of that cycle, counted

    def record(self, timings: Iterable[RequestTiming]) -> int:
        """Add finished requests; return how many were dropped (too many distinct models)."""
        dropped = 0
        with self._lock:
            now = self._clock()
            slot = slot_of(now)
            # per model of this batch: its entry and each quantity's values, added to the current sub-window's
            # sketch in one pass per quantity at the end (in arrival order: the same sketch as one add per value)
            batch: dict[str, tuple[_Model, dict[str, list[float]]]] = {}
            try:  # the values of the spans before one that raised are kept, as when each was added at once
                for t in timings:
                    entry = batch.get(t.model)
                    if entry is None:
                        m = self._models.get(t.model)
                        if m is None:
                            if len(self._models) >= self._max_models:
                                _add_batch(batch, slot)  # a model with values waiting is not idle
                                batch.clear()
                                self._evict_idle(now)
                            if len(self._models) >= self._max_models:
                                dropped += 1
                                continue
                            banded = PromptBandHistograms(self._ttft_extra) if self._prompt_bands else None
                            m = self._models[t.model] = _Model(self._histograms, banded)
                        entry = batch[t.model] = (m, {q: [] for q in m.sketches})
                    m, pending = entry
                    s = t.seconds
                    for q, v in s.items():
                        values = pending.get(q)
                        if values is not None:
                            values.append(v)
                    if "ttft" in s and "queue" in s and "prefill" in s:
                        m.gap.add(s["ttft"] - s["queue"] - s["prefill"], now)
                    g = good(t)
                    if g is not None:
                        m.good.add(g, now)
                    if m.banded is not None:
                        m.banded.observe(t)
                    if m.histograms is not None:
                        got = m.histograms.observe(t)
                        observer = self._observer
                        if observer is not None and got:
                            label = display_name(t.model, self._models, self._engine_models)
                            for metric, value, a in got:
                                observer(metric, value, {**dict(a), MODEL: label})
            finally:
                _add_batch(batch, slot)
            self.rejected_models += dropped
        return dropped

    def set_observer(self, observer: Observer | None) -> None:
        """Hand each semantic-convention measurement to ``observer`` as it is recorded (the OTLP sink)."""
        with self._lock:
            self._observer = observer

    def _evict_idle(self, now: float) -> None:
        for name in [n for n, m in self._models.items() if all(sk.empty(now) for sk in m.sketches.values())]:
            del self._models[name]

    def models(self) -> list[str]:
        with self._lock:
            return sorted(self._models)

    def window_stats(self, model: str, quantity: str, window: str) -> WindowStats | None:
        """Quantiles, tail ratio and bimodality of one series, or None when the window holds nothing."""
        now = self._clock()
        with self._lock:
            m = self._models.get(model)
            if m is None:
                return None
            sketch = m.sketches[quantity].window(WINDOWS_S[window], now)
        if not sketch.count:
            return None
        qs = quantiles(sketch, QUANTILES)
        p50, p99 = qs[0.5], qs[0.99]
        ratio = p99 / p50 if p50 > 0 else None
        key, slot = (model, quantity, window), slot_of(now)
        cached = self._bimodal_cache.get(key)
        bins = positive_bins(sketch)
        fresh = cached is not None and slot - cached[0] < slots_in(WINDOWS_S[window])
        if cached is not None and _same_input(cached[1], cached[2], fresh, bins):
            verdict = cached[2]
        else:
            verdict = bimodality.detect_log(log_bins(sketch))
            self.bimodality_fits += 1
            self._bimodal_cache[key] = (slot, bins, verdict)
        mean = sketch.sum / sketch.count if sketch.count else None
        return WindowStats(float(sketch.count), qs, ratio, verdict, mean)

    def frontend_gap(self, model: str, window: str) -> float | None:
        """Mean TTFT − (queue + prefill) over the window, seconds; None without such requests."""
        with self._lock:
            m = self._models.get(model)
            if m is None:
                return None
            total, count = m.gap.window(WINDOWS_S[window], self._clock())
        return total / count if count else None

    def goodput(self, model: str, window: str) -> float | None:
        """Share of the window's requests that met both goodput targets (exact); None without such requests."""
        with self._lock:
            m = self._models.get(model)
            if m is None:
                return None
            total, count = m.good.window(WINDOWS_S[window], self._clock())
        return total / count if count else None

    def compute(self, engine: EngineSeries | None = None) -> list[AnySample]:
        """Every catalog sample the analytics derive now (absent quantities stay absent); the runner's call.

        ``engine`` is the engine collector's last word: spans that name no model are reported under its one
        model, and a (model, window) whose frontend_gap it emits from its histograms is left to it (the
        metric has no ``source`` attribute: one producer per series).
        """
        engine = engine or EngineSeries()
        now = self._clock()
        with self._lock:
            self._evict_idle(now)
            names = sorted(self._models)
            shown = {name: display_name(name, names, engine.models) for name in names}
            self._engine_models = engine.models
            live = {(n, q, w) for n in names for q in QUANTITIES for w in WINDOWS_S}
            for key in [k for k in self._bimodal_cache if k not in live]:
                del self._bimodal_cache[key]
        published: dict[tuple[str, str, str], LatencyStats] = {}
        out: list[AnySample] = []
        hists: list[AnySample] = []
        for name in names:  # one model at a time: a model whose records break a step loses its series, alone
            got = self.failures.run(name, partial(self._model_samples, name, shown[name], engine))
            if got is not None:
                out.extend(got[0])
                hists.extend(got[1])
                published.update(got[2])
        self.failures.keep(names)
        self.published = published
        out.extend(hists)
        return out

    def _model_samples(
        self, name: str, label: str, engine: EngineSeries
    ) -> tuple[list[AnySample], list[AnySample], dict[Key, LatencyStats]]:
        """One model's samples: (windowed quantiles and what derives from them, histograms, published stats)."""
        with self._lock:
            m = self._models.get(name)
            hists: list[AnySample] = []
            if m is not None and m.histograms is not None:
                hists.extend(m.histograms.samples(label))
            if m is not None and m.banded is not None:
                hists.extend(m.banded.samples(label))
        out: list[AnySample] = []
        published: dict[Key, LatencyStats] = {}
        for window in WINDOWS_S:
            for q in QUANTITIES:
                st = self.window_stats(name, q, window)
                if st is None:
                    continue
                stats = LatencyStats(st.quantiles, st.count, SOURCE, st.mean_s)
                published[(label, q, window)] = stats
                out.extend(latency_samples(label, q, window, stats))
                if st.bimodality is not None:
                    a = attrs({MODEL: label, "quantity": q, "window": window, "source": SOURCE})
                    b = st.bimodality
                    out.append(Sample("inferwatch.engine.latency.bimodal", 1.0 if b.bimodal else 0.0, a))
                    out.append(Sample("inferwatch.engine.latency.bimodality", b.statistic, a))
            gap = self.frontend_gap(name, window) if (label, window) not in engine.gaps else None
            if gap is not None:
                out.append(Sample("inferwatch.engine.frontend_gap", gap, attrs({MODEL: label, "window": window})))
            gp = self.goodput(name, window)
            if gp is not None:
                a = attrs({MODEL: label, "window": window, "source": SOURCE})
                out.append(Sample("inferwatch.engine.goodput", gp, a))
        return out, hists, published


def quantiles(sketch: Any, qs: Iterable[float]) -> dict[float, float]:
    """``{q: float(sketch.get_quantile_value(q) or 0.0)}``, the positive bins walked once for all of ``qs``.

    DDSketch finds each quantile by summing the bins from the lowest up in Python; here the running sums are taken
    once (``itertools.accumulate``, the same additions in the same order, so the same floats) and each quantile's
    bin is found by bisection: the same key, the same value. A sketch with negative values (never a latency) is
    left to DDSketch.
    """
    count = sketch.count
    if not count or sketch._negative_store.count:
        return {q: float(sketch.get_quantile_value(q) or 0.0) for q in qs}
    store, zero, value = sketch._store, sketch._zero_count, sketch._mapping.value
    running = list(accumulate(store.bins))
    out: dict[float, float] = {}
    for q in qs:
        if not 0 <= q <= 1:
            out[q] = 0.0
            continue
        rank = q * (count - 1)
        if rank < zero:
            out[q] = 0.0
            continue
        i = bisect_right(running, rank - zero)  # the first bin whose running sum exceeds the rank
        out[q] = float(value(i + store.offset if i < len(running) else store.max_key) or 0.0)
    return out


def _add_batch(batch: dict[str, tuple[_Model, dict[str, list[float]]]], slot: int) -> None:
    for m, pending in batch.values():
        for q, values in pending.items():
            if values:
                add_values(m.sketches[q].sketch_at(slot), values)


def _same_input(fitted: Bins, verdict: bimodality.Bimodality | None, fresh: bool, bins: Bins) -> bool:
    """Whether ``verdict``, fitted on ``fitted``, still stands for ``bins`` (``fresh``: fitted within the window's
    length)."""
    if bins[2] == fitted[2] and bins[0] == fitted[0] and bins[1] == fitted[1]:
        return True  # the test is deterministic: the same bins, the same verdict
    if verdict is None or not fresh or bins[2] < bimodality.MIN_SAMPLES:  # None: a test of a few bins, cheap
        return False
    if bimodality.supported(bimodality.rescaled(verdict, bins[2])) != bimodality.supported(verdict):
        return False  # at this many requests the same shape would get the other verdict
    return shape_distance(fitted, bins) <= REFIT_SHAPE


def display_name(model: str, tracked: Iterable[str] = (), engine_models: tuple[str, ...] = ()) -> str:
    """The model to report ``model``'s spans under: spans that named none (vLLM v1's never do,
    :data:`~inferwatch.agent.common.samples.UNKNOWN_MODEL`) belong to the engine's model when the engine collector sees
    exactly one and no span named it; otherwise the name is kept."""
    if model != UNKNOWN_MODEL:
        return model
    if len(engine_models) == 1 and engine_models[0] not in tracked:
        return engine_models[0]
    return model
