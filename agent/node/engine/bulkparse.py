"""The bulk steps of a whole-body read (exposition.py's ``_read_whole``), compiled when the extension is built.

The steps that do per-line work for the sample lines of a text-format body: :func:`scan` (the sample lines of
the common shape, grouped into families, with their values), :func:`family` (a family's label texts looked up
in the reader's cache) and, on a cold read, :func:`label_sets` (label texts new to the reader split into label
sets) and :func:`canon_ids` (their canonical ids). Each is defined here in pure Python; ``_fastparse``
(``_fastparse.c`` beside this file, built by ``pip install`` where a C compiler and the Python headers are
there) computes the same answers in one C loop. :data:`COMPILED` says which one runs: the extension when it
imports, unless the environment variable ``INFERWATCH_PURE_PARSER`` is set to anything but ``""`` or ``0``
(then the pure-Python steps run; the tests run both). Either way the reader's result is the same:
``tests/test_bulkparse.py`` holds the two equal on generated, recorded and hostile inputs.
"""

from __future__ import annotations

import re
from collections.abc import Callable
from itertools import chain, count, filterfalse, groupby, islice, repeat
from operator import itemgetter
from typing import Any, cast

from inferwatch.agent.node.engine.compiled import PURE_ENV as PURE_ENV  # where the tests look for it
from inferwatch.agent.node.engine.compiled import compiled_module
from inferwatch.agent.node.engine.labelblock import Pair
from inferwatch.agent.node.engine.textformat import Labels

STEPS = ("scan", "family", "label_sets", "canon_ids")  # each has its pure-Python definition here as NAME_py

# A whole sample line of the common shape: a metric name valid unquoted, a label block or none, one space, a value
# of the characters a number may hold (``float`` judges it). A line of any other shape (a timestamp, blanks, a
# quoted name) leaves the body to the line-by-line read.
PLAIN_LINE = re.compile(r"^([a-zA-Z_:][a-zA-Z0-9_:]*)(?:\{([^\n]*)\})? ([-+.0-9a-zA-Z]+)$", re.M)

Family = tuple[str, list[str], list[float]]  # (name, label texts: "" for none, values), lines in order
Info = tuple[Labels, "str | None", int, "str | None"]  # a label text's entry: (labels, bad bound, canonical id, model)
FamilySets = tuple[list[Labels], set[int], set["str | None"], set["str | None"]]
LabelSets = tuple[list[Labels], list[Labels], list["str | None"], dict[str, Pair]]
_PAIR, _FLAG, _LAST = itemgetter(0), itemgetter(1), itemgetter(-1)
_LABELS, _BAD, _CANON, _MODEL = (itemgetter(i) for i in range(4))  # the fields of an Info
_ALL_BUT_LAST = itemgetter(slice(0, -1))


def sorted_labels(labels: Labels) -> Labels:
    """The pairs in name order (the label set's one form): ``labels`` itself when already so (the common case).

    A tuple, not a frozenset: the garbage collector stops tracking a tuple of strings, never a frozenset.
    """
    n = len(labels)
    if n < 2 or (n == 2 and labels[0] < labels[1]) or (n == 3 and labels[0] < labels[1] < labels[2]):
        return labels
    return tuple(sorted(labels))


def scan_py(text: str, start: int, end: int) -> list[Family] | None:
    """The sample lines of ``text[start:end]`` (no comment line among them) as families, in the order each first
    comes, each with its lines' label texts and values in order; None when a line is not of the :data:`PLAIN_LINE`
    shape or its value is no number as ``float`` reads it (or a NaN with a sign)."""
    rows = PLAIN_LINE.findall(text, start, end)
    start, end = min(max(start, 0), len(text)), min(max(end, 0), len(text))  # as re clamps pos and endpos
    lines = text.count("\n", start, end) + (end > start and text[end - 1] != "\n")
    if len(rows) != lines:
        return None
    if not rows:
        return []
    names, blocks, values = zip(*rows, strict=True)  # bulk operations only: no Python-level call per line
    try:
        floats = list(map(float, values))
    except ValueError:
        return None
    total = sum(floats)
    if total != total and any(f != f and v[0] in "+-" for v, f in zip(values, floats, strict=True)):
        return None  # a NaN with a sign (parse_float's rule)
    first = names[0]
    if names.count(first) == len(names):  # one family: the common chunk
        return [(first, list(blocks), floats)]
    # the families of a histogram or summary, interleaved series by series: each one's lines in order (a stable
    # sort), the families in the order they come
    order = sorted(range(len(names)), key=names.__getitem__)
    at = {name: list(group) for name, group in groupby(order, names.__getitem__)}
    return [
        (name, list(map(blocks.__getitem__, at[name])), list(map(floats.__getitem__, at[name])))
        for name in dict.fromkeys(names)
    ]


