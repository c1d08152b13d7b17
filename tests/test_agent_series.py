"""The agent's own series count (agent/node/analytics/series.py) against its real /metrics, and the budget setting.

The count must equal the sample lines of the exposition the agent serves for the same state (the exporter's own
render, and a running agent's /metrics), with histograms, duplicates from two sources, per-model series and the
processor's own four series; a budget below the setting's floor is refused with the field's name. The processor
counts only the families that changed since its last count: over a random sequence of states it must give what a
plain count of every sample gives (the reference below, the processor's code before it counted incrementally), and
a collection of unchanged families must not be counted again.
"""

from __future__ import annotations

import math
import random
import re
import time
from collections import Counter
from collections.abc import Iterable

import httpx
import pytest

from inferwatch.agent import catalog
from inferwatch.agent.catalog.spec import Kind, MetricSpec
from inferwatch.agent.common.samples import AnySample, Collection, HistogramSample, Sample, attrs
from inferwatch.agent.config import Settings
from inferwatch.agent.errors import ConfigError
from inferwatch.agent.node.analytics import series
from inferwatch.agent.node.analytics.series import OWN, SeriesBudget, count
from inferwatch.agent.node.state import AgentState, CollectorHealth
from inferwatch.exporters.prometheus import render
from tests.conftest import PYTHON, ROOT, free_port
from tests.procs import running, wait_http

MODEL = "gen_ai.request.model"


def _lines(text: bytes) -> list[str]:
    return [ln for ln in text.decode().splitlines() if ln and not ln.startswith("#")]


def _engine_like(models: int) -> Collection:
    samples: list[Sample | HistogramSample] = []
    for i in range(models):
        m = f"org/model-{i}"
        samples.append(Sample("inferwatch.engine.requests.running", 3, attrs({MODEL: m})))
        samples.append(Sample("inferwatch.engine.tokens", 10, attrs({MODEL: m}, type="prompt")))
        samples.append(Sample("inferwatch.engine.tokens", 10, attrs({MODEL: m}, type="prompt")))  # a duplicate
        buckets = ((0.1, 1.0), (1.0, 2.0), (math.inf, 3.0))
        a = attrs({MODEL: m, "gen_ai.operation.name": "", "gen_ai.provider.name": "vllm"})
        samples.append(HistogramSample("gen_ai.server.time_to_first_token", buckets, 1.5, 3.0, a))
    samples.append(Sample("inferwatch.engine.scrape.errors", 1, attrs(reason="connect")))
    return Collection(samples=samples)


def test_count_equals_the_exposition_lines_and_splits_by_model() -> None:
    state = AgentState()
    health = CollectorHealth("engine", 5.0, 2.0, runs=1, state="ok")
    state.record("engine", health, _engine_like(3))
    budget = SeriesBudget(state, 1000)
    state.record("series", CollectorHealth("series", 5.0, 2.0, runs=1, state="ok"), budget.collect())
    # a second cycle: the processor's own previous samples are in the state now and must not be counted twice
    state.record("series", CollectorHealth("series", 5.0, 2.0, runs=2, state="ok"), budget.collect())
    lines = _lines(render(state))
    own = {s.name: s.value for s in budget.collect().samples if isinstance(s, Sample)}
    assert own["inferwatch.agent.series"] == len(lines)
    assert own["inferwatch.agent.series.budget"] == 1000
    assert own["inferwatch.agent.series.models"] == 3
    # per model: running 1 + tokens 1 (the duplicate is one series) + TTFT 3 buckets + _sum + _count
    assert own["inferwatch.agent.series.max_per_model"] == 7
    total, per_model = count(state.samples())
    assert total == len(lines) - len(OWN) and set(per_model.values()) == {7}


def reference_count(samples: Iterable[AnySample]) -> tuple[int, Counter[str]]:
    """Every sample looked at, in order: the processor's count before it kept counts per family."""
    seen: set[tuple[str, tuple[str, ...]]] = set()
    total = 0
    per_model: Counter[str] = Counter()
    for s in samples:
        spec = catalog.CATALOG.get(s.name)
        if spec is None or s.name in OWN:
            continue
        a = dict(s.attributes)
        key = (s.name, tuple(a.get(k, "") for k in spec.attributes))
        if key in seen:
            continue
        seen.add(key)
        if isinstance(s, HistogramSample):
            if spec.kind is not Kind.HISTOGRAM:
                continue
            n = len(s.buckets) + (2 if s.buckets and s.buckets[0][0] >= 0 else 0)
        elif spec.kind is Kind.HISTOGRAM:
            continue
        else:
            n = 1
        total += n
        model = a.get(MODEL)
        if model:
            per_model[model] += n
    return total, per_model


TTFT = "gen_ai.server.time_to_first_token"
FAMILIES = ("inferwatch.engine.requests.running", "inferwatch.engine.tokens", TTFT, "no.such.metric", OWN[0])


def _random_sample(rng: random.Random) -> AnySample:
    name = rng.choice(FAMILIES)
    a: dict[str, str] = {}
    if rng.random() < 0.9:
        a[MODEL] = rng.choice(["m0", "m1", "m2", ""])
    if rng.random() < 0.5:
        a["type"] = rng.choice(["prompt", "generation"])
    if rng.random() < 0.2:
        a["engine"] = rng.choice(["e0", "e1"])  # a target attribute: not part of the counted key
    if rng.random() < 0.3:
        a.pop(MODEL, None)
        a["gen_ai.request.model"] = rng.choice(["m0", "m3"])
    wrong_kind = rng.random() < 0.1
    if (name == TTFT) != wrong_kind:
        bounds = rng.choice([(0.1, 1.0, math.inf), (1.0, math.inf), (-1.0, 0.5, math.inf), (), (math.inf,)])
        buckets = tuple((b, float(i)) for i, b in enumerate(bounds))
        return HistogramSample(name, buckets, 1.0, float(len(buckets)), attrs(a))
    return Sample(name, rng.random(), attrs(a))


