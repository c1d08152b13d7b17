"""OpenMetrics 1.0 family rules, checked over a whole body after its lines parsed (off the hot path).

Engines are asked for the text format; a body ending in ``# EOF`` is OpenMetrics and goes through
these checks as client_python's OpenMetrics parser applies them (the reference for
``tests/fixtures/expfmt/``): no blank line, nothing after ``# EOF``, metadata (``HELP``/``TYPE``/
``UNIT``) once per family and before its samples, families and their groups contiguous, sample names
allowed by the type (``_total`` for counters), ``le``/``quantile`` canonical numbers, buckets in
order with a ``+Inf`` bucket equal to ``_count``, counter-like values neither negative nor NaN,
exemplars only on buckets and counters, info and stateset values. A violation raises
:class:`~inferwatch.agent.node.engine.textformat.ExpositionError` with reason ``openmetrics`` (or ``negative_value``).
"""

from __future__ import annotations

import math
from collections.abc import Callable, Container
from typing import Any

from inferwatch.agent.node.engine.textformat import ExpositionError, Labels, LineError, metric_name_at

_SUFFIXES = {
    "counter": ("_total", "_created"),
    "summary": ("", "_count", "_sum", "_created"),
    "histogram": ("_count", "_sum", "_bucket", "_created"),
    "gaugehistogram": ("_gcount", "_gsum", "_bucket"),
    "info": ("_info",),
}
_COUNTER_LIKE = ("_total", "_sum", "_count", "_bucket", "_gcount", "_gsum")
_OM_TYPES = frozenset({"counter", "gauge", "histogram", "gaugehistogram", "summary", "info", "stateset", "unknown"})


def _go_float(v: float) -> str:
    if v == math.inf:
        return "+Inf"
    if v == -math.inf:
        return "-Inf"
    if v != v:
        return "NaN"
    s = repr(v)
    mantissa, _, exp = s.partition("e")
    if exp:
        sign = exp[0] if exp[0] in "+-" else "+"
        digits = exp.lstrip("+-")
        return f"{mantissa}e{sign}{digits.zfill(2)}"
    return s


class _Family:
    def __init__(self, name: str) -> None:
        self.name = name
        self.typ: str | None = None
        self.help: str | None = None
        self.unit: str | None = None
        self.samples: list[tuple[str, Labels, float, float | None, int]] = []
        self.allowed: tuple[str, ...] = (name,)
        self.group: tuple[tuple[str, str], ...] | None = None
        self.groups: set[tuple[tuple[str, str], ...]] = set()
        self.group_ts: float | None = None


def check_openmetrics(lines: list[str], expo_line_parser: Callable[..., Any], skip: Container[int] = ()) -> None:
    """Raise ExpositionError for the first OpenMetrics rule ``lines`` (the body split on ``\\n``) break.

    ``skip``: the ``id()`` of lines a tolerant read dropped (they are not there). An error at a line carries it
    (``ExpositionError.line``); one about a whole family does not.
    """
    if lines and lines[-1] == "":
        lines = lines[:-1]
    seen_names: set[str] = set()
    fam: _Family | None = None
    eof = False
    for lineno, line in enumerate(lines, 1):
        if skip and id(line) in skip:
            continue

        def fail(why: str, reason: str = "openmetrics", lineno: int = lineno, line: str = line) -> ExpositionError:
            return ExpositionError(f"line {lineno}: {why}: {line[:120]!r}", lineno, lineno == len(lines), reason, line)

        if eof:
            raise fail("text after # EOF")
        if not line:
            raise fail("blank line")
        if line == "# EOF":
            eof = True
            continue
        try:
            if line.startswith("#"):
                fam = _metadata(line, fam, seen_names, fail)
                continue
            s = expo_line_parser(line, True)
        except LineError as exc:  # a bad name in a metadata line, or a sample line
            raise fail(str(exc), "parse") from None
        if fam is None or s.name not in fam.allowed:
            if fam is not None:
                _finish(fam, seen_names, fail)
            fam = _Family(s.name)
            fam.typ = "unknown"
        _sample(fam, s, lineno, fail)
    if fam is not None:
        n = max(len(lines), 1)
        _finish(fam, seen_names, lambda why, reason="openmetrics": ExpositionError(f"line {n}: {why}", n, True, reason))
    if not eof:
        n = max(len(lines), 1)
        raise ExpositionError(f"line {n}: no '# EOF' at the end of an OpenMetrics body", n, True)


