"""Engine signals (issue 18) from fixture expositions: prefix cache, prompt tokens by source, speculative decoding,
LoRA slots, P/D KV transfer, per model and summed over data-parallel ranks; absent where an engine has no data.

Expected values are computed from the same file with prometheus_client's parser (an independent reader).
"""

from __future__ import annotations

from collections import defaultdict

import pytest
from prometheus_client.parser import text_string_to_metric_families

from inferwatch.agent.catalog import CATALOG
from inferwatch.agent.common.samples import HistogramSample, Sample
from inferwatch.agent.errors import SourceFormatError
from inferwatch.agent.node.engine.adapters import ADAPTERS, LORA_RECENT_S, LoraState, read_lora
from inferwatch.agent.node.engine.emit import reading_samples
from inferwatch.agent.node.engine.exposition import ExpositionReader
from inferwatch.agent.node.engine.scrape import EngineParser
from tests.conftest import FIXTURES

ENGINES = FIXTURES / "engines"
VLLM = "vllm-v1-signals-dp2.prom"
SGLANG = "sglang-signals-pd.prom"
QWEN = "Qwen/Qwen3-8B"
DSV3 = "deepseek-ai/DeepSeek-V3"


def independent(name: str) -> dict[str, list[tuple[dict[str, str], float]]]:
    out: dict[str, list[tuple[dict[str, str], float]]] = defaultdict(list)
    for family in text_string_to_metric_families((ENGINES / name).read_text()):
        for s in family.samples:
            out[s.name].append((s.labels, s.value))
    return out


def total(ref: dict[str, list[tuple[dict[str, str], float]]], name: str, **match: str) -> float:
    return sum(v for labels, v in ref[name] if all(labels.get(k) == x for k, x in match.items()))


def samples(name: str) -> dict[tuple[str, tuple[tuple[str, str], ...]], Sample | HistogramSample]:
    reading = EngineParser("auto", "unknown").parse((ENGINES / name).read_bytes())
    return {(s.name, s.attributes): s for s in reading_samples(reading)}


def value(
    got: dict[tuple[str, tuple[tuple[str, str], ...]], Sample | HistogramSample], name: str, **labels: str
) -> float:
    key = (name, tuple(sorted(labels.items())))
    assert key in got, f"{name}{labels} not exported; have {sorted(k for k in got if k[0] == name)}"
    s = got[key]
    assert isinstance(s, Sample)
    return s.value


M = "gen_ai.request.model"


def test_vllm_signals_are_summed_over_ranks() -> None:
    ref = independent(VLLM)
    got = samples(VLLM)
    m = {M: QWEN}
    for cache, prefix in (("local", "vllm:prefix_cache"), ("external", "vllm:external_prefix_cache")):
        q = value(got, "inferwatch.engine.prefix_cache.queries", **m, cache=cache)
        h = value(got, "inferwatch.engine.prefix_cache.hits", **m, cache=cache)
        assert q == total(ref, f"{prefix}_queries_total") and h == total(ref, f"{prefix}_hits_total")
    assert value(got, "inferwatch.engine.prefix_cache.hits", **m, cache="local") == 65105
    for source in ("local_compute", "local_cache_hit", "external_kv_transfer"):
        want = total(ref, "vllm:prompt_tokens_by_source_total", source=source)
        assert value(got, "inferwatch.engine.prompt_tokens.by_source", **m, source=source) == want
    assert value(got, "inferwatch.engine.tokens", **m, type="cached") == total(ref, "vllm:prompt_tokens_cached_total")
    drafts = value(got, "inferwatch.engine.spec_decode.drafts", **m)
    draft_tokens = value(got, "inferwatch.engine.spec_decode.draft_tokens", **m)
    accepted = value(got, "inferwatch.engine.spec_decode.accepted_tokens", **m)
    assert (drafts, draft_tokens, accepted) == (1500, 4500, 2490)
    assert accepted / draft_tokens == pytest.approx(0.5533, abs=1e-4)  # acceptance rate
    assert 1 + accepted / drafts == pytest.approx(2.66)  # mean acceptance length
    for pos in ("0", "1", "2"):
        want = total(ref, "vllm:spec_decode_num_accepted_tokens_per_pos_total", position=pos)
        assert value(got, "inferwatch.engine.spec_decode.accepted_by_position", **m, position=pos) == want
    assert value(got, "inferwatch.engine.kv_transfer.bytes", **m) == total(ref, "vllm:nixl_bytes_transferred_sum")
    assert value(got, "inferwatch.engine.kv_transfer.failures", **m) == 1
    hist = got[("inferwatch.engine.kv_transfer.duration", ((M, QWEN),))]
    assert isinstance(hist, HistogramSample)
    assert hist.count == total(ref, "vllm:nixl_xfer_time_seconds_count") == 40
    assert hist.sum == pytest.approx(total(ref, "vllm:nixl_xfer_time_seconds_sum"))
    assert dict(hist.buckets)[0.025] == total(ref, "vllm:nixl_xfer_time_seconds_bucket", le="0.025")
    assert value(got, "inferwatch.engine.preemptions", **m) == 43
    kv = [v for _, v in ref["vllm:kv_cache_usage_perc"]]
    assert value(got, "inferwatch.engine.kv_cache.usage", **m) == pytest.approx(sum(kv) / len(kv))


