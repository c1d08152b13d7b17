"""Ground truth of the tail explainer's out-of-sample benchmark: which injected effect added how many seconds to each
simulated request's TTFT (simulator/engine.py, ``SimRequest.causes``), and which causes were effective in a window
(benchmarks/tail_explain.py, ``ground_truth``). The engine cases run a handful of requests spaced far apart, so each
effect acts alone and its seconds are known from the request's own timestamps."""

from __future__ import annotations

import importlib.util
import sys
from pathlib import Path
from types import ModuleType

import pytest

from inferwatch.simulator.engine import EngineCore, Recorder, SimRequest, run_offline
from inferwatch.simulator.profiles import deploy
from inferwatch.simulator.scenarios import ScenarioSet, make

MODEL = "meta-llama/Llama-3.1-8B-Instruct"


@pytest.fixture(scope="module")
def bench() -> ModuleType:
    path = Path(__file__).resolve().parents[1] / "benchmarks" / "tail_explain.py"
    spec = importlib.util.spec_from_file_location("tail_explain_bench", path)
    assert spec is not None and spec.loader is not None
    mod = sys.modules["tail_explain_bench"] = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(mod)
    return mod


def _spaced(n: int, prompt: int = 512, gap_s: float = 5.0) -> list[SimRequest]:
    return [SimRequest(f"r{k}", prompt, 8, 1.0 + gap_s * k, ignore_eos=True) for k in range(n)]


def _run(scenarios: list, reqs: list[SimRequest], index: int = 0) -> list[SimRequest]:
    rec = Recorder()
    core = EngineCore(index, deploy(MODEL, "h100"), ScenarioSet(scenarios), rec, seed=3)
    run_offline(core, reqs)
    assert len(rec.finished) == len(reqs)
    return rec.finished


def test_stall_is_page_cache_not_slow_rank() -> None:
    """A page-cache stall on the slow rank: the stall's own seconds go to page_cache_pressure, and slow_rank gets
    (1 - 1/3) of the prefill steps only, never a part of the stall."""
    stall_s = 0.5
    done = _run(
        [make("page_cache_pressure", {"fraction": 1.0, "extra_s": stall_s}), make("slow_rank", {"engine": 0})],
        _spaced(5),
    )
    for r in done:
        assert r.first_scheduled is not None and r.first_token is not None
        stall = r.stall_until - r.first_scheduled
        assert 0.3 < stall < 0.8
        assert r.causes["page_cache_pressure"] == pytest.approx(stall)
        prefill = r.first_token - r.stall_until  # alone on the engine: one step (or a few) right after the stall
        assert r.causes["slow_rank"] == pytest.approx(prefill * 2 / 3, rel=0.05)
        assert r.causes["slow_rank"] < 0.1 * stall  # a stall put on the slow rank would be >= 2/3 of it
        assert set(r.causes) == {"page_cache_pressure", "slow_rank"}


def test_frontend_delay_exact_and_alone() -> None:
    done = _run([make("frontend_delay", {"fraction": 1.0, "extra_s": 0.4})], _spaced(4))
    for r in done:
        front = r.queued - r.arrival
        assert set(r.causes) == {"frontend_delay"}
        assert 0.3 < r.causes["frontend_delay"] < front < r.causes["frontend_delay"] + 0.05


def test_healthy_and_other_engine_claim_nothing() -> None:
    """No scenario, or the slow rank being another engine: nothing is attributed."""
    assert all(not r.causes for r in _run([], _spaced(4)))
    assert all(not r.causes for r in _run([make("slow_rank", {"engine": 1})], _spaced(4), index=0))


def test_queue_behind_a_burst_is_the_bursts() -> None:
    """100 requests at once on a 32-slot engine: those of the injected burst wait for slots, and that wait is the
    burst's (all of it but the first step, during which they waited for the step's end, not for a slot), and so is
    the burst's share of the prefill steps they share; the same arrivals untagged claim nothing (queueing under the
    traffic's own load)."""

    def burst(tag: str) -> list[SimRequest]:
        return [SimRequest(f"b{k}", 512, 64, 1.0 + 1e-4 * k, ignore_eos=True, injected=tag) for k in range(100)]

    done = _run([], burst("arrival_burst"))
    waited = [r for r in done if r.first_scheduled is not None and r.first_scheduled - r.queued > 0.05]
    assert len(waited) >= 30
    for r in waited:
        assert r.first_scheduled is not None
        wait = r.first_scheduled - r.queued
        assert r.first_token is not None
        assert wait - 0.05 < r.causes["arrival_burst"] <= r.first_token - r.queued
        assert set(r.causes) == {"arrival_burst"}
    assert all(not r.causes for r in _run([], burst("")))


def _req(k: int, ttft: float, causes: dict[str, float]) -> SimRequest:
    r = SimRequest(f"c{k}", 100, 10, float(k))
    r.first_token = r.arrival + ttft
    r.causes = dict(causes)
    return r


def test_ground_truth_names_the_stall(bench: ModuleType) -> None:
    """98 requests at 100 ms, 2 slow ones whose excess is mostly a page-cache stall and a little slow rank."""
    reqs = [_req(k, 0.1, {}) for k in range(98)]
    reqs += [_req(98 + k, 0.9, {"page_cache_pressure": 0.6, "slow_rank": 0.1}) for k in range(2)]
    gt = bench.ground_truth(reqs, ("page_cache", "dp_rank"))
    assert gt["shares"]["page_cache"] == pytest.approx(0.75)
    assert gt["shares"]["dp_rank"] == pytest.approx(0.125)
    assert gt["effective"] == ["page_cache"] and gt["dominant"] == "page_cache"
    assert bench.right_by_groundtruth(gt, "prefill", ["prefill"])
    assert not bench.right_by_groundtruth(gt, "dp_rank", ["dp_rank", "prefill"])


def test_ground_truth_two_effective_and_clipped(bench: ModuleType) -> None:
    reqs = [_req(k, 0.1, {"frontend_delay": 0.05}) for k in range(98)]
    reqs += [_req(98 + k, 1.1, {"frontend_delay": 0.9, "kv_blocks": 0.6}) for k in range(2)]
    gt = bench.ground_truth(reqs, ("frontend", "preemption"))
    # 1.5 s claimed for 1.0 s of excess: shared pro rata, never over the excess
    assert gt["shares"] == pytest.approx({"frontend": 0.6, "preemption": 0.4})
    assert gt["effective"] == ["frontend", "preemption"]
    assert bench.right_by_groundtruth(gt, "frontend", ["frontend", "preemption"])
    assert not bench.right_by_groundtruth(gt, "frontend", ["frontend"])


def test_ground_truth_no_effective_cause(bench: ModuleType) -> None:
    """The cause was injected but the tail is the traffic's own (no request above P99 carries it): healthy-like."""
    reqs = [_req(k, 0.1, {"kv_blocks": 0.01} if k < 10 else {}) for k in range(98)]
    reqs += [_req(98 + k, 0.8, {}) for k in range(2)]
    gt = bench.ground_truth(reqs, ("preemption",))
    assert gt["effective"] == [] and gt["dominant"] is None
    assert bench.right_by_groundtruth(gt, "none", [])
    assert not bench.right_by_groundtruth(gt, "preemption", ["preemption"])