def _metadata(line: str, fam: _Family | None, seen: set[str], fail: Callable[..., ExpositionError]) -> _Family:
    parts = line.split(" ", 2)
    if len(parts) < 3 or parts[0] != "#":
        raise fail("invalid metadata line")
    keyword, rest = parts[1], parts[2]
    name, i = metric_name_at(rest, 0, True)
    if i >= len(rest) or rest[i] != " ":
        raise fail("metadata needs a name and a value")
    value = rest[i + 1 :]
    if fam is not None and name == fam.name and fam.samples:
        raise fail("metadata after samples")
    if fam is None or name != fam.name:
        if fam is not None:
            _finish(fam, seen, fail)
        fam = _Family(name)
    if keyword == "HELP":
        if fam.help is not None:
            raise fail("second HELP line")
        fam.help = value
    elif keyword == "TYPE":
        if fam.typ is not None:
            raise fail("second TYPE line")
        if value not in _OM_TYPES:
            raise fail(f"invalid TYPE {value!r}")
        fam.typ = value
        fam.allowed = tuple(name + s for s in _SUFFIXES.get(value, ("",)))
    elif keyword == "UNIT":
        if fam.unit is not None:
            raise fail("second UNIT line")
        fam.unit = value
    else:
        raise fail("invalid metadata keyword")
    return fam


def _group(fam: _Family, name: str, labels: Labels) -> tuple[tuple[str, str], ...]:
    typ = fam.typ
    drop: str | None = None
    if typ == "info":
        return ()
    if typ == "summary" and name == fam.name:
        drop = "quantile"
    elif typ == "stateset":
        drop = fam.name
    elif typ in ("histogram", "gaugehistogram") and name == fam.name + "_bucket":
        drop = "le"
    return tuple(sorted(kv for kv in labels if kv[0] != drop))


def _sample(fam: _Family, s: Any, lineno: int, fail: Callable[..., ExpositionError]) -> None:
    name, labels, value, ts = s.name, s.labels, s.value, s.timestamp
    d = dict(labels)
    typ = fam.typ
    if typ == "stateset" and fam.name not in d:
        raise fail("stateset sample without its label")
    if name == fam.name + "_bucket":
        le = d.get("le")
        if le is None or le == "NaN" or _uncanonical(le):
            raise fail("invalid le label")
        if not float(value).is_integer():
            raise fail("bucket value is not an integer")
    if name in (fam.name + "_count", fam.name + "_gcount") and not float(value).is_integer():
        raise fail("count value is not an integer")
    if typ == "summary" and name == fam.name:
        q = d.get("quantile")
        try:
            qv = float(q) if q is not None else -1.0
        except ValueError:
            qv = -1.0
        if not 0 <= qv <= 1 or _uncanonical(q or ""):
            raise fail("invalid quantile label")
    g = _group(fam, name, labels)
    if fam.group is not None and g != fam.group and g in fam.groups:
        raise fail("samples of one group are not contiguous")
    if fam.group is not None and g == fam.group:
        if (ts is None) != (fam.group_ts is None):
            raise fail("timestamps on some samples of a group only")
        if fam.group_ts is not None and ts is not None and fam.group_ts > ts and typ != "info":
            raise fail("timestamps go backwards within a group")
    fam.samples.append((name, labels, value, ts, lineno))
    fam.group, fam.group_ts = g, ts
    fam.groups.add(g)
    if typ == "stateset" and value not in (0, 1):
        raise fail("stateset values must be 0 or 1")
    if typ == "info" and value != 1:
        raise fail("info values must be 1")
    if typ == "summary" and name == fam.name and value < 0:
        raise fail("negative quantile value", "negative_value")
    suffix = name[len(fam.name) :]
    if suffix in _COUNTER_LIKE and math.isnan(value):
        raise fail("counter-like value is NaN")
    if suffix in _COUNTER_LIKE[:5] and value < 0:
        raise fail("counter-like value is negative", "negative_value")
    if s.exemplar is not None and not (
        (typ in ("histogram", "gaugehistogram") and name.endswith("_bucket"))
        or (typ == "counter" and name.endswith("_total"))
    ):
        raise fail("exemplar on a sample that cannot have one")


