"""The grammar of one line of the Prometheus text format and of OpenMetrics 1.0: the line parser.

A sample line (``name{labels} value [timestamp]``, an OpenMetrics exemplar after ``# ``), its numbers
(Go's ``strconv.ParseFloat`` as expfmt accepts it), metric names plain or quoted (UTF-8), label blocks
and their escapes, a HELP text's escapes. :func:`parse_line` is the authority every new line goes
through once; the reader (exposition.py) and the OpenMetrics family rules (openmetrics.py) build on it.
A line's problem is a :class:`LineError`; the reader words it as an :class:`ExpositionError` with the
line number and one of :data:`REASONS`.
"""

from __future__ import annotations

import math
import re
from dataclasses import dataclass

from inferwatch.agent.errors import SourceFormatError

Labels = tuple[tuple[str, str], ...]

REASONS = (
    "parse",
    "duplicate_series",
    "type_conflict",
    "negative_value",
    "openmetrics",
    "label_value_length_limit",  # with limits: a label value over EngineLimits.max_label_value_bytes
    "label_bytes_limit",  # with limits: one series' labels over EngineLimits.max_label_bytes
)
MAX_EXEMPLAR_LABEL_CHARS = 128  # OpenMetrics 1.0: exemplar label names and values together
TYPES = frozenset({"counter", "gauge", "histogram", "summary", "untyped", "gauge_histogram", "gaugehistogram"})

METRIC_NAME = re.compile(r"[a-zA-Z_:][a-zA-Z0-9_:]*")
LABEL_NAME = re.compile(r"[a-zA-Z_][a-zA-Z0-9_]*")
_INT = re.compile(r"[-+]?[0-9]+")
_UNESCAPE = {"\\": "\\", '"': '"', "n": "\n"}
BLANK = " \t"


class ExpositionError(SourceFormatError):
    """A line that breaks the format; ``lineno`` is 1-based, ``last``: it is the final line.

    ``reason`` is one of :data:`REASONS`, so the collector can count rejections by cause.
    """

    def __init__(
        self, message: str, lineno: int, last: bool = False, reason: str = "parse", line: str | None = None
    ) -> None:
        super().__init__(message)
        self.lineno = lineno
        self.last = last
        self.reason = reason
        self.line = line  # the line object itself, when a reader raised it (a tolerant read drops it)


class LineError(ValueError):
    """Raised inside the line parser; the reader turns it into an ExpositionError with the line number."""

    def __init__(self, why: str, reason: str = "parse") -> None:
        super().__init__(why)
        self.reason = reason


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
        raise LineError(f"value {text[:40]!r} is not a number") from None


def _timestamp(text: str, om: bool) -> float:
    if om:
        try:
            ts = parse_float(text)
        except ValueError:
            raise LineError(f"timestamp {text[:40]!r} is not a number") from None
        if not math.isfinite(ts):
            raise LineError(f"timestamp {text[:40]!r} is not finite")
        return ts
    if _INT.fullmatch(text) is None:
        raise LineError(f"timestamp {text[:40]!r} is not an integer (milliseconds)")
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
                    raise LineError(f"invalid escape sequence '\\{nxt}'")
                buf.append("\\" + nxt)
            else:
                buf.append(_UNESCAPE[nxt])
            j += 2
        elif c == '"':
            return "".join(buf), j + 1
        else:
            buf.append(c)
            j += 1
    raise LineError("unterminated quoted string")


def metric_name_at(line: str, i: int, om: bool = False) -> tuple[str, int]:
    """The metric name at ``line[i]`` (plain or quoted, UTF-8) and the index after it."""
    if line.startswith('"', i):
        return _quoted(line, i, om)
    m = METRIC_NAME.match(line, i)
    if m is None:
        raise LineError(f"invalid metric name at {line[i : i + 20]!r}")
    return m.group(), m.end()


