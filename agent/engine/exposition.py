"""A fast, selective, conforming reader of the Prometheus text exposition format (engine ``/metrics``).

Conformance: the text format as prometheus/common's ``expfmt`` text parser reads it (Prometheus 3,
UTF-8 names: ``{"a.b",label="x"} 1``, ``# TYPE "a.b" counter``), and OpenMetrics 1.0 as
client_python's OpenMetrics parser reads it when the body ends with ``# EOF``. The cases, their
sources and expected outcomes are in ``tests/fixtures/expfmt/`` (see its SOURCE.md). Every line is
checked, not only the wanted ones: a malformed line anywhere rejects the exposition, as Prometheus
rejects the scrape. Rejections are :class:`ExpositionError` with a 1-based line number and a
``reason`` (:data:`REASONS`): ``parse`` (syntax), ``duplicate_series`` (one series twice),
``type_conflict`` (a second TYPE or HELP line, or TYPE after the family's samples),
``negative_value`` (a counter, a histogram bucket or count, a summary count going below zero),
``openmetrics`` (an OpenMetrics rule on families: grouping, ``_total``, buckets, units, ``# EOF``).

Hot path of the engine collector: a node serving many models or LoRA adapters exposes tens of
thousands of series per scrape, and the adapter needs a few families. So the reader keeps a cache
keyed by the text before the value (``name{labels}``): a line seen in an earlier scrape costs one
split, one dict lookup and one ``float``; only wanted names are stored. New heads go through the full
parser once. ``_created`` samples are stored only when asked for.
"""

from __future__ import annotations

import math
import re
from collections.abc import Container
from dataclasses import dataclass, field

from agent.engine.limits import EngineLimits, label_limit_error
from agent.errors import SourceFormatError

Labels = tuple[tuple[str, str], ...]
Series = list[tuple[Labels, float]]

REASONS = (
    "parse",
    "duplicate_series",
    "type_conflict",
    "negative_value",
    "openmetrics",
    "label_value_length_limit",  # with limits: a label value over EngineLimits.max_label_value_bytes
    "label_bytes_limit",  # with limits: one series' labels over EngineLimits.max_label_bytes
)
MAX_LABEL_CACHE_ENTRIES = 200_000  # a bound on memory when series churn (each entry ~ one series)
# After a read, caches holding more than this many times the series read (plus the slack) are dropped.
STALE_CACHE_FACTOR = 2
STALE_CACHE_SLACK = 10_000
MAX_EXEMPLAR_LABEL_CHARS = 128  # OpenMetrics 1.0: exemplar label names and values together
TYPES = frozenset({"counter", "gauge", "histogram", "summary", "untyped", "gauge_histogram", "gaugehistogram"})

_METRIC_NAME = re.compile(r"[a-zA-Z_:][a-zA-Z0-9_:]*")
_LABEL_NAME = re.compile(r"[a-zA-Z_][a-zA-Z0-9_]*")
_INT = re.compile(r"[-+]?[0-9]+")
_UNESCAPE = {"\\": "\\", '"': '"', "n": "\n"}
_BLANK = " \t"


class ExpositionError(SourceFormatError):
    """A line that breaks the format; ``lineno`` is 1-based, ``last``: it is the final line.

    ``reason`` is one of :data:`REASONS`, so the collector can count rejections by cause.
    """

    def __init__(self, message: str, lineno: int, last: bool = False, reason: str = "parse") -> None:
        super().__init__(message)
        self.lineno = lineno
        self.last = last
        self.reason = reason


class _LineError(ValueError):
    """Raised inside the line parser; the reader turns it into an ExpositionError with the line number."""

    def __init__(self, why: str, reason: str = "parse") -> None:
        super().__init__(why)
        self.reason = reason


