"""Engine input limits (agent/node/engine/limits.py): each rejects with its reason or caps, and is counted."""

from __future__ import annotations

import logging

import pytest

from inferwatch.agent.config import Settings
from inferwatch.agent.node.collectors.engine import EngineCollector
from inferwatch.agent.node.engine.adapters import ADAPTERS
from inferwatch.agent.node.engine.exposition import MAX_HEADS, Exposition, ExpositionReader
from inferwatch.agent.node.engine.fetch import EngineScrapeError
from inferwatch.agent.node.engine.limits import EngineLimits, SampleLineCounter, count_sample_lines
from inferwatch.agent.node.engine.scrape import EngineParser
from inferwatch.agent.node.runner import validate
from inferwatch.agent.node.wiring import collect_context
from tests import engine_server as es


def collector(url: str, **engine: object) -> EngineCollector:
    settings = Settings.from_values(dict(engine={"metrics_url": url, **engine}))
    return EngineCollector(collect_context(settings), settings.engine)


def gauges(models: int, value_len: int = 4) -> str:
    lines = ["# TYPE vllm:num_requests_running gauge"]
    lines += [f'vllm:num_requests_running{{model_name="m{i:0{value_len}d}"}} 1' for i in range(models)]
    return "\n".join(lines) + "\n"


def status(c: EngineCollector) -> dict[str, dict[str, float]]:
    out: dict[str, dict[str, float]] = {}
    for s in c.status_samples():
        key = dict(s.attributes).get("reason") or dict(s.attributes).get("limit") or ""
        out.setdefault(s.name, {})[key] = s.value
    return out


def test_counting_sample_lines_in_one_piece_and_in_chunks() -> None:
    text = '# HELP a x\n# TYPE a gauge\na 1\n\nb 2\nc{x="1"} 3\n#x\nd 4'
    assert count_sample_lines(text) == 4
    data = text.encode()
    for size in (1, 2, 3, 7, 100):
        counter = SampleLineCounter()
        for i in range(0, len(data), size):
            counter.feed(data[i : i + size])
        assert counter.samples == 4, size


@pytest.mark.parametrize(
    ("text", "limits", "reason"),
    [
        (gauges(11), EngineLimits(max_series=10), "sample_limit"),
        (gauges(1, value_len=2000), EngineLimits(), "label_value_length_limit"),
        (
            'vllm:num_requests_running{model_name="m",a="' + "x" * 900 + '",b="' + "y" * 900 + '"} 1\n',
            EngineLimits(max_label_bytes=1024),
            "label_bytes_limit",
        ),
        ('vllm:num_requests_running{model_name="' + "é" * 600 + '"} 1\n', EngineLimits(), "label_value_length_limit"),
        (
            'vllm:num_requests_running{model_name="m", a="' + "x" * 2000 + '"} 1\n',
            EngineLimits(),
            "label_value_length_limit",
        ),
    ],
)
def test_parser_rejects_with_the_limit_as_reason(text: str, limits: EngineLimits, reason: str) -> None:
    with pytest.raises(EngineScrapeError) as err:
        EngineParser("auto", "unknown", limits).parse(text.encode())
    assert err.value.reason == reason, str(err.value)


def test_within_the_limits_reads() -> None:
    reading = EngineParser("auto", "unknown", EngineLimits(max_series=10)).parse(gauges(10).encode())
    assert len(reading.models) == 10 and reading.models_dropped == 0


def test_models_past_the_cap_are_dropped_not_failed() -> None:
    reading = EngineParser("auto", "unknown", EngineLimits(max_models=64)).parse(gauges(1000).encode())
    assert sorted(reading.models) == [f"m{i:04d}" for i in range(64)]  # the first 64, in exposition order
    assert reading.models_dropped == 936