def label_sets_py(
    texts: list[str], known: dict[str, Pair], label: str, pair_of: Callable[[str, str], Pair | None]
) -> LabelSets | None:
    """Plain label texts (``a="x",b="y"``, no backslash) split into label sets.

    Returns (the sets, each one's :func:`sorted_labels` form, each one's value of ``label`` or None, the pair texts
    met that ``known`` lacks → ``pair_of``'s answer); ``pair_of`` is
    :func:`~inferwatch.agent.node.engine.labelblock.plain_pair`. Each pair is the ``(name, value)`` tuple ``known``
    (or the new entry) holds. None when any text is not such a block (an empty one, a trailing comma, a pair
    ``pair_of`` refuses), has a pair flagged as a bound that is not a number, or a label name twice: the reader then
    reads those texts one by one.
    """
    if not texts:
        return [], [], [], {}
    splits = list(map(str.split, map(str.__add__, texts, repeat(",")), repeat('",')))  # 'a="x",' → ['a="x', '']
    if set(map(_LAST, splits)) != {""}:
        return None
    parts = list(map(_ALL_BUT_LAST, splits))
    lens = list(map(len, parts))
    flat = list(chain.from_iterable(parts))
    fresh: dict[str, Pair] = {}
    for text in set(flat).difference(known):
        hit = pair_of(text, label)
        if hit is None:
            return None
        fresh[text] = hit
    hits: list[Any] = list(map(known.get, flat, map(fresh.get, flat)))
    if not set(map(_FLAG, hits)) <= {None, ""}:
        return None
    pairs = iter(list(map(_PAIR, hits)))
    tuples: list[Labels] = [tuple(islice(pairs, n)) for n in lens]
    dicts = list(map(dict, tuples))
    if list(map(len, dicts)) != lens:
        return None
    return tuples, list(map(sorted_labels, tuples)), list(map(dict.get, dicts, repeat(label))), fresh


def family_py(blocks: list[str], cache: dict[str | None, Info]) -> FamilySets | None:
    """A family's label texts looked up in the reader's cache of :data:`Info` entries: (the label sets in order, the
    set of their canonical ids, of their models, of their bad bounds); None when a text is not cached."""
    infos = list(map(cache.get, blocks))
    if None in infos:
        return None
    return family_of(cast("list[Info]", infos))


def family_of(infos: list[Info]) -> FamilySets:
    """:func:`family_py`'s answer from the entries themselves."""
    return list(map(_LABELS, infos)), set(map(_CANON, infos)), set(map(_MODEL, infos)), set(map(_BAD, infos))


def canon_ids_py(keys: list[Labels], canon: dict[Labels, int]) -> list[int]:
    """Each label set's id in ``canon`` (its :func:`sorted_labels` form → one id); a set new to it is entered with
    the next id (``len(canon)``), in the order the sets first come."""
    canon.update(zip(filterfalse(canon.__contains__, dict.fromkeys(keys)), count(len(canon))))
    return list(map(canon.__getitem__, keys))


_EXT = compiled_module()
COMPILED = _EXT is not None  # the compiled steps run (see the module's docstring)
scan: Callable[[str, int, int], list[Family] | None] = scan_py if _EXT is None else _EXT.scan
family: Callable[[list[str], dict[str | None, Info]], FamilySets | None] = family_py if _EXT is None else _EXT.family
canon_ids: Callable[[list[Labels], dict[Labels, int]], list[int]] = canon_ids_py if _EXT is None else _EXT.canon_ids
label_sets: Callable[[list[str], dict[str, Pair], str, Callable[[str, str], Pair | None]], LabelSets | None] = (
    label_sets_py if _EXT is None else _EXT.label_sets
)