@dataclass
class Exposition:
    """Wanted samples by full sample name (``vllm:prompt_tokens_total``), each with labels and value."""

    samples: dict[str, Series] = field(default_factory=dict)
    lines: int = 0  # lines scanned, all of them
    matched: int = 0  # samples kept
    types: dict[str, str] = field(default_factory=dict)  # family → TYPE as declared (lower case)
    models_dropped: int = 0  # distinct models past the reader's max_models (see ExpositionReader)

    def get(self, name: str) -> Series:
        return self.samples.get(name, [])


class Everything:
    """A ``wanted`` that keeps every sample (conformance tests, ``inferwatch engine inspect``)."""

    def __contains__(self, name: object) -> bool:
        return True


def decode(body: bytes) -> str:
    """Decode an exposition body; raise ExpositionError naming the line and offset of the first bad byte."""
    try:
        return body.decode("utf-8")
    except UnicodeDecodeError as exc:
        lineno = body.count(b"\n", 0, exc.start) + 1
        raise ExpositionError(f"line {lineno}: not UTF-8 text (invalid byte at offset {exc.start})", lineno) from None


def is_openmetrics(text: str) -> bool:
    """An OpenMetrics body ends with ``# EOF`` (the agent asks for the text format; some engines send OM)."""
    return text.endswith(("# EOF\n", "# EOF"))


# --- numbers -------------------------------------------------------------------------------------


def parse_float(text: str) -> float:
    """A float as Go's ``strconv.ParseFloat`` without hex, ``p`` or ``_`` (what expfmt accepts)."""
    value = float(text)  # ValueError for most garbage
    if not text.isascii() or "_" in text or text.strip() != text:
        raise ValueError(f"not a float: {text!r}")
    if value != value and text[0] in "+-":
        raise ValueError(f"not a float: {text!r}")
    return value


def _value(text: str) -> float:
    try:
        return parse_float(text)
    except ValueError:
        raise _LineError(f"value {text[:40]!r} is not a number") from None


def _timestamp(text: str, om: bool) -> float:
    if om:
        try:
            ts = parse_float(text)
        except ValueError:
            raise _LineError(f"timestamp {text[:40]!r} is not a number") from None
        if not math.isfinite(ts):
            raise _LineError(f"timestamp {text[:40]!r} is not finite")
        return ts
    if _INT.fullmatch(text) is None:
        raise _LineError(f"timestamp {text[:40]!r} is not an integer (milliseconds)")
    return float(text)


# --- the line parser (every new head goes through it once) ---------------------------------------


def _quoted(line: str, i: int, om: bool = False) -> tuple[str, int]:
    """The string quoted at ``line[i] == '"'`` unescaped (``\\\\``, ``\\"``, ``\\n``), and the index after it.

    Another escape is an error in the text format (expfmt) and kept as written in OpenMetrics
    (client_python).
    """
    j = i + 1
    end = line.find('"', j)
    if end != -1 and line.find("\\", j, end) == -1:
        return line[j:end], end + 1
    buf: list[str] = []
    n = len(line)
    while j < n:
        c = line[j]
        if c == "\\":
            nxt = line[j + 1 : j + 2]
            if nxt not in _UNESCAPE:
                if not om or not nxt:
                    raise _LineError(f"invalid escape sequence '\\{nxt}'")
                buf.append("\\" + nxt)
            else:
                buf.append(_UNESCAPE[nxt])
            j += 2
        elif c == '"':
            return "".join(buf), j + 1
        else:
            buf.append(c)
            j += 1
    raise _LineError("unterminated quoted string")


def metric_name_at(line: str, i: int, om: bool = False) -> tuple[str, int]:
    """The metric name at ``line[i]`` (plain or quoted, UTF-8) and the index after it."""
    if line.startswith('"', i):
        return _quoted(line, i, om)
    m = _METRIC_NAME.match(line, i)
    if m is None:
        raise _LineError(f"invalid metric name at {line[i : i + 20]!r}")
    return m.group(), m.end()


