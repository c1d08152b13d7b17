"""The adapters' bulk steps (seriesmaps.py): compiled against pure Python, bulk against sample by sample.

Each step of ``_fastparse`` must give exactly what its pure-Python definition gives (generated families: label tuples
memoised or not, keys left out, series apart, bounds out of order or twice, values below zero, NaN, negative zeros),
each bulk answer must be what the per-sample read (adapters.py's ``_bucket_maps_by_sample``, ``_totals_by_sample``)
gives where the bulk step answers, and the adapter's reading must be the same with the bulk steps (either), and with
none (every family sample by sample), on the engine corpus, the large vLLM body and hostile edits.
"""

from __future__ import annotations

import math
import os
import subprocess
from array import array
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from inferwatch.agent.errors import SourceFormatError
from inferwatch.agent.node.engine import adapters, bulkparse, seriesmaps
from inferwatch.agent.node.engine.adapters import ADAPTERS, VLLM, KeyCache, Source, detect, read
from inferwatch.agent.node.engine.exposition import Series
from inferwatch.agent.node.engine.histogram import Histogram
from inferwatch.agent.node.engine.limits import EngineLimits
from tests.conftest import PYTHON, ROOT
from tests.engine_expo import big_exposition
from tests.test_bulkparse import extension
from tests.test_exposition_whole import BASE, CORPUS, HOSTILE


@pytest.fixture
def ext() -> Any:
    return extension()


def canon(result: Any) -> Any:
    """An answer with every float as its repr (NaN equals NaN, -0.0 differs from 0.0)."""
    if isinstance(result, float):
        return repr(result)
    if isinstance(result, Histogram):
        return canon((result.buckets, result.sum, result.count))
    if isinstance(result, tuple | list):
        return type(result)(map(canon, result))
    if isinstance(result, dict):
        return [(canon(k), canon(v)) for k, v in result.items()]  # in order
    return result


# --- generated families: label tuples (distinct objects), what the memo holds for each, values ----------------------

MODELS = st.sampled_from(["m1", "m2"])
OTHERS = st.sampled_from([(), (("engine", "0"),), (("engine", "1"),)])
BOUNDS = st.sampled_from([0.1, 1.0, 5.0, math.inf])
ODD_BOUNDS = st.sampled_from([None, math.nan, -0.0, 0.0, 1, -math.inf])
VALUES = st.floats(min_value=0, max_value=1e6)  # +0.0 included, -0.0 not
ODD_VALUES = st.sampled_from([-0.0, -1.0, math.nan, math.inf, -math.inf])


@st.composite
def families(draw: st.DrawFn) -> tuple[list[Any], array[float], dict[int, Any], list[Any]]:
    """(label tuples, values, memo, the tuples kept alive): series of ascending bounds, then edits that break the
    common case now and then (an entry forgotten or None, a bound out of order, twice or odd, a series apart, a value
    below zero, a negative zero, a NaN)."""
    rows: list[tuple[Any, Any]] = []
    for model, others in draw(st.lists(st.tuples(MODELS, OTHERS), unique=True, max_size=4)):
        bounds = sorted(draw(st.sets(BOUNDS, min_size=1, max_size=4)))
        rows += [((model, others, b), None) for b in bounds]
    edits = draw(st.lists(st.integers(0, 14), max_size=2))  # 5 and above: none
    for edit in edits:
        if not rows:
            break
        at = draw(st.integers(0, len(rows) - 1))
        key = rows[at][0]
        if key is None:
            continue
        if edit == 0:
            rows[at] = (None, None)  # left out by the label filter
        elif edit == 1:
            rows[at] = (key, "forget")  # not memoised
        elif edit == 2:
            rows[at] = ((key[0], key[1], draw(ODD_BOUNDS)), None)
        elif edit == 3:
            rows.insert(draw(st.integers(0, len(rows))), rows[at])  # a sample twice, anywhere
        elif edit == 4:
            rows.append(rows[at])
    values = array("d", [draw(VALUES) for _ in rows])
    if rows and draw(st.integers(0, 3)) == 0:
        values[draw(st.integers(0, len(rows) - 1))] = draw(ODD_VALUES)
    labels: list[Any] = []
    memo: dict[int, Any] = {}
    shared: dict[Any, Any] = {}
    for key, how in rows:
        one = shared.setdefault(key, (("k", str(len(shared))),)) if draw(st.booleans()) else (("k", str(len(labels))),)
        labels.append(one)
        if how != "forget":
            memo[id(one)] = key
    return labels, values, memo, labels


