"""A fast, selective, conforming reader of the Prometheus text exposition format (engine ``/metrics``).

Its parts: the grammar of one line (textformat.py), plain label blocks read from their text with their
bounds and label limits (labelblock.py), the OpenMetrics family rules (openmetrics.py), handing freed
memory back (heap.py); here, the reader: caches, scrape rules, tolerant reads, streaming.

Conformance: the text format as prometheus/common's ``expfmt`` text parser reads it (Prometheus 3,
UTF-8 names: ``{"a.b",label="x"} 1``, ``# TYPE "a.b" counter``), and OpenMetrics 1.0 as
client_python's OpenMetrics parser reads it when the body ends with ``# EOF``. The cases, their
sources and expected outcomes are in ``tests/fixtures/expfmt/`` (see its SOURCE.md). Every line is
checked, not only the wanted ones. Problems are :class:`ExpositionError` with a 1-based line number and a
``reason`` (:data:`REASONS`): ``parse`` (syntax), ``duplicate_series`` (one series twice),
``type_conflict`` (a second TYPE or HELP line, or TYPE after the family's samples),
``negative_value`` (a counter, a histogram bucket or count, a summary count going below zero),
``openmetrics`` (an OpenMetrics rule on families: grouping, ``_total``, buckets, units, ``# EOF``).

Strict or tolerant. Without ``limits`` (the conformance tests, ``scrape_rules=False``) a problem anywhere
rejects the exposition, as Prometheus rejects the scrape. With ``limits`` (the engine collector, ``engine
inspect``) one bad line costs that line, not the scrape: a line with a problem of :data:`DROPPABLE` reasons is
dropped and counted (``Exposition.dropped``, and :attr:`ExpositionReader.dropped` for the reader's life:
``inferwatch.engine.series.dropped{reason}``), the first few problems are kept as the strict check words them
(``Exposition.problems``), every other line is read, and an OpenMetrics family rule broken is reported the same
way with the family's samples kept. Past ``limits.max_bad_lines`` dropped lines, or on a problem that is no
line's alone (a label limit, a body cut short: no newline or no ``# EOF`` at the end), the read fails as before.

Hot path of the engine collector: a node serving many models or LoRA adapters exposes tens of
thousands of series per scrape, and the adapter needs a few families. So the reader keeps a cache
keyed by the text before the value (``name{labels}``), up to :data:`MAX_HEADS` heads: a line seen in
an earlier scrape costs one split, one dict lookup and one ``float``. A head not cached, of the common
shape (``name{a="x",...} value``), is checked piece by piece, each piece cached by its text: the name,
the label block, each ``a="x"`` pair (so a known block costs a slice and a lookup more, a new block of
known pairs a split and a few lookups); any other shape goes through the full line parser. Only
wanted samples are stored (``_created`` ones only when asked for).

A whole text-format body (:meth:`ExpositionReader.read`) is first read with bulk operations instead of a
Python loop per line (:meth:`ExpositionReader._read_whole`: the lines' shape, values and label texts by the bulk
steps of bulkparse.py, compiled where the C extension is built, one call per chunk or family; set-based
duplicate checks); on anything that path does not take as it is, the line-by-line read above judges the body from
its start, with the same result and errors. A streamed body (:meth:`ExpositionReader.feed_text`, the collector's
read) is read so chunk by chunk: a chunk the bulk read does not take goes line by line, the others in bulk.

Memory: what a burst of series cached (a read far longer than the next, or caches much larger than
the series read) is dropped, and the next read begins by handing the freed memory back to the OS
(:func:`release_freed_memory`); the series of dropped models are checked but never cached.
"""

from __future__ import annotations

import logging
import math
import re
from array import array
from collections.abc import Container, Iterable, Iterator
from dataclasses import dataclass, field
from itertools import compress, repeat
from operator import is_, itemgetter
from typing import cast

from inferwatch.agent.common.precedence import step_aside
from inferwatch.agent.node.engine.bulkparse import FamilySets, canon_ids, family, family_of, label_sets, scan
from inferwatch.agent.node.engine.bulkparse import sorted_labels as _sorted
from inferwatch.agent.node.engine.heap import release_freed_memory
from inferwatch.agent.node.engine.labelblock import (
    BOUNDS,
    MAX_LABEL_PAIRS,
    Pair,
    bad_bound,
    bound_error,
    long_block_limit_error,
    plain_block,
    plain_pair,
)
from inferwatch.agent.node.engine.limits import EngineLimits, label_limit_error
from inferwatch.agent.node.engine.openmetrics import check_openmetrics
from inferwatch.agent.node.engine.textformat import (
    BLANK,
    METRIC_NAME,
    TYPES,
    ExpositionError,
    Labels,
    LineError,
    is_openmetrics,
    metric_name_at,
    parse_line,
    types_of,
    unescape_help,
)

log = logging.getLogger(__name__)


class Series:
    """A family's kept samples in the order read: the label tuples in a list and the values in an array of doubles
    (16 bytes a sample, where a ``(labels, value)`` tuple and its float took ~96: at 200 models x 2 ranks the
    83k samples the vLLM adapter reads held ~7.4 MB while the adapter read them, ~1.3 MB now). Iterates, indexes
    and compares as the list of ``(labels, value)`` pairs it stands for (the values exactly as read)."""

    __slots__ = ("labels", "values")

    def __init__(self, pairs: Iterable[tuple[Labels, float]] = ()) -> None:
        self.labels: list[Labels] = []
        self.values = array("d")
        for labels, value in pairs:
            self.append(labels, value)

    def append(self, labels: Labels, value: float) -> None:
        self.labels.append(labels)
        self.values.append(value)

    def __iter__(self) -> Iterator[tuple[Labels, float]]:
        return zip(self.labels, self.values, strict=True)

    def __len__(self) -> int:
        return len(self.labels)

    def __getitem__(self, i: int) -> tuple[Labels, float]:
        return self.labels[i], self.values[i]

    def __eq__(self, other: object) -> bool:
        if isinstance(other, Series | list):
            return list(self) == list(other)
        return NotImplemented

    __hash__ = None  # type: ignore[assignment]  # mutable, as the list it stands for

    def __repr__(self) -> str:
        return f"Series({list(self)!r})"