def _skip(line: str, i: int, om: bool) -> int:
    if om:
        return i
    n = len(line)
    while i < n and line[i] in _BLANK:
        i += 1
    return i


def _labels(line: str, i: int, om: bool) -> tuple[str | None, Labels, int]:
    """Parse the label block after ``{`` at ``i``: (quoted metric name or None, labels, index after ``}``)."""
    n = len(line)
    out: list[tuple[str, str]] = []
    seen: set[str] = set()
    metric: str | None = None
    i = _skip(line, i, om)
    while True:
        if i >= n:
            raise _LineError("unterminated label set")
        if line[i] == "}":
            return metric, tuple(out), i + 1
        if line[i] == '"':
            lname, i = _quoted(line, i, om)
            quoted = True
        else:
            m = _LABEL_NAME.match(line, i)
            if m is None:
                raise _LineError(f"invalid label name at {line[i : i + 20]!r}")
            lname, i, quoted = m.group(), m.end(), False
        i = _skip(line, i, om)
        if i < n and line[i] == "=":
            i = _skip(line, i + 1, om)
            if i >= n or line[i] != '"':
                raise _LineError(f"label {lname!r}: value must be quoted")
            value, i = _quoted(line, i, om)
            if not lname:
                raise _LineError("empty label name")
            if lname == "__name__" and not om:
                raise _LineError('label name "__name__" is reserved')
            if lname in seen:
                raise _LineError(f"duplicate label name {lname!r}")
            seen.add(lname)
            out.append((lname, value))
        elif quoted:
            if metric is not None:
                raise _LineError("multiple metric names in the label set")
            if not lname:
                raise _LineError("empty metric name")
            metric = lname
        else:
            raise _LineError(f"expected '=' after label name {lname!r}")
        i = _skip(line, i, om)
        if i < n and line[i] == ",":
            i += 1
            if om and line.startswith("}", i):
                raise _LineError("trailing comma in label set")
            i = _skip(line, i, om)
            if i < n and line[i] == ",":
                raise _LineError("two commas in label set")
        elif i < n and line[i] == "}":
            return metric, tuple(out), i + 1
        else:
            raise _LineError("expected ',' or '}' after a label")


@dataclass(slots=True)
class Line:
    """One sample line fully parsed; ``plain``: ``name{labels} value`` with one space, cacheable."""

    name: str
    labels: Labels
    value: float
    timestamp: float | None
    exemplar: tuple[Labels, float] | None
    plain: bool


def parse_line(line: str, om: bool = False) -> Line:
    """Parse one sample line (no comment, not blank); ValueError (``_LineError``) says why not."""
    n = len(line)
    i = _skip(line, 0, om)
    name: str | None = None
    if i < n and (line[i] == '"' or _METRIC_NAME.match(line, i)):
        name, i = metric_name_at(line, i, om)
    labels: Labels = ()
    j = _skip(line, i, om)  # expfmt allows blanks before "{"; OpenMetrics does not (_skip is a no-op)
    braces = j < n and line[j] == "{"
    if braces:
        inner, labels, i = _labels(line, j + 1, om)
        if inner is not None:
            if name is not None:
                raise _LineError("metric name given twice")
            name = inner
        if om and "__name__" in dict(labels):
            if name is not None:
                raise _LineError("metric name given twice")
            name = dict(labels)["__name__"]
            labels = tuple(kv for kv in labels if kv[0] != "__name__")
    if not name:
        raise _LineError("invalid metric name")
    value_at = i  # where the text after the name or label set starts
    if om:
        if i >= n or line[i] != " ":
            raise _LineError("expected one space before the value" if i < n else "missing value")
        parts = line[i + 1 :].split(" ")
        if not parts[0]:
            raise _LineError("missing value or more than one space")
    else:
        j = _skip(line, i, om)
        if j == i and not braces:
            raise _LineError("expected a blank after the metric name" if i < n else "missing value")
        if j >= n:
            raise _LineError("missing value")
        rest = line[j:]
        if rest.rstrip(_BLANK) != rest:
            raise _LineError("blank after the last field")
        parts = rest.replace("\t", " ").split()
    value = _value(parts[0])
    timestamp: float | None = None
    exemplar: tuple[Labels, float] | None = None
    k = 1
    if k < len(parts) and parts[k] != "#":
        timestamp = _timestamp(parts[k], om)
        k += 1
    if k < len(parts):
        if not om or parts[k] != "#":
            raise _LineError(f"unexpected text after the {'timestamp' if timestamp is not None else 'value'}")
        exemplar = _exemplar(" ".join(parts[k + 1 :]))
    plain = not om and len(parts) == 1 and line[value_at:] == " " + parts[0]
    return Line(name, labels, value, timestamp, exemplar, plain)


