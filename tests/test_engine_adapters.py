"""Every adapter on its fixtures: canonical quantities, data-parallel aggregation, absence, old/new names."""

from __future__ import annotations

import math
from collections import defaultdict

import pytest
from prometheus_client.parser import text_string_to_metric_families

from inferwatch.agent.node.engine.adapters import EngineReading
from inferwatch.agent.node.engine.fetch import EngineScrapeError
from inferwatch.agent.node.engine.histogram import sum_histograms
from inferwatch.agent.node.engine.limits import EngineLimits
from inferwatch.agent.node.engine.scrape import EngineParser
from tests.conftest import FIXTURES

ENGINES = FIXTURES / "engines"
QWEN = "Qwen/Qwen2.5-7B-Instruct"


def parse(name: str, kind: str = "auto", model: str = "unknown") -> EngineReading:
    body = (ENGINES / name).read_bytes()
    # The DataDog copy of the vLLM capture lost the final newline every exporter writes (expfmt requires it).
    return EngineParser(kind, model).parse(body if body.endswith(b"\n") else body + b"\n")


def independent(name: str) -> dict[str, list[tuple[dict[str, str], float]]]:
    """The fixture read by prometheus_client's parser: sample name → [(labels, value)]."""
    out: dict[str, list[tuple[dict[str, str], float]]] = defaultdict(list)
    for family in text_string_to_metric_families((ENGINES / name).read_text()):
        for s in family.samples:
            out[s.name].append((s.labels, s.value))
    return out


def cumulative(reading: EngineReading, model: str, quantity: str) -> dict[float, float]:
    h = sum_histograms(reading.models[model].histograms[quantity].values())
    assert h is not None
    return dict(h.buckets)


def test_vllm_v1_two_engines_are_summed() -> None:
    r = parse("vllm-v1-dp2-synthetic.prom")
    ref = independent("vllm-v1-dp2-synthetic.prom")
    m = r.models[QWEN]
    assert r.kind == "vllm" and list(r.models) == [QWEN]
    assert m.gauges["running"] == sum(v for _, v in ref["vllm:num_requests_running"])
    assert m.gauges["waiting"] == sum(v for _, v in ref["vllm:num_requests_waiting"])
    kv = [v for _, v in ref["vllm:kv_cache_usage_perc"]]
    assert m.gauges["kv_usage"] == pytest.approx(sum(kv) / len(kv))  # a ratio: averaged over ranks
    assert sum(m.counters["prompt_tokens"].values()) == sum(v for _, v in ref["vllm:prompt_tokens_total"])
    finished: dict[str, float] = defaultdict(float)
    for labels, v in ref["vllm:request_success_total"]:
        finished[labels["finished_reason"]] += v
    assert m.counters["finished"] == dict(finished)
    assert sum(finished.values()) == 40  # 20 requests on each of two engines
    # one series per engine, summed by le
    assert set(m.histograms["ttft"]) == {(("engine", "0"),), (("engine", "1"),)}
    ttft: dict[float, float] = defaultdict(float)
    for labels, v in ref["vllm:time_to_first_token_seconds_bucket"]:
        ttft[float(labels["le"])] += v
    assert cumulative(r, QWEN, "ttft") == dict(ttft)
    assert cumulative(r, QWEN, "ttft")[math.inf] == 40
    assert set(m.histograms) == {"ttft", "itl", "e2e", "queue", "prefill", "decode", "inference"}
    assert m.sources["itl"] == "vllm:inter_token_latency_seconds"


def test_vllm_deprecated_names_are_read() -> None:
    r = parse("vllm-v1-deprecated-names-synthetic.prom")
    ref = independent("vllm-v1-deprecated-names-synthetic.prom")
    m = r.models[QWEN]
    assert m.sources["itl"] == "vllm:time_per_output_token_seconds"
    assert m.sources["kv_usage"] == "vllm:gpu_cache_usage_perc"
    assert m.gauges["kv_usage"] == ref["vllm:gpu_cache_usage_perc"][0][1]
    assert cumulative(r, QWEN, "itl")[math.inf] == 12


