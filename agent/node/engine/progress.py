"""The progress pass: from an engine's exposition, only what hang detection reads, between two full reads.

Hang detection (:mod:`inferwatch.agent.node.engine.hang`) needs a reading every 2 s, but only of a few families per
rank: requests running and waiting, the prompt and generation token counters, the step signal (vLLM's KV-cache
usage), and the finished and preempted requests (:data:`PROGRESS_GAUGES`, :data:`PROGRESS_COUNTERS`). The rest of
an exposition (histograms above all: ~90 % of vLLM's lines) changes nothing there, and the engine collector reads
it whole once per collection interval. A :class:`ProgressReader` takes the sample lines of its families out of the
body with one regular expression over the bytes (no line of another family is decoded, split or parsed: ~0.1 µs
each), then
reads them with the same reader and adapter mapping as a full read (:class:`~inferwatch.agent.node.engine.
exposition.ExpositionReader`, :func:`~inferwatch.agent.node.engine.adapters.read`), so a value it gives is the value a
full read gives.

It answers None where it cannot be sure of that, and the collector then reads the same body in full: a line it
keeps breaks the format or a rule of the reading (the full read says which, and counts it), or the lines it took
are not a plain text-format body. What it does not check is every other family's lines: the full read at the
collection interval does, and counts what it finds as it always has.

**Asking for the families alone.** prometheus_client's exposition apps — vLLM's and SGLang's ``/metrics`` are its
``make_asgi_app`` — answer a ``name[]=<sample name>`` query with those samples only (``restricted_registry``, since
prometheus_client 0.12): :func:`filtered_url` is the metrics URL with the pass's sample names so asked, and the pass
reads a body of a few kB instead of the whole exposition (~15x less at 10 models x 2 ranks of vLLM). An engine that
does not know the query (TGI, llama.cpp, TensorRT-LLM's Triton) sends its whole exposition, which the pass reads as
before. An answer that cannot stand for the full read (prometheus_client before 0.25 answers such a query with
nothing from a multiprocess registry; a line the reader refuses) is never read in full itself: the collector reads the
plain URL in full instead and stops asking for a while (agent/node/collectors/engine.py).

The collector's pass is a :class:`ProgressScan`, a fetch's sink: the lines are taken out of the body as it arrives,
and only about :data:`FIND_CHUNK` of it is held unread at a time. The body itself is kept for that full read, its
first :data:`HOLD_RAW_BYTES` as they came and the rest compressed (zlib's fastest level): held whole, the 12 MB of
200 models x 2 ranks of vLLM were the agent's memory peak (docs/benchmarks.md, "/metrics and the API while a
200-model engine is read"); kept so, a pass holds ~4 MB at its peak instead of ~14 MB (tracemalloc), for ~20 ms more
CPU (~30 -> ~51 ms for the pass alone, in process). A body of 1 MiB or less (10 models: 0.6 MB) is kept as it came,
at no cost.
"""

from __future__ import annotations

import re
import zlib
from collections.abc import Iterable
from dataclasses import replace
from urllib.parse import urlencode, urlsplit, urlunsplit

from inferwatch.agent.errors import SourceFormatError
from inferwatch.agent.node.engine.adapters import (
    ADAPTERS,
    DEFAULT_MODEL,
    Adapter,
    EngineReading,
    KeyCache,
    read,
)
from inferwatch.agent.node.engine.exposition import STALE_CACHE_FACTOR, STALE_CACHE_SLACK
from inferwatch.agent.node.engine.limits import EngineLimits

# What HangDetector.update reads of a model and its ranks (agent/node/engine/hang.py): the rank quantities
# (adapters.RANK_QUANTITIES) and the request events that tell a decode from a prefill. The prefill speed (vLLM's
# prefill histogram, llama.cpp's prompt seconds) is the detector's from the last full read.
PROGRESS_GAUGES = ("running", "waiting", "kv_usage")
PROGRESS_COUNTERS = ("prompt_tokens", "generation_tokens", "finished", "preemptions")
# Bytes of the body searched per call of the regular expression, which holds the interpreter while it runs: the
# 12 MB of 200 models x 2 ranks took ~18 ms in one call, during which no other thread (the API's) ran.
FIND_CHUNK = 1 << 20
# A progress scan keeps its body for the full read it may fall back to: its first MiB as it came, the rest compressed.
HOLD_RAW_BYTES = 1 << 20


