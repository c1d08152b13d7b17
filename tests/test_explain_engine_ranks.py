"""The running agent feeds the tail explainer the engine's per-rank series: a slow data-parallel rank is named
behind stock vLLM spans (no ``vllm.dp_rank`` on them), from each rank's ITL histogram read off /metrics."""

from __future__ import annotations

import subprocess
import time

import httpx
import pytest

from inferwatch.agent.node.analytics.explain import TailExplainer
from inferwatch.agent.node.analytics.tailcauses import EngineCounters
from inferwatch.agent.node.engine.rankitl import rank_itl
from inferwatch.agent.node.engine.scrape import EngineParser
from tests.conftest import PYTHON, ROOT
from tests.procs import agent_beside_simulator

MODEL = "meta-llama/Llama-3.1-8B-Instruct"

EXPOSITION = """\
# HELP vllm:inter_token_latency_seconds Histogram of inter-token latency in seconds.
# TYPE vllm:inter_token_latency_seconds histogram
vllm:inter_token_latency_seconds_bucket{engine="0",le="0.01",model_name="m"} 50.0
vllm:inter_token_latency_seconds_bucket{engine="0",le="+Inf",model_name="m"} 100.0
vllm:inter_token_latency_seconds_sum{engine="0",model_name="m"} 1.5
vllm:inter_token_latency_seconds_count{engine="0",model_name="m"} 100.0
vllm:inter_token_latency_seconds_bucket{engine="1",le="0.01",model_name="m"} 0.0
vllm:inter_token_latency_seconds_bucket{engine="1",le="+Inf",model_name="m"} 40.0
vllm:inter_token_latency_seconds_sum{engine="1",model_name="m"} 1.8
vllm:inter_token_latency_seconds_count{engine="1",model_name="m"} 40.0
"""


def test_rank_itl_keeps_each_rank_of_the_itl_histogram() -> None:
    stream = EngineParser("vllm", "unknown").stream()
    stream.feed(EXPOSITION.encode())
    assert rank_itl(stream.finish()) == {"m": {"0": [1.5, 100.0], "1": [1.8, 40.0]}}
    one_rank = EngineParser("vllm", "unknown").stream()
    one_rank.feed("\n".join(line for line in EXPOSITION.splitlines() if 'engine="1"' not in line).encode() + b"\n")
    assert rank_itl(one_rank.finish()) == {}  # one rank has nothing to be compared with


def test_engine_counters_give_each_ranks_mean_itl_over_the_window() -> None:
    counters = EngineCounters()
    counters.observe_ranks("m", {"0": [10.0, 1000.0], "1": [10.0, 1000.0]}, now=0.0)
    counters.observe_ranks("m", {"0": [11.0, 1100.0], "1": [13.0, 1100.0]}, now=60.0)  # rank 1: 30 ms a token
    counters.observe_ranks("m", {"0": [12.0, 1200.0], "1": [16.0, 1200.0]}, now=120.0)
    got = counters.signals(["m"], 60.0, 120.0)
    assert got is not None and got.preemptions is None
    assert got.rank_itl_s == pytest.approx({"0": 0.01, "1": 0.03})
    # a restart (counts went down) starts again: one reading, no window yet
    counters.observe_ranks("m", {"0": [0.1, 10.0], "1": [0.1, 10.0]}, now=130.0)
    assert counters.signals(["m"], 60.0, 130.0) is None
    # through the explainer: the collection's details["rank_itl"] as the processor hands it over
    clock = iter([0.0, 60.0])
    explainer = TailExplainer(clock=lambda: next(clock))
    explainer.observe_engine([], {"m": {"0": [1.0, 100.0], "1": [1.0, 100.0]}})
    explainer.observe_engine([], {"m": {"0": [2.0, 200.0], "1": [4.0, 200.0]}})
    got = explainer.engine.signals(["m"], 60.0, 60.0)
    assert got is not None and got.rank_itl_s == pytest.approx({"0": 0.01, "1": 0.03})