def test_vllm_hybrid_capture_prefers_current_names() -> None:
    r = parse("vllm-0.5.x-with-v1-families.prom")
    m = r.models["facebook/opt-125m"]
    assert m.sources["kv_usage"] == "vllm:kv_cache_usage_perc"
    assert m.sources["itl"] == "vllm:inter_token_latency_seconds"
    assert m.counters["finished"] == {"length": 1.0}
    assert m.counters["preemptions"] == {"": 0.0}


def test_sglang_capture() -> None:
    r = parse("sglang-0.5.10.post1.prom")
    m = r.models["facebook/opt-125m"]
    assert r.kind == "sglang"
    assert m.gauges == {"running": 0.0, "waiting": 0.0, "kv_usage": 0.25}
    assert m.counters["prompt_tokens"] == {"": 5.0} and m.counters["generation_tokens"] == {"": 32.0}
    assert set(m.histograms) == {"ttft", "itl", "e2e", "queue"}
    assert cumulative(r, "facebook/opt-125m", "itl") == {0.01: 31.0, math.inf: 31.0}


def test_sglang_data_parallel_ranks_and_prefill_stage() -> None:
    r = parse("sglang-dp2-synthetic.prom")
    m = r.models["deepseek-ai/DeepSeek-V3"]
    assert m.gauges["running"] == 21 and m.gauges["waiting"] == 4
    assert m.gauges["kv_usage"] == pytest.approx(0.5)
    assert m.counters["preemptions"] == {"": 7.0}
    assert m.counters["finished"] == {"abort": 4.0}
    # prefill = stage prefill_forward only, summed over both dp ranks; prefill_waiting kept out
    assert cumulative(r, "deepseek-ai/DeepSeek-V3", "prefill") == {0.1: 100.0, 0.2: 200.0, math.inf: 200.0}
    prefill = sum_histograms(m.histograms["prefill"].values())
    assert prefill is not None and prefill.sum == 44.0 and prefill.count == 200
    assert "decode" not in m.histograms  # SGLang has no per-request decode histogram: absent


def test_tgi_has_no_model_label_and_no_ttft() -> None:
    r = parse("tgi-synthetic.prom", model="bigscience/bloom-560m")
    m = r.models["bigscience/bloom-560m"]
    assert r.kind == "tgi"
    assert m.gauges == {"running": 4.0, "waiting": 3.0}  # no KV-cache gauge: absent, not 0
    assert set(m.histograms) == {"itl", "e2e", "queue", "prefill", "inference"}
    assert m.counters["prompt_tokens"] == {"": 1500.0} and m.counters["generation_tokens"] == {"": 2000.0}
    assert m.counters["finished"] == {"error": 2.0}
    assert cumulative(r, "bigscience/bloom-560m", "prefill")[math.inf] == 6  # method="prefill" only


def test_llamacpp_counters_only() -> None:
    r = parse("llamacpp-synthetic-a.prom")
    m = r.models["unknown"]
    assert r.kind == "llamacpp"
    assert m.histograms == {}
    assert m.gauges == {"running": 2.0, "waiting": 1.0}
    assert m.counters["prompt_seconds"] == {"": 2.0} and m.counters["generation_tokens"] == {"": 500.0}


def test_trtllm_serve() -> None:
    r = parse("trtllm-serve-synthetic.prom")
    m = r.models["meta-llama/Llama-3.1-8B-Instruct"]
    assert r.kind == "trtllm"
    assert m.gauges == {"running": 6.0, "waiting": 2.0, "kv_usage": 0.42}
    assert m.counters["finished"] == {"stop": 30.0, "length": 10.0, "error": 1.0}
    assert set(m.histograms) == {"ttft", "itl", "queue", "prefill"}  # e2e/decode/inference absent
    assert cumulative(r, "meta-llama/Llama-3.1-8B-Instruct", "ttft")[0.08] == 30


