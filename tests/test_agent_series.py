"""The agent's own series count (agent/node/analytics/series.py) against its real /metrics, and the budget setting.

The count must equal the sample lines of the exposition the agent serves for the same state (the exporter's own
render, and a running agent's /metrics), with histograms, duplicates from two sources, per-model series and the
processor's own four series; a budget below the setting's floor is refused with the field's name.
"""

from __future__ import annotations

import math
import re
import time

import httpx
import pytest
from pydantic import ValidationError

from inferwatch.agent.common.samples import Collection, HistogramSample, Sample, attrs
from inferwatch.agent.config import Settings
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


def test_budget_setting_is_validated() -> None:
    assert Settings().series_budget == 50_000
    with pytest.raises(ValidationError, match="series_budget"):
        Settings(series_budget=10)


@pytest.mark.integration
def test_a_running_agent_reports_its_own_series(tmp_path) -> None:
    port = free_port()
    env = {"INFERWATCH_SERIES_BUDGET": "123456", "INFERWATCH_RUNTIME__CMDLINE_PATTERN": "no-such-runtime-series"}
    cmd = [PYTHON, "-m", "inferwatch.agent", "run", "--port", str(port), "--interval", "1"]
    with running(cmd, tmp_path / "agent.log", env=env, cwd=ROOT):
        url = f"http://127.0.0.1:{port}"
        wait_http(f"{url}/readyz", timeout_s=60, ok=lambda r: r.status_code == 200)
        deadline, lines, own = time.monotonic() + 30, [], -1.0
        while time.monotonic() < deadline:  # two scrapes in a row with nothing changed in between agree
            lines = _lines(httpx.get(f"{url}/metrics", timeout=10).content)
            own = next((float(ln.split()[-1]) for ln in lines if ln.startswith("inferwatch_agent_series ")), -1.0)
            if own == len(lines):
                break
            time.sleep(0.5)
        assert own == len(lines), (own, len(lines))
        assert any(re.fullmatch(r"inferwatch_agent_series_budget 123456(\.0)?", ln) for ln in lines)
