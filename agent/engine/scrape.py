"""From exposition bytes to an :class:`~agent.engine.adapters.EngineReading`, and from histograms to stats.

:class:`EngineParser` decodes (UTF-8 only), detects the engine (or takes ``engine.kind``), reads only
the adapter's families and maps them; it keeps one reader per engine kind so the label cache
survives between scrapes. Errors are :class:`~agent.engine.fetch.EngineScrapeError` with a reason.
"""

from __future__ import annotations

import codecs
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
from agent.engine.exposition import (
    STALE_CACHE_FACTOR,
    STALE_CACHE_SLACK,
    Exposition,
    ExpositionError,
    ExpositionReader,
    ReadPass,
)
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
        """Read a whole body (a file, ``engine inspect``); a body ending in ``# EOF`` is read as OpenMetrics."""
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
        reader = self._reader(kind)
        try:
            expo = reader.read(text)
        except ExpositionError as exc:
            truncated = exc.last and not text.endswith("\n") and exc.reason == "parse"
            raise EngineScrapeError("truncated" if truncated else exc.reason, str(exc)) from None
        except SourceFormatError as exc:
            raise EngineScrapeError("parse", str(exc)) from None
        return self._map(kind, expo)

    def stream(self) -> ExpositionStream:
        """A read of a body as it arrives (:class:`ExpositionStream`): the collector's path."""
        return ExpositionStream(self)

    def _reader(self, kind: str) -> ExpositionReader:
        reader = self._readers.get(kind)
        if reader is None:
            reader = self._readers[kind] = ADAPTERS[kind].reader(self.limits)
        return reader

    def _map(self, kind: str, expo: Exposition) -> EngineReading:
        adapter = ADAPTERS[kind]
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


DETECT_WINDOW_CHARS = 64 * 1024  # with engine.kind auto: the engine is told from the body's first 64 Ki chars
_BLANK = " \t"


class ExpositionStream:
    """An exposition read chunk by chunk as it arrives (:meth:`feed`), then :meth:`finish`.

    Only the line being cut by a chunk's end is held, never the body: each chunk is decoded
    (UTF-8, incrementally), split into lines and read by the target's :class:`ExpositionReader`
    at once, so a limit (a label limit, a bad line) stops the read — and the fetch feeding it —
    at the line that breaks it. With ``engine.kind`` auto, text is held until the engine is known
    (:data:`DETECT_WINDOW_CHARS`, or the whole body of a program that is no known engine). A body the
    engine labels OpenMetrics (``Content-Type: application/openmetrics-text``, :meth:`begin`) is
    held whole and read as :meth:`EngineParser.parse` reads it: its family rules need every line.
    """

    def __init__(self, parser: EngineParser) -> None:
        self.parser = parser
        self._decoder = codecs.getincrementaldecoder("utf-8")("strict")
        self._kind: str | None = parser.kind if parser.kind != "auto" else None
        self._reader: ExpositionReader | None = None
        self._pass: ReadPass | None = None
        self._held: list[str] = []  # text before the engine is known
        self._held_chars = 0
        self._carry = ""  # the line cut by the last chunk's end
        self._offset = 0  # bytes decoded so far
        self._whole: bytearray | None = None  # an OpenMetrics body, held whole
        self.bytes = 0
        if self._kind is not None:
            self._start(self._kind)

    def begin(self, content_type: str) -> None:
        """The media type the engine announced (lower case, no parameters)."""
        if content_type == "application/openmetrics-text":
            self._whole = bytearray()

    def feed(self, chunk: bytes) -> None:
        self.bytes += len(chunk)
        if self._whole is not None:
            self._whole += chunk
            return
        pending = len(self._decoder.getstate()[0])  # bytes of a character the last chunk cut
        try:
            text = self._decoder.decode(chunk)
        except UnicodeDecodeError as exc:
            at = self._offset - pending + exc.start
            raise EngineScrapeError("not_utf8", f"body is not UTF-8 (invalid byte at offset {at})") from None
        self._offset += len(chunk)
        self._text(text)

    def finish(self) -> EngineReading:
        if self._whole is not None:
            return self.parser.parse(bytes(self._whole))
        try:
            self._text(self._decoder.decode(b"", final=True))
        except UnicodeDecodeError:
            raise EngineScrapeError("not_utf8", f"body is not UTF-8 (cut at offset {self._offset})") from None
        if self._kind is None:
            text = "".join(self._held)
            self._held.clear()
            kind = detect(text)
            if kind is None:
                raise self.parser._unknown(text)
            self._start(kind)
            self._lines(text)
        assert self._reader is not None and self._pass is not None and self._kind is not None
        last = self._carry
        if last.strip(_BLANK):
            n = self._pass.lines + 1
            raise EngineScrapeError("truncated", f"line {n}: no newline at the end of the input: {last[:120]!r}")
        return self.parser._map(self._kind, self._reader.end(self._pass))

    def _text(self, text: str) -> None:
        if self._kind is None:
            before = self._held_chars
            tail = self._held[-1].rpartition("\n")[2] if self._held else ""  # the line this text continues
            self._held.append(text)
            self._held_chars += len(text)
            if self._held_chars < DETECT_WINDOW_CHARS:
                return
            # the window once in full, then only what is new (a program that is no engine: held whole)
            kind = detect("".join(self._held) if before < DETECT_WINDOW_CHARS else tail + text)
            if kind is None:
                return
            text = "".join(self._held)
            self._held.clear()
            self._start(kind)
        self._lines(text)

    def _start(self, kind: str) -> None:
        self._kind = kind
        self._reader = self.parser._reader(kind)
        self._pass = self._reader.begin()

    def _lines(self, text: str) -> None:
        if not text:
            return
        lines = (self._carry + text).split("\n") if self._carry else text.split("\n")
        self._carry = lines.pop()
        assert self._reader is not None and self._pass is not None
        try:
            self._reader.feed(self._pass, lines)
        except ExpositionError as exc:
            raise EngineScrapeError(exc.reason, str(exc)) from None
        except SourceFormatError as exc:
            raise EngineScrapeError("parse", str(exc)) from None


def stats_from_histogram(h: Histogram | None) -> LatencyStats | None:
    """Quantiles interpolated from (increments of) cumulative buckets; None when nothing was observed."""
    if h is None or not h.count > 0:
        return None
    qs = {q: h.quantile(q) for q in QUANTILES}
    if any(math.isnan(v) for v in qs.values()):
        return None
    mean = h.sum / h.count if math.isfinite(h.sum) else None
    return LatencyStats(qs, h.count, "histogram", mean)
