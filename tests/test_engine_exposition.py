"""The selective exposition reader: format corners, errors, cache correctness, parity with prometheus_client."""

from __future__ import annotations

import math

import pytest
from prometheus_client.parser import text_string_to_metric_families

from agent.engine.adapters import ADAPTERS, detect
from agent.engine.exposition import ExpositionError, ExpositionReader, parse_labels
from tests.conftest import FIXTURES

ENGINES = FIXTURES / "engines"


def with_final_newline(text: str) -> str:
    """The DataDog copy of the vLLM capture lost the final newline every exporter writes (and expfmt requires)."""
    return text if text.endswith("\n") else text + "\n"


def reader(*names: str, prefixes: tuple[str, ...] = ("vllm:",)) -> ExpositionReader:
    return ExpositionReader(prefixes, frozenset(names))


def test_reads_only_wanted_names_and_skips_comments_and_created() -> None:
    text = (
        "# HELP vllm:prompt_tokens_total Prefill tokens.\n"
        "# TYPE vllm:prompt_tokens_total counter\n"
        'vllm:prompt_tokens_total{engine="0",model_name="m"} 12.0\n'
        'vllm:prompt_tokens_created{engine="0",model_name="m"} 1.7e+09\n'
        'vllm:other{model_name="m"} 3\n'
        "python_gc_objects_collected_total 5\n"
    )
    expo = reader("vllm:prompt_tokens_total").read(text)
    assert expo.samples == {"vllm:prompt_tokens_total": [((("engine", "0"), ("model_name", "m")), 12.0)]}


def test_escapes_braces_commas_trailing_comma_timestamps_exemplars() -> None:
    text = (
        'vllm:x{model_name="a\\"b\\\\c\\nd",engine="0"} 1\n'
        'vllm:x{model_name="has } brace, comma = eq",engine="1"} 2 1700000000000\n'
        'vllm:x{model_name="t",engine="2",} 3\n'
        'vllm:x{model_name="e", engine="3"} 4\n'
        "vllm:x 5\n"
        'vllm:x{model_name="="} +Inf\n'
        'vllm:x{model_name="}"} NaN\n'
    )
    got = reader("vllm:x").read(text).get("vllm:x")
    assert got[0] == ((("model_name", 'a"b\\c\nd'), ("engine", "0")), 1.0)
    assert got[1] == ((("model_name", "has } brace, comma = eq"), ("engine", "1")), 2.0)
    assert got[2] == ((("model_name", "t"), ("engine", "2")), 3.0)
    assert got[3] == ((("model_name", "e"), ("engine", "3")), 4.0)
    assert got[4] == ((), 5.0)
    assert got[5] == ((("model_name", "="),), math.inf)
    assert got[6][0] == (("model_name", "}"),) and math.isnan(got[6][1])
    assert reader("vllm:x").read("vllm:x{} 6\n").get("vllm:x") == [((), 6.0)]


def test_exemplars_are_read_in_openmetrics_only() -> None:
    om = '# TYPE vllm:x counter\nvllm:x_total{model_name="e"} 4 # {trace_id="abc"} 0.5 1700000000.1\n# EOF\n'
    assert reader("vllm:x_total").read(om).get("vllm:x_total") == [((("model_name", "e"),), 4.0)]
    with pytest.raises(ExpositionError, match="after the value"):
        reader("vllm:x").read('vllm:x{model_name="e"} 4 # {trace_id="abc"} 0.5\n')  # text format: no exemplars


def test_second_scrape_from_cache_sees_new_values() -> None:
    r = reader("vllm:x")
    first = r.read('vllm:x{model_name="m"} 1\nvllm:x{model_name="n"} 2\n')
    second = r.read('vllm:x{model_name="m"} 7\nvllm:x{model_name="n"} 2\nvllm:x{model_name="o"} 8 123\n')
    assert [v for _, v in first.get("vllm:x")] == [1.0, 2.0]
    assert [v for _, v in second.get("vllm:x")] == [7.0, 2.0, 8.0]