# What a tolerant read (limits given) drops with the line, instead of failing: a line's own problems. The label
# limits are not among them (Prometheus' label_limit rejects the scrape, and they bound what a read holds).
DROPPABLE = ("parse", "duplicate_series", "type_conflict", "negative_value", "openmetrics")
PROBLEMS_KEPT = 5  # problems of a read worded with their line number (finding it costs a pass over the lines)
MAX_LABEL_CACHE_ENTRIES = 200_000  # a bound on memory when series churn (each entry ~ one series)
# After a read, caches holding more than this many times the series read (plus the slack) are dropped.
STALE_CACHE_FACTOR = 2
STALE_CACHE_SLACK = 10_000


@dataclass
class Exposition:
    """Wanted samples by full sample name (``vllm:prompt_tokens_total``), each with labels and value."""

    samples: dict[str, Series] = field(default_factory=dict)
    lines: int = 0  # lines scanned, all of them
    matched: int = 0  # samples kept
    types: dict[str, str] = field(default_factory=dict)  # family → TYPE as declared (lower case)
    models_dropped: int = 0  # distinct models past the reader's max_models (see ExpositionReader)
    # which of its reader's caches the label tuples come from: it changes when the reader drops its caches
    # (so memos keyed by those tuples, as adapters.KeyCache, know theirs are stale)
    generation: int = 0
    dropped: dict[str, int] = field(default_factory=dict)  # reason → lines dropped by a tolerant read
    # the first PROBLEMS_KEPT of them: (reason, the strict read's words for it)
    problems: list[tuple[str, str]] = field(default_factory=list)

    def get(self, name: str) -> Series:
        got = self.samples.get(name)
        return got if got is not None else Series()


class Everything:
    """A ``wanted`` that keeps every sample (conformance tests, ``inferwatch engine inspect``)."""

    def __contains__(self, name: object) -> bool:
        return True


# --- families: what a TYPE line implies for each sample name --------------------------------------

# Sample-name suffixes whose values must not be negative, by type. The format itself (expfmt)
# forbids negative histogram buckets and counts; the scrape rules add counters and summary counts.
_NONNEG = {
    "histogram": ("_bucket", "_count"),
    "gauge_histogram": ("_bucket", "_count"),
    "gaugehistogram": ("_bucket", "_count", "_gcount"),
}
_SCRAPE_NONNEG = {"counter": ("", "_total"), "summary": ("_count",)}


MAX_UNKEPT_HEADS = 20_000  # per read: lines of families not read checked for duplicates (by their text)
# Heads (``name{labels}``) cached per reader, whole: beyond, a line is read through the caches of its name and of
# its label text (what a cold read of known series does). At 200 models x 2 ranks of vLLM (127k series) the
# warm read is ~20 % slower than with every head cached and ~25 MB smaller (each cached head holds its text and
# an entry: ~300 bytes); below the bound, every head is cached as before (docs/benchmarks.md, "Engine scale").
# A reader whose last read had more lines than the bound caches no head at all: the 16,384 it would hold cover
# a small share of such a read (13 % at 200 models) for ~4 MB (agent at 50 models: 86-87 -> 82.6 MB).
MAX_HEADS = 16_384
MAX_DROPPED_MODELS_COUNTED = 65_536  # distinct dropped models counted per read (beyond: a lower bound)

WHOLE_CHUNK = 1 << 18  # characters of sample lines matched at once (bounds the rows held: ~2,700 vLLM lines)
_LABELS, _BAD, _CANON, _MODEL = (itemgetter(i) for i in range(4))  # the fields of an _Info


_Info = tuple[Labels, "str | None", int, "str | None"]  # (labels, bad bound, canonical id, model)
_UNKEPT = -2  # the canonical id of a label set of a name not wanted, not interned (see ExpositionReader.feed)
_BY_TEXT = -3  # the series id of a cached head of a name not wanted: the series is the head's text
_UNKEPT_INFO: _Info = ((), None, _UNKEPT, None)  # the label text of a name not wanted, checked, bounds numbers
_Head = tuple[str, Labels, int, bool, "str | None", "str | None"]  # (name, labels, series id, kept, bad, model)


class ReadPass:
    """The state of one read while its lines arrive (all of them at once, or chunk by chunk)."""

    __slots__ = (
        "bad",
        "bad_ids",
        "base",
        "dropped",
        "helps",
        "kept",
        "last_lineno",
        "last_name",
        "lines",
        "nonneg",
        "om",
        "out",
        "problems",
        "sampled",
        "seen",
        "seen_by_name",
        "seen_ts",
        "typed_hist",
        "types",
        "unkept",
        "unkept_blocks",
    )

    def __init__(self, om: bool) -> None:
        self.out: dict[str, Series] = {}
        self.types: dict[str, str] = {}
        self.helps: set[str] = set()
        self.nonneg: set[str] = set()
        self.typed_hist: set[str] = set()  # histogram/summary families whose le/quantile must be numbers
        self.sampled: set[str] = set()
        self.seen: set[str] = set()  # head texts of families not read (_BY_TEXT; see ExpositionReader.feed)
        # per name: the canonical ids of its label sets read (ints the reader's caches hold: none made per line)
        self.seen_by_name: dict[str, set[int]] = {}
        self.unkept = 0  # lines of names not wanted whose text was added to ``seen`` (at most MAX_UNKEPT_HEADS)
        # the whole-text read's ``seen``: per name not wanted, the label texts of its lines checked for duplicates
        self.unkept_blocks: dict[str, set[str]] = {}
        self.seen_ts: set[tuple[int, float]] = set()  # (series id: the name's identity and the label set's id, ts)
        self.last_name = ""
        self.lines = 0
        self.kept: set[str | None] = set()  # models whose samples are kept (None: no model label)
        self.dropped: set[int] = set()  # hashes of the models past max_models
        self.om = om
        self.last_lineno = -1  # the number of the body's last line, when known (whole-text reads)
        self.bad: dict[str, int] = {}  # reason → lines a tolerant read dropped
        self.bad_ids: set[int] = set()  # id() of each line dropped (an OpenMetrics body's family check skips them)
        self.problems: list[tuple[str, str]] = []  # the first PROBLEMS_KEPT: (reason, words with the line number)
        # a chunk of a streamed read tried with bulk operations (ExpositionReader.feed_text): the read it belongs to,
        # whose series and texts the chunk's duplicate checks also look at; None: a whole body, or a read itself
        self.base: ReadPass | None = None

    def overlay(self) -> ReadPass:
        """A pass for a chunk of this read, tried in bulk: this read's small state copied (types, models, names
        met), its own sets of what the chunk adds (merged into this read by :meth:`merge` if it is taken)."""
        q = ReadPass(self.om)
        q.types, q.helps, q.nonneg = dict(self.types), set(self.helps), set(self.nonneg)
        q.typed_hist, q.sampled, q.kept = set(self.typed_hist), set(self.sampled), set(self.kept)
        q.unkept = self.unkept
        q.base = self
        return q

    def merge(self, q: ReadPass) -> None:
        """Take the chunk read by ``q`` (:meth:`overlay`) into this read."""
        for name, series in q.out.items():
            kept = self.out.get(name)
            if kept is None:
                self.out[name] = series
            else:
                kept.labels.extend(series.labels)
                kept.values.extend(series.values)
        for name, ids in q.seen_by_name.items():
            seen = self.seen_by_name.get(name)
            if seen is None:
                self.seen_by_name[name] = ids
            else:
                seen |= ids
        self.seen |= q.seen
        self.types, self.helps, self.nonneg = q.types, q.helps, q.nonneg
        self.typed_hist, self.sampled, self.kept, self.unkept = q.typed_hist, q.sampled, q.kept, q.unkept
        self.lines += q.lines - 1  # q counts the empty line after the chunk's last newline
        self.last_name = ""  # the line-by-line read of a next chunk looks its family up again

    def series(self) -> int:
        """Series read so far (those checked for duplicates)."""
        seen = len(self.seen) + len(self.seen_ts) + sum(map(len, self.unkept_blocks.values()))
        return seen + sum(map(len, self.seen_by_name.values()))


