"""Per-model latency statistics (:class:`LatencyStats`) and the samples every producer exports from them.

:class:`LatencyBoard` holds the latest stats per (source, model, quantity, window); the engine collector
keeps its own (``source="histogram"``). It is not shared between producers: the span analytics read
what they need from the engine collector's collection in the state.

:func:`latency_samples` turns one :class:`LatencyStats` into the catalog samples
``inferwatch.engine.latency`` (per quantile), ``.samples`` and ``.tail_ratio``, so every producer
exports the same shape.
"""

from __future__ import annotations

import math
import threading
from collections.abc import Iterable, Mapping
from dataclasses import dataclass

from inferwatch.agent.catalog.engine import MODEL
from inferwatch.agent.common.samples import Attributes, Sample, attrs

QUANTILES = (0.5, 0.9, 0.95, 0.99)
SOURCES = ("spans", "histogram")  # preference order when a reader wants one value


@dataclass(frozen=True, slots=True)
class LatencyStats:
    """Quantiles (seconds) of one timing quantity over one window, with the observations behind them.

    ``quantiles`` maps each of :data:`QUANTILES` to seconds; ``count`` is the number of requests (or
    tokens, for inter-token latency) observed in the window; ``mean_s`` is ``sum/count`` when known.
    """

    quantiles: Mapping[float, float]
    count: float
    source: str  # histogram | spans
    mean_s: float | None = None

    @property
    def tail_ratio(self) -> float | None:
        p50, p99 = self.quantiles.get(0.5), self.quantiles.get(0.99)
        if p50 is None or p99 is None or not p50 > 0 or not math.isfinite(p99):
            return None
        return p99 / p50


Key = tuple[str, str, str]  # (model, quantity, window)


class LatencyBoard:
    """Thread-safe latest :class:`LatencyStats` per (source, model, quantity, window)."""

    def __init__(self) -> None:
        self._lock = threading.Lock()
        self._by_source: dict[str, dict[Key, LatencyStats]] = {}
        self._models: dict[str, tuple[str, ...]] = {}

    def set_models(self, source: str, models: Iterable[str]) -> None:
        """The models ``source`` currently sees (the engine collector: every model of the last scrape)."""
        with self._lock:
            self._models[source] = tuple(sorted(models))

    def models(self, source: str) -> tuple[str, ...]:
        with self._lock:
            return self._models.get(source, ())

    def replace(self, source: str, entries: Mapping[Key, LatencyStats]) -> None:
        """Replace everything ``source`` published before (what it no longer sees becomes absent)."""
        with self._lock:
            self._by_source[source] = dict(entries)

    def get(self, model: str, quantity: str, window: str, source: str | None = None) -> LatencyStats | None:
        """One source's stats, or (``source=None``) the preferred one: spans, then histogram."""
        with self._lock:
            for src in (source,) if source else SOURCES:
                stats = self._by_source.get(src, {}).get((model, quantity, window))
                if stats is not None:
                    return stats
        return None

    def snapshot(self) -> dict[str, dict[Key, LatencyStats]]:
        with self._lock:
            return {src: dict(entries) for src, entries in self._by_source.items()}


def latency_samples(model: str, quantity: str, window: str, stats: LatencyStats) -> list[Sample]:
    """Catalog samples for one stats value (quantiles, sample count, P99/P50)."""
    base, by_quantile = _attributes(model, quantity, window, stats.source)
    out = []
    for q, v in sorted(stats.quantiles.items()):
        if math.isfinite(v):
            text = _fmt_q(q)
            a = by_quantile.get(text)
            if a is None:
                a = by_quantile[text] = attrs(dict(base), quantile=text)
            out.append(Sample("inferwatch.engine.latency", v, a))
    out.append(Sample("inferwatch.engine.latency.samples", stats.count, base))
    ratio = stats.tail_ratio
    if ratio is not None:
        out.append(Sample("inferwatch.engine.latency.tail_ratio", ratio, base))
    return out


# The attributes of each (model, quantity, window, source)'s samples, and of each of its quantiles (by their text):
# the same tuples every read, made once (an engine's full read at 10 models x 2 ranks makes ~840 of these samples).
# Emptied when it reaches MAX_CACHED_KEYS (models come and go), then filled again.
MAX_CACHED_KEYS = 8_192
_ATTRIBUTES: dict[tuple[str, str, str, str], tuple[Attributes, dict[str, Attributes]]] = {}


def _attributes(model: str, quantity: str, window: str, source: str) -> tuple[Attributes, dict[str, Attributes]]:
    key = (model, quantity, window, source)
    hit = _ATTRIBUTES.get(key)
    if hit is None:
        if len(_ATTRIBUTES) >= MAX_CACHED_KEYS:
            _ATTRIBUTES.clear()
        hit = _ATTRIBUTES[key] = (attrs({MODEL: model, "quantity": quantity, "window": window, "source": source}), {})
    return hit


def _fmt_q(q: float) -> str:
    return repr(q)  # 0.5, 0.9, 0.95, 0.99
