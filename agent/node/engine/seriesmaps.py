"""The bulk steps of the engine adapters' read (adapters.py), compiled when the extension is built.

The adapters key each sample by ``(model, other labels sorted, le text's bound or None)`` (``adapters.KeyCache``,
memoised by the identity of the reader's label tuples: ``id(labels) → key``). The steps here take a whole family at
once: :func:`memoise` splits the label tuples not memoised yet and memoises their keys, :func:`bucket_tuples` makes
a histogram family's ``_bucket`` samples into each series' buckets as a
:class:`~inferwatch.agent.node.engine.histogram.Histogram` holds them, :func:`totals` a ``_sum`` or ``_count`` family
into one value per series. Each is defined here in pure Python; ``_fastparse`` (``_fastparse.c``, beside the
reader's bulk steps) computes the same answers in one C loop, selected as
:mod:`~inferwatch.agent.node.engine.bulkparse` selects the reader's (:data:`COMPILED`, ``INFERWATCH_PURE_PARSER``);
``tests/test_seriesmaps.py`` holds the two equal. The adapters run the steps only where they are compiled: in pure
Python their definitions are no faster than reading each family sample by sample, which the adapters do then.

:func:`bucket_tuples` and :func:`totals` answer only the common case and say None for everything else, where the
adapter reads the family sample by sample (adapters.py's ``_bucket_maps_by_sample`` and ``_totals_by_sample``, which
the tests hold these equal to): a label tuple not memoised, or memoised as left out by the label filter (None), a
bucket without a bound, a value below zero or a NaN first, a negative zero (the per-sample read adds each value to
0.0, which makes it +0.0), a series whose samples are not consecutive, a series twice (``_sum``, ``_count``), or a
series' bounds not in ascending order (or one twice).
"""

from __future__ import annotations

import math
from array import array
from collections.abc import Callable, Collection, Sequence
from itertools import groupby, islice
from operator import itemgetter, lt
from typing import Any

from inferwatch.agent.node.engine.bulkparse import compiled_module
from inferwatch.agent.node.engine.textformat import Labels

STEPS = ("memoise", "bucket_tuples", "totals")  # each has its pure-Python definition here as NAME_py

Key = tuple[str, Labels, "float | None"]  # (model, other labels sorted, le bound or None)
SeriesKey = tuple[str, Labels]  # (model, other labels sorted)
Split = tuple[str, Labels, "str | None"]  # a Key with the le text, not parsed yet
Memo = dict[int, "Key | None"]
Buckets = tuple[tuple[float, float], ...]  # a histogram's ((upper bound, cumulative count), ...), +Inf last

_SERIES, _BOUND = itemgetter(0, 1), itemgetter(2)
_NEGATIVE_ZERO = array("d", [-0.0]).tobytes()


def split_one(labels: Labels, order: Sequence[str], skip: Collection[str], same: dict[Any, Any], default: str) -> Split:
    """One label tuple's (model, the other labels sorted, le text or None): the model is the value of the first of
    ``order``'s labels present (``default`` when none is), the pairs named in ``skip`` are left out; the model and
    the other labels are interned in ``same`` (one object per value)."""
    model = None
    rank = len(order)
    le = None
    rest = []
    for pair in labels:  # the reader's pair tuples are kept as they are (shared, not copied)
        name = pair[0]
        if name == "le":
            le = pair[1]
        elif name in order:
            at = order.index(name)
            if at < rank:
                model, rank = pair[1], at
        elif name not in skip:
            rest.append(pair)
    if len(rest) > 1:
        rest.sort()
    others = tuple(rest)
    return (same.setdefault(model, model) if model is not None else default), same.setdefault(others, others), le