class ExpositionReader:
    """Reads samples whose names are in ``wanted``; checks every line.

    ``prefixes`` is kept for the adapters' detection; all lines are read. ``scrape_rules``: on top of
    the format, reject what Prometheus' scrape rejects or what makes a reading wrong — one series
    twice (``duplicate_series``), a negative counter or summary count (``negative_value``); off, the
    reader accepts exactly what the reference parsers accept (the conformance tests). Keep one
    reader per target: its caches (heads up to :data:`MAX_HEADS`, none once a read has more lines; then
    names and label texts) are what make repeated scrapes cheap.

    ``model_labels`` with ``limits``: the first ``limits.max_models`` distinct models (the first of
    these labels present, in order; none: one model) among the wanted samples, in exposition order,
    are kept; samples of the others are checked line by line but neither kept nor cached (so a
    flood of model names costs no memory per series) and their models are counted
    (``Exposition.models_dropped``). Lines of families not read are checked for duplicates by their
    text: those whose head is cached, and up to :data:`MAX_UNKEPT_HEADS` more per read; past that they
    are checked line by line, without the duplicate check (their values are not used).

    A body can be read in one piece (:meth:`read`) or as it arrives (:meth:`begin`, :meth:`feed` with
    the complete lines of each chunk, :meth:`end`), with the same checks.
    """

    def __init__(
        self,
        prefixes: tuple[str, ...],
        wanted: Container[str],
        scrape_rules: bool = True,
        limits: EngineLimits | None = None,
        model_labels: tuple[str, ...] = (),
    ) -> None:
        self.prefixes = prefixes
        self.wanted = wanted
        self.scrape_rules = scrape_rules
        self.limits = limits  # label limits, checked once per distinct label set (never on a cached head)
        self.model_labels = model_labels
        self.max_models: float = limits.max_models if limits is not None else math.inf
        self.max_bad_lines = limits.max_bad_lines if limits is not None else 0  # 0: strict (see the module doc)
        self.dropped: dict[str, int] = dict.fromkeys(DROPPABLE, 0)  # lines dropped, by reason, over the reader's life
        self._dropping = False  # the last read dropped lines (logged once when that starts and once when it ends)
        self._short_labels = min(limits.max_label_value_bytes, limits.max_label_bytes) if limits is not None else 0
        # "name{labels}" → (name, labels, series id, wanted, bad bound, model); series id: the label set's
        # canonical id (a series is the name, one object per reader, and that id: ReadPass.seen_by_name);
        # bad bound: "le" or "quantile" when that label is not a number (an error in a histogram/summary)
        self._heads: dict[str, _Head] = {}
        self._unkept_entries: dict[str, _Head] = {}  # name not wanted → the entry its heads share (see feed)
        # interned label tuples (the adapters memoise by identity) → (labels, bad bound, canonical id, model)
        self._labels: dict[Labels, _Info] = {}
        self._canon: dict[Labels, int] = {}  # label set, pairs sorted (see _sorted) → one id
        self._raw: dict[str | None, _Info] = {}  # label text of plain heads of wanted names → _info_of()
        # label text of plain heads of names not wanted → (no labels, bad bound, _UNKEPT, no model): checked once
        self._raw_unkept: dict[str | None, _Info] = {}
        self._names: dict[str, str] = {}  # every metric name read, one object each (series ids, `is` tests)
        self._plain_names: dict[str, str] = {}  # names valid unquoted (``a_b``, not ``a.b``) → the same objects
        self._pairs: dict[str, Pair] = {}  # label pair texts checked valid → ((name, value), flag)
        self._fresh: list[tuple[str, Pair]] = []  # pairs of the label set being read, not in _pairs yet
        # the one model label, for plain_block; None: several (in order of preference), or a bound's name
        self._model_label = model_labels[0] if len(model_labels) == 1 and model_labels[0] not in BOUNDS else None
        self._bounds: dict[str, bool] = {}  # le/quantile label texts → a number (see bad_bound)
        self.generation = 0  # caches dropped so far (Exposition.generation)
        self._release_due = False  # release_freed_memory() when the next read begins (a burst is over)
        self._last_lines = 0  # lines of the last read
        self._head_room = MAX_HEADS  # heads cached at most: MAX_HEADS, or none after a read of more lines
        self._open_lines: int | None = None  # lines of the read under way (None: none), as of its last feed

    def read(self, text: str, openmetrics: bool | None = None) -> Exposition:
        om = is_openmetrics(text) if openmetrics is None else openmetrics
        if not om:
            return self._read_text(text)
        lines = text.split("\n")
        p = self.begin(om=True)
        p.last_lineno = len(lines)
        self.feed(p, lines)
        if self.max_bad_lines and (lines[-1] if lines[-1] else lines[-2:][0]) != "# EOF":
            n = len(lines)  # a body cut short is no exposition (the family check below may stop before it)
            raise ExpositionError(f"line {n}: no '# EOF' at the end of an OpenMetrics body", n, True)
        while True:  # a tolerant read: the lines dropped are skipped, a line or family rule broken is reported
            try:
                check_openmetrics(lines, expo_line_parser=parse_line, skip=p.bad_ids)
                break
            except ExpositionError as exc:
                cut = exc.last and exc.reason == "parse"  # a body cut short (no # EOF) is no exposition
                if not self.max_bad_lines or cut or (exc.line is None and exc.reason != "openmetrics"):
                    raise
                self._drop(p, exc)
                if exc.reason == "openmetrics":  # a family rule: its samples were read, the rule is reported
                    break
        return self.end(p)

    def _read_text(self, text: str) -> Exposition:
        """A whole text-format body: :meth:`_read_whole` when it can, else line by line (:meth:`feed`)."""
        last = text[text.rfind("\n") + 1 :]
        if last.strip(BLANK):
            n = text.count("\n") + 1  # the lines str.split makes
            raise ExpositionError(f"line {n}: no newline at the end of the input: {last[:120]!r}", n, True)
        p = self.begin()
        if not last and self._read_whole(p, text):  # it counts the lines it reads (p.lines)
            self._open_lines = p.lines
            return self.end(p)
        n = text.count("\n") + 1  # the lines str.split makes (the last one empty when the body ends with \n)
        p = ReadPass(False)  # what the whole-text read cached is as the line-by-line read would cache it
        p.last_lineno = n
        self.feed(p, text.split("\n"))
        return self.end(p)

    def _read_whole(self, p: ReadPass, text: str) -> bool:
        """Read a text-format body ending in a newline with bulk operations; False: read it line by line instead.

        The comment lines are read one by one (:meth:`_comment`); the sample lines between them are matched
        :data:`WHOLE_CHUNK` characters at a time (:func:`~inferwatch.agent.node.engine.bulkparse.scan`: every line
        of the common shape, grouped into families, with their values, or None), and read family by family
        (:meth:`_whole_family`), their label texts looked up in the caches the line-by-line read fills. Whatever
        this path does not take as it is (a line of another shape, a value that is no number, any problem a line
        may have, a model past ``max_models``) makes it give up, and the line-by-line read judges the body from its
        start: the same result and the same errors. Each line is taken once, as a comment or in a chunk whose
        lines all matched, so on success ``p.lines`` is the lines ``str.split`` makes of the body.
        """
        n = len(text)
        if n and text[-1] != "\n":
            return False
        at = taken = 0
        try:
            while at < n:
                if text.startswith("#", at):
                    end = text.index("\n", at)
                    self._comment(p, [], text[at:end])
                    at = end + 1
                    taken += 1
                    continue
                stop = text.find("#", at)  # the next comment line: a "#" that begins a line (memchr: fast)
                while stop != -1 and text[stop - 1] != "\n":
                    stop = text.find("#", stop + 1)
                if stop == -1:
                    stop = n
                while at < stop:
                    step_aside()  # a request the API answers goes first (agent/common/precedence.py)
                    end = stop if stop - at <= WHOLE_CHUNK else text.index("\n", at + WHOLE_CHUNK) + 1
                    # the families of a histogram or summary come interleaved series by series: each one's lines
                    # in order, the families in the order they come
                    families = scan(text, at, end)
                    if families is None:  # a line of another shape, or a value that is no number
                        return False
                    ordered = len(families) == 1
                    for name, blocks, floats in families:
                        if not self._whole_family(p, name, blocks, floats, ordered):
                            return False
                        taken += len(floats)
                    at = end
        except (ExpositionError, ValueError):
            return False
        p.lines = taken + 1  # the last, empty, after the final newline
        p.last_lineno = p.lines
        return True

    def _whole_family(self, p: ReadPass, text_name: str, blocks: list[str], floats: list[float], ordered: bool) -> bool:
        """The samples of one family from one chunk, checked and kept as :meth:`_feed` would; False: give up.

        ``ordered``: the chunk holds this family alone, so its lines are read in their order. The models it keeps
        are counted line by line as :meth:`_feed` counts them, so it caches the label sets :meth:`_feed` would;
        past ``max_models`` it gives up. A chunk of several families, read family by family, may have cached a
        label set of a model :meth:`_feed` would drop: the caches are dropped when such a chunk gives up there.
        """
        name = self._plain_names.get(text_name) or self._name(text_name)
        total = sum(floats)
        nan = total != total  # a NaN among them (or infinities of both signs)
        if name in p.nonneg and (any(f < 0 for f in floats) if nan else min(floats) < 0):
            return False
        keep = name in self.wanted
        raw, unkept = self._raw, self._raw_unkept
        # a wanted family whose label texts are all cached (a warm read; a cold one once they are): one pass over them
        sets = family(blocks, raw) if keep else None
        if sets is not None:
            return self._keep_family(p, name, sets, floats, ordered)
        # a name not wanted needs only its label text checked and its bad bound: one checked for a wanted name will do
        found = list(map(raw.get, blocks)) if keep else list(map(unkept.get, blocks, map(raw.get, blocks)))
        if keep and self._new_label_texts(p, blocks, found):  # label texts new to the reader: in bulk if common
            sets = family(blocks, raw)
            if sets is not None:
                return self._keep_family(p, name, sets, floats, ordered)
        elif not keep and None in found and self._new_unkept_texts(blocks, found):
            found = list(map(unkept.get, blocks, map(raw.get, blocks)))
        if None in found:  # label texts new to the reader: each checked and cached once, as _feed does
            kept, cap = p.kept, self.max_models
            for i, info in enumerate(found):
                if info is None:
                    block = blocks[i]
                    info = (raw.get(block) if keep else unkept.get(block, raw.get(block))) or self._plain_info(
                        p, [], "", name, block, keep
                    )
                    if info is None:
                        return False
                    found[i] = info
                if keep and info[3] not in kept:  # a model met first: counted at its line, as _feed does
                    if len(kept) >= cap or info[2] < 0:
                        return self._past_cap(p, ordered)
                    kept.add(info[3])
        infos = cast("list[_Info]", found)
        if keep:
            return self._keep_family(p, name, family_of(infos), floats, ordered)
        if name in p.typed_hist and self._bad_bound(p, name, set(map(_BAD, infos))):
            return False
        rules = self.scrape_rules
        checked = min(len(blocks), MAX_UNKEPT_HEADS - p.unkept)  # as _feed: the first lines of a read only
        if checked > 0 and p.base is not None:
            # a chunk of a streamed read: the series are the heads' texts, as _feed checks them (a line without
            # labels, "name" or "name{}", goes line by line: the two are different heads there)
            if "" in blocks[:checked]:
                return False
            heads = set(map(f"{name}{{".__add__, map(str.__add__, blocks[:checked], repeat("}"))))
            if rules and (len(heads) != checked or not p.base.seen.isdisjoint(heads) or not p.seen.isdisjoint(heads)):
                return False
            p.seen |= heads
            p.unkept += checked
        elif checked > 0:
            texts = set(blocks[:checked])
            family_texts = p.unkept_blocks.get(name)
            if family_texts is None:
                family_texts = p.unkept_blocks[name] = set()
            if rules and (len(texts) != checked or not family_texts.isdisjoint(texts)):
                return False
            family_texts |= texts
            p.unkept += checked
        p.sampled.add(name)
        return True

    def _keep_family(self, p: ReadPass, name: str, sets: FamilySets, floats: list[float], ordered: bool) -> bool:
        """Keep the samples of a wanted family from one chunk (:meth:`_whole_family`): its label sets (and their
        canonical ids, models and bad bounds: :func:`~inferwatch.agent.node.engine.bulkparse.family`) and values."""
        labels, ids, models, bads = sets
        if name in p.typed_hist and self._bad_bound(p, name, bads):
            return False
        if not models <= p.kept:
            fresh = models - p.kept
            if len(p.kept) + len(fresh) > self.max_models:
                return self._past_cap(p, ordered)
            p.kept |= fresh
        family_ids = p.seen_by_name.get(name)
        if family_ids is None:
            family_ids = p.seen_by_name[name] = set()
        if self.scrape_rules and (len(ids) != len(labels) or not family_ids.isdisjoint(ids)):
            return False
        if p.base is not None and self.scrape_rules:  # a chunk of a streamed read: the read's series before it
            before = p.base.seen_by_name.get(name)
            if before is not None and not before.isdisjoint(ids):
                return False
        family_ids |= ids
        series = p.out.get(name)
        if series is None:
            series = p.out[name] = Series()
        series.labels.extend(labels)
        series.values.fromlist(floats)
        p.sampled.add(name)
        return True

    @staticmethod
    def _bad_bound(p: ReadPass, name: str, bads: set[str | None]) -> bool:
        """A bound that is not a number breaks a sample of the histogram or summary family ``name``."""
        typ = p.types.get(name)
        return any(bound_error(bad, typ) is not None for bad in bads if bad is not None)

    def _past_cap(self, p: ReadPass, ordered: bool) -> bool:
        """Give up at a model past ``max_models`` (False); see :meth:`_whole_family` for when the caches go (not in
        a chunk of a streamed read: the read's series ids come from them)."""
        if not ordered and p.base is None:
            self.clear()
        return False

    def _new_label_texts(self, p: ReadPass, blocks: list[str], found: list[_Info | None]) -> bool:
        """Cache the label texts of a wanted family new to the reader in bulk, as :meth:`_plain_info` would one by one.

        Only the common case: one model label, plain ASCII texts within the label limits, every ``a="x"`` pair valid
        and no bound that is not a number, no duplicate label name, no label set met under another text, no model
        past ``max_models``. False (nothing cached): the texts go one by one through :meth:`_plain_info`.
        """
        label = self._model_label
        if label is None:
            return False
        texts = list(dict.fromkeys(compress(blocks, map(is_, found, repeat(None)))))
        if not self._plain_texts(texts):
            return False
        known = self._pairs
        # an empty block, a trailing comma, a value not closed, a bound that is not a number, a label name twice: None
        sets = label_sets(texts, known, label, plain_pair)
        if sets is None:
            return False  # one by one
        tuples, keys, models, fresh = sets
        if any(map(self._labels.get, tuples)):
            return False  # a label set met under another text
        if len(p.kept.union(models, map(_MODEL, filter(None, found)))) > self.max_models:
            return False  # the family's models, known or new, past the cap: one by one, counted line by line
        infos = list(zip(tuples, repeat(None), canon_ids(keys, self._canon), models, strict=False))
        self._labels.update(zip(tuples, infos, strict=True))
        self._raw.update(zip(texts, infos, strict=True))
        if len(known) + len(fresh) <= MAX_LABEL_PAIRS:
            known.update(fresh)
        return True

    def _plain_texts(self, texts: list[str]) -> bool:
        """The label texts can be split in bulk: no backslash, and within the label limits at a glance (ASCII, none
        longer than the smaller limit: see :meth:`_plain_info`)."""
        joined = ",".join(texts)
        return "\\" not in joined and (
            self.limits is None or (joined.isascii() and max(map(len, texts), default=0) <= self._short_labels)
        )

    def _new_unkept_texts(self, blocks: list[str], found: list[_Info | None]) -> bool:
        """Check and cache the label texts of a family not read, new to the reader, in bulk, as :meth:`_plain_info`
        would one by one (its label set is not kept: only its text is cached, as checked, with no bad bound).

        Only the common case, as :meth:`_new_label_texts`, and room for every text in the cache; a family's line
        without labels goes one by one. False (nothing cached): the texts go one by one through :meth:`_plain_info`.
        """
        label = self._model_label
        texts = list(filter(None, dict.fromkeys(compress(blocks, map(is_, found, repeat(None))))))
        if label is None or not texts or len(self._raw_unkept) + len(texts) > MAX_UNKEPT_HEADS:
            return False
        if not self._plain_texts(texts):
            return False
        known = self._pairs
        sets = label_sets(texts, known, label, plain_pair)  # None also for a bound that is not a number: one by one
        if sets is None:
            return False
        self._raw_unkept.update(zip(texts, repeat(_UNKEPT_INFO)))
        fresh = sets[3]
        if len(known) + len(fresh) <= MAX_LABEL_PAIRS:
            known.update(fresh)
        return True

    def begin(self, om: bool = False) -> ReadPass:
        """Start a read (see :meth:`feed`)."""
        if self._open_lines is not None:  # the last read was given up (its fetch stopped): it ended there
            self._ended(self._open_lines)
        self._open_lines = 0
        if len(self._heads) >= MAX_LABEL_CACHE_ENTRIES or len(self._canon) >= MAX_LABEL_CACHE_ENTRIES:
            self.clear()
        self._head_room = 0 if self._last_lines > MAX_HEADS else MAX_HEADS
        if not self._head_room and self._heads:  # the exposition outgrew the head cache: its lines go by their parts
            self._heads.clear()
            self._unkept_entries.clear()
        if self._release_due:  # by now the read that made it due has let go of all it held (body, lines)
            self._release_due = False
            release_freed_memory()
        return ReadPass(om)

    def end(self, p: ReadPass) -> Exposition:
        """The exposition read by ``p``; gives back the caches of series that are gone.

        Its ``generation`` is that of the caches its label tuples come from: when they are dropped here,
        the next read's differs, so a memo of these tuples (adapters.KeyCache) is dropped then too.
        """
        generation = self.generation
        if self._cached() > STALE_CACHE_FACTOR * p.series() + STALE_CACHE_SLACK:
            self.clear()  # most of the cache is gone (a burst of series ended): give the memory back
        self._ended(p.lines)
        if bool(p.bad) != self._dropping:  # logged once when it starts, once when it ends
            self._dropping = bool(p.bad)
            if p.bad:
                counts = ", ".join(f"{n} {reason}" for reason, n in sorted(p.bad.items()))
                log.warning(
                    "engine exposition: bad lines dropped, the rest read (%s); first: %s", counts, p.problems[0][1]
                )
            else:
                log.info("engine exposition: no bad line any more")
        return Exposition(
            p.out, p.lines, sum(map(len, p.out.values())), p.types, len(p.dropped), generation, p.bad, p.problems
        )

    def abandon(self, p: ReadPass) -> None:
        """A read that failed: give back what it cached if most of the cache is its own (as :meth:`end`)."""
        cached = self._cached()
        if cached > STALE_CACHE_FACTOR * p.series() + STALE_CACHE_SLACK or (
            cached > STALE_CACHE_SLACK and p.lines > STALE_CACHE_SLACK
        ):
            self.clear()
        self._ended(p.lines)

    def _ended(self, lines: int) -> None:
        """A read of ``lines`` lines is over. Far fewer than the read before: a burst is over; its cached
        series are dropped (the next read is a cold one) and what it took from the allocator (bodies,
        lines, caches) is handed back when the next read begins."""
        if self._last_lines > STALE_CACHE_FACTOR * lines + STALE_CACHE_SLACK:
            self.clear()
            self._release_due = True
        self._last_lines = lines
        self._open_lines = None

    def _cached(self) -> int:
        """Entries of the largest cache (heads, label texts, label pairs, label texts of names not read, names)."""
        return max(len(self._heads), len(self._raw), len(self._pairs), len(self._raw_unkept), len(self._names))

    def feed_text(self, p: ReadPass, text: str) -> None:
        """Read complete lines of the body read by ``p`` (``text`` ends with a newline; the streamed read's chunks):
        with bulk operations where :meth:`_read_whole` takes them as they are, else line by line (:meth:`feed`),
        with the same result and errors. A chunk tried in bulk is read into its own pass (:meth:`ReadPass.overlay`)
        and merged into ``p`` only when every line of it was taken."""
        if not p.om:
            q = p.overlay()
            if self._read_whole(q, text):
                p.merge(q)
                self._open_lines = p.lines
                return
        lines = text.split("\n")
        lines.pop()  # the empty string after the last newline
        self.feed(p, lines)

    def feed(self, p: ReadPass, lines: list[str]) -> None:
        """Read complete lines (no ``\\n``) of the body read by ``p``, in order; raise ExpositionError.

        ``lines`` are distinct objects (as ``str.split`` makes them): a line's identity finds its number
        for an error. A tolerant reader (``limits.max_bad_lines``) drops a line with a problem of
        :data:`DROPPABLE` reasons, counts it and reads on from the next line.
        """
        if not self.max_bad_lines:
            self._feed(p, lines, iter(lines))
            return
        rest = iter(lines)  # a failed pass has consumed the bad line: the next one reads on from there
        while True:
            try:
                self._feed(p, lines, rest)
                return
            except ExpositionError as exc:
                if exc.reason not in DROPPABLE or exc.line is None:
                    raise
                self._drop(p, exc)

    def _drop(self, p: ReadPass, exc: ExpositionError) -> None:
        """Count the line ``exc`` names as dropped (or raise ``exc``: past max_bad_lines)."""
        dropped = sum(p.bad.values())
        if dropped >= self.max_bad_lines:
            raise ExpositionError(
                f"{exc} (and {dropped} bad lines before it: over engine limit max_bad_lines={self.max_bad_lines})",
                exc.lineno,
                exc.last,
                exc.reason,
                exc.line,
            ) from None
        p.bad[exc.reason] = p.bad.get(exc.reason, 0) + 1
        self.dropped[exc.reason] = self.dropped.get(exc.reason, 0) + 1
        if len(p.problems) < PROBLEMS_KEPT:
            p.problems.append((exc.reason, str(exc)))
        if exc.line is not None:
            p.bad_ids.add(id(exc.line))

    def _feed(self, p: ReadPass, lines: list[str], rest: Iterator[str]) -> None:
        """:meth:`feed`'s pass over ``rest`` (an iterator over ``lines``), to its end or to the first bad line."""
        om = p.om
        # The head cache holds only plain sample heads (never a comment or a blank line), so it is asked
        # first. OpenMetrics bodies are read without it (their lines are judged by parse_line).
        heads = self._heads if not om else {}
        out, types, nonneg, typed_hist, sampled = p.out, p.types, p.nonneg, p.typed_hist, p.sampled
        seen, seen_ts, kept, seen_by_name = p.seen, p.seen_ts, p.kept, p.seen_by_name
        last_name = p.last_name
        family_seen = seen_by_name.get(last_name)  # the label set ids of last_name read so far
        series = out.get(last_name)  # the kept samples of last_name
        cap = self.max_models
        room = self._head_room
        rules = self.scrape_rules
        names, wanted = self._plain_names, self.wanted
        raw_kept, raw_unkept, unkept_entries = self._raw, self._raw_unkept, self._unkept_entries
        # "name{" of the last new plain head with labels, and its name: the next new heads are most often of
        # the same family (a prefix test instead of a search, a slice and a lookup)
        run, run_name, run_len = "\n", "", 1
        for line in rest:
            head, _, val = line.rpartition(" ")
            hit = heads.get(head)
            if hit is not None:
                name, labels, sid, keep, bad, model = hit
                try:  # parse_float, inline: this runs for every line of every scrape
                    value = float(val)
                    if "_" in val or not val.isascii() or val.strip() != val or (value != value and val[0] in "+-"):
                        raise ValueError(val)
                except ValueError:
                    raise self._error(p, lines, line, f"value {val[:40]!r} is not a number") from None
                ts = None
            else:
                if not line:
                    continue
                c = line[0]
                if c in "# \t" and (c == "#" or line.lstrip(BLANK)[:1] in ("#", "")):
                    if om:
                        continue  # metadata is checked by check_openmetrics
                    self._comment(p, lines, line)
                    continue
                # The common new head (name, name{a="x",...}): its name and label text are each checked
                # once and cached by their text; any other shape goes to parse_line (the authority).
                info = None
                if not om:
                    known: str | None
                    if head.startswith(run) and head[-1] == "}":  # the family of the line before
                        known, raw = run_name, head[run_len:-1]
                    else:
                        brace = head.find("{")
                        if brace == -1:
                            text, raw = head, None
                        elif head[-1] == "}":
                            text, raw = head[:brace], head[brace + 1 : -1]
                        else:
                            text = raw = ""  # a label block that does not end the head: parse_line judges it
                        known = names.get(text)
                        if known is None and METRIC_NAME.fullmatch(text) is not None:
                            known = self._name(text)
                        if known is not None and raw is not None:
                            run, run_name = known + "{", known
                            run_len = len(run)
                    if known is not None:
                        name = known
                        try:  # parse_float, inline
                            value = float(val)
                            if not (
                                "_" in val
                                or not val.isascii()
                                or val.strip() != val
                                or (value != value and val[0] in "+-")
                            ):
                                keep = name in wanted
                                if keep:
                                    info = raw_kept.get(raw) or self._plain_info(p, lines, line, name, raw, True)
                                else:  # only its bad bound is used: the text checked for a wanted name will do
                                    info = (
                                        raw_unkept.get(raw)
                                        or raw_kept.get(raw)
                                        or self._plain_info(p, lines, line, name, raw, False)
                                    )
                        except ValueError:
                            pass
                if info is not None:
                    ts = None
                    plain = True
                else:
                    try:
                        parsed = parse_line(line, om)
                    except LineError as exc:
                        raise self._error(p, lines, line, str(exc), exc.reason) from None
                    name, value, ts = parsed.name, parsed.value, parsed.timestamp
                    name = self._names.get(name) or self._name(name)
                    keep = name in wanted
                    info = self._info_of(p, lines, line, name, parsed.labels)
                    plain = parsed.plain and not om
                labels, bad, canon, model = info
                if keep and canon >= 0:
                    # the series is the name (one object per reader: ``_names``) and the label set's id
                    sid = canon
                    if plain and len(heads) < room:
                        heads[head] = (name, labels, sid, keep, bad, model)
                elif not keep and plain and p.unkept < MAX_UNKEPT_HEADS:
                    # a family not read: its series is the head's text (the same line twice is a duplicate; its
                    # labels in another order are not seen); its head is cached with an entry shared by the
                    # family (no labels, no id)
                    sid = _BY_TEXT
                    p.unkept += 1
                    if len(heads) < room:
                        entry = unkept_entries.get(name) if bad is None else None
                        if entry is None:
                            entry = (name, (), _BY_TEXT, False, bad, None)
                            if bad is None:
                                unkept_entries[name] = entry
                        heads[head] = entry
                else:
                    sid = -1  # not checked for duplicates: a dropped model, or past MAX_UNKEPT_HEADS in this read
            if keep and model not in kept:
                if len(kept) < cap:
                    kept.add(model)
                else:
                    keep = False
                    if len(p.dropped) < MAX_DROPPED_MODELS_COUNTED:
                        p.dropped.add(hash(model))
            if name is not last_name:
                sampled.add(name)
                last_name = name
                series = out.get(name)
                family_seen = seen_by_name.get(name)
                if family_seen is None:
                    family_seen = seen_by_name[name] = set()
            if bad is not None and name in typed_hist and bound_error(bad, types.get(name)) is not None:
                raise self._error(p, lines, line, f"{bound_error(bad, types.get(name))} label is not a number")
            if value < 0 and name in nonneg:
                raise self._error(
                    p, lines, line, f"negative value {value:g} for a {types_of(name, types)}", "negative_value"
                )
            if sid >= 0:
                if ts is None:
                    assert family_seen is not None  # made when the name's first line came
                    if sid in family_seen and rules:
                        raise self._error(p, lines, line, "duplicate series", "duplicate_series")
                    family_seen.add(sid)
                else:
                    # OM: nanoseconds, as client_python
                    ts_key = (id(name) << 32 | sid, math.floor(ts * 1e9 + 1e-6) if om else ts)
                    if ts_key in seen_ts:
                        if rules:
                            raise self._error(p, lines, line, "duplicate series (same timestamp)", "duplicate_series")
                        continue  # the reference keeps the first sample
                    seen_ts.add(ts_key)
            elif sid == _BY_TEXT:  # a cached head of a family not read: its text is the series
                if head in seen and rules:
                    raise self._error(p, lines, line, "duplicate series", "duplicate_series")
                seen.add(head)
            # else: not kept and not cached: no duplicate check (its values are not used)
            if keep:
                if series is None:
                    series = out[name] = Series()
                series.labels.append(labels)
                series.values.append(value)
        p.last_name = last_name
        p.lines += len(lines)
        self._open_lines = p.lines

    def clear(self) -> None:
        """Forget every cached head, label set and name (the next read is a cold one).

        A cache of more than :data:`STALE_CACHE_SLACK` entries dropped is memory the allocator would
        otherwise keep: it is handed back to the OS (:func:`release_freed_memory`) when the next read begins.
        """
        large = self._cached() > STALE_CACHE_SLACK
        self._release_due = self._release_due or large
        self.generation += 1
        self._heads.clear()
        self._unkept_entries.clear()
        self._labels.clear()
        self._raw.clear()
        self._raw_unkept.clear()
        self._canon.clear()
        self._names.clear()
        self._plain_names.clear()
        self._pairs.clear()
        if large:
            release_freed_memory()

    def _info_of(self, p: ReadPass, lines: list[str], line: str, name: str, labels: Labels) -> _Info:
        """(labels interned, bad bound, canonical id, model) of the labels of a head parse_line read.

        Interned and cached for a wanted name; for a name not wanted, not interned (canonical id
        ``_UNKEPT``: the head may be cached alone, up to :data:`MAX_HEADS`); for a model
        past ``max_models``, nothing (-1)."""
        wanted = name in self.wanted
        hit = self._labels.get(labels) if wanted else None
        if hit is not None:
            return hit
        if self.limits is not None:
            broken = label_limit_error(labels, self.limits)
            if broken is not None:
                raise self._error(p, lines, line, broken[1], broken[0])
        if not wanted:
            return labels, bad_bound(labels, self._bounds), _UNKEPT, None
        model = _model_of(labels, self.model_labels)
        if model not in p.kept and len(p.kept) >= self.max_models:
            return labels, bad_bound(labels, self._bounds), -1, model  # a dropped model: nothing cached
        canon = self._canon.setdefault(_sorted(labels), len(self._canon))
        hit = self._labels[labels] = (labels, bad_bound(labels, self._bounds), canon, model)
        return hit

    def _name(self, text: str) -> str:
        """The reader's one object for the metric name ``text`` (series ids and ``is`` tests rely on it).

        Only a name valid unquoted is also entered in the fast path's table: ``a.b`` read from
        ``{"a.b"} 1`` must not make a later ``a.b 1`` line valid.
        """
        name = self._names.setdefault(text, text)
        if METRIC_NAME.fullmatch(text) is not None:
            self._plain_names[text] = name
        return name

    def _plain_info(
        self, p: ReadPass, lines: list[str], line: str, name: str, raw: str | None, keep: bool
    ) -> _Info | None:
        """The :data:`_Info` of a plain head's label text ``raw`` (None: no label block), cached by that text.

        None when the text is not a plain label block (:func:`plain_block`): parse_line judges the line.
        For a wanted name (``keep``), as :meth:`_info_of` (the labels get a canonical id), cached in
        ``_raw`` unless its model is dropped. A name not wanted needs only its block checked and its bad
        bound: cached apart (``_raw_unkept``, up to :data:`MAX_UNKEPT_HEADS` texts), its labels not kept.
        """
        fresh = self._fresh
        try:  # every way out forgets the pairs met (only a label set kept keeps them)
            # A plain ASCII label text no longer than the smaller limit cannot break one: its names and values
            # are shorter than the text (the common case: one length test instead of a pass over the labels).
            limits = self.limits
            check = limits is not None and raw is not None and (len(raw) > self._short_labels or not raw.isascii())
            if raw:
                if check and len(raw) > self._short_labels:
                    broken = long_block_limit_error(raw, limits)  # type: ignore[arg-type]  # before any copy
                    if broken is not None:
                        raise self._error(p, lines, line, broken[1], broken[0])
                block = plain_block(raw, self._pairs, self._model_label, fresh)
                if block is None:
                    return None
                labels, model, bad = block
            else:
                labels, model, bad = (), None, None
            info = self._labels.get(labels) if keep else None  # the same labels under another text
            if info is None:
                if check:
                    broken = label_limit_error(labels, limits)  # type: ignore[arg-type]
                    if broken is not None:
                        raise self._error(p, lines, line, broken[1], broken[0])
                if not keep:
                    info = _UNKEPT_INFO if bad is None else ((), bad, _UNKEPT, None)
                    if len(self._raw_unkept) >= MAX_UNKEPT_HEADS:
                        return info
                    self._raw_unkept[raw] = info
                else:
                    if self._model_label is None:
                        model = _model_of(labels, self.model_labels)
                    if model not in p.kept and len(p.kept) >= self.max_models:
                        return labels, bad, -1, model  # a dropped model: nothing cached
                    n = len(labels)  # the label set's one form: its pairs in name order (see _sorted)
                    key = labels if n < 2 or (n == 3 and labels[0] < labels[1] < labels[2]) else _sorted(labels)
                    canon = self._canon.setdefault(key, len(self._canon))
                    info = self._labels[labels] = (labels, bad, canon, model)
                    self._raw[raw] = info
            else:
                self._raw[raw] = info
            if fresh and len(self._pairs) + len(fresh) <= MAX_LABEL_PAIRS:  # pairs of a label set kept
                self._pairs.update(fresh)
            return info
        finally:
            fresh.clear()

    def _comment(self, p: ReadPass, lines: list[str], line: str) -> None:
        """``# HELP name doc`` / ``# TYPE name type``; any other comment is ignored (expfmt's rules)."""
        body = line.lstrip(BLANK)[1:].lstrip(BLANK)
        keyword = re.split(r"[ \t]", body, maxsplit=1)[0]
        if keyword not in ("HELP", "TYPE"):
            return
        rest = body[len(keyword) :].lstrip(BLANK)
        if not rest:
            return
        types, helps = p.types, p.helps
        try:
            name, i = metric_name_at(rest, 0)
            if i < len(rest) and rest[i] not in BLANK:
                raise LineError("invalid metric name in comment")
            text = rest[i:].lstrip(BLANK)
            if not text:
                return  # "# HELP name" alone sets nothing (expfmt)
            if keyword == "HELP":
                if name in helps:
                    raise LineError(f"second HELP line for {name!r}", "type_conflict")
                unescape_help(text)
                helps.add(name)
                return
            typ = text.lower()
            if typ not in TYPES:
                raise LineError(f"unknown metric type {text[:40]!r}")
            if name in types or name in p.sampled:
                raise LineError(f"second TYPE line for {name!r}, or TYPE after its samples", "type_conflict")
        except LineError as exc:
            raise self._error(p, lines, line, str(exc), exc.reason) from None
        types[name] = typ
        p.nonneg.update(name + s for s in _NONNEG.get(typ, ()))
        if self.scrape_rules:
            p.nonneg.update(name + s for s in _SCRAPE_NONNEG.get(typ, ()))
        if typ == "summary":
            p.typed_hist.add(name)
        elif typ in ("histogram", "gauge_histogram", "gaugehistogram"):
            p.typed_hist.add(name + "_bucket")

    @staticmethod
    def _error(p: ReadPass, lines: list[str], line: str, why: str, reason: str = "parse") -> ExpositionError:
        # Line numbers are only computed on the error path (never in the loop), and only for the problems worded
        # (a tolerant read past PROBLEMS_KEPT of them counts the rest: no pass over the lines for each)
        if len(p.problems) < PROBLEMS_KEPT:
            index = next((i + 1 for i, candidate in enumerate(lines) if candidate is line), 0)
            lineno = p.lines + index
            message = f"line {lineno}: {why}: {line[:120]!r}"
        else:
            lineno, message = 0, f"{why}: {line[:120]!r}"
        return ExpositionError(message, lineno, lineno == p.last_lineno, reason, line)


def _model_of(labels: Labels, order: tuple[str, ...]) -> str | None:
    """The value of the first of ``order``'s labels present (the model), else None."""
    if not order:
        return None
    if len(order) == 1:
        first = order[0]
        for k, v in labels:
            if k == first:
                return v
        return None
    have = dict(labels)
    return next((have[k] for k in order if k in have), None)
