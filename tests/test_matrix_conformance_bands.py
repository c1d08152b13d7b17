"""The conformance band per prompt band (alerts/matrix.rules.yml, issue 21) on a real Prometheus, fed by the agent's
own span analytics: three nodes of one hardware type, each exporting what an agent with
receiver.prompt_band_histograms and receiver.emit_histograms exports (inferwatch.agent.node.analytics.latency rendered
by inferwatch.exporters.prometheus, from the requests each node served since it started).

- node a: 30 short prompts/s (<=1k tokens, TTFT 0.3 s) and 1 long/s (>16k, TTFT 3 s);
- node b: the same latencies, but 6 short and 12 long prompts/s: more long prompts than its peers, not slower;
- node c: as a, but its long prompts take 8 s: slow on long prompts only.

NodeOutsideConformanceBand must fire for c in prompt_band ">16k" only; b, whose unsplit gen_ai.server.* P95 is a
long-prompt one (the unsplit path would flag it, tests/rules/matrix.test.yml shows it), must never go pending, and no
prompt_band="all" record may exist (every node has the split). Time compressed as in tests/test_matrix_conformance.py
(factor 60 at 1 s scrape and evaluation).
"""

from __future__ import annotations

import contextlib
import threading
import time
from collections.abc import Iterator
from http.server import BaseHTTPRequestHandler
from typing import Any

import httpx
import pytest

from inferwatch.agent.alerts.profile import render_file
from inferwatch.agent.common.samples import Collection, RequestTiming
from inferwatch.agent.node.analytics.latency import LatencyAnalytics
from inferwatch.agent.node.state import AgentState, CollectorHealth
from inferwatch.exporters.prometheus import render
from tests.alerting import ALERTS_DIR
from tests.tools import require

pytestmark = pytest.mark.integration
ALERT = "NodeOutsideConformanceBand"
MODEL = "Qwen/Qwen2.5-0.5B-Instruct"
MACHINE, CPU = "c7g.16xlarge", "Neoverse-V1"
# node: ((short prompts/s, long prompts/s), long prompts' TTFT s). TPOT (e2e - TTFT) / 9 = 0.04 s everywhere,
# inside one bucket (0.025, 0.05], not at an edge: no ITL difference.
NODES = {"a": ((30, 1), 3.0), "b": ((6, 12), 3.0), "c": ((30, 1), 8.0)}
SHORT, LONG = (512, 0.3), (20_000, None)
DEADLINE_S = 60.0
QUIET_S = 5.0


class _Node:
    """One node's agent analytics, fed at each scrape with the requests due since it started."""

    def __init__(self, name: str, started: float) -> None:
        self.rates, self.slow_ttft = NODES[name]
        self.started = started
        self.fed = [0, 0]
        self.analytics = LatencyAnalytics(histograms=True, prompt_bands=True)
        self.lock = threading.Lock()

    def exposition(self) -> str:
        with self.lock:
            elapsed = time.monotonic() - self.started
            timings: list[RequestTiming] = []
            for i, (rate, (prompt, ttft)) in enumerate(zip(self.rates, (SHORT, LONG), strict=True)):
                due = int(elapsed * rate)
                ttft = ttft if ttft is not None else self.slow_ttft
                timings += [
                    RequestTiming(MODEL, {"ttft": ttft, "e2e": ttft + 0.36}, prompt_tokens=prompt, completion_tokens=10)
                ] * (due - self.fed[i])
                self.fed[i] = due
            self.analytics.record(timings)
            state = AgentState()
            state.register(CollectorHealth("spans", 15.0, 5.0))
            state.record("spans", CollectorHealth("spans", 15.0, 5.0), Collection(samples=self.analytics.compute()))
        return render(state).decode() + (  # what the agent's other collectors add (the dashboard's variables read them)
            'inferwatch_agent_info{version="test"} 1\n'
            f'inferwatch_engine_info{{engine="vllm",gen_ai_request_model="{MODEL}"}} 1\n'
            f'inferwatch_node_info{{machine_type="{MACHINE}",cpu_model="{CPU}"}} 1\n'
        )


def _route(node: _Node) -> Any:
    from tests import engine_server as es

    def send(h: BaseHTTPRequestHandler) -> None:
        es.body(node.exposition())(h)

    return send


@pytest.fixture(scope="module")
def fleet(tmp_path_factory: pytest.TempPathFactory) -> Iterator[tuple[str, dict[str, str]]]:
    from tests import engine_server as es
    from tests import stack

    require("prometheus")  # a failure, not a skip, when the test command did not install it
    tmp = tmp_path_factory.mktemp("conformance-bands")
    rules = tmp / "matrix.rules.yml"
    rules.write_text(render_file(ALERTS_DIR / "matrix.rules.yml", 60))
    started = time.monotonic()
    with contextlib.ExitStack() as ctx:
        servers = {n: ctx.enter_context(es.EngineServer({"/metrics": _route(_Node(n, started))})) for n in NODES}
        instances = {n: f"127.0.0.1:{s.port}" for n, s in servers.items()}
        targets = {"inferwatch-agent": list(instances.values())}
        yield ctx.enter_context(stack.prometheus(tmp, targets, rule_files=[rules])), instances