def _exemplar(text: str) -> tuple[Labels, float]:
    """``{labels} value [timestamp]`` after ``# `` (OpenMetrics)."""
    if not text.startswith("{"):
        raise _LineError("exemplar must start with a label set")
    metric, labels, i = _labels(text, 1, True)
    if metric is not None:
        raise _LineError("exemplar label set holds a metric name")
    if sum(len(k) + len(v) for k, v in labels) > MAX_EXEMPLAR_LABEL_CHARS:
        raise _LineError(f"exemplar labels longer than {MAX_EXEMPLAR_LABEL_CHARS} characters")
    rest = text[i:]
    if not rest.startswith(" "):
        raise _LineError("expected one space before the exemplar value")
    parts = rest[1:].split(" ")
    if len(parts) > 2 or not all(parts):
        raise _LineError("bad exemplar value or timestamp")
    value = _value(parts[0])
    if len(parts) == 2:
        _timestamp(parts[1], True)
    return labels, value


# --- families: what a TYPE line implies for each sample name --------------------------------------

# Sample-name suffixes whose values must not be negative, by type. The format itself (expfmt)
# forbids negative histogram buckets and counts; the scrape rules add counters and summary counts.
_NONNEG = {
    "histogram": ("_bucket", "_count"),
    "gauge_histogram": ("_bucket", "_count"),
    "gaugehistogram": ("_bucket", "_count", "_gcount"),
}
_SCRAPE_NONNEG = {"counter": ("", "_total"), "summary": ("_count",)}


MAX_UNKEPT_HEADS = 20_000  # heads of series not kept (other families, dropped models) cached per reader
MAX_DROPPED_MODELS_COUNTED = 65_536  # distinct dropped models counted per read (beyond: a lower bound)


_Info = tuple[Labels, "str | None", int, "str | None"]  # (labels, bad bound, canonical id, model)
_UNKEPT = -2  # the canonical id of a label set of a name not wanted, not interned (see ExpositionReader.feed)


class ReadPass:
    """The state of one read while its lines arrive (all of them at once, or chunk by chunk)."""

    __slots__ = (
        "dropped",
        "helps",
        "kept",
        "last_lineno",
        "last_name",
        "lines",
        "matched",
        "nonneg",
        "om",
        "out",
        "sampled",
        "seen",
        "seen_ts",
        "typed_hist",
        "types",
    )

    def __init__(self, om: bool) -> None:
        self.out: dict[str, Series] = {}
        self.types: dict[str, str] = {}
        self.helps: set[str] = set()
        self.nonneg: set[str] = set()
        self.typed_hist: set[str] = set()  # histogram/summary families whose le/quantile must be numbers
        self.sampled: set[str] = set()
        self.seen: set[int] = set()
        self.seen_ts: set[tuple[int, float]] = set()
        self.last_name = ""
        self.matched = 0
        self.lines = 0
        self.kept: set[str | None] = set()  # models whose samples are kept (None: no model label)
        self.dropped: set[int] = set()  # hashes of the models past max_models
        self.om = om
        self.last_lineno = -1  # the number of the body's last line, when known (whole-text reads)