AGENT_ENV = {"INFERWATCH_ENGINE__METRICS_URL": "http://127.0.0.1:{sim_port}/metrics", "INFERWATCH_INTERVAL_S": "1"}


def _load(sim_port: int, count: int) -> None:
    """``count`` requests at 16/s from the load generator, outputs of 16-64 tokens."""
    out = subprocess.run(
        [PYTHON, "-m", "inferwatch.agent", "loadgen", "--url", f"http://127.0.0.1:{sim_port}", "--json", "--count",
         str(count), "--rate", "16", "--seed", "3", "--output-tokens", "uniform:16:64"],
        cwd=ROOT, capture_output=True, text=True, timeout=180,
    )  # fmt: skip
    assert out.returncode == 0, out.stderr


@pytest.mark.integration
@pytest.mark.slow
def test_a_slow_rank_is_named_behind_stock_spans(tmp_path) -> None:
    """The simulator with two data-parallel engines, rank 1 three times slower, spans as stock vLLM sends them; the
    agent reads its /metrics and receives its spans; ``/api/v1/explain`` names dp_rank=1 from the engine's series."""
    sim_args = ["--engines", "2", "--seed", "6", "--scenario", "slow_rank", "--stock-spans"]
    count = 400
    with agent_beside_simulator(tmp_path, sim_args, AGENT_ENV) as (base, sim_port, _):
        _load(sim_port, count)
        deadline = time.monotonic() + 120  # bounds a hang (CI's load 10-17 on 2 cores)
        while True:  # the last spans and one more engine read after the load
            report = httpx.get(f"{base}/api/v1/explain", params={"window": "5m", "top": 3}, timeout=10).json()
            e2e = report.get("quantities", {}).get("e2e", {})
            if (report.get("requests", 0) >= count and e2e.get("driver") == "dp_rank") or time.monotonic() > deadline:
                break
            time.sleep(0.5)
        text = httpx.get(f"{base}/api/v1/explain", params={"window": "5m", "format": "text"}, timeout=10).text
    assert report.get("requests", 0) >= count, report
    # stock spans: no rank on any request, so no dp_rank value among the tail's attributes
    for q in ("ttft", "e2e"):
        assert not any(s["attribute"] == "dp_rank" for s in report["quantities"][q]["separators"]), report
    assert e2e["driver"] == "dp_rank", e2e
    slow = e2e["slow_placement"]
    assert slow["value"] == "1" and slow["source"] == "engine per-rank series" and slow["itl_ratio"] >= 2.0, slow
    assert "dp_rank=1" in text, text


@pytest.mark.integration
@pytest.mark.slow
def test_the_engines_kv_cache_usage_and_preemptions_reach_the_verdict(tmp_path) -> None:
    """The simulator with its KV cache cut (``kv_saturation``), stock spans: the agent hands the explainer the
    engine's preemption counter and KV-cache usage read off /metrics, and the report shows them over the window."""
    sim_args = ["--seed", "7", "--scenario", "kv_saturation", "--stock-spans"]
    count = 200
    with agent_beside_simulator(tmp_path, sim_args, AGENT_ENV) as (base, sim_port, _):
        _load(sim_port, count)
        deadline = time.monotonic() + 120  # bounds a hang (CI's load 10-17 on 2 cores)
        while True:
            report = httpx.get(f"{base}/api/v1/explain", params={"window": "5m", "top": 0}, timeout=10).json()
            signals = report.get("engine_signals") or {}
            done = report.get("requests", 0) >= count and (signals.get("preemptions") or 0) > 0
            if done or time.monotonic() > deadline:
                break
            time.sleep(0.5)
    assert report.get("requests", 0) >= count, report
    assert signals.get("preemptions", 0) > 0, signals  # the cut cache preempted: the counter's increase
    assert signals.get("kv_usage_max") is not None and signals["kv_usage_max"] >= 0.9, signals  # and ran full