FAMILY = families()


@settings(max_examples=400, deadline=None)
@given(FAMILY)
def test_bucket_tuples_and_totals_are_the_pure_steps(family: Any) -> None:
    ext = extension()
    labels, values, memo, _alive = family
    for step in ("bucket_tuples", "totals"):
        assert canon(getattr(ext, step)(labels, values, memo)) == canon(
            getattr(seriesmaps, f"{step}_py")(labels, values, memo)
        ), step


def by_sample(step: str, labels: list[Any], values: array[float], memo: dict[int, Any]) -> Any:
    """What the per-sample read gives for the family (the memo's keys, as a KeyCache holds them)."""
    keys = KeyCache(("model_name",), "unknown")
    keys._memo[()] = memo
    series = Series(zip(labels, values, strict=True))
    src = Source("f")
    if step == "bucket_tuples":
        maps = adapters._bucket_maps_by_sample(src, series, keys)
        return {k: tuple(sorted(b.items())) for k, b in maps.items() if math.inf in b}
    return adapters._totals_by_sample(src, series, "_count", 1.0, keys)


@settings(max_examples=400, deadline=None)
@given(FAMILY)
def test_each_bulk_answer_is_the_per_sample_reads(family: Any) -> None:
    labels, values, memo, _alive = family
    for step in ("bucket_tuples", "totals"):
        got = getattr(seriesmaps, f"{step}_py")(labels, values, memo)
        if got is not None:
            assert canon(got) == canon(by_sample(step, labels, values, memo)), step


def test_the_common_case_is_taken_in_bulk() -> None:
    """A conforming family gets an answer (not None) from either step: the bulk path is the one taken."""
    labels = [(("le", str(i)),) for i in range(3)]
    memo = {id(one): ("m", (), b) for one, b in zip(labels, (0.5, 1.0, math.inf), strict=True)}
    values = array("d", [1.0, 2.0, 2.0])
    want = {("m", ()): ((0.5, 1.0), (1.0, 2.0), (math.inf, 2.0))}
    assert seriesmaps.bucket_tuples_py(labels, values, memo) == want
    assert seriesmaps.bucket_tuples(labels, values, memo) == want


PAIRS = st.sampled_from(
    [("model_name", "a"), ("model_name", "b"), ("name", "n"), ("le", "1"), ("le", "+Inf"), ("engine", "0"),
     ("engine", "1"), ("source", "x"), ("z", "")]
)  # fmt: skip


@settings(max_examples=300, deadline=None)
@given(
    st.lists(st.lists(PAIRS, max_size=5).map(tuple), max_size=8),
    st.sampled_from([(), ("model_name",), ("model_name", "name"), ("name", "model_name")]),
    st.sampled_from([frozenset(), frozenset({"source"}), frozenset({"engine", "z"})]),
    st.sampled_from([{}, {"1": 1.0}, {"1": 1.0, "+Inf": math.inf}]),
    st.integers(0, 3),
)
def test_memoise_is_the_pure_step(
    labels: list[Any], order: tuple[str, ...], skip: frozenset[str], bounds: dict[str, float], known: int
) -> None:
    """The same keys memoised (the same interned objects), the same tuples kept alive, the same le texts parsed (an
    le that is no number, "+Inf" here, left out); label tuples already memoised left as they are, one object met
    twice memoised once."""
    ext = extension()
    labels = [tuple(one) for one in labels]
    labels += labels[:2]  # the same objects again
    answers = []
    for step in (ext.memoise, seriesmaps.memoise_py):
        memo: dict[int, Any] = {id(one): None for one in labels[:known]}
        alive: list[Any] = []
        same: dict[Any, Any] = {}
        parsed = dict(bounds)
        asked: list[str] = []

        def bound_of(text: str, parsed: dict[str, float] = parsed, asked: list[str] = asked) -> float | None:
            asked.append(text)
            if text == "+Inf":
                return None
            parsed[text] = float(text)
            return parsed[text]

        entered = step(labels, memo, alive, order, skip, same, "unknown", parsed, bound_of)
        for key in memo.values():  # interned: the objects ``same`` holds
            assert key is None or (same.get(key[1]) is key[1] and (key[0] == "unknown" or same[key[0]] is key[0]))
        assert entered == len(alive)
        answers.append((canon(memo), [id(one) for one in alive], list(same.items()), asked, parsed))
    assert answers[0] == answers[1]