def test_collector_counts_limit_hits_and_logs_once(caplog: pytest.LogCaptureFixture) -> None:
    with es.EngineServer() as srv:
        srv.routes["/metrics"] = es.body(gauges(100))
        c = collector(srv.url("/metrics"), max_models=8)
        try:
            with caplog.at_level(logging.INFO, logger="inferwatch.agent.node.collectors.engine"):
                for _ in range(3):
                    got = validate(c.collect())
                assert got.details["models_dropped"] == 92
                # engine-level samples (the recognised schema, the unmapped families) carry no model
                models = {dict(s.attributes).get("gen_ai.request.model") for s in got.samples} - {None}
                assert len(models) == 8
                srv.routes["/metrics"] = es.body(gauges(5))
                c.collect()
                c.collect()
            st = status(c)
            assert st["inferwatch.engine.limit_hits"]["max_models"] == 3
            assert st["inferwatch.engine.models.dropped"][""] == 0
            assert st["inferwatch.engine.up"] == {"": 1}
            messages = [r.getMessage() for r in caplog.records]
            assert sum("dropped" in m for m in messages) == 1 and sum("back within" in m for m in messages) == 1
            srv.routes["/metrics"] = es.body(gauges(1, value_len=5000))
            with pytest.raises(EngineScrapeError):
                c.collect()
            srv.routes["/metrics"] = es.body(gauges(200_001))
            with pytest.raises(EngineScrapeError) as err:
                c.collect()
            assert err.value.reason == "sample_limit"
            st = status(c)
            assert st["inferwatch.engine.up"] == {"": 0}
            assert st["inferwatch.engine.scrape.errors"]["label_value_length_limit"] == 1
            assert st["inferwatch.engine.scrape.errors"]["sample_limit"] == 1
            assert st["inferwatch.engine.limit_hits"]["sample_limit"] == 1
            assert st["inferwatch.engine.limit_hits"]["label_value_length_limit"] == 1
            validate(type(got)(samples=c.status_samples()))
        finally:
            c.close()


def ranks(n: int) -> str:
    lines = ["# TYPE vllm:num_requests_running gauge"]
    lines += [f'vllm:num_requests_running{{model_name="m{i % 3}",rank="{i}"}} 1' for i in range(n)]
    return "\n".join(lines) + "\n"


def test_samples_of_dropped_models_are_checked_not_cached() -> None:
    """A flood of model names costs no memory per series: only the kept models' heads are cached."""
    parser = EngineParser("auto", "unknown", EngineLimits(max_models=4))
    reading = parser.parse(gauges(30_000).encode())
    assert sorted(reading.models) == ["m0000", "m0001", "m0002", "m0003"] and reading.models_dropped == 29_996
    reader = parser._readers["vllm"]
    assert len(reader._heads) == 4 and len(reader._labels) == 4 and len(reader._canon) == 4
    # a dropped model's lines are still checked: a bad one is dropped and counted (strict: the scrape fails)
    parser.parse((gauges(30_000) + 'vllm:num_requests_running{model_name="x"} one\n').encode())
    assert parser.dropped_lines()["parse"] == 1 and "line 30002" in parser.problems[0][1]
    strict = EngineParser("auto", "unknown", EngineLimits(max_models=4, max_bad_lines=0))
    with pytest.raises(EngineScrapeError) as err:
        strict.parse((gauges(30_000) + 'vllm:num_requests_running{model_name="x"} one\n').encode())
    assert err.value.reason == "parse" and "line 30002" in str(err.value)


def test_caches_of_a_burst_of_series_are_given_back() -> None:
    parser = EngineParser("auto", "unknown", EngineLimits(max_models=4))
    parser.parse(ranks(30_000).encode())  # a whole body: read through the label texts' cache, no head cached
    reader, keys = parser._readers["vllm"], parser._keys["vllm"]
    assert len(reader._raw) == 30_000 and len(reader._heads) == 0
    parser.parse(gauges(3).encode())  # the engine is back to three models
    assert len(reader._raw) == 0 and keys.size <= 3
    parser.parse(gauges(3).encode())
    assert len(reader._raw) == 3  # a steady target keeps its warm cache


def fed(reader: ExpositionReader, text: str) -> Exposition:
    """``text`` read line by line, as the collector's stream feeds it (the path that caches heads)."""
    p = reader.begin()
    reader.feed(p, text.split("\n"))
    return reader.end(p)


def test_an_exposition_past_the_head_bound_caches_no_head() -> None:
    """Past MAX_HEADS lines, the heads cached would cover a small share of the read: none is kept, the same reading."""
    reader = ADAPTERS["vllm"].reader(EngineLimits(max_models=4, max_series=100_000))
    first = fed(reader, ranks(30_000))
    assert len(reader._heads) == MAX_HEADS  # the first read cannot know
    again = fed(reader, ranks(30_000))
    assert len(reader._heads) == 0 and again == first
    fed(reader, ranks(MAX_HEADS // 2))  # smaller again: the read after it caches every head
    fed(reader, ranks(MAX_HEADS // 2))
    assert len(reader._heads) == MAX_HEADS // 2
