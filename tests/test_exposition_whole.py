"""The whole-text read (bulk operations over a body) against the line-by-line read, which is the reference.

``ExpositionReader.read`` of a text-format body goes through ``_read_whole`` and gives up to the line-by-line read
(``feed``) on anything it does not take as it is. Both must give the same exposition, or the same error, for every
body: the engine corpus, the expfmt conformance cases, and hostile edits of a conforming body. The operation count
test bounds the Python-level calls per sample of a cold read (a regression check that does not time anything).
"""

from __future__ import annotations

import json
import sys
from collections.abc import Callable
from pathlib import Path

import pytest

from inferwatch.agent.node.engine.adapters import ADAPTERS, VLLM
from inferwatch.agent.node.engine.exposition import Everything, Exposition, ExpositionReader
from inferwatch.agent.node.engine.limits import EngineLimits
from inferwatch.agent.node.engine.textformat import ExpositionError
from tests.engine_expo import big_exposition

FIXTURES = Path(__file__).parent / "fixtures"
CORPUS = sorted((FIXTURES / "engines").glob("*.prom"))


def outcome(read: Callable[[str], Exposition], text: str) -> tuple[object, ...]:
    """What a read gives: the exposition's fields (not its cache generation), or the error's."""
    try:
        e = read(text)
    except ExpositionError as exc:
        return ("error", exc.reason, str(exc), exc.lineno, exc.last)
    samples = {name: [(labels, repr(v)) for labels, v in series] for name, series in e.samples.items()}  # NaN
    return ("ok", samples, e.lines, e.matched, e.types, e.models_dropped, e.dropped, e.problems)


def line_by_line(reader: ExpositionReader) -> Callable[[str], Exposition]:
    def read(text: str) -> Exposition:
        lines = text.split("\n")
        if lines[-1].strip(" \t"):
            n = len(lines)
            raise ExpositionError(f"line {n}: no newline at the end of the input: {lines[-1][:120]!r}", n, True)
        p = reader.begin()
        p.last_lineno = len(lines)
        reader.feed(p, lines)
        return reader.end(p)

    return read


READERS: dict[str, Callable[[], ExpositionReader]] = {
    "strict, everything": lambda: ExpositionReader(("",), Everything(), scrape_rules=False),
    "scrape rules, everything": lambda: ExpositionReader(("",), Everything()),
    "vLLM, tolerant": lambda: VLLM.reader(EngineLimits()),
    "vLLM, strict": lambda: VLLM.reader(EngineLimits(max_bad_lines=0)),
    "vLLM, 2 models, small labels": lambda: VLLM.reader(
        EngineLimits(max_models=2, max_label_value_bytes=24, max_label_bytes=60)
    ),
    "sglang": lambda: ADAPTERS["sglang"].reader(EngineLimits()),
}


def same(text: str, twice: bool = True) -> list[tuple[object, ...]]:
    """Assert the whole-text read and the line-by-line read agree on ``text`` (cold, and warm when ``twice``)."""
    got = []
    for make in READERS.values():
        whole, lines = make(), make()
        for _ in range(2 if twice else 1):
            a, b = outcome(whole.read, text), outcome(line_by_line(lines), text)
            assert a == b, text[:300]
            got.append(a)
    return got


@pytest.mark.parametrize("path", CORPUS, ids=[p.name for p in CORPUS])
def test_the_engine_corpus_reads_the_same(path: Path) -> None:
    same(path.read_text())


def test_the_expfmt_text_cases_read_the_same() -> None:
    cases = json.loads((FIXTURES / "expfmt" / "manifest.json").read_text())["cases"]
    checked = 0
    for case in cases:
        if case.get("format") != "text":
            continue
        same((FIXTURES / "expfmt" / case["file"]).read_bytes().decode("utf-8", errors="replace"), twice=False)
        checked += 1
    assert checked > 20


def test_a_conforming_engine_body_is_read_whole() -> None:
    """The fast path is taken (not given up) for a vLLM body and the corpus' plain bodies, cold and warm."""
    text, _ = big_exposition(2_000)
    reader = VLLM.reader(EngineLimits())
    for _ in range(2):
        assert reader._read_whole(reader.begin(), text)
    assert reader._read_whole(reader.begin(), BASE)  # the hostile edits below start from a body read whole
    whole = [
        p.name for p in CORPUS if (r := ExpositionReader(("",), Everything()))._read_whole(r.begin(), p.read_text())
    ]
    assert len(whole) >= len(CORPUS) // 2, whole


