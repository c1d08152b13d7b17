"""Quantities derived from successive engine readings: windowed latency stats, the frontend gap, means from counters.

Per model, :class:`EngineTimeline` keeps sliding windows (1 m, 5 m) over the engine's histograms (bucket
increments, reset-aware, summed over ranks) and over the cumulative counters whose ratio is a mean: seconds
per token by phase (:data:`TOKEN_TIME`) and the means an engine exposes only as counters (``DERIVED_MEANS``
in the catalog's engine schemas). The frontend gap is mean TTFT − (mean queue + mean prefill).
"""

from __future__ import annotations

from inferwatch.agent.catalog.engine import MODEL
from inferwatch.agent.catalog.engine_schemas import DERIVED_MEANS
from inferwatch.agent.common.precedence import step_aside
from inferwatch.agent.common.samples import Attributes, Sample, attrs
from inferwatch.agent.node.engine.adapters import QUANTITIES, EngineReading
from inferwatch.agent.node.engine.board import Key, LatencyStats, latency_samples
from inferwatch.agent.node.engine.scrape import stats_from_histogram
from inferwatch.agent.node.engine.windows import WINDOWS_S, CounterWindow, HistogramWindow

TOKEN_TIME = {"prefill": ("prompt_seconds", "prompt_tokens"), "decode": ("generation_seconds", "generation_tokens")}
# the counters whose increases over a window are asked (token_time, and the means of quantities an engine exposes
# only as cumulative counters: DERIVED_MEANS): the only ones a CounterWindow keeps per scrape
WINDOWED_COUNTERS = frozenset(name for pair in (*TOKEN_TIME.values(), *DERIVED_MEANS.values()) for name in pair)


class EngineTimeline:
    """Per-model sliding windows over successive readings; turns them into samples and latency stats."""

    def __init__(self) -> None:
        self._hist: dict[tuple[str, str], HistogramWindow] = {}
        self._counters: dict[str, CounterWindow] = {}
        # the attributes of the derived samples by (model, window, attribute, value): the same every read, made once;
        # emptied when a model goes
        self._attrs: dict[tuple[str, str, str, str], Attributes] = {}

    def update(self, t: float, reading: EngineReading) -> None:
        live: set[tuple[str, str]] = set()
        for model, m in reading.models.items():
            step_aside()  # per model: a request the API answers goes first (agent/common/precedence.py)
            for quantity, series in m.histograms.items():
                if quantity not in QUANTITIES:  # re-exported only (SIGNAL_HISTOGRAMS)
                    continue
                key = (model, quantity)
                live.add(key)
                self._hist.setdefault(key, HistogramWindow()).update(t, series)
            flat = {name: sum(dims.values()) for name, dims in m.counters.items() if name in WINDOWED_COUNTERS}
            self._counters.setdefault(model, CounterWindow()).update(t, flat)
        for key in set(self._hist) - live:  # the model or family is gone (restart with other flags)
            del self._hist[key]
        for model in set(self._counters) - set(reading.models):
            del self._counters[model]
            self._attrs.clear()

    def stats(self) -> dict[Key, LatencyStats]:
        out: dict[Key, LatencyStats] = {}
        for (model, quantity), window in self._hist.items():
            step_aside()
            for wname, seconds in WINDOWS_S.items():
                stats = stats_from_histogram(window.window(seconds))
                if stats is not None:
                    out[(model, quantity, wname)] = stats
        return out

    def derived_samples(self, stats: dict[Key, LatencyStats]) -> list[Sample]:
        out: list[Sample] = []
        for (model, quantity, wname), s in sorted(stats.items()):
            step_aside()
            out.extend(latency_samples(model, quantity, wname, s))
        models = {k[0] for k in self._hist} | set(self._counters)
        for model in sorted(models):
            step_aside()
            for wname, seconds in WINDOWS_S.items():
                gap = frontend_gap(stats, model, wname)
                if gap is not None:
                    out.append(Sample("inferwatch.engine.frontend_gap", gap, self._attributes(model, wname, "", "")))
                counters = self._counters.get(model)
                if counters is None:
                    continue
                # a mean over the window from two cumulative counters: token time per phase, and the means an engine
                # exposes only as counters (Triton per request, llama.cpp per token)
                for name, key, table in (
                    ("inferwatch.engine.token_time", "phase", TOKEN_TIME),
                    ("inferwatch.engine.latency.mean", "quantity", DERIVED_MEANS),
                ):
                    for label, (secs, count) in table.items():
                        d_secs = counters.increase(secs, seconds)
                        d_count = counters.increase(count, seconds)
                        if d_secs is not None and d_count:
                            out.append(Sample(name, d_secs / d_count, self._attributes(model, wname, key, label)))
        return out

    def _attributes(self, model: str, window: str, key: str, label: str) -> Attributes:
        """``attrs`` of a derived sample: the model, the window and (``key`` not empty) ``key=label``."""
        cache_key = (model, window, key, label)
        hit = self._attrs.get(cache_key)
        if hit is None:
            extra = {key: label} if key else {}
            hit = self._attrs[cache_key] = attrs({MODEL: model}, window=window, **extra)
        return hit


def frontend_gap(stats: dict[Key, LatencyStats], model: str, window: str) -> float | None:
    """Mean TTFT − (mean queue + mean prefill): API server, tokenisation, templating and IPC (seconds)."""
    parts = [stats.get((model, q, window)) for q in ("ttft", "queue", "prefill")]
    means = [p.mean_s if p is not None else None for p in parts]
    if any(m is None for m in means):
        return None
    ttft, queue, prefill = means
    assert ttft is not None and queue is not None and prefill is not None
    return ttft - (queue + prefill)
