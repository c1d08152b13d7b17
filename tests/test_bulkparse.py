"""The compiled bulk steps (``_fastparse``) against their pure-Python definition (bulkparse.py); the reader with each.

The extension must give exactly what the pure-Python steps give, for every input: step by step on generated and
hostile texts (huge lines, NUL bytes, every string width, escapes, values that are no number), and through the
reader (the engine corpus, the expfmt text cases, the hostile edits of test_exposition_whole, generated bodies):
the same exposition or the same error, and the same caches after. Where a C compiler and the Python headers are
there the extension must have been built (``pip install -e .`` builds it in place); the pure path is forced with
``INFERWATCH_PURE_PARSER=1``.
"""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import sysconfig
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from inferwatch.agent.node.engine import bulkparse, exposition, limits
from inferwatch.agent.node.engine.adapters import VLLM
from inferwatch.agent.node.engine.exposition import Everything, ExpositionReader
from inferwatch.agent.node.engine.labelblock import plain_pair
from inferwatch.agent.node.engine.limits import EngineLimits
from tests import test_exposition_whole as whole
from tests.conftest import PYTHON, ROOT
from tests.engine_expo import big_exposition
from tests.test_exposition_whole import BASE, CORPUS, FIXTURES, HOSTILE, READERS, outcome


def compiler_here() -> bool:
    """A C compiler and the Python headers: what the optional extension's build needs."""
    headers = Path(sysconfig.get_paths()["include"]) / "Python.h"
    return headers.is_file() and any(shutil.which(cc) for cc in ("cc", "gcc", "clang"))


def extension() -> Any:
    try:
        from inferwatch.agent.node.engine import _fastparse  # type: ignore[attr-defined]
    except ImportError:
        if compiler_here():
            pytest.fail("a C compiler and Python.h are here but _fastparse is not built: run pip install -e .")
        pytest.skip("no C compiler or Python headers here: the extension cannot be built")
    return _fastparse


@pytest.fixture
def ext() -> Any:
    return extension()


def canon(result: Any) -> Any:
    """A step's answer with floats as their repr (NaN equals NaN)."""
    if result is None:
        return None
    return [(name, blocks, [repr(v) for v in values]) for name, blocks, values in result]


# --- scan: step by step ------------------------------------------------------------------------------------------

NAME = st.sampled_from(["a", "vllm:x_total", "_b", ":c", "x1", "1x", "a.b", "é", ""])
VALUE = st.sampled_from(
    ["1", "1.0", "-2.5e3", "+Inf", "-Inf", "inf", "Infinity", "NaN", "nan", "+NaN", "-nan", "1e999", "1e-400",
     "0x10", "1_0", "1e", ".", "", "one", "1.", ".5", "+.5e+2", "٣", " 1", "1 2", "\x00", "9" * 400]
)  # fmt: skip
LABELS = st.sampled_from(
    ["", "{}", '{a="x"}', '{a="x",b="y"}', '{a="x",}', '{a="x} 1"}', '{a="\\"q"}', '{a="x\\q"}', '{a="\x00"}',
     '{a="ü"}', '{a="\U0001f600"}', '{a="ꙮ"}', "{a=x}", '{ a="x" }', '{"a.b"="x"}', "{", "}", '{a="' + "v" * 300 + '"}']
)  # fmt: skip
SEP = st.sampled_from([" ", " ", " ", "\t", "  ", ""])
TS = st.sampled_from(["", "", " 17"])
LINE = st.builds(lambda n, lb, s, v, ts: f"{n}{lb}{s}{v}{ts}", NAME, LABELS, SEP, VALUE, TS)
BODY = st.lists(st.one_of(LINE, st.sampled_from(["", "# HELP a x", "\r"])), max_size=12).map("\n".join)


