"""The simulator's engine signals (issue 18) in vLLM's names, labels and buckets, and the fault scenarios that move
them: prefix-cache collapse, KV saturation with a preemption storm, speculative-decoding acceptance collapse, LoRA
slot exhaustion, a slow KV transfer in a P/D pair.

Each run drives the real scheduler offline (virtual time) with the real vLLM metric families, then reads the
exposition with the agent's own parser, as the agent would on a scrape.
"""

from __future__ import annotations

import random

import pytest
from prometheus_client import generate_latest
from prometheus_client.parser import text_string_to_metric_families

from inferwatch.agent.node.engine.emit import reading_samples
from inferwatch.agent.node.engine.scrape import EngineParser
from inferwatch.simulator.engine import EngineCore, Features, SimRequest, run_offline
from inferwatch.simulator.metrics import NIXL_BYTES_BUCKETS, VllmMetrics
from inferwatch.simulator.profiles import deploy
from inferwatch.simulator.runtime import _Listener
from inferwatch.simulator.scenarios import ScenarioSet, make
from tests.conftest import FIXTURES

MODEL = "meta-llama/Llama-3.1-8B-Instruct"
Got = dict[tuple[str, tuple[tuple[str, str], ...]], float]
Run = tuple[EngineCore, Got, str]
SIGNALS = FIXTURES / "engines" / "vllm-v1-signals-dp2.prom"
M = "gen_ai.request.model"
FEATURES = Features(num_speculative_tokens=3, max_loras=2, kv_connector=True)


def requests(n: int, rate: float, seed: int = 1, prompt: int = 700, out_tokens: int = 32) -> list[SimRequest]:
    """Chat-like traffic: a 512-token shared system prompt + a user turn, 32 output tokens."""
    rng = random.Random(seed)
    t = 0.0
    out = []
    for k in range(n):
        t += rng.expovariate(rate)
        out.append(
            SimRequest(
                f"req-{k}",
                prompt,
                out_tokens,
                t,
                ignore_eos=True,
                prefix_key=7,
                prefix_tokens=512 if prompt > 512 else 64,
            )
        )
    return out


def simulate(
    *scenarios: str,
    features: Features = FEATURES,
    n: int = 300,
    rate: float = 20.0,
    out_tokens: int = 32,
    **params: float,
) -> Run:
    dep = deploy(MODEL, "h100")
    metrics = VllmMetrics(dep.size.max_model_len, process_metrics=False, features=features)
    sset = ScenarioSet(make(s, params) for s in scenarios)
    core = EngineCore(0, dep, sset, _Listener(metrics.engine(MODEL, 0, dep), None), seed=3, features=features)
    run_offline(core, requests(n, rate, prompt=700 if out_tokens <= 32 else 128, out_tokens=out_tokens))
    text = generate_latest(metrics.registry).decode()
    reading = EngineParser("auto", "unknown").parse(text.encode())
    got = {(s.name, s.attributes): getattr(s, "value", 0.0) for s in reading_samples(reading)}
    return core, got, text


def v(got: Got, name: str, **labels: str) -> float:
    key = (name, tuple(sorted({M: MODEL, **labels}.items())))
    assert key in got, f"{name}{labels} missing"
    return got[key]


@pytest.fixture(scope="module")
def healthy() -> Run:
    return simulate()


def test_families_labels_and_buckets_are_vllms(healthy: Run) -> None:
    _core, _got, text = healthy
    fams = {f.name: f for f in text_string_to_metric_families(text)}
    ref = {f.name: f for f in text_string_to_metric_families(SIGNALS.read_text())}
    for name in (
        "vllm:prefix_cache_queries",
        "vllm:prompt_tokens_by_source",
        "vllm:prompt_tokens_cached",
        "vllm:spec_decode_num_drafts",
        "vllm:spec_decode_num_draft_tokens",
        "vllm:spec_decode_num_accepted_tokens",
        "vllm:spec_decode_num_accepted_tokens_per_pos",
        "vllm:lora_requests_info",
        "vllm:nixl_xfer_time_seconds",
        "vllm:nixl_num_failed_transfers",
    ):
        assert name in fams and fams[name].type == ref[name].type, name
        ours = {k for s in fams[name].samples for k in s.labels} - {"le"}
        theirs = {k for s in ref[name].samples for k in s.labels} - {"le"}
        assert ours == theirs, (name, ours, theirs)
    les = [s.labels["le"] for s in fams["vllm:nixl_xfer_time_seconds"].samples if s.name.endswith("_bucket")]
    want = [s.labels["le"] for s in ref["vllm:nixl_xfer_time_seconds"].samples if s.name.endswith("_bucket")][:13]
    assert les == want  # 0.005 .. 5.0, +Inf (vLLM drops the 0.001 edge of its list)
    nbytes = {float(s.labels["le"]) for s in fams["vllm:nixl_bytes_transferred"].samples if s.name.endswith("_bucket")}
    assert nbytes == {2.0**11, 2.0**13, *(float(b) for b in NIXL_BYTES_BUCKETS), float("inf")}
    assert len(NIXL_BYTES_BUCKETS) == 12 and NIXL_BYTES_BUCKETS[-1] == 2**33
    positions = {s.labels["position"] for s in fams["vllm:spec_decode_num_accepted_tokens_per_pos"].samples}
    assert positions == {"0", "1", "2"}