def progress_adapter(adapter: Adapter) -> Adapter:
    """``adapter`` with only the families a progress pass reads (no histogram, no LoRA info)."""
    return replace(
        adapter,
        histograms={},
        gauges={q: adapter.gauges[q] for q in PROGRESS_GAUGES if q in adapter.gauges},
        counters={q: adapter.counters[q] for q in PROGRESS_COUNTERS if q in adapter.counters},
        lora=(),
    )


def progress_lines(names: frozenset[str]) -> tuple[re.Pattern[bytes], re.Pattern[bytes]]:
    """Patterns of the sample lines of the sample names ``names`` (unquoted, with or without labels): one finds them
    after a newline, the other matches the body's first line. The first starts with a literal newline, which the
    regular expression engine searches for before it tries the names: ~0.1 µs a line of another family, where
    ``^`` with ``re.M`` tried the names at every byte (7x slower at 10 models, 4x at 200)."""
    alts = b"|".join(re.escape(n.encode()) for n in sorted(names, key=len, reverse=True))
    line = rb"((?:" + alts + rb")[{ \t][^\n]*)"
    return re.compile(rb"\n" + line), re.compile(line)


def filtered_url(url: str, names: Iterable[str]) -> str:
    """``url`` asking prometheus_client's exposition app for the samples ``names`` only (``name[]=`` once per name,
    after the URL's own query)."""
    parts = urlsplit(url)
    query = urlencode([("name[]", n) for n in sorted(names)])
    return urlunsplit(parts._replace(query=f"{parts.query}&{query}" if parts.query else query))


def find_lines(pattern: re.Pattern[bytes], body: bytes | bytearray, chunk: int = FIND_CHUNK) -> list[bytes]:
    """``pattern.findall(body)`` for a :func:`progress_lines` pattern (a newline, then the rest of that line), in
    calls over ``chunk`` bytes or so: each ends at a newline (where the line a match takes ends too) and the next
    starts there, so every line is found once, as one call over the whole body finds it."""
    found: list[bytes] = []
    at, size = 0, len(body)
    while at < size:
        end = body.find(b"\n", at + chunk) if size - at > chunk else -1
        end = size if end < 0 else end
        found += pattern.findall(body, at, end)
        at = end
    return found


class ProgressReader:
    """The progress pass of one engine kind; keeps its reader's and its label splits' caches between passes."""

    def __init__(self, kind: str, default_model: str = DEFAULT_MODEL, limits: EngineLimits | None = None) -> None:
        self.kind = kind
        self.adapter = progress_adapter(ADAPTERS[kind])
        self.default_model = default_model
        self.names = self.adapter.wanted()  # the sample names the pass reads
        self._lines, self._first = progress_lines(self.names)
        self._reader = self.adapter.reader(limits if limits is not None else EngineLimits())
        self._keys = KeyCache(self.adapter.model_labels, default_model)
        self.lines = 0  # sample lines kept by the last pass

    def read(self, body: bytes | bytearray) -> EngineReading | None:
        """The progress families of ``body`` mapped per model and rank, or None (read the body in full instead)."""
        if not body.endswith(b"\n"):  # cut short, or a last line without its newline: the full read says which
            return None
        kept = find_lines(self._lines, body)
        first = self._first.match(body)
        if first is not None:
            kept.insert(0, first.group(1))
        return self.reading(kept)

    def scan(self, hold: bool = True) -> ProgressScan:
        """A pass over a body as it arrives (:class:`ProgressScan`): the collector's path. ``hold``: keep the body for
        a full read of it (not for the answer to a :func:`filtered_url`, which is never read in full)."""
        return ProgressScan(self, hold)

    def reading(self, kept: list[bytes]) -> EngineReading | None:
        """The pass over the sample lines ``kept`` of its families (without their newlines, in the body's order)."""
        self.lines = len(kept)
        if not kept:
            return None
        kept.append(b"")
        try:
            expo = self._reader.read(b"\n".join(kept).decode("utf-8"), openmetrics=False)
        except (UnicodeDecodeError, SourceFormatError):
            return None
        if any(expo.dropped.values()) or expo.matched == 0:  # a line dropped: the full read counts and words it
            return None
        if self._keys.size > STALE_CACHE_FACTOR * expo.matched + STALE_CACHE_SLACK:
            self._keys.clear()
        try:
            return read(self.adapter, expo, self.default_model, self._keys)
        except SourceFormatError:  # a value outside its domain (ReadingError): the full read rejects it
            return None