def _uncanonical(text: str) -> bool:
    try:
        v = float(text)
    except ValueError:
        return True
    return v == math.inf and text != _go_float(v)


def _finish(fam: _Family, seen: set[str], fail: Callable[..., ExpositionError]) -> None:
    typ = fam.typ or "unknown"
    for suffix in {*_SUFFIXES.get(typ, ()), ""}:
        if fam.name + suffix in seen:
            raise fail(f"clashing family name {fam.name + suffix!r}")
        seen.add(fam.name + suffix)
    if fam.unit and not fam.name.endswith("_" + fam.unit):
        raise fail("unit does not match the metric name")
    if fam.unit and typ in ("info", "stateset"):
        raise fail("unit not allowed for this type")
    if typ in ("histogram", "gaugehistogram"):
        _check_histogram(fam, fail)


def _check_histogram(fam: _Family, fail: Callable[..., ExpositionError]) -> None:
    state: dict[str, Any] = {}
    group: object = None
    ts: object = None

    def done() -> None:
        if state["bucket"] != math.inf:
            raise fail(f"+Inf bucket missing in {fam.name!r}")
        if state["count"] is not None and state["value"] != state["count"]:
            raise fail(f"_count does not match the +Inf bucket in {fam.name!r}")
        if state["sum"] and state["count"] is None:
            raise fail(f"_sum without _count in {fam.name!r}")
        if state["gsum"] and state["count"] is None:
            raise fail(f"_gsum without _gcount in {fam.name!r}")
        if not (state["sum"] or state["gsum"]) and state["count"] is not None:
            raise fail(f"_count without _sum in {fam.name!r}")
        if state["neg_buckets"] and state["sum"]:
            raise fail(f"_sum with negative buckets in {fam.name!r}")
        if not state["neg_buckets"] and state["neg_gsum"]:
            raise fail(f"negative _gsum with non-negative buckets in {fam.name!r}")

    for name, labels, value, sts, _lineno in fam.samples:
        suffix = name[len(fam.name) :]
        if not suffix:
            continue
        g = tuple(kv for kv in labels if kv[0] != "le") if suffix == "_bucket" else labels
        g = tuple(sorted(g))
        if g != group or sts != ts:
            if group is not None:
                done()
            state = {"count": None, "bucket": None, "neg_buckets": False, "sum": False, "gsum": False}
            state.update(neg_gsum=False, value=0.0)
        group, ts = g, sts
        if suffix == "_bucket":
            b = float(dict(labels)["le"])
            if b < 0:
                state["neg_buckets"] = True
            if state["bucket"] is not None and b <= state["bucket"]:
                raise fail(f"buckets out of order in {fam.name!r}")
            if value < state["value"]:
                raise fail(f"bucket values go down in {fam.name!r}")
            state["bucket"], state["value"] = b, value
        elif suffix in ("_count", "_gcount"):
            state["count"] = value
        elif suffix == "_sum":
            state["sum"] = True
        elif suffix == "_gsum":
            state["gsum"] = True
            if value < 0:
                state["neg_gsum"] = True
    if group is not None:
        done()