def memoise_py(
    labels: list[Labels],
    memo: Memo,
    alive: list[Labels],
    order: tuple[str, ...],
    skip: frozenset[str],
    same: dict[Any, Any],
    default: str,
    bounds: dict[str, float],
    bound_of: Callable[[str], float | None],
) -> int:
    """Memoise the key of each label tuple of ``labels`` whose ``id`` is not a key of ``memo`` yet, in order
    (:func:`split_one`; its le text's bound from ``bounds``, else ``bound_of``, which enters it there), each memoised
    tuple appended to ``alive``; a tuple whose le ``bound_of`` says None of (no number) is left out. Returns how many
    were memoised."""
    entered = 0
    for one in labels:
        if id(one) in memo:
            continue
        model, others, le = split_one(one, order, skip, same, default)
        bound = None
        if le is not None:
            bound = bounds.get(le)
            if bound is None:
                bound = bound_of(le)
                if bound is None:
                    continue
        memo[id(one)] = (model, others, bound)
        alive.append(one)
        entered += 1
    return entered


def _plain(values: array[float]) -> bool:
    """No value below zero, none a negative zero, and the first no NaN (``min`` then skips the later ones, which
    compare false, and finds any value below zero)."""
    if not values:
        return True
    if not min(values) >= 0:
        return False
    raw = values.tobytes()
    at = raw.find(_NEGATIVE_ZERO)
    while at >= 0 and at % values.itemsize:  # the pattern across two values: look on
        at = raw.find(_NEGATIVE_ZERO, at + 1)
    return at < 0


def _keys(labels: list[Labels], values: array[float], memo: Memo) -> tuple[list[Key], list[SeriesKey]] | None:
    """The family's keys and series keys when its values are plain and every label tuple is memoised as taken, else
    None."""
    if len(labels) != len(values):
        raise ValueError("a family's label tuples and values differ in length")
    if not _plain(values):
        return None
    found = list(map(memo.get, map(id, labels)))
    try:
        return found, list(map(_SERIES, found))  # type: ignore[return-value,arg-type]
    except TypeError:  # a None among them: not memoised, or left out by the label filter
        return None


def bucket_tuples_py(labels: list[Labels], values: array[float], memo: Memo) -> dict[SeriesKey, Buckets] | None:
    """A ``_bucket`` family's label tuples and values as each series' ``((bound, count), ...)`` in the order of the
    bounds, the series in the order they come, those without a ``+Inf`` bound left out (no usable histogram:
    Prometheus would return NaN); None where the caller must read sample by sample (see the module docstring)."""
    got = _keys(labels, values, memo)
    if got is None:
        return None
    found, series = got
    bounds = list(map(_BOUND, found))
    if set(map(type, bounds)) - {float}:
        return None  # a bucket without a bound
    out: dict[SeriesKey, Buckets] = {}
    seen: set[SeriesKey] = set()
    start = 0
    for one, run in groupby(series):
        end = start + len(list(run))
        ascending = bounds[start:end]
        if one in seen or not all(map(lt, ascending, islice(ascending, 1, None))):
            return None  # the series' samples apart, or its bounds not in ascending order (or one twice)
        seen.add(one)
        if ascending[-1] == math.inf:
            out[one] = tuple(zip(ascending, values[start:end], strict=True))
        start = end
    return out


def totals_py(labels: list[Labels], values: array[float], memo: Memo) -> dict[SeriesKey, float] | None:
    """A ``_sum`` or ``_count`` family's label tuples and values as one value per series, in order; None where the
    caller must read sample by sample (see the module docstring)."""
    got = _keys(labels, values, memo)
    if got is None:
        return None
    series = got[1]
    out = dict(zip(series, values, strict=True))
    return out if len(out) == len(series) else None


_EXT = compiled_module()
COMPILED = _EXT is not None  # the compiled steps run (see the module's docstring)
memoise: Callable[..., int] = memoise_py if _EXT is None else _EXT.memoise
bucket_tuples: Callable[[list[Labels], array[float], Memo], dict[SeriesKey, Buckets] | None] = (
    bucket_tuples_py if _EXT is None else _EXT.bucket_tuples
)
totals: Callable[[list[Labels], array[float], Memo], dict[SeriesKey, float] | None] = (
    totals_py if _EXT is None else _EXT.totals
)
