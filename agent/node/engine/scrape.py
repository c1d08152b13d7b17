"""From exposition bytes to an :class:`~inferwatch.agent.node.engine.adapters.EngineReading`, and from histograms to
stats.

:class:`EngineParser` decodes (UTF-8 only), detects the engine (or takes ``engine.kind``), reads only
the adapter's families and maps them; it keeps one reader per engine kind so the label cache
survives between scrapes. Errors are :class:`~inferwatch.agent.node.engine.fetch.EngineScrapeError` with a reason.
"""

from __future__ import annotations

import codecs
import math
import zlib
from collections.abc import Iterator
from itertools import chain

from inferwatch.agent.catalog.engine import ENGINE_KINDS
from inferwatch.agent.errors import SourceFormatError
from inferwatch.agent.node.engine.adapters import (
    ADAPTERS,
    DEFAULT_MODEL,
    EngineReading,
    KeyCache,
    ReadingError,
    detect,
    prefixes_seen,
    read,
)
from inferwatch.agent.node.engine.board import QUANTILES, LatencyStats
from inferwatch.agent.node.engine.exposition import (
    DROPPABLE,
    STALE_CACHE_FACTOR,
    STALE_CACHE_SLACK,
    Exposition,
    ExpositionReader,
    ReadPass,
)
from inferwatch.agent.node.engine.fetch import EngineScrapeError
from inferwatch.agent.node.engine.histogram import Histogram
from inferwatch.agent.node.engine.limits import EngineLimits, count_sample_lines
from inferwatch.agent.node.engine.textformat import ExpositionError


class EngineParser:
    """``limits`` (:class:`~inferwatch.agent.node.engine.limits.EngineLimits`): what one exposition may make us hold."""

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
        self.problems: list[tuple[str, str]] = []  # the last read's dropped lines: (reason, where and why), a few

    def dropped_lines(self) -> dict[str, int]:
        """Lines of the engine's expositions dropped with a problem of their own, by reason, since the start."""
        out = dict.fromkeys(DROPPABLE, 0)
        for reader in list(self._readers.values()):  # a status read from another thread: no dict to iterate
            for reason, n in list(reader.dropped.items()):
                out[reason] = out.get(reason, 0) + n
        return out

    def parse(self, body: bytes | bytearray) -> EngineReading:
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
        self.problems = expo.problems
        if expo.matched == 0 and expo.problems:  # every line the adapter reads was dropped: the first one says why
            raise EngineScrapeError(*expo.problems[0])
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


STREAM_HOLD_BYTES = 8 * 1024 * 1024  # the first 8 MiB of a body are held (as bytes) before they are read
HOLD_RAW_BYTES = 1024 * 1024  # a body's first MiB is held as it came, the rest of what is held compressed (zlib)
_PIECE_BYTES = 64 * 1024  # held bytes are read in pieces of this size
_BLANK = " \t"