def test_vllm_lora_reads_the_newest_label_set() -> None:
    got = samples(VLLM)
    m = {M: QWEN}  # the info gauge names no model; vLLM serves one base model per process
    assert value(got, "inferwatch.engine.lora.adapters", **m, state="running") == 2
    assert value(got, "inferwatch.engine.lora.adapters", **m, state="waiting") == 2
    assert value(got, "inferwatch.engine.lora.max_adapters", **m) == 2
    # both slots taken by adapter_json and adapter_ko; adapter_sql waits for a slot (adapter_ko waits in its slot)
    assert value(got, "inferwatch.engine.lora.blocked", **m) == 1


def test_lora_state_blocked_only_when_every_slot_is_taken() -> None:
    assert LoraState(frozenset({"a"}), frozenset({"b"}), 2).blocked == 0  # a free slot: b gets it next step
    assert LoraState(frozenset({"a", "b"}), frozenset({"a", "b"}), 2).blocked == 0  # waiting in resident slots
    assert LoraState(frozenset({"a", "b"}), frozenset({"c", "d", "a"}), 2).blocked == 2


def test_lora_blocked_counts_any_label_set_of_the_last_15_s() -> None:
    """vLLM sets the info gauge to now under each step's label set and keeps every set: a slot taken and freed
    between two reads shows in the sets of the last 15 s (engine clock), not in the newest one."""
    sets = [  # (waiting, running, seconds before the newest)
        ("", "a", 0.0),  # the newest step: a slot free of contention
        ("b,c", "a", 9.0),  # 9 s earlier: b and c waited while a held the one slot
        ("b,c,d", "a", 40.0),  # 40 s earlier: older than the last read
    ]
    body = "".join(
        f'vllm:lora_requests_info{{max_lora="1",running_lora_adapters="{r}",waiting_lora_adapters="{w}"}} '
        f"{1_765_000_000.0 - ago}\n"
        for w, r, ago in sets
    )
    expo = ExpositionReader(("vllm:",), ADAPTERS["vllm"].wanted()).read(body)
    state = read_lora(ADAPTERS["vllm"], expo)
    assert state is not None
    assert (state.running, state.waiting, state.blocked) == (frozenset({"a"}), frozenset(), 0)
    assert state.blocked_recent == 2  # b and c, not the 40 s old set's three
    assert LORA_RECENT_S == 15.0


def test_lora_bad_max_lora_is_a_source_format_error() -> None:
    body = b'vllm:lora_requests_info{max_lora="two",running_lora_adapters="",waiting_lora_adapters=""} 1.0\n'
    expo = ExpositionReader(("vllm:",), ADAPTERS["vllm"].wanted()).read(body.decode())
    with pytest.raises(SourceFormatError, match="max_lora"):
        read_lora(ADAPTERS["vllm"], expo)