class ExpositionReader:
    """Reads samples whose names are in ``wanted``; checks every line.

    ``prefixes`` is kept for the adapters' detection; all lines are read. ``scrape_rules``: on top of
    the format, reject what Prometheus' scrape rejects or what makes a reading wrong — one series
    twice (``duplicate_series``), a negative counter or summary count (``negative_value``); off, the
    reader accepts exactly what the reference parsers accept (the conformance tests). Keep one
    reader per target: its head cache is what makes repeated scrapes cheap.

    ``model_labels`` with ``limits``: the first ``limits.max_models`` distinct models (the first of
    these labels present, in order; none: one model) among the wanted samples, in exposition order,
    are kept; samples of the others are checked line by line but neither kept nor cached (so a
    flood of model names costs no memory per series) and their models are counted
    (``Exposition.models_dropped``). Heads of series that are not kept are cached up to
    :data:`MAX_UNKEPT_HEADS`; past it they are checked line by line, without the duplicate check
    (their values are not used).

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
        self._short_labels = min(limits.max_label_value_bytes, limits.max_label_bytes) if limits is not None else 0
        # "name{labels}" → (name, labels, series id, wanted, bad bound, model); series id: one int per distinct
        # series (the name's identity and the label set's canonical id); bad bound: "le" or "quantile" when
        # that label is not a number (an error in a histogram/summary)
        self._heads: dict[str, tuple[str, Labels, int, bool, str | None, str | None]] = {}
        self._unkept = 0  # cached heads of names not wanted
        # interned label tuples (the adapters memoise by identity) → (labels, bad bound, canonical id, model)
        self._labels: dict[Labels, _Info] = {}
        self._canon: dict[frozenset[tuple[str, str]], int] = {}  # label set in any order → one id
        self._raw: dict[str | None, _Info] = {}  # label text of plain heads → _info()
        self._names: dict[str, str] = {}  # metric names checked valid, one object each (cheap `is` tests)
        self._bounds: dict[str, bool] = {}  # le/quantile label texts → a number (see _bad_bound)

    def read(self, text: str, openmetrics: bool | None = None) -> Exposition:
        om = is_openmetrics(text) if openmetrics is None else openmetrics
        lines = text.split("\n")
        if om:
            from agent.engine.openmetrics import check_openmetrics  # builds on this module: imported late

            p = self.begin(om=True)
            p.last_lineno = len(lines)
            self.feed(p, lines)
            check_openmetrics(lines, expo_line_parser=parse_line)
            return self.end(p)
        if lines[-1].strip(_BLANK):
            n = len(lines)
            raise ExpositionError(f"line {n}: no newline at the end of the input: {lines[-1][:120]!r}", n, True)
        p = self.begin()
        p.last_lineno = len(lines)
        self.feed(p, lines)
        return self.end(p)

    def begin(self, om: bool = False) -> ReadPass:
        """Start a read (see :meth:`feed`)."""
        if len(self._heads) >= MAX_LABEL_CACHE_ENTRIES or len(self._canon) >= MAX_LABEL_CACHE_ENTRIES:
            self.clear()
        return ReadPass(om)

    def end(self, p: ReadPass) -> Exposition:
        """The exposition read by ``p``; gives back the caches of series that are gone."""
        if len(self._heads) > STALE_CACHE_FACTOR * (len(p.seen) + len(p.seen_ts)) + STALE_CACHE_SLACK:
            self.clear()  # most cached heads are gone (a burst of series ended): give the memory back
        return Exposition(p.out, p.lines, p.matched, p.types, len(p.dropped))

    def abandon(self, p: ReadPass) -> None:
        """A read that failed: give back what it cached if most of the cache is its own (as :meth:`end`)."""
        if len(self._heads) > STALE_CACHE_FACTOR * (len(p.seen) + len(p.seen_ts)) + STALE_CACHE_SLACK or (
            len(self._heads) > STALE_CACHE_SLACK and p.lines > STALE_CACHE_SLACK
        ):
            self.clear()

    def feed(self, p: ReadPass, lines: list[str]) -> None:
        """Read complete lines (no ``\\n``) of the body read by ``p``, in order; raise ExpositionError."""
        heads = self._heads
        om = p.om
        out, types, nonneg, typed_hist, sampled = p.out, p.types, p.nonneg, p.typed_hist, p.sampled
        seen, seen_ts, kept = p.seen, p.seen_ts, p.kept
        last_name = p.last_name
        matched = p.matched
        cap = self.max_models
        rules = self.scrape_rules
        names, raw_cache, wanted = self._names, self._raw, self.wanted
        for line in lines:
            if not line:
                continue
            c = line[0]
            if c == "#" or (c in _BLANK and line.lstrip(_BLANK)[:1] in ("#", "")):
                if om:
                    continue  # metadata is checked by check_openmetrics
                self._comment(p, lines, line)
                continue
            head, _, val = line.rpartition(" ")
            hit = heads.get(head)
            if hit is not None and not om:
                name, labels, sid, keep, bad, model = hit
                try:  # parse_float, inline: this runs for every line of every scrape
                    value = float(val)
                    if "_" in val or not val.isascii() or val.strip() != val or (value != value and val[0] in "+-"):
                        raise ValueError(val)
                except ValueError:
                    raise self._error(p, lines, line, f"value {val[:40]!r} is not a number") from None
                ts = None
            else:
                # The common new head (name, name{a="x",...}): its name and label text are each checked
                # once and cached by their text; any other shape goes to parse_line (the authority).
                info = None
                plain = False
                if not om:
                    brace = head.find("{")
                    text = head if brace == -1 else head[:brace]
                    known = names.get(text)
                    if known is None and _METRIC_NAME.fullmatch(text) is not None:
                        known = names[text] = text
                    if known is not None and (brace == -1 or head[-1] == "}"):
                        name = known
                        raw = None if brace == -1 else head[brace + 1 : -1]
                        info = raw_cache.get(raw)
                        if info is None:
                            plain_labels = _plain_labels(raw) if raw else ()
                            if plain_labels is not None:
                                info = self._info_of(p, lines, line, name, plain_labels, True, raw)
                    if info is not None:
                        try:  # parse_float, inline
                            value = float(val)
                            if (
                                "_" in val
                                or not val.isascii()
                                or val.strip() != val
                                or (value != value and val[0] in "+-")
                            ):
                                info = None
                        except ValueError:
                            info = None
                if info is not None:
                    ts = None
                    plain = True
                else:
                    try:
                        parsed = parse_line(line, om)
                    except _LineError as exc:
                        raise self._error(p, lines, line, str(exc), exc.reason) from None
                    name, value, ts = parsed.name, parsed.value, parsed.timestamp
                    name = names.setdefault(name, name)
                    info = self._info_of(p, lines, line, name, parsed.labels)
                    plain = parsed.plain and not om
                labels, bad, canon, model = info
                keep = name in wanted
                if canon >= 0:
                    # one int per series: the name is one object per reader (``_names``), the label set one id
                    sid = id(name) << 32 | canon
                    if plain:
                        if not keep:
                            self._unkept += 1
                        heads[head] = (name, labels, sid, keep, bad, model)
                elif canon == _UNKEPT and plain:
                    # a family not read: its head is cached without its labels; its series id is the cached
                    # text's identity (the same line twice is a duplicate; its labels in another order are not seen)
                    sid = id(head)
                    self._unkept += 1
                    heads[head] = (name, (), sid, False, bad, None)
                else:
                    sid = -1  # not cached: a dropped model, or past MAX_UNKEPT_HEADS
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
            if bad is not None and name in typed_hist and (bad == "le") == (types.get(name) != "summary"):
                raise self._error(p, lines, line, f"{bad} label is not a number")
            if value < 0 and name in nonneg:
                raise self._error(
                    p, lines, line, f"negative value {value:g} for a {types_of(name, types)}", "negative_value"
                )
            if sid < 0:
                pass  # a series that is not kept and not cached: no duplicate check (its values are not used)
            elif ts is None:
                if sid in seen and rules:
                    raise self._error(p, lines, line, "duplicate series", "duplicate_series")
                seen.add(sid)
            else:
                ts_key = (sid, math.floor(ts * 1e9 + 1e-6) if om else ts)  # OM: nanoseconds, as client_python
                if ts_key in seen_ts:
                    if rules:
                        raise self._error(p, lines, line, "duplicate series (same timestamp)", "duplicate_series")
                    continue  # the reference keeps the first sample
                seen_ts.add(ts_key)
            if keep:
                series = out.get(name)
                if series is None:
                    out[name] = [(labels, value)]
                else:
                    series.append((labels, value))
                matched += 1
        p.last_name = last_name
        p.matched = matched
        p.lines += len(lines)

    def clear(self) -> None:
        """Forget every cached head, label set and name (the next read is a cold one)."""
        self._heads.clear()
        self._unkept = 0
        self._labels.clear()
        self._raw.clear()
        self._canon.clear()
        self._names.clear()

    def _info_of(
        self,
        p: ReadPass,
        lines: list[str],
        line: str,
        name: str,
        labels: Labels,
        by_raw: bool = False,
        raw: str | None = None,
    ) -> _Info:
        """(labels interned, bad bound, canonical id, model) of a new head's labels.

        Interned and cached for a wanted name; for a name not wanted, not interned (canonical id
        ``_UNKEPT``: the head may be cached alone, or -1 once :data:`MAX_UNKEPT_HEADS` are); for a model
        past ``max_models``, nothing (-1). ``by_raw``: also cache the result by the plain label text
        ``raw`` (None: no label block)."""
        hit = self._labels.get(labels)
        if hit is not None:
            if by_raw:
                self._raw[raw] = hit
            return hit
        # A plain ASCII label text no longer than the smaller limit cannot break one: its names and values
        # are shorter than the text (the common case: one length test instead of a pass over the labels).
        if self.limits is not None and not (raw is not None and len(raw) <= self._short_labels and raw.isascii()):
            broken = label_limit_error(labels, self.limits)
            if broken is not None:
                raise self._error(p, lines, line, broken[1], broken[0])
        model = _model_of(labels, self.model_labels)
        if name not in self.wanted:
            return labels, _bad_bound(labels, self._bounds), _UNKEPT if self._unkept < MAX_UNKEPT_HEADS else -1, None
        if model not in p.kept and len(p.kept) >= self.max_models:
            return labels, _bad_bound(labels, self._bounds), -1, model  # a dropped model: nothing cached
        canon = self._canon.setdefault(frozenset(labels), len(self._canon))
        hit = self._labels[labels] = (labels, _bad_bound(labels, self._bounds), canon, model)
        if by_raw:
            self._raw[raw] = hit
        return hit

    def _comment(self, p: ReadPass, lines: list[str], line: str) -> None:
        """``# HELP name doc`` / ``# TYPE name type``; any other comment is ignored (expfmt's rules)."""
        body = line.lstrip(_BLANK)[1:].lstrip(_BLANK)
        keyword = re.split(r"[ \t]", body, maxsplit=1)[0]
        if keyword not in ("HELP", "TYPE"):
            return
        rest = body[len(keyword) :].lstrip(_BLANK)
        if not rest:
            return
        types, helps = p.types, p.helps
        try:
            name, i = metric_name_at(rest, 0)
            if i < len(rest) and rest[i] not in _BLANK:
                raise _LineError("invalid metric name in comment")
            text = rest[i:].lstrip(_BLANK)
            if not text:
                return  # "# HELP name" alone sets nothing (expfmt)
            if keyword == "HELP":
                if name in helps:
                    raise _LineError(f"second HELP line for {name!r}", "type_conflict")
                _help(text)
                helps.add(name)
                return
            typ = text.lower()
            if typ not in TYPES:
                raise _LineError(f"unknown metric type {text[:40]!r}")
            if name in types or name in p.sampled:
                raise _LineError(f"second TYPE line for {name!r}, or TYPE after its samples", "type_conflict")
        except _LineError as exc:
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
        # Line numbers are only computed on the error path (never in the loop).
        index = next((i + 1 for i, candidate in enumerate(lines) if candidate is line), 0)
        lineno = p.lines + index
        return ExpositionError(f"line {lineno}: {why}: {line[:120]!r}", lineno, lineno == p.last_lineno, reason)


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


