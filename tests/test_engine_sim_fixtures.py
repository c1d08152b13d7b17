"""The vLLM adapter on the simulator's real expositions (tests/fixtures/sim, see its SOURCE note).

Issue 4's acceptance "unit tests on the simulator's output": aggregation over data-parallel engines,
several models, old and new metric names, and a counter reset (engine restart) between two scrapes.
Every expectation is computed from prometheus_client's independent parse of the same file.
"""

from __future__ import annotations

import functools
import math
from collections import defaultdict
from pathlib import Path

import pytest
from prometheus_client.parser import text_string_to_metric_families

from inferwatch.agent.node.engine.adapters import QUANTITIES, EngineReading
from inferwatch.agent.node.engine.histogram import Histogram, bucket_quantile, sum_histograms
from inferwatch.agent.node.engine.inspect import inspect
from inferwatch.agent.node.engine.scrape import EngineParser
from inferwatch.agent.node.engine.windows import HistogramWindow
from tests.conftest import FIXTURES

SIM = FIXTURES / "sim"
MODELS = ("Qwen/Qwen2.5-0.5B-Instruct", "meta-llama/Llama-3.1-8B-Instruct")
FILES = ("vllm-sim-dp2-a.prom", "vllm-sim-dp2-b.prom", "vllm-sim-dp2-restarted.prom", "vllm-sim-dp2-hidden.prom")
FAMILY = {
    "ttft": "vllm:time_to_first_token_seconds",
    "itl": "vllm:inter_token_latency_seconds",
    "e2e": "vllm:e2e_request_latency_seconds",
    "queue": "vllm:request_queue_time_seconds",
    "prefill": "vllm:request_prefill_time_seconds",
    "decode": "vllm:request_decode_time_seconds",
    "inference": "vllm:request_inference_time_seconds",
}
DEPRECATED_ITL = "vllm:time_per_output_token_seconds"


def parse_text(text: str) -> EngineReading:
    return EngineParser("auto", "unknown").parse(text.encode())


def parse(name: str) -> EngineReading:
    return EngineParser("auto", "unknown").parse((SIM / name).read_bytes())


Series = dict[tuple[str, str], dict[str, float]]  # (model, engine) -> {le or "": value}


@functools.cache
def _independent_all(text: str) -> dict[str, Series]:
    out: dict[str, Series] = defaultdict(lambda: defaultdict(dict))
    for family in text_string_to_metric_families(text):
        for s in family.samples:
            if "model_name" in s.labels:
                key = s.labels.get("le", s.labels.get("finished_reason", ""))
                out[s.name][(s.labels["model_name"], s.labels["engine"])][key] = s.value
    return out


def independent(text: str, sample: str) -> Series:
    """prometheus_client's reading of one sample name: per (model, engine), by ``le`` (or ``""``)."""
    return _independent_all(text).get(sample, {})


def per_engine_hist(text: str, family: str, model: str) -> dict[str, Histogram]:
    buckets = independent(text, family + "_bucket")
    sums, counts = independent(text, family + "_sum"), independent(text, family + "_count")
    return {
        engine: Histogram(
            tuple(sorted((float(le), v) for le, v in buckets[(m, engine)].items())),
            sums[(m, engine)][""],
            counts[(m, engine)][""],
        )
        for (m, engine) in buckets
        if m == model
    }


def cumulative(reading: EngineReading, model: str, quantity: str) -> Histogram:
    h = sum_histograms(reading.models[model].histograms[quantity].values())
    assert h is not None
    return h


@pytest.mark.parametrize("name", FILES)
def test_every_model_summed_over_both_engines(name: str) -> None:
    text = (SIM / name).read_text()
    r = parse(name)
    assert r.kind == "vllm" and sorted(r.models) == list(MODELS)
    for model in MODELS:
        m = r.models[model]
        assert set(m.histograms) == set(QUANTITIES)
        for quantity, family in FAMILY.items():
            assert set(m.histograms[quantity]) == {(("engine", "0"),), (("engine", "1"),)}
            ref = per_engine_hist(text, family, model)
            assert set(ref) == {"0", "1"} and all(h.count > 0 for h in ref.values())  # both engines served
            want = sum_histograms(ref.values())
            got = cumulative(r, model, quantity)
            assert want is not None and got.buckets == want.buckets and got.count == want.count
            assert got.sum == pytest.approx(want.sum, rel=1e-12)
        for counter, sample in (("prompt_tokens", "vllm:prompt_tokens_total"),
                                ("generation_tokens", "vllm:generation_tokens_total")):  # fmt: skip
            want_total = sum(v[""] for (mm, _e), v in independent(text, sample).items() if mm == model)
            assert sum(m.counters[counter].values()) == want_total > 0
        finished: dict[str, float] = defaultdict(float)
        for (mm, _e), by_reason in independent(text, "vllm:request_success_total").items():
            if mm == model:
                for reason, v in by_reason.items():
                    finished[reason] += v
        assert m.counters["finished"] == dict(finished)
        # every finished request is one e2e observation, summed over both engines
        assert sum(finished.values()) == cumulative(r, model, "e2e").count
        for gauge, sample in (("running", "vllm:num_requests_running"), ("waiting", "vllm:num_requests_waiting")):
            assert m.gauges[gauge] == sum(v[""] for (mm, _e), v in independent(text, sample).items() if mm == model)
        kv = [v[""] for (mm, _e), v in independent(text, "vllm:kv_cache_usage_perc").items() if mm == model]
        assert m.gauges["kv_usage"] == pytest.approx(sum(kv) / len(kv))