def test_healthy_signals(healthy: Run) -> None:
    _core, got, _ = healthy
    hits = v(got, "inferwatch.engine.prefix_cache.hits", cache="local")
    queries = v(got, "inferwatch.engine.prefix_cache.queries", cache="local")
    assert 0.6 < hits / queries < 0.75  # 512 of 700 prompt tokens shared (block-aligned), first request misses
    by = {
        s: v(got, "inferwatch.engine.prompt_tokens.by_source", source=s)
        for s in ("local_compute", "local_cache_hit", "external_kv_transfer")
    }
    assert by["local_cache_hit"] == hits and by["local_compute"] == 0  # decode side of a P/D pair: pulled, not computed
    assert sum(by.values()) == queries
    external = v(got, "inferwatch.engine.prefix_cache.queries", cache="external")
    assert external == by["external_kv_transfer"] == v(got, "inferwatch.engine.prefix_cache.hits", cache="external")
    assert v(got, "inferwatch.engine.tokens", type="cached") == by["local_cache_hit"] + by["external_kv_transfer"]
    drafts = v(got, "inferwatch.engine.spec_decode.drafts")
    accepted = v(got, "inferwatch.engine.spec_decode.accepted_tokens")
    assert v(got, "inferwatch.engine.spec_decode.draft_tokens") == 3 * drafts
    p0 = v(got, "inferwatch.engine.spec_decode.accepted_by_position", position="0") / drafts
    p1 = v(got, "inferwatch.engine.spec_decode.accepted_by_position", position="1") / drafts
    assert p0 == pytest.approx(0.8, abs=0.02) and p1 == pytest.approx(0.64, abs=0.03)
    assert 1 + accepted / drafts == pytest.approx(1 + 0.8 + 0.64 + 0.512, abs=0.05)
    assert v(got, "inferwatch.engine.preemptions") == 0
    assert v(got, "inferwatch.engine.lora.max_adapters") == 2
    assert v(got, "inferwatch.engine.lora.blocked") == 0


def test_prefix_cache_collapse() -> None:
    _core, got, _ = simulate("prefix_cache_collapse")
    assert v(got, "inferwatch.engine.prefix_cache.hits", cache="local") == 0


def test_spec_decode_collapse() -> None:
    _core, got, _ = simulate("spec_decode_collapse", acceptance=0.1)
    rate = v(got, "inferwatch.engine.spec_decode.accepted_tokens") / v(
        got, "inferwatch.engine.spec_decode.draft_tokens"
    )
    assert rate == pytest.approx((0.1 + 0.01 + 0.001) / 3, abs=0.01)


def test_kv_saturation_preemption_storm() -> None:
    core, got, _ = simulate("kv_saturation", fraction=0.01, n=200, out_tokens=256)
    assert v(got, "inferwatch.engine.preemptions") >= 50
    assert core.reserved_blocks > 0.9 * core.total_blocks


def test_kv_saturation_queues_at_compose_load() -> None:
    """At 2 req/s and 32 output tokens (compose's load) the default scenario must still starve the scheduler of
    blocks: requests queue for them (a 5 % cache of an H100 alone would hold dozens of these requests)."""

    def mean_queue_s(text: str) -> float:
        f = {f.name: f for f in text_string_to_metric_families(text)}["vllm:request_queue_time_seconds"]
        vals = {s.name: s.value for s in f.samples if not s.name.endswith("_bucket")}
        return vals["vllm:request_queue_time_seconds_sum"] / vals["vllm:request_queue_time_seconds_count"]

    core, _g, text = simulate("kv_saturation", n=300, rate=2.0)
    _c, _g, healthy = simulate(n=300, rate=2.0)
    assert core.total_blocks - core.reserved_blocks == 64
    assert mean_queue_s(text) > 20 * max(mean_queue_s(healthy), 0.001)


def test_slow_kv_transfer() -> None:
    _c, _g, text = simulate("slow_kv_transfer", factor=50, n=100)

    def mean(t: str) -> float:
        f = {f.name: f for f in text_string_to_metric_families(t)}["vllm:nixl_xfer_time_seconds"]
        vals = {s.name: s.value for s in f.samples if not s.name.endswith("_bucket")}
        return vals["vllm:nixl_xfer_time_seconds_sum"] / vals["vllm:nixl_xfer_time_seconds_count"]

    _c, _g, fast_text = simulate(n=100)
    assert mean(text) / mean(fast_text) == pytest.approx(50, rel=0.1)


def test_lora_slot_exhaustion_blocks_adapters() -> None:
    dep = deploy(MODEL, "h100")
    features = Features(max_loras=2)
    for scenarios, blocked in (((), False), ((make("lora_slot_exhaustion", {"adapters": 8}),), True)):
        metrics = VllmMetrics(dep.size.max_model_len, process_metrics=False, features=features)
        listener = _Listener(metrics.engine(MODEL, 0, dep), None)
        core = EngineCore(0, dep, ScenarioSet(scenarios), listener, seed=3, features=features)
        for k in range(64):
            core.add(SimRequest(f"req-{k}", 200, 32, 0.0, ignore_eos=True))
        step = core.plan(1.0)
        assert step is not None
        core.complete(step, 1.1)
        running, waiting = core.lora_state()
        assert len(running) <= 2
        reading = EngineParser("auto", "unknown").parse(generate_latest(metrics.registry))
        got = {(s.name, s.attributes): getattr(s, "value", 0.0) for s in reading_samples(reading)}
        assert (v(got, "inferwatch.engine.lora.blocked") > 0) is blocked, (running, waiting)
