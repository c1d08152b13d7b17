"""One bad line in an engine's exposition costs that line, not the scrape (issue 31).

Before, one malformed line, bad value or duplicate series anywhere made the engine read as down and every good
series of that scrape was lost. Now the line is dropped and counted (``inferwatch.engine.series.dropped{reason}``),
the rest is read, the engine is up; the strict verdict (``limits.max_bad_lines=0``, the conformance tests) is
unchanged, and the tolerant read keeps its words (``Exposition.problems``). Real expositions from
``tests/fixtures/engines/`` are corrupted line by line.
"""

from __future__ import annotations

import logging
import re

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from inferwatch.agent.node.engine.exposition import Everything, ExpositionReader
from inferwatch.agent.node.engine.limits import EngineLimits
from inferwatch.agent.node.engine.scrape import EngineParser
from inferwatch.agent.node.engine.textformat import ExpositionError
from tests import engine_server as es
from tests.conftest import FIXTURES
from tests.test_engine_collector import VALID, collector, samples_by_name

ENGINES = FIXTURES / "engines"
STRICT = EngineLimits(max_bad_lines=0)
_BIG = EngineLimits(max_series=10_000_000, max_models=10_000)


def _text_fixtures() -> dict[str, str]:
    """The text-format fixtures (not OpenMetrics) that read clean under the scrape rules."""
    out = {}
    for path in sorted(ENGINES.glob("*.prom")):
        text = path.read_text()
        text = text if text.endswith("\n") else text + "\n"
        if text.rstrip().endswith("# EOF"):
            continue
        try:
            ExpositionReader(("",), Everything(), limits=EngineLimits(max_bad_lines=0, max_models=10_000)).read(text)
        except ExpositionError:
            continue
        out[path.name] = text
    return out


FIXTURE_TEXTS = _text_fixtures()


def _reader(limits: EngineLimits) -> ExpositionReader:
    return ExpositionReader(("",), Everything(), limits=limits)


def _content(samples: dict) -> dict[str, list[tuple]]:
    """Each family's (labels, value) in a canonical order (a duplicate may keep its copy at another place)."""
    return {name: sorted((labels, repr(v)) for labels, v in series) for name, series in samples.items()}


def _garbage(kind: str, lines: list[str], pick: int) -> tuple[str, str, int]:
    """One bad line of ``kind`` made from the exposition's own ``lines``, the reason it is dropped for, and the first
    place it is bad at (a copy of a sample is a duplicate after it; before it, the original would be the one)."""
    samples = [i for i, ln in enumerate(lines) if ln and not ln.startswith("#")]
    typed = [i for i, ln in enumerate(lines) if ln.startswith("# TYPE ")]
    if kind == "duplicate" and samples:
        i = samples[pick % len(samples)]
        return lines[i], "duplicate_series", i + 1
    if kind == "second_type" and typed:
        return lines[typed[pick % len(typed)]], "type_conflict", 0  # the same TYPE twice: the first one stands
    if kind == "bad_value" and samples:
        head = lines[samples[pick % len(samples)]].rpartition(" ")[0].split(" ")[0]
        return f"{head} one", "parse", 0
    if kind == "unterminated" and samples:
        head = lines[samples[pick % len(samples)]]
        return (head.split("}")[0] + " 1" if "{" in head else head.split(" ")[0] + '{a="1 1'), "parse", 0
    if kind == "negative_counter":
        counters = [i for i in typed if lines[i].split()[3:4] == ["counter"]]
        if counters:
            i = counters[pick % len(counters)]
            name = lines[i].split()[2]
            name = name if name.endswith("_total") else name + "_total"
            return f'{name}{{inferwatch_test="{pick}"}} -5', "negative_value", i + 1  # a counter once typed
    return "this is {{{ not a metric line", "parse", 0


KINDS = ("garbage", "duplicate", "second_type", "bad_value", "unterminated", "negative_counter")


@pytest.mark.parametrize("name", sorted(FIXTURE_TEXTS))
def test_every_fixture_reads_the_same_tolerant_and_strict(name: str) -> None:
    text = FIXTURE_TEXTS[name]
    strict = _reader(EngineLimits(max_bad_lines=0, max_models=10_000)).read(text)
    tolerant = _reader(EngineLimits(max_models=10_000)).read(text)
    assert tolerant.samples == strict.samples and tolerant.dropped == {} and tolerant.problems == []