class ExpositionStream:
    """An exposition read as it arrives (:meth:`feed` each chunk), then :meth:`finish`.

    The first :data:`STREAM_HOLD_BYTES` are held as bytes — a body over ``engine.max_series`` lines usually crosses
    that limit there, and is refused by the fetch before any line is parsed, which costs far less than parsing it —
    and the engine is told from them (``engine.kind`` auto). Past the first :data:`HOLD_RAW_BYTES`, what is held is
    compressed (zlib's fastest level; the engine told from each chunk as it comes, with the same answer): at 200
    models x 2 ranks of vLLM the 8 MiB held as they came were ~5 MB of a full read's peak (tracemalloc: ~16 -> ~11
    MB over the heap it leaves), for ~16 ms more CPU (~106 -> ~123 ms for the stream's read alone, in process); a
    body of 1 MiB or less (10 models: 0.6 MB) is held as it came. After that, or at the end of a shorter body, the
    held bytes and every further chunk are decoded (UTF-8, incrementally) and their complete lines read by the
    target's :class:`ExpositionReader` at once, in bulk where they are of the common shape, else line by line
    (:meth:`ExpositionReader.feed_text`): only the line a chunk cuts is held, so raising ``engine.max_bytes`` does
    not let memory follow the body, and a limit (a label limit, a bad line) stops the read — and the fetch feeding
    it — at the line that breaks it. Held longer: the body of a program that is no known engine (to say what it is),
    and a body the engine labels OpenMetrics (``Content-Type: application/openmetrics-text``, :meth:`begin`), read
    whole as :meth:`EngineParser.parse` reads it (its family rules need every line)."""

    def __init__(self, parser: EngineParser) -> None:
        self.parser = parser
        self._decoder = codecs.getincrementaldecoder("utf-8")("strict")
        self._kind: str | None = parser.kind if parser.kind != "auto" else None
        self._reader: ExpositionReader | None = None
        self._pass: ReadPass | None = None
        self._held: bytearray | None = bytearray()  # None once lines are being read
        self._whole = False  # OpenMetrics: held to the end
        self._carry = ""  # the line cut by the last chunk's end
        self._long: list[str] = []  # the chunks after it while they hold no newline
        self._offset = 0  # bytes decoded so far
        self._scanned = 0  # held bytes already searched for an engine's family
        self._zip: zlib._Compress | None = None  # past HOLD_RAW_BYTES: the bytes held after _held, compressed
        self._zipped: list[bytes] = []
        self._zip_bytes = 0  # bytes given to the compressor
        self._tail = b""  # compressed: the bytes since the last newline (an engine's prefix may span two chunks)
        self._found = len(ENGINE_KINDS)  # compressed: the first engine kind (ENGINE_KINDS order) met so far

    def begin(self, content_type: str) -> None:
        """The media type the engine announced (lower case, no parameters)."""
        self._whole = content_type == "application/openmetrics-text"

    def feed(self, chunk: bytes) -> None:
        held = self._held
        if held is None:
            self._decode(chunk)
            return
        if self._zip is None and len(held) + len(chunk) > HOLD_RAW_BYTES and not self._whole:
            self._zip = zlib.compressobj(1)  # the held bytes so far stay as they came, the rest is compressed
            if self._kind is None:
                kind = detect(held)
                self._found = len(ENGINE_KINDS) if kind is None else ENGINE_KINDS.index(kind)
                cut = held.rfind(b"\n")
                self._tail = bytes(held[cut:] if cut >= 0 else held)
        if self._zip is not None:
            self._hold_zipped(chunk)
            if len(held) + self._zip_bytes >= STREAM_HOLD_BYTES:
                self._release(final=False)
            return
        held += chunk
        if len(held) >= STREAM_HOLD_BYTES and not self._whole:
            self._release(final=False)

    def finish(self) -> EngineReading:
        if self._held is not None:
            if self._whole:
                return self.parser.parse(self._held)
            self._release(final=True)
        if self._held is not None:  # no known engine's family
            try:
                text = b"".join(self._held_pieces()).decode("utf-8")
            except UnicodeDecodeError as exc:
                raise EngineScrapeError("not_utf8", f"body is not UTF-8 (invalid byte at offset {exc.start})") from None
            raise self.parser._unknown(text)
        self._decode(b"", final=True)
        assert self._reader is not None and self._pass is not None and self._kind is not None
        last = self._carry + "".join(self._long)
        if last.strip(_BLANK):
            n = self._pass.lines + 1
            raise EngineScrapeError("truncated", f"line {n}: no newline at the end of the input: {last[:120]!r}")
        expo = self._reader.end(self._pass)
        # the read's own sets (series ids of the duplicate check: one int each, 127k at 200 models) go before the
        # reading is made, so what the collection keeps is allocated where they were (less memory held after it)
        self._pass = None
        return self.parser._map(self._kind, expo)

    def _release(self, final: bool) -> None:
        """Read the held bytes once the engine is known (else keep holding, up to engine.max_bytes)."""
        held = self._held
        assert held is not None
        if self._kind is None and self._zip is not None:
            if self._found == len(ENGINE_KINDS):
                return
            self._kind = ENGINE_KINDS[self._found]
        elif self._kind is None:
            start = max(held.rfind(b"\n", 0, self._scanned), 0)  # only what is new since the last look
            kind = detect(held[start:] if start else held)
            self._scanned = len(held)
            if kind is None:
                return
            self._kind = kind
        self._reader = self.parser._reader(self._kind)
        self._pass = self._reader.begin()
        pieces = self._held_pieces()
        self._held = None
        for piece in pieces:
            self._decode(piece)

    def _hold_zipped(self, chunk: bytes) -> None:
        """Hold ``chunk`` compressed; while no engine is known, look for one in it (and the line it continues)."""
        assert self._zip is not None
        self._zip_bytes += len(chunk)
        if out := self._zip.compress(chunk):
            self._zipped.append(out)
        if self._kind is None and self._found > 0:  # detect's answer over the whole: the first kind met anywhere
            text = self._tail + chunk
            kind = detect(text)
            if kind is not None:
                self._found = min(self._found, ENGINE_KINDS.index(kind))
            self._tail = text[text.rfind(b"\n") :] if b"\n" in chunk else text

    def _held_pieces(self) -> Iterator[bytes]:
        """The held bytes in order, in pieces of :data:`_PIECE_BYTES` (decompressed piece by piece); the stream
        lets them go."""
        held, zipper = self._held, self._zip
        assert held is not None
        if zipper is None:
            return _pieces(held)
        zipped = [*self._zipped, zipper.flush()]
        self._zip, self._zipped, self._tail = None, [], b""
        return chain(_pieces(held), _unzipped(zipped))

    def _decode(self, chunk: bytes, final: bool = False) -> None:
        pending = len(self._decoder.getstate()[0])  # bytes of a character the last chunk cut
        try:
            text = self._decoder.decode(chunk, final)
        except UnicodeDecodeError as exc:
            at = self._offset - pending + exc.start
            raise EngineScrapeError("not_utf8", f"body is not UTF-8 (invalid byte at offset {at})") from None
        self._offset += len(chunk)
        if not text:
            return
        if "\n" not in text:  # a line longer than a chunk: its pieces are joined once, when it ends
            self._long.append(text)
            return
        if self._long:
            self._long.append(text)
            text = "".join(self._long)
            self._long.clear()
        if self._carry:
            text = self._carry + text
        cut = text.rfind("\n") + 1
        self._carry = text[cut:]
        assert self._reader is not None and self._pass is not None
        try:  # the complete lines: in bulk where they are of the common shape, else line by line
            self._reader.feed_text(self._pass, text[:cut])
        except ExpositionError as exc:
            self._reader.abandon(self._pass)
            raise EngineScrapeError(exc.reason, str(exc)) from None
        except SourceFormatError as exc:
            self._reader.abandon(self._pass)
            raise EngineScrapeError("parse", str(exc)) from None


def _pieces(held: bytearray) -> Iterator[bytes]:
    if not held:
        return
    view = memoryview(held)
    try:
        for i in range(0, len(held), _PIECE_BYTES):
            yield bytes(view[i : i + _PIECE_BYTES])
    finally:
        view.release()


def _unzipped(zipped: list[bytes]) -> Iterator[bytes]:
    unzip = zlib.decompressobj()
    for part in zipped:
        data = part
        while data:
            yield unzip.decompress(data, _PIECE_BYTES)
            data = unzip.unconsumed_tail
    if rest := unzip.flush():
        yield rest


def stats_from_histogram(h: Histogram | None) -> LatencyStats | None:
    """Quantiles interpolated from (increments of) cumulative buckets; None when nothing was observed."""
    if h is None or not h.count > 0:
        return None
    qs = dict(zip(QUANTILES, h.quantiles(QUANTILES), strict=True))
    if any(math.isnan(v) for v in qs.values()):
        return None
    mean = h.sum / h.count if math.isfinite(h.sum) else None
    return LatencyStats(qs, h.count, "histogram", mean)