BASE = (
    "# HELP vllm:num_requests_running Running.\n"
    "# TYPE vllm:num_requests_running gauge\n"
    'vllm:num_requests_running{engine="0",model_name="m1"} 1.0\n'
    'vllm:num_requests_running{engine="1",model_name="m1"} 2.0\n'
    'vllm:num_requests_running{engine="0",model_name="m2"} 0.0\n'
    "# TYPE vllm:prompt_tokens_total counter\n"
    'vllm:prompt_tokens_total{engine="0",model_name="m1"} 10.0\n'
    'vllm:prompt_tokens_total{engine="0",model_name="m2"} 20.0\n'
    "# TYPE vllm:e2e_request_latency_seconds histogram\n"
    'vllm:e2e_request_latency_seconds_bucket{engine="0",le="0.5",model_name="m1"} 1.0\n'
    'vllm:e2e_request_latency_seconds_bucket{engine="0",le="+Inf",model_name="m1"} 2.0\n'
    'vllm:e2e_request_latency_seconds_count{engine="0",model_name="m1"} 2.0\n'
    'vllm:e2e_request_latency_seconds_sum{engine="0",model_name="m1"} 0.7\n'
    'vllm:e2e_request_latency_seconds_bucket{engine="0",le="0.5",model_name="m2"} 0.0\n'
    'vllm:e2e_request_latency_seconds_bucket{engine="0",le="+Inf",model_name="m2"} 1.0\n'
    'vllm:e2e_request_latency_seconds_count{engine="0",model_name="m2"} 1.0\n'
    'vllm:e2e_request_latency_seconds_sum{engine="0",model_name="m2"} 3.5\n'
    "# TYPE other_gauge gauge\n"
    'other_gauge{a="x"} 1\n'
    'other_gauge{a="y"} 2\n'
    "other_plain 3\n"
)
LINE = 'vllm:num_requests_running{engine="1",model_name="m1"} 2.0\n'
HOSTILE = {
    "duplicate wanted": (LINE, LINE + LINE),
    "duplicate, labels reordered": (LINE, LINE + 'vllm:num_requests_running{model_name="m1",engine="1"} 5\n'),
    "duplicate not wanted": ('other_gauge{a="y"} 2\n', 'other_gauge{a="y"} 2\nother_gauge{a="y"} 3\n'),
    "not wanted, with and without braces": ("other_plain 3\n", "other_plain 3\nother_plain{} 4\n"),
    "negative counter": ("} 10.0\n", "} -10.0\n"),
    "negative bucket": ('le="+Inf",model_name="m1"} 2.0', 'le="+Inf",model_name="m1"} -2.0'),
    "value with underscore": ("} 1.0\n", "} 1_0\n"),
    "word value": ("} 1.0\n", "} one\n"),
    "NaN": ("} 1.0\n", "} NaN\n"),
    "+NaN": ("} 1.0\n", "} +NaN\n"),
    "-nan": ("} 1.0\n", "} -nan\n"),
    "NaN counter": ("} 10.0\n", "} nan\n"),
    "+Inf and -Inf": ("} 1.0\n", "} +Inf\n" + LINE.replace("2.0", "-Inf").replace('"1"', '"7"')),
    "timestamp": ("} 1.0\n", "} 1.0 1700000000000\n"),
    "tab separator": ("} 1.0\n", "}\t1.0\n"),
    "two spaces": ("} 1.0\n", "}  1.0\n"),
    "trailing blank": ("} 1.0\n", "} 1.0 \n"),
    "blank line": (LINE, LINE + "\n"),
    "blank-only line": (LINE, LINE + "   \n"),
    "leading blank": (LINE, " " + LINE),
    "indented comment": ("# TYPE other_gauge", "  # TYPE other_gauge"),
    "CRLF": (LINE, LINE.replace("\n", "\r\n")),
    "space in a label value": ('a="x"', 'a="x y"'),
    "brace and space in a label value": ('a="x"', 'a="x} 1"'),
    "escaped quote": ('a="x"', 'a="x\\"q"'),
    "escaped newline": ('a="x"', 'a="x\\ny"'),
    "bad escape": ('a="x"', 'a="x\\q"'),
    "quoted metric name": ('other_gauge{a="x"}', '{"other.gauge",a="x"}'),
    "quoted label name": ('a="x"', '"a.b"="x"'),
    "duplicate label name": ('a="x"', 'a="x",a="z"'),
    "__name__ label": ('a="x"', '__name__="x"'),
    "trailing comma": ('a="x"', 'a="x",'),
    "blank in the label set": ('a="x"', 'a = "x"'),
    "blank before the brace": ('other_gauge{a="x"}', 'other_gauge {a="x"}'),
    "label block not closed": ('other_gauge{a="x"} 1', 'other_gauge{a="x" 1'),
    "bad label name": ('a="x"', '1a="x"'),
    "unquoted label value": ('a="x"', "a=x"),
    "bad bound": ('le="0.5",model_name="m1"', 'le="half",model_name="m1"'),
    "bad bound, gauge": ('a="x"', 'le="half"'),
    "non-ASCII label value": ('a="x"', 'a="ü ünïcödé"'),
    "non-ASCII digit value": ("other_plain 3\n", "other_plain \u0663\n"),
    "second TYPE": ("# TYPE other_gauge gauge\n", "# TYPE other_gauge gauge\n# TYPE other_gauge counter\n"),
    "TYPE after samples": ("other_plain 3\n", "other_plain 3\n# TYPE other_plain gauge\n"),
    "unknown TYPE": ("# TYPE other_gauge gauge", "# TYPE other_gauge gaugy"),
    "second HELP": ("# HELP vllm:num_requests_running Running.\n", "# HELP vllm:num_requests_running a\n" * 2),
    "a family split in two": ("other_plain 3\n", 'other_plain 3\nother_gauge{a="z"} 4\n'),
    "a split family's duplicate": ("other_plain 3\n", 'other_plain 3\nother_gauge{a="x"} 4\n'),
    "third model": ("other_plain 3\n", 'other_plain 3\nvllm:num_requests_running{engine="0",model_name="m3"} 1\n'),
    "long label value": ('a="x"', 'a="' + "v" * 100 + '"'),
    "no newline at the end": ("other_plain 3\n", "other_plain 3"),
    "a '#' in a label value": ('a="x"', 'a="#x"'),
    "a line that is a '#' in a label": ('other_gauge{a="y"} 2\n', 'other_gauge{a="y\n#"} 2\n'),
    "empty body": (BASE, ""),
    "only a newline": (BASE, "\n"),
}