def _query(url: str, q: str) -> list[dict[str, Any]]:
    return list(httpx.get(f"{url}/api/v1/query", params={"query": q}, timeout=10).json()["data"]["result"])


def _alerts(url: str) -> list[dict[str, Any]]:
    alerts = httpx.get(f"{url}/api/v1/alerts", timeout=10).json()["data"]["alerts"]
    return [a for a in alerts if a["labels"]["alertname"] == ALERT]


def test_slow_on_long_prompts_is_flagged_in_that_band_more_long_prompts_is_not(
    fleet: tuple[str, dict[str, str]],
) -> None:
    url, instances = fleet
    deadline = time.monotonic() + DEADLINE_S
    seen: set[tuple[str, str, str]] = set()
    firing: set[tuple[str, str, str]] = set()
    while time.monotonic() < deadline and not firing:
        for a in _alerts(url):
            key = (a["labels"]["instance"], a["labels"]["quantity"], a["labels"]["prompt_band"])
            seen.add(key)
            if a["state"] == "firing":
                firing.add(key)
        time.sleep(0.5)
    p95 = {
        (x["metric"]["instance"], x["metric"]["quantity"], x["metric"]["prompt_band"]): float(x["value"][1])
        for x in _query(url, "instance_model:inferwatch_conformance_p95_seconds:rate5m")
    }
    assert firing == {(instances["c"], "ttft", ">16k")}, f"firing {firing}; node P95 {p95}"
    quiet_until = time.monotonic() + QUIET_S
    while time.monotonic() < quiet_until:  # a few more evaluations: nothing else even goes pending
        seen |= {(a["labels"]["instance"], a["labels"]["quantity"], a["labels"]["prompt_band"]) for a in _alerts(url)}
        time.sleep(0.5)
    assert seen == {(instances["c"], "ttft", ">16k")}, seen
    # every node is on the split path: no unsplit record, and each node has both bands of both quantities
    assert {band for _, _, band in p95} == {"<=1k", ">16k"}, p95
    assert {(i, q) for i, q, _ in p95} == {(i, q) for i in instances.values() for q in ("ttft", "itl")}, p95
    # b's unsplit TTFT P95 (what the engine's histogram shows) is a long-prompt one, its peers' a short-prompt one
    q = "histogram_quantile(0.95, sum by (instance, le) (rate(gen_ai_server_time_to_first_token_seconds_bucket[5s])))"
    unsplit = {x["metric"]["instance"]: float(x["value"][1]) for x in _query(url, q)}
    assert unsplit[instances["b"]] > 2.5 > 0.5 >= unsplit[instances["a"]], unsplit
    alert = next(a for a in _alerts(url) if a["state"] == "firing")
    text = alert["annotations"]["description"]
    assert text.startswith(
        f"{MACHINE} node {instances['c']} ({MODEL}, prompts >16k tokens): TTFT P95 9.875s vs band 4.875s–4.875s"
    ), text
    assert "(2 same-type peers inside it)" in text and text.endswith("(compare its load with its peers')."), text


def test_band_panel_shows_each_prompt_band(fleet: tuple[str, dict[str, str]]) -> None:
    """The matrix dashboard's conformance table, as Grafana resolves it: one line per node, quantity and prompt band
    (its joins keep the bands apart: no many-to-many match error), the slow node's >16k TTFT over its upper edge."""
    from inferwatch.dashboards import load_all
    from inferwatch.dashboards.prove import Prover

    url, instances = fleet
    prover = Prover(url, rate_interval="10s", range_="20s")
    try:
        out = [o for o in prover.prove(load_all()["inferwatch-matrix"]) if o.query.panel.startswith("Nodes against")]
    finally:
        prover.close()
    assert len(out) == 4, out
    assert all(o.ok for o in out), [(o.query.ref_id, o.series, o.error, o.resolved) for o in out if not o.ok]
    over = {
        (x["metric"]["instance"], x["metric"]["quantity"], x["metric"]["prompt_band"]): float(x["value"][1])
        for x in _query(url, out[3].resolved)
    }
    assert len(over) == 3 * 2 * 2, over
    assert over.pop((instances["c"], "ttft", ">16k")) == pytest.approx(9.875 / 4.875, rel=0.01)
    assert all(r == pytest.approx(1.0, rel=0.01) for r in over.values()), over