def test_triton_trtllm_backend() -> None:
    r = parse("triton-trtllm-synthetic.prom")
    m = r.models["tensorrt_llm"]
    assert m.gauges == {"running": 5.0, "waiting": 2.0, "kv_usage": 0.25}
    assert m.counters["prompt_tokens"] == {"": 300.0} and m.counters["generation_tokens"] == {"": 450.0}
    assert m.histograms == {}


def test_kind_override_and_wrong_kind() -> None:
    assert parse("vllm-v1-dp2-synthetic.prom", kind="vllm").kind == "vllm"
    with pytest.raises(EngineScrapeError) as err:
        parse("sglang-0.5.10.post1.prom", kind="vllm")
    assert err.value.reason == "not_prometheus"


def test_multiple_models_stay_apart() -> None:
    from tests.engine_expo import VllmLike

    gen = VllmLike(["a", "b"], engines=3, seed=3)
    gen.observe(2, model="a")
    gen.observe(5, model="b")
    r = EngineParser().parse(gen.text().encode())
    assert cumulative(r, "a", "e2e")[math.inf] == 6 and cumulative(r, "b", "e2e")[math.inf] == 15


def test_ray_serve_vllm_re_export_is_read_as_vllm() -> None:
    r = parse("ray-vllm-datadog.prom")
    assert r.kind == "vllm"
    m = r.models["neuralmagic/Meta-Llama-3.1-70B-Instruct-FP8"]
    assert m.counters["prompt_tokens"] == {"": 58.0} and m.counters["generation_tokens"] == {"": 300.0}
    assert m.gauges["running"] == 0.0 and m.gauges["waiting"] == 0.0
    assert m.gauges["kv_usage"] == pytest.approx(5.882698982295764e-05)
    assert m.sources["itl"] == "ray_vllm:time_per_output_token_seconds"
    assert cumulative(r, "neuralmagic/Meta-Llama-3.1-70B-Instruct-FP8", "itl")[math.inf] == 299.0


def test_ray_serve_underscore_names_read_as_the_colon_ones() -> None:
    """Ray's current dashboards query ``ray_vllm_*`` (ray-project/ray vllm_engine_panels.py), Ray 2.32 exported
    ``ray_vllm:*``: the real 2.32 capture with the colon made an underscore reads the same, release and values."""
    text = (FIXTURES / "engines" / "ray-vllm-datadog.prom").read_text(encoding="utf-8")
    renamed = text.replace("ray_vllm:", "ray_vllm_")
    assert "ray_vllm:" not in renamed and renamed.count("ray_vllm_") == text.count("ray_vllm:") > 0
    before, after = EngineParser().parse(text.encode()), EngineParser().parse(renamed.encode())
    assert after.kind == "vllm"
    assert after.recognition == before.recognition and after.recognition.schema == "vllm-legacy-names"
    assert after.coverage() == before.coverage()
    model = "neuralmagic/Meta-Llama-3.1-70B-Instruct-FP8"
    m, was = after.models[model], before.models[model]
    assert m.gauges == was.gauges and m.counters == was.counters
    assert m.sources["itl"] == "ray_vllm_time_per_output_token_seconds"
    assert cumulative(after, model, "itl") == cumulative(before, model, "itl")


def test_triton_core_without_the_tensorrt_llm_backend() -> None:
    r = parse("triton-core-datadog.prom")
    assert r.kind == "trtllm"
    assert set(r.models) == {
        "simple_string",
        "simple_sequence",
        "simple_int8",
        "simple_identity",
        "densenet_onnx",
        "simple_dyna_sequence",
        "inception_graphdef",
        "simple",
    }
    m = r.models["densenet_onnx"]
    assert m.counters["finished"] == {"success": 3.0, "error": 0.0}
    assert m.gauges["waiting"] == 0.0


def test_early_sglang_names_the_model_in_a_name_label() -> None:
    # Synthetic: early SGLang releases labelled scheduler gauges with `name` (engines.md, issue 14).
    text = (
        "# TYPE sglang:num_running_reqs gauge\n"
        'sglang:num_running_reqs{name="Qwen/Qwen2-7B"} 3.0\n'
        "# TYPE sglang:num_queue_reqs gauge\n"
        'sglang:num_queue_reqs{name="Qwen/Qwen2-7B"} 1.0\n'
    )
    r = EngineParser().parse(text.encode())
    assert r.kind == "sglang" and r.models["Qwen/Qwen2-7B"].gauges == {"running": 3.0, "waiting": 1.0}


