"""From exposition bytes to an :class:`~agent.engine.adapters.EngineReading`, and from histograms to stats.

:class:`EngineParser` decodes (UTF-8 only), detects the engine (or takes ``engine.kind``), reads only
the adapter's families and maps them; it keeps one reader per engine kind so the label cache
survives between scrapes. Errors are :class:`~agent.engine.fetch.EngineScrapeError` with a reason.
"""

from __future__ import annotations

import math

from agent.engine.adapters import (
    ADAPTERS,
    DEFAULT_MODEL,
    EngineReading,
    KeyCache,
    ReadingError,
    detect,
    prefixes_seen,
    read,
)
from agent.engine.board import QUANTILES, LatencyStats
from agent.engine.exposition import STALE_CACHE_FACTOR, STALE_CACHE_SLACK, ExpositionError, ExpositionReader
from agent.engine.fetch import EngineScrapeError
from agent.engine.histogram import Histogram
from agent.engine.limits import EngineLimits, count_sample_lines
from agent.errors import SourceFormatError


class EngineParser:
    """``limits`` (:class:`~agent.engine.limits.EngineLimits`): what one exposition may make us hold."""

    def __init__(
        self, kind: str = "auto", default_model: str = DEFAULT_MODEL, limits: EngineLimits | None = None
    ) -> None:
        if kind != "auto" and kind not in ADAPTERS:
            raise ValueError(f"unknown engine kind {kind!r}")
        self.kind = kind
        self.default_model = default_model
        self.limits = limits if limits is not None else EngineLimits()
        self._readers: dict[str, ExpositionReader] = {}
        self._keys: dict[str, KeyCache] = {}

    def parse(self, body: bytes) -> EngineReading:
        try:
            text = body.decode("utf-8")
        except UnicodeDecodeError as exc:
            raise EngineScrapeError("not_utf8", f"body is not UTF-8 (invalid byte at offset {exc.start})") from None
        limit = self.limits.max_series
        if text.count("\n") > limit and (n := count_sample_lines(text)) > limit:  # before any line is parsed
            raise EngineScrapeError("sample_limit", f"{n} sample lines, over the engine.max_series limit of {limit}")
        kind = self.kind if self.kind != "auto" else detect(text)
        if kind is None:
            raise self._unknown(text)
        adapter = ADAPTERS[kind]
        reader = self._readers.get(kind)
        if reader is None:
            reader = self._readers[kind] = adapter.reader(self.limits)
        try:
            expo = reader.read(text)
        except ExpositionError as exc:
            truncated = exc.last and not text.endswith("\n") and exc.reason == "parse"
            raise EngineScrapeError("truncated" if truncated else exc.reason, str(exc)) from None
        except SourceFormatError as exc:
            raise EngineScrapeError("parse", str(exc)) from None
        if expo.matched == 0:
            raise EngineScrapeError("not_prometheus", f"no {kind} families this adapter reads in the response")
        keys = self._keys.get(kind)
        if keys is None:
            keys = self._keys[kind] = KeyCache(adapter.model_labels, self.default_model)
        if keys.size > STALE_CACHE_FACTOR * expo.matched + STALE_CACHE_SLACK:
            keys.clear()  # label splits of series that are gone (as the reader's own caches)
        try:
            return read(adapter, expo, self.default_model, keys, self.limits.max_models)
        except ReadingError as exc:  # a value outside its quantity's domain
            raise EngineScrapeError(exc.reason, str(exc)) from None
        except SourceFormatError as exc:  # a bucket bound that is not a number, in a family without TYPE
            raise EngineScrapeError("parse", str(exc)) from None

    @staticmethod
    def _unknown(text: str) -> EngineScrapeError:
        """``unknown_engine`` for a valid exposition of another program, else ``not_prometheus``."""
        try:
            ExpositionReader(("",), frozenset(), scrape_rules=False).read(text)
        except ExpositionError as exc:
            if exc.reason != "parse":  # an exposition, broken by a scrape rule (a second TYPE line)
                return EngineScrapeError(exc.reason, str(exc))
            head = text[:60].replace("\n", "\\n")
            return EngineScrapeError("not_prometheus", f"not a Prometheus exposition ({exc}; starts {head!r})")
        seen = prefixes_seen(text)
        if not seen:
            return EngineScrapeError("not_prometheus", "the response holds no samples")
        return EngineScrapeError("unknown_engine", f"no known engine families; prefixes seen: {', '.join(seen)}")


def stats_from_histogram(h: Histogram | None) -> LatencyStats | None:
    """Quantiles interpolated from (increments of) cumulative buckets; None when nothing was observed."""
    if h is None or not h.count > 0:
        return None
    qs = {q: h.quantile(q) for q in QUANTILES}
    if any(math.isnan(v) for v in qs.values()):
        return None
    mean = h.sum / h.count if math.isfinite(h.sum) else None
    return LatencyStats(qs, h.count, "histogram", mean)