def test_steps_refuse_what_they_do_not_take(ext: Any) -> None:
    with pytest.raises(ValueError, match="differ in length"):
        ext.bucket_tuples([()], array("d"), {})
    with pytest.raises(ValueError, match="differ in length"):
        seriesmaps.totals_py([()], array("d"), {})
    with pytest.raises(TypeError):
        ext.totals([()], [1.0], {})  # no buffer of doubles
    with pytest.raises(TypeError):
        ext.memoise([(("a",),)], {}, [], (), frozenset(), {}, "u", {}, float)  # a pair of one
    one = (("a", "b"),)
    with pytest.raises(TypeError):
        ext.bucket_tuples([one], array("d", [1.0]), {id(one): ("m", ())})  # a memo entry not a key


# --- the adapter's reading, with the bulk steps and without --------------------------------------------------------


@pytest.fixture
def steps() -> Iterator[Callable[[str], None]]:
    """Switch the adapters' bulk steps: "compiled", "pure" (their pure-Python definitions), or "none" (each family
    sample by sample, as without the extension)."""
    saved = {name: getattr(adapters, name) for name in seriesmaps.STEPS}

    def use(which: str) -> None:
        for name in seriesmaps.STEPS:
            if which == "compiled":
                setattr(adapters, name, getattr(extension(), name))
            else:
                setattr(adapters, name, getattr(seriesmaps, f"{name}_py") if which == "pure" else None)

    yield use
    for name, step in saved.items():
        setattr(adapters, name, step)


def reading(text: str, kind: str | None = None) -> Any:
    """The adapter's reading of ``text``, cold then warm (the same reader and keys), as comparable values."""
    adapter = ADAPTERS[kind or detect(text) or "vllm"]
    reader, keys = adapter.reader(EngineLimits()), KeyCache(adapter.model_labels, "unknown")
    out = []
    for _ in range(2):
        try:
            r = read(adapter, reader.read(text), keys=keys)
        except SourceFormatError as exc:
            out.append(("error", type(exc).__name__, str(exc)))
            continue
        models = {
            name: (m.histograms, m.gauges, m.counters, m.sources, m.ranks, m.lora) for name, m in r.models.items()
        }
        out.append(canon((list(models), models, r.series, r.models_dropped, r.recognition)))
    return out


def three_ways(text: str, steps: Callable[[str], None], kind: str | None = None) -> None:
    steps("none")
    want = reading(text, kind)
    steps("pure")
    assert reading(text, kind) == want, text[:300]
    steps("compiled")
    assert reading(text, kind) == want, text[:300]


@pytest.mark.parametrize("path", CORPUS, ids=[p.name for p in CORPUS])
def test_the_engine_corpus_maps_the_same_in_bulk(path: Path, steps: Callable[[str], None]) -> None:
    three_ways(path.read_text(), steps)


def test_a_large_body_maps_the_same_in_bulk(steps: Callable[[str], None]) -> None:
    text, _gen = big_exposition(4_000)
    three_ways(text, steps, "vllm")


@pytest.mark.parametrize("edit", sorted(HOSTILE))
def test_hostile_edits_map_the_same_in_bulk(edit: str, steps: Callable[[str], None]) -> None:
    old, new = HOSTILE[edit]
    three_ways(BASE.replace(old, new, 1), steps, "vllm")