def test_sglang_signals_and_absence() -> None:
    ref = independent(SGLANG)
    got = samples(SGLANG)
    m = {M: DSV3}
    rates = [v for _, v in ref["sglang:spec_accept_rate"]]
    assert value(got, "inferwatch.engine.spec_decode.acceptance", **m) == pytest.approx(sum(rates) / len(rates))
    assert value(got, "inferwatch.engine.spec_decode.acceptance_length", **m) == pytest.approx(3.0)
    assert value(got, "inferwatch.engine.kv_transfer.latency", **m) == pytest.approx(0.015)  # ms → s, mean of ranks
    assert value(got, "inferwatch.engine.kv_transfer.failures", **m) == 1
    assert value(got, "inferwatch.engine.tokens", **m, type="cached") == total(ref, "sglang:cached_tokens_total")
    assert value(got, "inferwatch.engine.preemptions", **m) == total(ref, "sglang:num_retracted_requests_total")
    names = {k[0] for k in got}
    for absent in (
        "inferwatch.engine.lora.adapters",
        "inferwatch.engine.prompt_tokens.by_source",
        "inferwatch.engine.spec_decode.accepted_by_position",
        "inferwatch.engine.prefix_cache.queries",
    ):
        assert absent not in names  # absent, never zero


def test_engines_without_the_families_export_none_of_them() -> None:
    signals = {n for n in CATALOG if any(p in n for p in ("spec_decode", "lora", "kv_transfer", "prefix_cache"))}
    for fixture in ("llamacpp-synthetic-a.prom", "tgi-synthetic.prom", "vllm-v1-dp2-synthetic.prom"):
        got = samples(fixture)
        assert not signals & {k[0] for k in got}, fixture


def test_every_signal_sample_is_declared_with_its_attributes() -> None:
    for fixture in (VLLM, SGLANG):
        for (name, attributes), _s in samples(fixture).items():
            spec = CATALOG[name]
            assert {k for k, _ in attributes} == set(spec.attributes), (name, attributes)


def test_goodput_from_spans_is_exact_and_counts_both_targets_together() -> None:
    from inferwatch.agent.common.samples import RequestTiming
    from inferwatch.agent.node.analytics.latency import LatencyAnalytics

    now = [1000.0]
    la = LatencyAnalytics(clock=lambda: now[0])
    timings = [
        RequestTiming("m", {"ttft": 0.2, "decode": 0.9}, completion_tokens=10),  # good: 0.1 s/token exactly
        RequestTiming("m", {"ttft": 0.7, "decode": 0.5}, completion_tokens=11),  # TTFT missed
        RequestTiming("m", {"ttft": 0.3, "decode": 3.0}, completion_tokens=11),  # TPOT missed (0.3 s/token)
        RequestTiming("m", {"ttft": 0.4}, completion_tokens=1),  # one token: nothing after the first to be slow
        RequestTiming("m", {"ttft": 0.1}, completion_tokens=20),  # no decode time: not counted
        RequestTiming("m", {"e2e": 1.0}),  # no TTFT: not counted
    ]
    la.record(timings)
    assert la.goodput("m", "5m") == pytest.approx(2 / 4)
    got = {
        (s.name, dict(s.attributes)["window"]): s.value
        for s in la.compute()
        if s.name == "inferwatch.engine.goodput" and isinstance(s, Sample)
    }
    assert got == {("inferwatch.engine.goodput", "1m"): 0.5, ("inferwatch.engine.goodput", "5m"): 0.5}
    now[0] += 120  # out of the 1m window, still in the 5m one
    assert la.goodput("m", "1m") is None and la.goodput("m", "5m") == 0.5


def test_goodput_rules_use_the_catalogs_targets() -> None:
    import re

    from inferwatch.agent.catalog.engine import GOODPUT_TPOT_TARGET_S, GOODPUT_TTFT_TARGET_S
    from tests.conftest import ROOT

    text = (ROOT / "alerts" / "engine-signals.rules.yml").read_text()
    ttft = re.findall(r'gen_ai_server_time_to_first_token_seconds_bucket\{le="([^"]+)"\}', text)
    tpot = re.findall(r'gen_ai_server_time_per_output_token_seconds_bucket\{le="([^"]+)"\}', text)
    assert ttft == [str(GOODPUT_TTFT_TARGET_S)] and tpot == [str(GOODPUT_TPOT_TARGET_S)]
    assert f"TTFT <= {GOODPUT_TTFT_TARGET_S:g} s and time per output token <= {GOODPUT_TPOT_TARGET_S:g} s" in text
