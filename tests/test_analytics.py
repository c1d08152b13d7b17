"""Latency analytics: sketch accuracy, sliding windows, bimodality power and false-positive rate."""

from __future__ import annotations

import math
import random

import pytest

from inferwatch.agent import catalog
from inferwatch.agent.node.analytics import bimodality
from inferwatch.agent.node.analytics.latency import QUANTILES, LatencyAnalytics, RequestTiming
from inferwatch.agent.node.analytics.windows import SUB_WINDOW_S, WindowedSketch, log_bins, new_sketch
from inferwatch.agent.node.collectors.base import Collection
from inferwatch.agent.node.runner import validate


class Clock:
    def __init__(self, t: float = 1000.0) -> None:
        self.t = t

    def __call__(self) -> float:
        return self.t


def exact_quantile(sorted_values: list[float], q: float) -> float:
    """The value at rank q·(n−1), rounded down: the rank DDSketch's quantile targets."""
    return sorted_values[math.floor(q * (len(sorted_values) - 1))]


@pytest.mark.parametrize(
    "gen",
    [
        lambda r: r.lognormvariate(math.log(0.38), 0.6),
        lambda r: 0.38 if r.random() < 0.8 else 0.85 * r.lognormvariate(0, 0.1),
        lambda r: r.expovariate(20.0),
    ],
    ids=["lognormal", "bimodal", "exponential"],
)
def test_sketch_quantiles_within_one_percent_on_100k_samples(gen) -> None:
    rng = random.Random(7)
    values = [gen(rng) for _ in range(100_000)]
    ws = WindowedSketch()
    # spread over the 5 m window's sub-windows so the merge path is what is measured
    for i, v in enumerate(values):
        ws.add(v, 1000.0 + (i % 30) * SUB_WINDOW_S)
    merged = ws.window(300.0, 1000.0 + 29 * SUB_WINDOW_S)
    assert merged.count == 100_000
    values.sort()
    for q in (0.01, 0.1, 0.25, 0.5, 0.75, 0.9, 0.95, 0.99, 0.999):
        exact = exact_quantile(values, q)
        got = merged.get_quantile_value(q)
        assert abs(got - exact) <= 0.01 * exact, (q, got, exact)


def test_windows_slide_and_expire() -> None:
    clock = Clock()
    a = LatencyAnalytics(clock=clock)
    a.record([RequestTiming("m", {"ttft": 0.1})] * 100)
    clock.t += 90  # out of the 1 m window, still in the 5 m one
    a.record([RequestTiming("m", {"ttft": 1.0})] * 10)
    one = a.window_stats("m", "ttft", "1m")
    five = a.window_stats("m", "ttft", "5m")
    assert one is not None and one.count == 10 and one.quantiles[0.5] == pytest.approx(1.0, rel=0.01)
    assert five is not None and five.count == 110 and five.quantiles[0.5] == pytest.approx(0.1, rel=0.01)
    clock.t += 301
    assert a.window_stats("m", "ttft", "5m") is None
    assert a.compute() == [] and a.models() == []  # an idle model is evicted, its series disappear


def test_samples_match_the_catalog_and_absent_quantities_stay_absent() -> None:
    clock = Clock()
    a = LatencyAnalytics(clock=clock, histograms=True)
    rng = random.Random(1)
    timings = []
    for _ in range(200):
        q, p = rng.uniform(0, 0.02), rng.uniform(0.05, 0.1)
        timings.append(RequestTiming("llama", {"ttft": q + p + 0.03, "queue": q, "prefill": p, "e2e": 1.0}))
    a.record(timings)
    samples = a.compute()
    validate(Collection(samples=samples))  # names, kinds and attribute keys as declared
    quantities = {dict(s.attributes).get("quantity") for s in samples}
    assert quantities == {"ttft", "queue", "prefill", "e2e", None}  # no decode/itl/inference: absent, not 0
    gap = [s for s in samples if s.name == "inferwatch.engine.frontend_gap"]
    assert {dict(s.attributes)["window"] for s in gap} == {"1m", "5m"}
    assert all(s.value == pytest.approx(0.03) for s in gap)
    lat = {
        dict(s.attributes)["quantile"]
        for s in samples
        if s.name == "inferwatch.engine.latency" and dict(s.attributes)["quantity"] == "ttft"
    }
    assert lat == {str(q) for q in QUANTILES}
    assert all(dict(s.attributes).get("source", "spans") == "spans" for s in samples)
    hist = {s.name: s for s in samples if s.name.startswith("gen_ai.server.")}
    assert set(hist) == {"gen_ai.server.time_to_first_token", "gen_ai.server.request.duration"}
    ttft = hist["gen_ai.server.time_to_first_token"]
    assert [b for b, _ in ttft.buckets[:-1]] == list(catalog.get(ttft.name).buckets)
    assert ttft.count == 200 and ttft.buckets[-1][1] == 200
    # cumulative and consistent with the values: every TTFT is in (0.08, 0.25]
    counts = dict(ttft.buckets)
    assert counts[0.08] == 0 and counts[0.25] == 200