class ProgressScan:
    """A progress pass over a body as it arrives (a fetch's sink: :meth:`begin`, :meth:`feed` each chunk), then
    :meth:`finish`; :meth:`body` gives the body back for the full read when the pass gives None.

    The lines are found as :meth:`ProgressReader.read` finds them in the whole body — searched in calls over about
    :data:`FIND_CHUNK` bytes, each ending at a newline, the next starting there — so they are the same lines and
    give the same reading; only the bytes after the last such newline wait for the next chunk. The body is kept for
    :meth:`body`: its first :data:`HOLD_RAW_BYTES` as they came, the rest compressed (zlib, level 1).
    """

    def __init__(self, reader: ProgressReader, hold: bool = True) -> None:
        self._reader = reader
        self._holds = hold
        self._kept: list[bytes] = []
        self._pending = bytearray()  # from the newline the last search ended at (the body's start at first)
        self._started = False  # the body's first line was looked at
        self._last = 0  # the body's last byte so far (0: none yet)
        self._raw: list[bytes] = []  # the body as it came, up to HOLD_RAW_BYTES
        self._raw_bytes = 0
        self._zip: zlib._Compress | None = None  # past HOLD_RAW_BYTES: the rest of the body compressed
        self._zipped: list[bytes] = []

    def begin(self, content_type: str) -> None:
        pass

    def feed(self, chunk: bytes) -> None:
        if not chunk:
            return
        if self._holds:
            self._hold(chunk)
        self._last = chunk[-1]
        pending = self._pending
        pending += chunk
        if len(pending) > FIND_CHUNK:  # the last newline past FIND_CHUNK: none before this chunk, if searched
            end = pending.rfind(b"\n", max(FIND_CHUNK, len(pending) - len(chunk)))
            if end > 0:
                self._search(end)
                del pending[:end]

    def finish(self) -> EngineReading | None:
        """The pass's reading, as :meth:`ProgressReader.read` of the whole body gives it (None: read it in full)."""
        if self._last != 0x0A:  # cut short, or a last line without its newline: the full read says which
            self._pending.clear()
            return None
        self._search(len(self._pending))
        self._pending = bytearray()
        kept, self._kept = self._kept, []
        return self._reader.reading(kept)

    def body(self) -> bytes:
        """The whole body, for the full read (a scan made with ``hold``)."""
        if not self._holds:
            raise RuntimeError("a progress scan made without hold keeps no body")
        if self._zip is None:
            return b"".join(self._raw)
        rest = zlib.decompress(b"".join([*self._zipped, self._zip.flush()]))
        self._zip, self._zipped = None, []
        return b"".join([*self._raw, rest])

    def _hold(self, chunk: bytes) -> None:
        if self._zip is None:
            if self._raw_bytes + len(chunk) <= HOLD_RAW_BYTES:
                self._raw.append(chunk)
                self._raw_bytes += len(chunk)
                return
            self._zip = zlib.compressobj(1)
        if out := self._zip.compress(chunk):
            self._zipped.append(out)

    def _search(self, end: int) -> None:
        """The lines in ``self._pending[:end]`` (``end``: a newline, or the end of the body)."""
        pending, reader = self._pending, self._reader
        if not self._started:
            self._started = True
            first = reader._first.match(pending, 0, end)
            if first is not None:
                self._kept.append(first.group(1))
        self._kept += reader._lines.findall(pending, 0, end)