def test_unknown_engine_with_valid_text_names_the_prefixes_seen() -> None:
    text = "# TYPE foo_requests counter\nfoo_requests 1\nbar:queue 2\nprocess_open_fds 5\n"
    with pytest.raises(EngineScrapeError) as err:
        EngineParser().parse(text.encode())
    assert err.value.reason == "unknown_engine"
    assert "no known engine families; prefixes seen: foo_, bar:, process_" in str(err.value)
    with pytest.raises(EngineScrapeError) as err:
        EngineParser().parse(b"<html>hello</html>\n")
    assert err.value.reason == "not_prometheus"


@pytest.mark.parametrize(
    ("text", "reason"),
    [
        # two samples of one series (the 5 and -7, once summed to -2): Prometheus rejects the scrape
        (
            'vllm:num_requests_running{model_name="m"} 5\nvllm:num_requests_running{model_name="m"} -7\n',
            "duplicate_series",
        ),
        # the same series with its labels in another order is still the same series
        (
            'vllm:num_requests_running{a="1",model_name="m"} 5\nvllm:num_requests_running{model_name="m",a="1"} 5\n',
            "duplicate_series",
        ),
        (
            "# TYPE vllm:num_requests_running gauge\n# TYPE vllm:num_requests_running counter\n"
            'vllm:num_requests_running{model_name="m"} 1\n',
            "type_conflict",
        ),
        ('vllm:num_requests_running{model_name="m"} 1\n# TYPE vllm:num_requests_running gauge\n', "type_conflict"),
        ('# TYPE vllm:prompt_tokens_total counter\nvllm:prompt_tokens_total{model_name="m"} -5\n', "negative_value"),
        (
            "# TYPE vllm:e2e_request_latency_seconds histogram\n"
            'vllm:e2e_request_latency_seconds_bucket{le="1",model_name="m"} -1\n',
            "negative_value",
        ),
        (
            "# TYPE vllm:e2e_request_latency_seconds histogram\n"
            'vllm:e2e_request_latency_seconds_bucket{le="abc",model_name="m"} 1\n',
            "parse",
        ),
        # no TYPE line: the format allows le="abc", the histogram cannot be read
        ('vllm:e2e_request_latency_seconds_bucket{le="abc",model_name="m"} 1\n', "parse"),
        ("vllm:num_requests_running 1_2\n", "parse"),
        ('{"vllm:num_requests_running",model_name="m"} 1\nvllm:num_requests_running 1 NaN\n', "parse"),
    ],
)
def test_scrape_rules_reject_with_a_named_reason(text: str, reason: str) -> None:
    with pytest.raises(EngineScrapeError) as err:  # strict: the verdict on the line
        EngineParser(limits=EngineLimits(max_bad_lines=0)).parse(text.encode())
    assert err.value.reason == reason, str(err.value)
    assert "line " in str(err.value) or reason == "parse"
    # tolerant (the default): the line is dropped and counted; when nothing the adapter reads is left, the scrape
    # fails with the same reason
    parser = EngineParser()
    try:
        parser.parse(text.encode())
    except EngineScrapeError as exc:  # nothing left; or an le no number in a family without TYPE (the mapping's)
        assert exc.reason == reason
    else:
        assert parser.dropped_lines()[reason] == 1 and parser.problems[0][0] == reason


def test_valid_corners_the_old_reader_refused_or_dropped() -> None:
    text = (
        'vllm:num_requests_running {model_name="a"} 1\n'  # blank before {
        'vllm:num_requests_waiting{model_name="a"}\t2\n'  # tab before the value
        '   vllm:num_requests_running{model_name="b"} 3\n'  # leading blanks
        '{"vllm:num_requests_waiting",model_name="b"} 4\n'  # Prometheus 3 quoted name
    )
    r = EngineParser().parse(text.encode())
    assert r.models["a"].gauges == {"running": 1.0, "waiting": 2.0}
    assert r.models["b"].gauges == {"running": 3.0, "waiting": 4.0}