@pytest.mark.parametrize(
    "edit",
    [
        ('le="+Inf",model_name="m1"} 2.0', 'le="+Inf",model_name="m1"} -0.0'),  # a negative zero
        ('le="+Inf"', 'le="0.5"'),  # a series without +Inf
        ('engine="0",le="+Inf"', 'engine="0",le="+Inf",x="1"'),  # a series of one bucket
    ],
)
def test_edits_the_bulk_steps_refuse_map_the_same(edit: tuple[str, str], steps: Callable[[str], None]) -> None:
    three_ways(BASE.replace(edit[0], edit[1], 1), steps, "vllm")


def test_each_step_is_selected_at_import(ext: Any) -> None:
    """The adapters run the compiled steps where selected, else none (each family sample by sample)."""
    assert seriesmaps.COMPILED == bulkparse.COMPILED
    for name in seriesmaps.STEPS:
        chosen = getattr(seriesmaps, name)
        assert chosen is (getattr(ext, name) if seriesmaps.COMPILED else getattr(seriesmaps, f"{name}_py")), name
        assert getattr(adapters, name) is (chosen if seriesmaps.COMPILED else None), name


def test_the_environment_variable_forces_the_pure_steps(ext: Any) -> None:
    code = (
        "from inferwatch.agent.node.engine import adapters as a, seriesmaps as s; "
        "print(s.COMPILED, s.totals is s.totals_py, a.totals)"
    )
    env = {**os.environ, bulkparse.PURE_ENV: "1"}
    out = subprocess.run([PYTHON, "-c", code], cwd=ROOT, env=env, capture_output=True, text=True, check=True)
    assert out.stdout.split() == ["False", "True", "None"]


def test_a_vllm_reading_takes_every_histogram_in_bulk(steps: Callable[[str], None]) -> None:
    """The large body's histogram families all get a bulk answer (none read sample by sample), with either step."""
    text, _gen = big_exposition(2_000)
    by_sample: list[str] = []
    saved = adapters._bucket_maps_by_sample
    adapters._bucket_maps_by_sample = lambda src, *a: by_sample.append(src.name) or saved(src, *a)  # type: ignore[assignment]
    try:
        for which in ("pure", "compiled"):
            steps(which)
            read(VLLM, VLLM.reader(EngineLimits()).read(text))
    finally:
        adapters._bucket_maps_by_sample = saved
    assert by_sample == []


LE_PAIRS = st.sampled_from([("le", "0.5"), ("le", "+Inf"), ("le", "1e3"), ("le", "x")])  # "x": no number


@settings(max_examples=200, deadline=None)
@given(st.lists(st.lists(st.one_of(PAIRS, LE_PAIRS), max_size=4).map(tuple), max_size=10), st.booleans())
def test_a_bulk_fill_memoises_what_one_by_one_does(labels: list[Any], filtered: bool) -> None:
    """KeyCache.fill enters the keys KeyCache.key enters one by one (the same values, the same interned objects; a
    tuple whose le text is new may come after the others), with the compiled steps and the pure ones, and leaves out
    a label tuple whose le is no number (the per-sample read rejects the reading there, in order)."""
    labels = [tuple(one) for one in labels]  # distinct objects, some equal
    match = (("engine", "0"),) if filtered else ()
    single = KeyCache(("model_name", "name"), "unknown")
    want: dict[int, Any] = {}
    for one in labels:
        try:
            want[id(one)] = single.key(one, match)
        except SourceFormatError:
            assert ("le", "x") in one
    saved = adapters.memoise
    try:
        for step in (seriesmaps.memoise_py, extension().memoise):
            adapters.memoise = step
            bulk = KeyCache(("model_name", "name"), "unknown")
            bulk.fill(labels, match)
            assert sorted(canon(bulk.memo(match))) == sorted(canon(want))  # in any order
            for key in bulk.memo(match).values():
                if key is not None:
                    assert key[1] is bulk._same[key[1]]
            assert not bulk.fill(labels, match) or any(("le", "x") in one for one in labels)
    finally:
        adapters.memoise = saved
