"""Label blocks read from their text on the reader's fast path, and what a label set may break there.

A plain block (``a="x",b="y"``: names unquoted, values without escapes) is split and its pairs cached by
their text (:func:`plain_block`), which notes the model label's value and an ``le``/``quantile`` bound
that is not a number (:func:`bad_bound`, :func:`bound_error`); a block longer than a label limit is
judged in place, before a value of megabytes is copied (:func:`long_block_limit_error`). Any other
shape goes to the line parser (textformat.py), which says what is wrong with it.
"""

from __future__ import annotations

from inferwatch.agent.node.engine.limits import EngineLimits
from inferwatch.agent.node.engine.textformat import LABEL_NAME, Labels, parse_float

BOUNDS = ("le", "quantile")
MAX_LABEL_PAIRS = 16_384  # label pair texts remembered per reader (names and values repeat across series)


Pair = tuple[tuple[str, str], "str | None"]  # ((name, value), flag): see plain_pair


def plain_pair(text: str, model_label: str | None) -> Pair | None:
    """A plain pair text as the split leaves it (``a="x``) → ((name, value), flag), None if not plain.

    flag: ``"le"`` or ``"quantile"`` when that bound is not a number, ``""`` for the model label, else None.
    """
    lname, eq, value = text.partition('="')
    if not eq or '"' in value or LABEL_NAME.fullmatch(lname) is None or lname == "__name__":
        return None
    flag = None
    if lname == "le" or lname == "quantile":
        try:
            parse_float(value)
        except ValueError:
            flag = lname
    elif lname == model_label:
        flag = ""
    return (lname, value), flag


def plain_block(
    raw: str, known: dict[str, Pair], model_label: str | None, fresh: list[tuple[str, Pair]]
) -> tuple[Labels, str | None, str | None] | None:
    """(pairs in order, model, bad bound) of a plain label block, ``a="x",b="y"`` (one trailing comma allowed).

    Plain: names unquoted, values without escapes, no blanks around ``=`` and ``,``; parse_line reads
    these the same way. None for any other shape, a duplicate label name or ``__name__``: parse_line
    judges those lines and reports the error. In a block without backslashes every ``"`` delimits a
    value, so ``",`` only ends one. ``known``: the pair texts already checked → :func:`plain_pair`'s answer,
    whose (name, value) tuple is shared by every label set holding the pair; the pairs not in it are
    appended to ``fresh`` (the caller adds them once it caches the label set: the pairs of dropped
    models are not remembered). model: the value of ``model_label`` (None: absent, or no single model
    label); bad bound: as :func:`bad_bound`.
    """
    if "\\" in raw:
        return None
    parts = raw.split('",')
    last = parts.pop()
    if last:
        if last[-1] != '"':
            return None
        parts.append(last[:-1])
    out = []
    model = bad = None
    for part in parts:
        hit = known.get(part)
        if hit is None:
            hit = plain_pair(part, model_label)
            if hit is None:
                return None
            fresh.append((part, hit))
        pair, flag = hit
        if flag is not None:
            if not flag:
                model = pair[1]
            else:
                bad = flag if bad is None else "le quantile"  # both (a duplicate name is rejected below)
        out.append(pair)
    n = len(out)
    if n > 1 and (out[0][0] == out[1][0] if n == 2 else len(dict(out)) != n):
        return None
    return tuple(out), model, bad


def long_block_limit_error(raw: str, limits: EngineLimits) -> tuple[str, str] | None:
    """:func:`~inferwatch.agent.node.engine.limits.label_limit_error` of a plain label block, read in place.

    For a block longer than a limit: a value of megabytes is refused before any copy of it is made.
    None: within the limits, or not a plain ASCII block without duplicate names (the caller's full
    path judges it, as it would without this look)."""
    if "\\" in raw or not raw.isascii():
        return None
    n = len(raw)
    i = total = 0
    names: set[str] = set()
    broken: tuple[str, str] | None = None
    while i < n:
        eq = raw.find('="', i)
        if eq == -1 or LABEL_NAME.fullmatch(raw, i, eq) is None:
            return None
        end = raw.find('"', eq + 2)
        if end == -1:
            return None
        name = raw[i:eq]
        if name in names or name == "__name__":
            return None  # a parse error, reported as such
        names.add(name)
        size = end - eq - 2
        if broken is None and size > limits.max_label_value_bytes:
            broken = (
                "label_value_length_limit",
                (f"label {name[:40]!r} value is {size} bytes, over the {limits.max_label_value_bytes}-byte limit"),
            )
        total += size + len(name)
        i = end + 1
        if i < n:
            if raw[i] != ",":
                return None
            i += 1
    if broken is None and total > limits.max_label_bytes:
        broken = (
            "label_bytes_limit",
            (f"labels of one series are {total} bytes, over the {limits.max_label_bytes}-byte limit"),
        )
    return broken


MAX_BOUND_TEXTS = 4096  # le/quantile texts remembered per reader (bucket bounds repeat in every series)


def bad_bound(labels: Labels, bounds: dict[str, bool]) -> str | None:
    """Which of ``le`` and ``quantile`` is not a number: ``"le"``, ``"quantile"``, ``"le quantile"`` (both), else
    None (see :func:`bound_error`); ``bounds``: texts seen → a number."""
    bad = None
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
                bad = k if bad is None else "le quantile"
    return bad


def bound_error(bad: str, typ: str | None) -> str | None:
    """The label whose bad bound breaks a sample of a histogram (``le``) or a summary (``quantile``), else None."""
    want = "quantile" if typ == "summary" else "le"
    return want if want in bad.split() else None
