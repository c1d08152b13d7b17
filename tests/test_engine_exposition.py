"""The selective exposition reader: format corners, errors, cache correctness, parity with prometheus_client."""

from __future__ import annotations

import math
import platform
import sys

import pytest
from prometheus_client.parser import text_string_to_metric_families

from inferwatch.agent.node.engine import exposition as expo_module
from inferwatch.agent.node.engine import heap
from inferwatch.agent.node.engine.adapters import ADAPTERS, KeyCache, detect, read
from inferwatch.agent.node.engine.exposition import Everything, ExpositionReader
from inferwatch.agent.node.engine.limits import EngineLimits
from inferwatch.agent.node.engine.textformat import ExpositionError, parse_labels
from tests.conftest import FIXTURES
from tests.engine_expo import big_exposition

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


def test_a_quoted_name_does_not_make_its_unquoted_form_valid() -> None:
    # {"a.b"} 1 is valid (Prometheus 3); a later a.b 2 is not, even though the name was read before.
    everything = ExpositionReader(("",), Everything(), scrape_rules=False)
    with pytest.raises(ExpositionError) as err:
        everything.read('{"a.b"} 1\na.b 2\n')
    assert err.value.lineno == 2
    assert everything.read('{"a_b"} 1\na_b{x="1"} 2\n').samples == {"a_b": [((), 1.0), ((("x", "1"),), 2.0)]}


def test_bad_bucket_bound_is_found_whatever_other_bound_labels_say() -> None:
    hist = '# TYPE h histogram\nh_bucket{quantile="q",le="y"} 1\n'
    with pytest.raises(ExpositionError, match="le label is not a number") as err:
        reader("h_bucket").read(hist)
    assert err.value.lineno == 2
    # a summary reads quantile, not le: an odd le label is just a label
    summary = '# TYPE s summary\ns{le="x",quantile="0.5"} 1\n'
    assert reader("s").read(summary).get("s") == [((("le", "x"), ("quantile", "0.5")), 1.0)]


@pytest.mark.parametrize(
    ("block", "reason"),
    [
        (f'model_name="{"x" * 1025}"', "label_value_length_limit"),
        (f'model_name="{"x" * 1024}"', None),
        (f'a="{"x" * 1000}",b="{"y" * 1000}",c="{"z" * 1000}",d="{"w" * 1000}",e="{"v" * 100}"', "label_bytes_limit"),
        (f'a="{"x" * 2000}",b="{"y" * 1000}",c="{"z" * 1100}"', "label_value_length_limit"),
        (f'a="{"x" * 2000}",a="1"', "parse"),  # a duplicate name is a parse error, as without limits
        (f'a="{"x" * 2000}", b="1"', "label_value_length_limit"),  # not plain: parse_line, then the limit
    ],
)
def test_long_label_blocks_are_judged_as_the_full_path_judges_them(block: str, reason: str | None) -> None:
    """A long block is measured in place (no copy of a huge value); the verdict is label_limit_error's."""
    text = f"vllm:x{{{block}}} 1\n"
    strict = EngineLimits(max_bad_lines=0)  # the verdict itself (a tolerant read drops a parse error's line)
    r = ExpositionReader(("vllm:",), frozenset({"vllm:x"}), limits=strict, model_labels=("model_name",))
    if reason is None:
        assert r.read(text).matched == 1
        return
    with pytest.raises(ExpositionError) as err:
        r.read(text)
    assert err.value.reason == reason and err.value.lineno == 1


def test_duplicates_of_a_family_not_read_are_found_by_their_text() -> None:
    with pytest.raises(ExpositionError) as err:
        reader("vllm:x").read('vllm:y{a="1"} 1\nvllm:x 2\nvllm:y{a="1"} 3\n')
    assert err.value.reason == "duplicate_series" and err.value.lineno == 3
    r = reader("vllm:x")
    for _ in range(2):  # and from the cache, scrape after scrape
        assert r.read('vllm:y{a="1"} 1\nvllm:y{a="2"} 1\nvllm:x 2\n').matched == 1
    with pytest.raises(ExpositionError, match="duplicate series"):
        r.read('vllm:y{a="1"} 1\nvllm:y{a="1"} 1\nvllm:x 2\n')


def test_after_a_burst_the_caches_and_the_memory_are_given_back(monkeypatch: pytest.MonkeyPatch) -> None:
    released: list[int] = []

    def release() -> bool:
        released.append(1)
        return True

    monkeypatch.setattr(expo_module, "release_freed_memory", release)
    adapter = ADAPTERS["vllm"]
    r = adapter.reader(EngineLimits(max_models=4))
    keys = KeyCache(adapter.model_labels, "unknown")
    normal = 'vllm:num_requests_running{model_name="m",engine="0"} 1\n'
    burst = "".join(f'vllm:num_requests_running{{model_name="m{i}",engine="0"}} 1\n' for i in range(40_000))
    first = r.read(normal)
    read(adapter, first, keys=keys)
    hostile = r.read(burst)
    assert hostile.models_dropped == 39_996 and len(r._pairs) < 100  # dropped models' label pairs are not kept
    read(adapter, hostile, keys=keys)
    after = r.read(normal)  # the burst is over: its cached series are dropped, the next read is a cold one
    assert len(r._heads) == 0 and len(r._raw) == 0 and released == []
    read(adapter, after, keys=keys)
    again = r.read(normal)  # which begins by handing the freed memory back to the OS
    assert released == [1] and again.generation != hostile.generation
    read(adapter, again, keys=keys)
    assert keys.size == 1  # the memo of the burst's label tuples went with them
    r.read(normal)  # a whole body is read through the cache of label texts (heads are the line-by-line read's)
    assert released == [1] and len(r._raw) == 1


def test_a_stream_of_chunks_reads_as_the_whole_text() -> None:
    text, _gen = big_exposition(2_000)
    whole = ADAPTERS["vllm"].reader(EngineLimits()).read(text)
    r = ADAPTERS["vllm"].reader(EngineLimits())
    for _ in range(2):  # cold, then from the cache
        p = r.begin()
        lines = text.split("\n")
        for i in range(0, len(lines) - 1, 97):
            r.feed(p, lines[i : min(i + 97, len(lines) - 1)])
        streamed = r.end(p)
        assert streamed.samples == whole.samples and streamed.matched == whole.matched


def test_freed_memory_is_handed_back_on_glibc_only() -> None:
    glibc = sys.platform.startswith("linux") and platform.libc_ver()[0] == "glibc"
    assert heap.release_freed_memory() is glibc
    assert heap.release_freed_memory() is glibc  # the thresholds are fixed once; trimming again is fine