def test_incremental_count_equals_a_count_of_every_sample() -> None:
    rng = random.Random(38)
    state = AgentState()
    budget = SeriesBudget(state, 1000)
    current: dict[str, list[AnySample]] = {}
    for step in range(300):
        name = rng.choice(["engine", "other", "third"])
        before = current.get(name, [])
        change = rng.random()
        if change < 0.3:  # a progress pass: the same objects, some families' samples new
            samples = [_random_sample(rng) if rng.random() < 0.1 else s for s in before]
        elif change < 0.45:  # the same samples, another order or one fewer
            samples = list(before)
            rng.shuffle(samples)
            samples = samples[: max(0, len(samples) - rng.randint(0, 1))]
        elif change < 0.6:  # a new read: equal values in new objects
            samples = [type(s)(*(getattr(s, f) for f in s.__slots__)) for s in before]
        elif change < 0.65:  # a collector gone
            state.forget(name)
            current.pop(name, None)
        else:
            samples = [_random_sample(rng) for _ in range(rng.randint(0, 30))]
        if change < 0.6 or change >= 0.65:
            current[name] = samples
            state.record(name, CollectorHealth(name, 5.0, 2.0, runs=1, state="ok"), Collection(samples=samples))
        loose = [_random_sample(rng) for _ in range(rng.randint(0, 5))]
        state.add_source("loose", loose.copy)
        assert budget.totals() == reference_count(state.samples()), step
        assert budget.totals() == reference_count(state.samples()), step  # and again, from what it kept
        assert count(state.samples()) == reference_count(state.samples()), step


def test_only_the_families_that_changed_are_counted_again(monkeypatch: pytest.MonkeyPatch) -> None:
    counted: list[str] = []
    real = series._count_family

    def spy(spec: MetricSpec, samples: Iterable[AnySample]) -> tuple[int, Counter[str]]:
        counted.append(spec.name)
        return real(spec, samples)

    monkeypatch.setattr(series, "_count_family", spy)
    state = AgentState()
    health = CollectorHealth("engine", 5.0, 2.0, runs=1, state="ok")
    first = _engine_like(3)
    state.record("engine", health, first)
    budget = SeriesBudget(state, 1000)
    assert budget.totals() == reference_count(state.samples())
    assert "inferwatch.engine.tokens" in counted and TTFT in counted
    counted.clear()
    budget.totals()
    assert [n for n in counted if n.startswith(("inferwatch.engine", "gen_ai"))] == []  # the same collection
    # a progress pass: every sample the same object but the running requests, whose label sets change
    samples = [
        Sample(s.name, 1, attrs({MODEL: "org/model-9"})) if s.name == "inferwatch.engine.requests.running" else s
        for s in first.samples
    ]
    state.record("engine", health, Collection(samples=samples))
    assert budget.totals() == reference_count(state.samples())
    engine_families = [n for n in counted if n.startswith(("inferwatch.engine", "gen_ai"))]
    assert engine_families == ["inferwatch.engine.requests.running"]
    counted.clear()
    # a full read: new objects, the same label sets, other values: nothing counted again
    again = [
        Sample(s.name, s.value + 1, s.attributes)
        if isinstance(s, Sample)
        else HistogramSample(s.name, tuple((b, c + 1) for b, c in s.buckets), s.sum + 1, s.count + 1, s.attributes)
        for s in samples
    ]
    state.record("engine", health, Collection(samples=again))
    assert budget.totals() == reference_count(state.samples())
    assert [n for n in counted if n.startswith(("inferwatch.engine", "gen_ai"))] == []


def test_budget_setting_is_validated() -> None:
    assert Settings().series_budget == 50_000
    with pytest.raises(ConfigError, match="series_budget"):
        Settings.from_values({"series_budget": 10})


@pytest.mark.integration
def test_a_running_agent_reports_its_own_series(tmp_path) -> None:
    port = free_port()
    env = {"INFERWATCH_SERIES_BUDGET": "123456", "INFERWATCH_RUNTIME__CMDLINE_PATTERN": "no-such-runtime-series"}
    cmd = [PYTHON, "-m", "inferwatch.agent", "run", "--port", str(port), "--interval", "1"]
    with running(cmd, tmp_path / "agent.log", env=env, cwd=ROOT):
        url = f"http://127.0.0.1:{port}"
        wait_http(f"{url}/readyz", timeout_s=60, ok=lambda r: r.status_code == 200)
        deadline, lines, own = time.monotonic() + 120, [], -1.0  # bounds a hang (CI's load 10-17 on 2 cores)
        while time.monotonic() < deadline:  # two scrapes in a row with nothing changed in between agree
            lines = _lines(httpx.get(f"{url}/metrics", timeout=10).content)
            own = next((float(ln.split()[-1]) for ln in lines if ln.startswith("inferwatch_agent_series ")), -1.0)
            if own == len(lines):
                break
            time.sleep(0.5)
        assert own == len(lines), (own, len(lines))
        assert any(re.fullmatch(r"inferwatch_agent_series_budget 123456(\.0)?", ln) for ln in lines)