@settings(max_examples=400, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(body=BODY, newline=st.booleans(), cut=st.tuples(st.integers(-3, 400), st.integers(-3, 400)))
def test_scan_is_the_pure_step(body: str, newline: bool, cut: tuple[int, int]) -> None:
    ext = extension()
    text = body + ("\n" if newline else "")
    assert canon(ext.scan(text, 0, len(text))) == canon(bulkparse.scan_py(text, 0, len(text))), text
    start, end = cut
    assert canon(ext.scan(text, start, end)) == canon(bulkparse.scan_py(text, start, end)), (text, cut)


HOSTILE_TEXTS = {
    "a 1 MB value": "a " + "9" * 1_000_000 + "\n",
    "a 1 MB label text": 'a{x="' + "v" * 1_000_000 + '"} 1\n',
    "a 1 MB name": "a" * 1_000_000 + " 1\n",
    "a 1 MB line of blanks": " " * 1_000_000 + "\n",
    "NUL bytes": 'a{x="\x00"} 1\n\x00 1\na \x00\n',
    "a NUL in the value": "a 1\x00\n",
    "latin-1": 'a{x="é"} 1\nb 2\n',
    "two-byte characters": 'a{x="ꙮ"} 1\nb 2\n',
    "four-byte characters": 'a{x="\U0001f600"} 1\nb 2\n',
    "a non-ASCII digit": "a \u0663\n",
    "a lone surrogate": 'a{x="\ud800"} 1\n',
    "malformed escapes": 'a{x="\\"} 1\na{x="\\q"} 2\na{x="\\\\"} 3\n',
    "invalid floats": "a 1e\na .\na 0x10\na 1_0\na --1\na 1e+\n",
    "huge exponents": "a 1e999999999999\na -1e-999999999999\n",
    "signed NaN": "a +nan\n",
    "interleaved families": "a_bucket 1\na_sum 2\na_bucket 3\na_count 4\na_sum 5\n",
    "no newline at the end": "a 1\nb 2",
    "only newlines": "\n\n\n",
    "empty": "",
}


@pytest.mark.parametrize("case", HOSTILE_TEXTS, ids=list(HOSTILE_TEXTS))
def test_scan_on_hostile_text_is_the_pure_step(ext: Any, case: str) -> None:
    text = HOSTILE_TEXTS[case]
    for start, end in ((0, len(text)), (0, len(text) // 2), (2, len(text)), (-5, 10**9), (len(text), 0)):
        assert canon(ext.scan(text, start, end)) == canon(bulkparse.scan_py(text, start, end)), (case, start, end)


def test_scan_refuses_what_is_not_a_string(ext: Any) -> None:
    for args in ((b"a 1\n", 0, 4), ("a 1\n", "0", 4), ("a 1\n",), ("a 1\n", 0, 10**30)):
        with pytest.raises((TypeError, OverflowError)):
            ext.scan(*args)


NUMBER = st.one_of(
    st.floats(allow_nan=False).map(repr),
    st.floats(allow_nan=False, allow_infinity=False).map(lambda f: f"{f:.{abs(hash(f)) % 25}f}"),
    st.from_regex(r"[-+]?[0-9]{0,25}(\.[0-9]{0,25})?([eE][-+]?[0-9]{1,3})?", fullmatch=True),
)


@settings(max_examples=1000, deadline=None)
@given(value=NUMBER)
def test_scan_reads_numbers_as_float_does(value: str) -> None:
    """Values are read as ``float()`` reads them, bit for bit (the extension reads the common ones without strtod)."""
    ext = extension()
    text = f"a {value}\n"
    got = ext.scan(text, 0, len(text))
    assert canon(got) == canon(bulkparse.scan_py(text, 0, len(text)))
    if got is not None:
        assert repr(got[0][2][0]) == repr(float(value)), value


# --- label_sets: step by step --------------------------------------------------------------------------------------

PAIR = st.sampled_from(
    ['a="x"', 'b="y"', 'model_name="m1"', 'model_name="m2"', 'le="0.5"', 'le="+Inf"', 'le="half"', 'quantile="q"',
     'a="z"', '__name__="n"', "1a=\"x\"", 'a=x', 'a="x', "", 'a="é"', 'a="\U0001f600"', 'a="x"y"', 'engine="0"']
)  # fmt: skip
TEXT = st.lists(PAIR, min_size=1, max_size=6).map(",".join) | st.sampled_from(["", '"', 'a="x",', ",", '",'])


@settings(max_examples=400, deadline=None)
@given(texts=st.lists(TEXT, max_size=6, unique=True), known=st.lists(PAIR, max_size=4))
def test_label_sets_is_the_pure_step(texts: list[str], known: list[str]) -> None:
    ext = extension()
    cache = {t: hit for t in known if (hit := plain_pair(t, "model_name")) is not None}
    before = dict(cache)
    a = ext.label_sets(texts, cache, "model_name", plain_pair)
    assert cache == before  # the caller adds the fresh pairs
    b = bulkparse.label_sets_py(texts, cache, "model_name", plain_pair)
    assert a == b, texts
    if a is not None:  # the pairs are the cached tuples themselves, and a sorted form is the set itself when sorted
        for labels, key in zip(a[0], a[1], strict=True):
            for pair in labels:
                assert any(pair is hit[0] for hit in (*cache.values(), *a[3].values()))
            assert (key is labels) == (bulkparse.sorted_labels(labels) is labels)


def test_label_sets_of_texts_that_share_pieces_is_the_pure_step(ext: Any) -> None:
    """Texts of a family repeat most pairs at the same places (the extension reuses the piece before): buckets,
    a wider string between, more pairs than it remembers, a pair moved."""
    many = ",".join(f'l{i}="{i}"' for i in range(40))
    cases = [
        [f'engine="0",le="{le}",model_name="m1"' for le in ("0.1", "0.5", "1.0", "+Inf")],
        ['a="x",b="y"', 'a="ü",b="y"', 'a="x",b="y",c="z"', 'a="\U0001f600",b="y"', 'a="x",b="z"'],
        [many, many.replace('l39="39"', 'l39="x"'), many.replace('l3="3"', 'l3="x"'), many + ',z="1"'],
        ['b="y",a="x"', 'a="x",b="y"', 'a="x",a="y"'],
        ['a="x",model_name="m1"', 'a="x",model_name="m2"', 'model_name="m2",a="x"'],
    ]
    for texts in cases:
        assert ext.label_sets(texts, {}, "model_name", plain_pair) == bulkparse.label_sets_py(
            texts, {}, "model_name", plain_pair
        ), texts


def test_label_sets_passes_on_an_error_of_the_pair_check(ext: Any) -> None:
    def broken(text: str, label: str) -> None:
        raise RuntimeError(text)

    with pytest.raises(RuntimeError):
        ext.label_sets(['a="x"'], {}, "model_name", broken)
    with pytest.raises(TypeError):
        ext.label_sets(['a="x"'], {}, "model_name", lambda t, lb: ("not a pair", None))
    with pytest.raises(TypeError):
        ext.label_sets([b'a="x"'], {}, "model_name", plain_pair)


INFOS = {
    'a="x"': ((("a", "x"),), None, 0, None),
    'a="y",model_name="m1"': ((("a", "y"), ("model_name", "m1")), None, 1, "m1"),
    'le="x",model_name="m2"': ((("le", "x"), ("model_name", "m2")), "le", 2, "m2"),
    "": ((), None, 3, None),
}


@settings(max_examples=200, deadline=None)
@given(blocks=st.lists(st.sampled_from([*INFOS, 'b="z"']), max_size=8))
def test_family_is_the_pure_step(blocks: list[str]) -> None:
    ext = extension()
    assert ext.family(blocks, INFOS) == bulkparse.family_py(blocks, INFOS)
    got = ext.family(blocks, INFOS)
    if got is not None:  # the label sets are the cached tuples themselves
        assert all(a is INFOS[b][0] for a, b in zip(got[0], blocks, strict=True))


def test_family_refuses_what_is_not_a_cache_entry(ext: Any) -> None:
    with pytest.raises(TypeError):
        ext.family(["a"], {"a": ("labels", None)})
    with pytest.raises(TypeError):
        ext.family(("a",), INFOS)
    with pytest.raises(TypeError):
        ext.family([["unhashable"]], INFOS)


# --- the reader with each ------------------------------------------------------------------------------------------


@pytest.fixture
def pure() -> Iterator[Callable[[], None]]:
    """Switch the reader to the pure-Python steps (call it); restored after the test."""
    saved = {name: getattr(exposition, name) for name in bulkparse.STEPS}
    yield lambda: use(None)
    for name, step in saved.items():
        setattr(exposition, name, step)


def use(ext: Any) -> None:
    """The reader's bulk steps from the extension ``ext``, or (None) the pure-Python ones."""
    for name in bulkparse.STEPS:
        setattr(exposition, name, getattr(ext, name) if ext is not None else getattr(bulkparse, f"{name}_py"))


def both(text: str, ext: Any, pure: Callable[[], None]) -> None:
    """Every reader of test_exposition_whole reads ``text`` cold and warm alike with either step, caches included."""
    use(ext)
    compiled = [(make(), make) for make in READERS.values()]
    got = [[outcome(r.read, text) for _ in range(2)] for r, _ in compiled]
    pure()
    for (r, make), seen in zip(compiled, got, strict=True):
        other = make()
        assert [outcome(other.read, text) for _ in range(2)] == seen, text[:300]
        for cache in ("_raw", "_labels", "_canon", "_pairs", "_raw_unkept", "_names"):
            assert getattr(r, cache) == getattr(other, cache), cache


@pytest.mark.parametrize("path", CORPUS, ids=[p.name for p in CORPUS])
def test_the_engine_corpus_reads_the_same_with_either(path: Path, ext: Any, pure: Callable[[], None]) -> None:
    both(path.read_text(), ext, pure)


def test_the_expfmt_text_cases_read_the_same_with_either(ext: Any, pure: Callable[[], None]) -> None:
    cases = json.loads((FIXTURES / "expfmt" / "manifest.json").read_text())["cases"]
    texts = [
        (FIXTURES / "expfmt" / c["file"]).read_bytes().decode("utf-8", errors="replace")
        for c in cases
        if c.get("format") == "text"
    ]
    assert len(texts) > 20
    for text in texts:
        both(text, ext, pure)


@pytest.mark.parametrize("edit", HOSTILE, ids=list(HOSTILE))
def test_hostile_edits_read_the_same_with_either(edit: str, ext: Any, pure: Callable[[], None]) -> None:
    old, new = HOSTILE[edit]
    both(BASE.replace(old, new, 1), ext, pure)


def test_a_large_body_reads_the_same_with_either(ext: Any, pure: Callable[[], None]) -> None:
    text, _ = big_exposition(6_000)
    both(text, ext, pure)
    at = text.index("vllm:generation_tokens_total{")
    line = text[at : text.index("\n", at) + 1]
    both(text.replace(line, line + line, 1), ext, pure)


GENERATED_PAIRS = ['engine="0"', 'engine="1"', 'model_name="m1"', 'model_name="m2"', 'le="0.5"', 'le="+Inf"', 'a="x"']
GENERATED = st.lists(
    st.tuples(
        st.sampled_from(["vllm:num_requests_running", "vllm:prompt_tokens_total", "vllm:x_bucket", "other"]),
        st.lists(st.sampled_from(GENERATED_PAIRS), max_size=4),
        st.sampled_from(["1", "2.5", "-1", "NaN", "+Inf", "0"]),
    ),
    max_size=20,
)


@settings(max_examples=150, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(rows=GENERATED, typed=st.booleans())
def test_generated_expositions_read_the_same_with_either(
    rows: list[tuple[str, list[str], str]], typed: bool, pure: Callable[[], None]
) -> None:
    ext = extension()
    head = "# TYPE vllm:prompt_tokens_total counter\n# TYPE vllm:x histogram\n" if typed else ""
    text = head + "".join(f"{n}{{{','.join(lb)}}} {v}\n" if lb else f"{n} {v}\n" for n, lb, v in rows)
    both(text, ext, pure)


def test_a_conforming_body_takes_the_compiled_step(ext: Any) -> None:
    """The reader reads a vLLM body through the extension when it is built (the selection at import)."""
    forced = os.environ.get(bulkparse.PURE_ENV, "") not in ("", "0")
    assert bulkparse.COMPILED is not forced
    text, _ = big_exposition(2_000)
    calls = []
    saved = exposition.scan
    exposition.scan = lambda *a: calls.append(1) or ext.scan(*a)  # type: ignore[assignment]
    try:
        reader = VLLM.reader(EngineLimits())
        assert reader._read_whole(reader.begin(), text) and calls
    finally:
        exposition.scan = saved
    assert ExpositionReader(("",), Everything()).read(text).matched > 2_000


@pytest.mark.parametrize(("value", "compiled"), [("1", False), ("yes", False), ("0", True), ("", True)])
def test_the_environment_variable_forces_the_pure_steps(ext: Any, value: str, compiled: bool) -> None:
    code = "from inferwatch.agent.node.engine import bulkparse as b; print(b.COMPILED, b.scan is b.scan_py)"
    env = {**os.environ, bulkparse.PURE_ENV: value}
    out = subprocess.run([PYTHON, "-c", code], cwd=ROOT, env=env, capture_output=True, text=True, check=True)
    assert out.stdout.split() == [str(compiled), str(not compiled)]


# --- the streamed read: chunks in bulk where they can be -----------------------------------------------------------


def chunked(reader: ExpositionReader, size: int) -> Callable[[str], Any]:
    """Read a body as the collector's stream does (scrape.ExpositionStream): its complete lines chunk by chunk through
    ``feed_text``; the lines and the last line's number counted as ``read`` counts them (the stream knows no end)."""

    def read(text: str) -> Any:
        last = text[text.rfind("\n") + 1 :]
        if last.strip(" \t"):
            return reader.read(text)  # the same error (the stream words its own)
        p = reader.begin()
        p.last_lineno = text.count("\n") + 1
        carry = ""
        for i in range(0, len(text), size):
            piece = carry + text[i : i + size]
            cut = piece.rfind("\n") + 1
            carry = piece[cut:]
            if cut:
                reader.feed_text(p, piece[:cut])
        reader.feed(p, [carry])
        return reader.end(p)

    return read


def stream_same(text: str, sizes: tuple[int, ...] = (64, 700, 1 << 16)) -> None:
    """Every reader of test_exposition_whole reads ``text`` in chunks as it reads it whole, cold and warm."""
    for make in READERS.values():
        for size in sizes:
            whole, streamed = make(), make()
            for _ in range(2):
                assert outcome(chunked(streamed, size), text) == outcome(whole.read, text), (size, text[:300])


@pytest.mark.parametrize("path", CORPUS, ids=[p.name for p in CORPUS])
def test_the_engine_corpus_streams_as_it_reads(path: Path) -> None:
    stream_same(path.read_text())


@pytest.mark.parametrize("edit", HOSTILE, ids=list(HOSTILE))
def test_hostile_edits_stream_as_they_read(edit: str) -> None:
    old, new = HOSTILE[edit]
    stream_same(BASE.replace(old, new, 1), sizes=(16, 64, 200, 1 << 16))


SPLIT = {  # a problem whose lines fall in different chunks
    "duplicate wanted": 'vllm:num_requests_running{engine="0",model_name="m1"} 7\n',
    "duplicate not wanted": 'other_gauge{a="x"} 5\n',
    "duplicate not wanted, no labels": "other_plain 5\n",
    "TYPE after samples": "# TYPE other_gauge gauge\n",
    "HELP twice": "# HELP vllm:num_requests_running again\n",
    "negative counter": 'vllm:prompt_tokens_total{engine="0",model_name="m9"} -1\n',
    "third model": 'vllm:num_requests_running{engine="0",model_name="m3"} 1\n',
    "a line of another shape": 'other_gauge{a="q"} 1 17\n',
}


@pytest.mark.parametrize("case", SPLIT, ids=list(SPLIT))
def test_problems_across_chunks_stream_as_they_read(case: str) -> None:
    text = BASE + BASE.replace("# ", "#x ").replace("vllm:", "vllmx:").replace("other_", "otherx_") + SPLIT[case]
    stream_same(text, sizes=(40, 300, 900))
    stream_same(SPLIT[case] + text, sizes=(40, 300, 900))


def test_a_large_body_streams_in_bulk() -> None:
    """The chunks of a conforming body are read in bulk (none line by line), with the reading of a whole read."""
    text, _ = big_exposition(6_000)
    reader = VLLM.reader(EngineLimits())
    lines: list[int] = []
    feed = reader.feed
    reader.feed = lambda p, ls: lines.append(len(ls)) or feed(p, ls)  # type: ignore[method-assign]
    for _ in range(2):
        assert outcome(chunked(reader, 1 << 16), text) == outcome(VLLM.reader(EngineLimits()).read, text)
    assert lines == [1, 1], lines  # only the empty line after the last newline
    edited = text.replace("} 1.0\n", "}  1.0\n", 1)  # two blanks: that chunk goes line by line, the others in bulk
    assert outcome(chunked(reader, 1 << 16), edited) == outcome(VLLM.reader(EngineLimits()).read, edited)


@settings(max_examples=200, deadline=None)
@given(keys=st.lists(st.sampled_from([(), (("a", "x"),), (("a", "y"),), (("a", "x"), ("b", "y"))]), max_size=8))
def test_canon_ids_is_the_pure_step(keys: list[tuple[tuple[str, str], ...]]) -> None:
    ext = extension()
    for start in ({}, {(("a", "y"),): 0}, {(("b", "z"),): 0, (("a", "x"),): 1}):
        a, b = dict(start), dict(start)
        assert ext.canon_ids(keys, a) == bulkparse.canon_ids_py(keys, b)
        assert list(a.items()) == list(b.items())  # the same ids, entered in the same order
    with pytest.raises(TypeError):
        ext.canon_ids([["unhashable"]], {})


def test_each_step_is_selected_at_import(ext: Any) -> None:
    """Every step the reader calls is the extension's where it is selected, else its pure-Python definition."""
    for name in bulkparse.STEPS:
        chosen = getattr(bulkparse, name)
        assert chosen is (getattr(ext, name) if bulkparse.COMPILED else getattr(bulkparse, f"{name}_py")), name
        assert getattr(exposition, name) is chosen, name


def test_the_pure_steps_make_no_python_call_per_line(pure: Callable[[], None]) -> None:
    """test_exposition_whole's operation count (Python-level calls flat in the lines of a warm read) with the
    pure-Python steps, whichever were selected at import: without the extension the reader is still bulk."""
    pure()
    assert exposition.scan is bulkparse.scan_py
    whole.test_operations_of_a_read_grow_with_families_and_label_texts_not_lines()


@settings(max_examples=400, deadline=None)
@given(
    chunk=st.lists(
        st.sampled_from([b"\n", b"\n\n", b"#", b"a", b'{x="1"}', b" 1", b"\n#", b"\r", b"\x00"]), max_size=40
    ),
    after=st.booleans(),
)
def test_sample_lines_is_the_pure_step(chunk: list[bytes], after: bool) -> None:
    """The fetch's sample-line count per chunk (engine.max_series): compiled, the same as bytes.count's four searches
    (runs of newlines included), for bytes and bytearray; selected at import as the other steps are."""
    ext = extension()
    data = b"".join(chunk)
    assert ext.sample_lines(data, after) == limits.sample_lines_py(data, after)
    assert ext.sample_lines(bytearray(data), after) == limits.sample_lines_py(bytearray(data), after)
    assert limits.sample_lines is (ext.sample_lines if bulkparse.COMPILED else limits.sample_lines_py)
    with pytest.raises(TypeError):
        ext.sample_lines("text", after)


def test_the_fetch_counts_a_body_in_chunks_as_it_counts_it_whole() -> None:
    """SampleLineCounter (the step selected at import) over a body cut anywhere gives the whole body's count."""
    from inferwatch.agent.node.engine.limits import SampleLineCounter, count_sample_lines

    text, _ = big_exposition(2_000)
    data = text.encode()
    for size in (1, 7, 100, 4096, 1 << 16, len(data)):
        counter = SampleLineCounter()
        for i in range(0, len(data), size):
            counter.feed(data[i : i + size])
        assert counter.samples == count_sample_lines(text), size