@pytest.mark.parametrize(
    ("line", "why"),
    [
        ('vllm:x{model_name="m" 1', "expected ',' or '}'"),
        ('vllm:x{model_name="m"} abc', "not a number"),
        ('vllm:x{model_name="m"}', "missing value"),
        ("vllm:x{model_name=m} 1", "must be quoted"),
        ('vllm:x{a="1",model_name=m} 1', "must be quoted"),
        ('vllm:x{9bad="m"} 1', "invalid label name"),
        ('vllm:x{a="1",a="2"} 1', "duplicate label name"),
        ("vllm:x 1_2", "not a number"),
        ("vllm:x 1 NaN", "timestamp"),
        ("vllm:x 1 2.5", "timestamp"),
        ('vllm:x{model_name="m"} 1 notatime', "timestamp"),
    ],
)
def test_malformed_wanted_line_names_its_line(line: str, why: str) -> None:
    with pytest.raises(ExpositionError, match=why) as err:
        reader("vllm:x").read(f"# TYPE vllm:x gauge\n{line}\n")
    assert err.value.lineno == 2 and not err.value.last


def test_malformed_unwanted_line_rejects_the_exposition() -> None:
    # Prometheus rejects the whole scrape for one bad line; a reader that skipped it would not notice.
    with pytest.raises(ExpositionError) as err:
        reader("vllm:x").read('vllm:y{model_name="m" garbage\nvllm:x 1\n')
    assert err.value.lineno == 1


def test_truncated_last_line_is_flagged_as_last() -> None:
    with pytest.raises(ExpositionError) as err:
        reader("vllm:x").read('vllm:x{model_name="m"} 1\nvllm:x{model_na')
    assert err.value.last


def test_parse_labels_rejects_garbage() -> None:
    with pytest.raises(ValueError):
        parse_labels('a="b" c="d"')
    with pytest.raises(ValueError):
        parse_labels('a="\\q"')  # expfmt: only \\\\, \\" and \\n are escapes


@pytest.mark.parametrize(
    "fixture",
    [
        "vllm-0.5.x-with-v1-families.prom",
        "vllm-v1-dp2-synthetic.prom",
        "vllm-v1-deprecated-names-synthetic.prom",
        "sglang-0.5.10.post1.prom",
        "sglang-dp2-synthetic.prom",
        "tgi-synthetic.prom",
        "llamacpp-synthetic-a.prom",
        "trtllm-serve-synthetic.prom",
        "triton-trtllm-synthetic.prom",
    ],
)
def test_identical_to_prometheus_client_for_every_wanted_family(fixture: str) -> None:
    text = with_final_newline((ENGINES / fixture).read_text())
    kind = detect(text)
    assert kind is not None
    adapter = ADAPTERS[kind]
    wanted = adapter.wanted()
    ours = adapter.reader().read(text)
    theirs: dict[str, list] = {}
    for family in text_string_to_metric_families(text):
        for s in family.samples:
            # prometheus_client renames a counter sample without _total (TGI's) to NAME_total
            renamed = s.name.endswith("_total") and f"\n{s.name}" not in f"\n{text}"
            name = s.name[: -len("_total")] if renamed else s.name
            if name in wanted:
                theirs.setdefault(name, []).append((tuple(sorted(s.labels.items())), s.value))
    assert ours.matched > 0
    assert {k: sorted((tuple(sorted(lbl)), v) for lbl, v in vs) for k, vs in ours.samples.items()} == {
        k: sorted(vs) for k, vs in theirs.items()
    }


def test_detection_from_the_exposition() -> None:
    expected = {
        "vllm-0.5.x-with-v1-families.prom": "vllm",
        "vllm-v1-dp2-synthetic.prom": "vllm",
        "sglang-0.5.10.post1.prom": "sglang",
        "tgi-synthetic.prom": "tgi",
        "llamacpp-synthetic-a.prom": "llamacpp",
        "trtllm-serve-synthetic.prom": "trtllm",
        "triton-trtllm-synthetic.prom": "trtllm",
    }
    for name, kind in expected.items():
        assert detect((ENGINES / name).read_text()) == kind, name
    assert detect("<html><body>hello</body></html>") is None
    assert detect("ray_vllm:num_requests_running 1\n") == "vllm"  # Ray Serve's re-export