def test_current_names_win_and_deprecated_ones_are_read_alone() -> None:
    text = (SIM / "vllm-sim-dp2-hidden.prom").read_text()
    assert DEPRECATED_ITL + "_bucket" in text and "vllm:gpu_cache_usage_perc{" in text
    both = parse_text(text)
    for model in MODELS:
        assert both.models[model].sources["itl"] == "vllm:inter_token_latency_seconds"
        assert both.models[model].sources["kv_usage"] == "vllm:kv_cache_usage_perc"
    # An engine exposing only the deprecated names (vLLM <= 0.10 style): drop the current families.
    old_only = "\n".join(
        line
        for line in text.splitlines()
        if "vllm:inter_token_latency_seconds" not in line and "vllm:kv_cache_usage_perc" not in line
    )
    old = parse_text(old_only + "\n")
    for model in MODELS:
        m = old.models[model]
        assert m.sources["itl"] == DEPRECATED_ITL and m.sources["kv_usage"] == "vllm:gpu_cache_usage_perc"
        want = sum_histograms(per_engine_hist(text, DEPRECATED_ITL, model).values())
        assert want is not None and cumulative(old, model, "itl").buckets == want.buckets
        # the simulator observes both ITL names with the same values, as vLLM does
        assert cumulative(old, model, "itl").buckets == cumulative(both, model, "itl").buckets
        assert m.gauges["kv_usage"] == both.models[model].gauges["kv_usage"]


def _window_increase(first: EngineReading, second: EngineReading, model: str, quantity: str) -> Histogram:
    w = HistogramWindow(horizon_s=math.inf)
    w.update(0.0, first.models[model].histograms[quantity])
    w.update(15.0, second.models[model].histograms[quantity])
    h = w.window(60.0)
    assert h is not None
    return h


def test_later_scrape_gives_the_increase_per_bucket() -> None:
    a_text, b_text = (SIM / "vllm-sim-dp2-a.prom").read_text(), (SIM / "vllm-sim-dp2-b.prom").read_text()
    a, b = parse("vllm-sim-dp2-a.prom"), parse("vllm-sim-dp2-b.prom")
    for model in MODELS:
        for quantity, family in FAMILY.items():
            before, after = per_engine_hist(a_text, family, model), per_engine_hist(b_text, family, model)
            want: dict[float, float] = defaultdict(float)
            for engine, h in after.items():
                prev = before[engine].as_map()
                for le, c in h.buckets:
                    assert c >= prev[le]  # no reset between a and b
                    want[le] += c - prev[le]
            got = _window_increase(a, b, model, quantity)
            assert dict(got.buckets) == dict(want)
            assert got.count == sum(after[e].count - before[e].count for e in after)
        assert _window_increase(a, b, model, "e2e").count == 60  # the second batch, on both engines together


def test_engine_restart_is_a_counter_reset() -> None:
    b_text, r_text = (SIM / "vllm-sim-dp2-b.prom").read_text(), (SIM / "vllm-sim-dp2-restarted.prom").read_text()
    b, restarted = parse("vllm-sim-dp2-b.prom"), parse("vllm-sim-dp2-restarted.prom")
    for model in MODELS:
        for quantity, family in FAMILY.items():
            before, after = per_engine_hist(b_text, family, model), per_engine_hist(r_text, family, model)
            want: dict[float, float] = defaultdict(float)
            for engine, h in after.items():
                prev = before[engine].as_map()
                for le, c in h.buckets:
                    # the recording makes every non-empty bucket lower after the restart (a reset)
                    assert c < prev[le] or c == prev[le] == 0
                    want[le] += c
            got = _window_increase(b, restarted, model, quantity)
            assert dict(got.buckets) == dict(want)  # increase() after a reset: the new value
            for q in (0.5, 0.99):
                assert got.quantile(q) == bucket_quantile(q, sorted(want.items()))
        assert _window_increase(b, restarted, model, "e2e").count == 20
        # a naive difference would be negative; the reset-aware one never is
        assert all(c >= 0 for _, c in _window_increase(b, restarted, model, "ttft").buckets)


def test_inspect_against_a_baseline_on_simulator_output() -> None:
    out = inspect(parse("vllm-sim-dp2-b.prom"), parse("vllm-sim-dp2-a.prom"))
    assert out["engine"] == "vllm" and sorted(out["models"]) == list(MODELS)
    for model in MODELS:
        ttft = out["models"][model]["ttft"]
        assert ttft["count"] == 60 and ttft["source"] == "histogram"
        assert 0 < ttft["p50"] <= ttft["p90"] <= ttft["p95"] <= ttft["p99"]
        assert out["absent"][model] == []


def test_fixture_files_are_the_recorded_ones() -> None:
    for name in FILES:
        assert (SIM / name).stat().st_size > 10_000
    assert Path(SIM / "vllm-sim-dp2.prom.SOURCE.md").is_file()