@pytest.mark.parametrize(
    ("text", "reason"),
    [
        # no TYPE line: the format allows any value; the adapter knows what each family means
        ('vllm:kv_cache_usage_perc{model_name="m"} -1e308\n', "negative_value"),
        ('vllm:kv_cache_usage_perc{model_name="m"} 1.5\n', "out_of_range"),
        ('vllm:kv_cache_usage_perc{model_name="m"} +Inf\n', "out_of_range"),
        ('vllm:num_requests_waiting{model_name="m"} -3\n', "negative_value"),
        ('vllm:prompt_tokens_total{model_name="m"} -5\n', "negative_value"),
        ('vllm:request_success_total{finished_reason="stop",model_name="m"} -1\n', "negative_value"),
        ('vllm:e2e_request_latency_seconds_bucket{le="+Inf",model_name="m"} -1\n', "negative_value"),
        (
            'vllm:e2e_request_latency_seconds_bucket{le="+Inf",model_name="m"} 1\n'
            'vllm:e2e_request_latency_seconds_sum{model_name="m"} -0.5\n'
            'vllm:e2e_request_latency_seconds_count{model_name="m"} 1\n',
            "negative_value",
        ),
        (
            "# TYPE vllm:e2e_request_latency_seconds histogram\n"
            'vllm:e2e_request_latency_seconds_bucket{le="+Inf",model_name="m"} 1\n'
            'vllm:e2e_request_latency_seconds_sum{model_name="m"} -1e308\n'  # the format allows a negative sum
            'vllm:e2e_request_latency_seconds_count{model_name="m"} 1\n',
            "negative_value",
        ),
    ],
)
def test_values_outside_their_quantity_are_rejected(text: str, reason: str) -> None:
    with pytest.raises(EngineScrapeError) as err:
        EngineParser().parse(text.encode())
    assert err.value.reason == reason, str(err.value)
    assert "vllm:" in str(err.value)


def test_values_on_the_edges_of_their_domain_are_read() -> None:
    text = (
        'vllm:kv_cache_usage_perc{model_name="a"} 0\nvllm:kv_cache_usage_perc{model_name="b"} 1\n'
        'vllm:num_requests_running{model_name="a"} 0\nvllm:prompt_tokens_total{model_name="a"} 0\n'
    )
    reading = EngineParser().parse(text.encode())
    assert reading.models["a"].gauges == {"kv_usage": 0.0, "running": 0.0}
    assert reading.models["b"].gauges == {"kv_usage": 1.0}


def test_a_token_counter_going_down_is_a_reset_not_a_rejection() -> None:
    """As Prometheus' ``increase``: a lower value is a restart; the increase after it is the new value."""
    from inferwatch.agent.node.engine.derived import EngineTimeline
    from inferwatch.agent.node.engine.emit import reading_samples

    def body(prompt_tokens: float, seconds: float) -> bytes:
        return (
            "# TYPE llamacpp:prompt_tokens_total counter\n"
            f"llamacpp:prompt_tokens_total {prompt_tokens}\n"
            "# TYPE llamacpp:prompt_seconds_total counter\n"
            f"llamacpp:prompt_seconds_total {seconds}\n"
        ).encode()

    parser, timeline = EngineParser("llamacpp"), EngineTimeline()
    for t, (tokens, secs) in enumerate([(1000, 10.0), (400, 2.0)]):
        reading = parser.parse(body(tokens, secs))
        timeline.update(float(t), reading)
    exported = [s for s in reading_samples(reading) if s.name == "inferwatch.engine.tokens"]
    assert [s.value for s in exported] == [400]  # what the engine says now; rate() downstream sees the reset
    token_time = [s for s in timeline.derived_samples({}) if s.name == "inferwatch.engine.token_time"]
    assert {s.value for s in token_time} == {2.0 / 400}  # the increase after the reset is the new value