@pytest.mark.parametrize("edit", HOSTILE, ids=list(HOSTILE))
def test_hostile_edits_read_the_same(edit: str) -> None:
    old, new = HOSTILE[edit]
    assert old in BASE
    same(BASE.replace(old, new, 1))


def test_hostile_edits_in_a_large_body_read_the_same() -> None:
    """The same edits deep in a body of many chunks (the whole-text read matches it WHOLE_CHUNK at a time)."""
    text, _ = big_exposition(6_000)
    at = text.index("vllm:generation_tokens_total{")
    line = text[at : text.index("\n", at) + 1]
    for new in (line + line, line.replace("} ", "} -"), line.replace("} ", "}\t"), line + "\n", " " + line):
        edited = text.replace(line, new, 1)
        for make in (lambda: VLLM.reader(EngineLimits()), lambda: VLLM.reader(EngineLimits(max_bad_lines=0))):
            assert outcome(make().read, edited) == outcome(line_by_line(make()), edited)


def python_calls(read: Callable[[], object]) -> int:
    """Python-level calls (functions, and builtins called from Python code) made during ``read()``."""
    calls = 0

    def count(frame: object, event: str, arg: object) -> None:
        nonlocal calls
        if event in ("call", "c_call"):
            calls += 1

    sys.setprofile(count)
    try:
        read()
    finally:
        sys.setprofile(None)
    return calls


def test_operations_of_a_read_grow_with_families_and_label_texts_not_lines() -> None:
    """A regression check on operation counts, not time. A warm read of a vLLM body makes Python-level calls per
    family and comment line, none per sample line (bulk operations do the per-line work); a cold read adds a bounded
    number per distinct label text. The line-by-line read makes ~16 per line."""
    measured = {}
    for series in (2_000, 8_000):
        text, _ = big_exposition(series)
        body = [line for line in text.split("\n") if line and not line.startswith("#")]
        texts = len({line[line.find("{") : line.rfind("}")] for line in body})
        warm_reader = VLLM.reader(EngineLimits())
        cold = python_calls(lambda: warm_reader.read(text))  # noqa: B023  (called at once)
        warm = python_calls(lambda: warm_reader.read(text))  # noqa: B023
        lines = python_calls(lambda: line_by_line(VLLM.reader(EngineLimits()))(text))  # noqa: B023
        measured[series] = (len(body), texts, cold, warm, lines)
        # measured at this change: 2,088 lines, 520 label texts: cold 6,740, warm 2,532, line by line 35,230;
        # 8,352 lines, 2,080 texts: cold 16,704, warm 2,532, line by line 132,574
        assert (cold - warm) / texts < 15 and lines / len(body) > 10, measured
    assert measured[8_000][3] <= measured[2_000][3] * 1.05, measured  # warm: flat in the lines read


def test_a_body_past_max_models_caches_what_the_line_by_line_read_caches() -> None:
    """Past ``max_models`` in a family's own lines the whole-text read gives up where the line-by-line read drops the
    model: no cache is dropped, and the label texts and sets cached are the line-by-line read's (the next read is
    warm). (In a chunk of interleaved families, read family by family, it drops its caches: the hostile edit
    "third model" above.)"""
    text = BASE.replace(LINE, LINE + 'vllm:num_requests_running{engine="0",model_name="m3"} 1\n')
    whole, lines = VLLM.reader(EngineLimits(max_models=2)), VLLM.reader(EngineLimits(max_models=2))
    for _ in range(2):
        got = outcome(whole.read, text)
        assert got == outcome(line_by_line(lines), text) and got[5] == 1  # one model dropped
        assert whole.generation == 0 and set(whole._raw) == set(lines._raw)
        assert set(whole._labels) == set(lines._labels) and set(whole._canon) == set(lines._canon)