_PLAIN_PAIR = r'[a-zA-Z_][a-zA-Z0-9_]*="[^"\\\n]*"'
# A plain label block: names and values without blanks or escapes, optionally one trailing comma.
# parse_line reads these the same way and judges every other shape.
_PLAIN_BLOCK = re.compile(rf"(?:{_PLAIN_PAIR},)*(?:{_PLAIN_PAIR},?)?")
_PAIRS = re.compile(r'([a-zA-Z_][a-zA-Z0-9_]*)="([^"\\\n]*)"')  # the pairs of a block _PLAIN_BLOCK matched


def _plain_labels(raw: str) -> Labels | None:
    """The pairs of a plain label block (:data:`_PLAIN_BLOCK`); None for what parse_line must judge.

    A duplicate label name or ``__name__`` is an error that parse_line reports with its message.
    """
    if _PLAIN_BLOCK.fullmatch(raw) is None:
        return None
    out = _PAIRS.findall(raw)
    if len(out) > 1 and len(dict(out)) != len(out):
        return None
    if "__name__" in raw and any(k == "__name__" for k, _ in out):
        return None
    return tuple(out)


MAX_BOUND_TEXTS = 4096  # le/quantile texts remembered per reader (bucket bounds repeat in every series)


def _bad_bound(labels: Labels, bounds: dict[str, bool]) -> str | None:
    """The label (``le`` or ``quantile``) that is not a number, else None; ``bounds``: texts seen → a number."""
    for k, v in labels:
        if k == "le" or k == "quantile":
            ok = bounds.get(v)
            if ok is None:
                try:
                    parse_float(v)
                    ok = True
                except ValueError:
                    ok = False
                if len(bounds) < MAX_BOUND_TEXTS:
                    bounds[v] = ok
            if not ok:
                return k
    return None