def _skip(line: str, i: int, om: bool) -> int:
    if om:
        return i
    n = len(line)
    while i < n and line[i] in BLANK:
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
            raise LineError("unterminated label set")
        if line[i] == "}":
            return metric, tuple(out), i + 1
        if line[i] == '"':
            lname, i = _quoted(line, i, om)
            quoted = True
        else:
            m = LABEL_NAME.match(line, i)
            if m is None:
                raise LineError(f"invalid label name at {line[i : i + 20]!r}")
            lname, i, quoted = m.group(), m.end(), False
        i = _skip(line, i, om)
        if i < n and line[i] == "=":
            i = _skip(line, i + 1, om)
            if i >= n or line[i] != '"':
                raise LineError(f"label {lname!r}: value must be quoted")
            value, i = _quoted(line, i, om)
            if not lname:
                raise LineError("empty label name")
            if lname == "__name__" and not om:
                raise LineError('label name "__name__" is reserved')
            if lname in seen:
                raise LineError(f"duplicate label name {lname!r}")
            seen.add(lname)
            out.append((lname, value))
        elif quoted:
            if metric is not None:
                raise LineError("multiple metric names in the label set")
            if not lname:
                raise LineError("empty metric name")
            metric = lname
        else:
            raise LineError(f"expected '=' after label name {lname!r}")
        i = _skip(line, i, om)
        if i < n and line[i] == ",":
            i += 1
            if om and line.startswith("}", i):
                raise LineError("trailing comma in label set")
            i = _skip(line, i, om)
            if i < n and line[i] == ",":
                raise LineError("two commas in label set")
        elif i < n and line[i] == "}":
            return metric, tuple(out), i + 1
        else:
            raise LineError("expected ',' or '}' after a label")


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
    """Parse one sample line (no comment, not blank); ValueError (``LineError``) says why not."""
    n = len(line)
    i = _skip(line, 0, om)
    name: str | None = None
    if i < n and (line[i] == '"' or METRIC_NAME.match(line, i)):
        name, i = metric_name_at(line, i, om)
    labels: Labels = ()
    j = _skip(line, i, om)  # expfmt allows blanks before "{"; OpenMetrics does not (_skip is a no-op)
    braces = j < n and line[j] == "{"
    if braces:
        inner, labels, i = _labels(line, j + 1, om)
        if inner is not None:
            if name is not None:
                raise LineError("metric name given twice")
            name = inner
        if om and "__name__" in dict(labels):
            if name is not None:
                raise LineError("metric name given twice")
            name = dict(labels)["__name__"]
            labels = tuple(kv for kv in labels if kv[0] != "__name__")
    if not name:
        raise LineError("invalid metric name")
    value_at = i  # where the text after the name or label set starts
    if om:
        if i >= n or line[i] != " ":
            raise LineError("expected one space before the value" if i < n else "missing value")
        parts = line[i + 1 :].split(" ")
        if not parts[0]:
            raise LineError("missing value or more than one space")
    else:
        j = _skip(line, i, om)
        if j == i and not braces:
            raise LineError("expected a blank after the metric name" if i < n else "missing value")
        if j >= n:
            raise LineError("missing value")
        rest = line[j:]
        if rest.rstrip(BLANK) != rest:
            raise LineError("blank after the last field")
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
            raise LineError(f"unexpected text after the {'timestamp' if timestamp is not None else 'value'}")
        exemplar = _exemplar(" ".join(parts[k + 1 :]))
    plain = not om and len(parts) == 1 and line[value_at:] == " " + parts[0]
    return Line(name, labels, value, timestamp, exemplar, plain)


def _exemplar(text: str) -> tuple[Labels, float]:
    """``{labels} value [timestamp]`` after ``# `` (OpenMetrics)."""
    if not text.startswith("{"):
        raise LineError("exemplar must start with a label set")
    metric, labels, i = _labels(text, 1, True)
    if metric is not None:
        raise LineError("exemplar label set holds a metric name")
    if sum(len(k) + len(v) for k, v in labels) > MAX_EXEMPLAR_LABEL_CHARS:
        raise LineError(f"exemplar labels longer than {MAX_EXEMPLAR_LABEL_CHARS} characters")
    rest = text[i:]
    if not rest.startswith(" "):
        raise LineError("expected one space before the exemplar value")
    parts = rest[1:].split(" ")
    if len(parts) > 2 or not all(parts):
        raise LineError("bad exemplar value or timestamp")
    value = _value(parts[0])
    if len(parts) == 2:
        _timestamp(parts[1], True)
    return labels, value


def types_of(name: str, types: dict[str, str]) -> str:
    for suffix in ("", "_total", "_bucket", "_count", "_gcount", "_sum"):
        if suffix and name.endswith(suffix) and name[: -len(suffix)] in types:
            return f"{types[name[: -len(suffix)]]} {suffix[1:]}"
    return types.get(name, "sample")


def unescape_help(text: str) -> str:
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
                raise LineError(f"invalid escape sequence '\\{nxt}' in HELP")
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
    except LineError as exc:
        raise ValueError(str(exc)) from None
    if metric is not None or end != len(raw) + 1:
        raise ValueError("not a label set")
    return labels
