"""Every adapter on its fixtures: canonical quantities, data-parallel aggregation, absence, old/new names."""

from __future__ import annotations

import math
from collections import defaultdict

import pytest
from prometheus_client.parser import text_string_to_metric_families

from agent.engine.adapters import EngineReading
from agent.engine.fetch import EngineScrapeError
from agent.engine.histogram import sum_histograms
from agent.engine.scrape import EngineParser
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