def test_no_histograms_unless_asked() -> None:
    a = LatencyAnalytics()
    a.record([RequestTiming("m", {"ttft": 0.2, "e2e": 1.0})])
    assert not any(s.name.startswith("gen_ai.server.") for s in a.compute())


def test_model_cap_counts_and_drops() -> None:
    a = LatencyAnalytics(max_models=2)
    dropped = a.record([RequestTiming(f"m{i}", {"ttft": 0.1}) for i in range(5)])
    assert dropped == 3 and a.models() == ["m0", "m1"]


def test_bimodality_needs_enough_requests_and_reports_modes() -> None:
    assert bimodality.detect([0.38] * 10) is None
    rng = random.Random(5)
    values = [rng.lognormvariate(math.log(0.38), 0.1) for _ in range(800)]
    values += [rng.lognormvariate(math.log(0.85), 0.1) for _ in range(200)]
    res = bimodality.detect(values)
    assert res is not None and res.bimodal and res.statistic >= bimodality.D_THRESHOLD
    assert res.mode_fast == pytest.approx(0.38, rel=0.05) and res.mode_slow == pytest.approx(0.85, rel=0.05)
    assert res.weight_slow == pytest.approx(0.2, abs=0.05)
    # the collapse to one 296 ms peak after the cause is removed
    single = bimodality.detect([rng.lognormvariate(math.log(0.296), 0.15) for _ in range(1000)])
    assert single is not None and not single.bimodal and single.statistic < bimodality.D_THRESHOLD


def _flag_rate(gen, trials: int, seed: int, n: int = 500) -> float:
    rng = random.Random(seed)
    flagged = 0
    for i in range(trials):
        sketch = new_sketch()
        for _ in range(n):
            sketch.add(gen(rng, i))
        res = bimodality.detect_log(log_bins(sketch))
        assert res is not None
        flagged += res.bimodal
    return flagged / trials


def test_bimodality_power_on_380_850_mixtures() -> None:
    """Issue target: >= 95 % flagged at n = 500 with >= 20 % slow. Measured ~100 %; assert >= 97 %."""

    def mixture(r: random.Random, i: int) -> float:
        slow = (0.2, 0.3, 0.5)[i % 3]
        return r.lognormvariate(math.log(0.85 if r.random() < slow else 0.38), 0.15)

    assert _flag_rate(mixture, trials=200, seed=11) >= 0.97


def test_bimodality_false_positives_on_unimodal_lognormals() -> None:
    """Issue target: <= 5 % of unimodal lognormals (sigma up to 0.6) flagged. Measured ~0 %; assert <= 2 %."""

    def lognormal(r: random.Random, i: int) -> float:
        return r.lognormvariate(math.log(0.38), (0.1, 0.2, 0.4, 0.6)[i % 4])

    assert _flag_rate(lognormal, trials=200, seed=12) <= 0.02


def test_publishes_its_stats_and_leaves_frontend_gap_to_the_engine_when_it_has_one() -> None:
    from inferwatch.agent.node.analytics.latency import EngineSeries

    a = LatencyAnalytics()
    a.record([RequestTiming("m", {"ttft": 0.5, "queue": 0.1, "prefill": 0.3})] * 60)
    samples = a.compute()
    assert a.published.get(("m", "ttft", "1m")) is not None
    assert a.published[("m", "ttft", "1m")].mean_s == pytest.approx(0.5, rel=1e-9)
    assert {dict(s.attributes)["window"] for s in samples if s.name == "inferwatch.engine.frontend_gap"} == {
        "1m",
        "5m",
    }
    # the engine collector now emits frontend_gap for 1m from its histograms (its collection in the state says
    # so): that series is its, not ours
    engine = EngineSeries(models=("m",), gaps=frozenset({("m", "1m")}))
    gaps = {dict(s.attributes)["window"] for s in a.compute(engine) if s.name == "inferwatch.engine.frontend_gap"}
    assert gaps == {"5m"}