@settings(max_examples=150, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(
    name=st.sampled_from(sorted(FIXTURE_TEXTS)),
    kind=st.sampled_from(KINDS),
    where=st.integers(min_value=0),
    pick=st.integers(min_value=0, max_value=10_000),
)
def test_one_garbage_line_anywhere_costs_only_that_line(name: str, kind: str, where: int, pick: int) -> None:
    text = FIXTURE_TEXTS[name]
    lines = text.split("\n")[:-1]
    bad, reason, first = _garbage(kind, lines, pick)
    at = first + where % (len(lines) + 1 - first)
    corrupted = "\n".join([*lines[:at], bad, *lines[at:]]) + "\n"
    limits = EngineLimits(max_models=10_000)
    clean = _reader(EngineLimits(max_bad_lines=0, max_models=10_000)).read(text)
    got = _reader(limits).read(corrupted)
    assert _content(got.samples) == _content(clean.samples)  # every other series, with its value
    assert got.dropped == {reason: 1}, got.problems
    (why,) = got.problems
    assert why[0] == reason and why[1].startswith("line ")
    with pytest.raises(ExpositionError) as err:  # the strict verdict names the same problem
        _reader(EngineLimits(max_bad_lines=0, max_models=10_000)).read(corrupted)
    assert err.value.reason == reason


@pytest.mark.parametrize("chunk", [1, 7, 4096])
def test_a_bad_line_in_every_chunk_of_a_stream_is_dropped_and_counted(chunk: int) -> None:
    lines = VALID.split("\n")[:-1]
    bad = [f'vllm:num_requests_running{{model_name="m",x="{i}"}} one' for i in range(3)]
    body = "\n".join([bad[0], *lines[:40], bad[1], *lines[40:], bad[2]]) + "\n"
    parser = EngineParser()
    stream = parser.stream()
    stream.begin("text/plain")
    raw = body.encode()
    for i in range(0, len(raw), chunk):
        stream.feed(raw[i : i + chunk])
    got = stream.finish()
    assert got == EngineParser().parse(VALID.encode())
    assert parser.dropped_lines()["parse"] == 3
    assert [p[1].split(":")[0] for p in parser.problems] == ["line 1", "line 42", f"line {len(lines) + 3}"]


def test_past_max_bad_lines_the_scrape_fails_as_before() -> None:
    garbage = "".join(f"bad line {i} {{\n" for i in range(11))
    parser = EngineParser(limits=EngineLimits(max_bad_lines=10))
    with pytest.raises(Exception, match="max_bad_lines=10") as err:
        parser.parse((VALID + garbage).encode())
    assert getattr(err.value, "reason", None) == "parse"
    assert EngineParser(limits=EngineLimits(max_bad_lines=11)).parse((VALID + garbage).encode()).models


def test_a_label_limit_still_fails_the_scrape() -> None:
    """Limits bound what a read holds (Prometheus' label_limit rejects the scrape): not a line's own problem."""
    long = 'vllm:num_requests_running{model_name="' + "x" * 2000 + '"} 1\n'
    with pytest.raises(Exception) as err:
        EngineParser().parse((VALID + long).encode())
    assert getattr(err.value, "reason", None) == "label_value_length_limit"


def test_openmetrics_bad_line_and_family_rule_are_reported_not_fatal() -> None:
    om = (
        "# TYPE vllm:num_requests_running gauge\n"
        'vllm:num_requests_running{model_name="m"} 1\n'
        "garbage {{{\n"
        "# TYPE vllm:prompt_tokens counter\n"
        'vllm:prompt_tokens{model_name="m"} 3\n'  # no _total: an OpenMetrics family rule
        "# EOF\n"
    )
    r = _reader(EngineLimits())
    got = r.read(om)
    assert got.samples["vllm:num_requests_running"] == [((("model_name", "m"),), 1.0)]
    assert got.dropped == {"parse": 1, "openmetrics": 1}
    with pytest.raises(ExpositionError):
        _reader(STRICT).read(om)
    with pytest.raises(ExpositionError, match="EOF"):  # a body cut short is still no exposition
        r.read(om.removesuffix("# EOF\n"), openmetrics=True)


def test_collector_keeps_the_engine_up_and_every_good_series(caplog: pytest.LogCaptureFixture) -> None:
    lines = VALID.split("\n")[:-1]
    corrupted = "\n".join([*lines[:25], 'vllm:num_requests_running{model_name="m"} not-a-number', *lines[25:]]) + "\n"
    with es.EngineServer({"/metrics": es.body(VALID)}) as srv:
        c = collector(srv.url("/metrics"), timeout_s=5)
        try:
            clean = c.collect()
            srv.routes["/metrics"] = es.body(corrupted)
            with caplog.at_level(logging.INFO, logger="inferwatch.agent.node.engine.exposition"):
                bad = [c.collect() for _ in range(3)]
                srv.routes["/metrics"] = es.body(VALID)
                c.collect()
            status = samples_by_name(c.status_samples())
        finally:
            c.close()

    def series(col) -> set:
        return {(s.name, s.attributes) for s in col.samples}

    assert series(bad[-1]) == series(clean)  # every series of the scrape is still there
    assert status["inferwatch.engine.up"][0].value == 1
    dropped = {dict(s.attributes)["reason"]: s.value for s in status["inferwatch.engine.series.dropped"]}
    assert dropped["parse"] == 3 and sum(dropped.values()) == 3
    errors = {dict(s.attributes)["reason"]: s.value for s in status["inferwatch.engine.scrape.errors"]}
    assert sum(errors.values()) == 0
    said = [r.getMessage() for r in caplog.records if r.name == "inferwatch.agent.node.engine.exposition"]
    assert len(said) == 2, said  # once when it starts, once when it ends
    assert re.search(r"1 parse\); first: line 26: value 'not-a-number' is not a number", said[0]), said[0]