def types_of(name: str, types: dict[str, str]) -> str:
    for suffix in ("", "_total", "_bucket", "_count", "_gcount", "_sum"):
        if suffix and name.endswith(suffix) and name[: -len(suffix)] in types:
            return f"{types[name[: -len(suffix)]]} {suffix[1:]}"
    return types.get(name, "sample")


def _help(text: str) -> str:
    """A HELP docstring unescaped (``\\\\``, ``\\n``, ``\\"``); any other escape is an error (expfmt)."""
    if "\\" not in text:
        return text
    out: list[str] = []
    i = 0
    while i < len(text):
        c = text[i]
        if c == "\\":
            nxt = text[i + 1 : i + 2]
            if nxt not in _UNESCAPE:
                raise _LineError(f"invalid escape sequence '\\{nxt}' in HELP")
            out.append(_UNESCAPE[nxt])
            i += 2
        else:
            out.append(c)
            i += 1
    return "".join(out)


def parse_labels(raw: str) -> Labels:
    """Parse the inside of a label block (``a="x",b="y"``) into ((name, value), ...), in order."""
    try:
        metric, labels, end = _labels(raw + "}", 0, False)
    except _LineError as exc:
        raise ValueError(str(exc)) from None
    if metric is not None or end != len(raw) + 1:
        raise ValueError("not a label set")
    return labels
