"""``GET /engines/{name}/ready`` from the agent state: each reason, load shedding, auth, and its cost.

The state is filled the way the runner fills it (:meth:`AgentState.record` with a collector health and a
collection); the endpoint is served by the agent's real ASGI app through httpx's ASGI transport.
"""

from __future__ import annotations

import statistics
import time
from typing import Any

import httpx
import pytest

from inferwatch.agent.common.samples import Collection, Finding
from inferwatch.agent.config import EngineSettings, ReadinessSettings, Settings
from inferwatch.agent.node.api.readiness import readiness
from inferwatch.agent.node.state import AgentState, CollectorHealth, next_health

ENGINE_URL = "http://127.0.0.1:8000/metrics"
ENGINE = EngineSettings(metrics_url=ENGINE_URL)


def _ready(
    state: AgentState, name: str = "default", now: float | None = None, **cfg: Any
) -> tuple[int, dict[str, Any]]:
    """readiness() with only the sections it reads: ``readiness`` (``cfg``) and the engine's."""
    return readiness(ReadinessSettings(**cfg), ENGINE, state, name, now)


def _settings(**extra: Any) -> Settings:
    return Settings.from_values({"engine": {"metrics_url": ENGINE_URL}, **extra})


def _ranks(running: float, waiting: float) -> list[dict[str, Any]]:
    return [{"model": "m", "rank": "0", "running": running, "waiting": waiting, "stall_s": 0.0}]


def _record(state: AgentState, outcome: str = "ok", findings: tuple[Finding, ...] = (), waiting: float = 0.0) -> None:
    prev = state.health().get("engine") or CollectorHealth("engine", 2.0, 2.0)
    health = next_health(prev, outcome, 0.01, time.time(), "connect: refused" if outcome != "ok" else None)
    collection = Collection([], list(findings), {"hang": _ranks(1, waiting)}) if outcome == "ok" else None
    state.record("engine", health, collection)


def _hung() -> Finding:
    return Finding("engine_hung", "fail", "engine rank 0 of m: no token for 7s", {"model": "m", "rank": "0"})


def test_reasons_in_order() -> None:
    state = AgentState()
    state.register(CollectorHealth("engine", 2.0, 2.0))
    assert _ready(state)[1]["reason"] == "pending"
    _record(state)
    assert _ready(state) == (200, _ready(state)[1])
    assert _ready(state)[1]["ready"] is True
    _record(state, findings=(_hung(),))
    code, body = _ready(state)
    assert (code, body["reason"], body["ranks"]) == (503, "hung", [{"model": "m", "rank": "0"}])
    _record(state, "exception")
    code, body = _ready(state)
    assert (code, body["reason"], body["detail"]) == (503, "down", "connect: refused")
    _record(state)
    assert _ready(state)[0] == 200
    assert _ready(state, now=time.time() + 60)[1]["reason"] == "stale"
    probe_fail = Finding("probe.openai.error", "fail", "openai probe failed (timeout): no token in 10s", {})
    state.record("probe", CollectorHealth("probe", 30, 10, runs=1, state="ok"), Collection([], [probe_fail], {}))
    assert _ready(state)[1]["reason"] == "probe_failed"
    assert _ready(state, "other")[0] == 404


def test_saturated_is_ready_unless_load_shedding_is_asked_for() -> None:
    state = AgentState()
    _record(state, waiting=500)
    assert _ready(state)[0] == 200
    code, body = _ready(state, shed_waiting=100)
    assert (code, body["reason"]) == (503, "saturated")
    assert _ready(state, shed_waiting=1000)[0] == 200


def test_no_engine_configured() -> None:
    code, body = readiness(ReadinessSettings(), EngineSettings(), AgentState(), "default")
    assert (code, body["reason"]) == (503, "not_configured")


def test_answered_from_the_state_within_5_ms() -> None:
    state = AgentState()
    _record(state, findings=(_hung(),))
    times = []
    for _ in range(2000):
        t = time.perf_counter()
        _ready(state)
        times.append(time.perf_counter() - t)
    assert statistics.median(times) < 0.005  # typically ~10 µs: a dict lookup under the state's lock


@pytest.mark.parametrize(
    ("api", "token", "expected"),
    [
        ({}, None, 503),  # no token configured: loopback-only agent, anonymous read
        ({"tokens": [{"token": "t" * 20, "scopes": ["read"]}]}, None, 401),  # tokens: a probe must send one ...
        ({"tokens": [{"token": "t" * 20, "scopes": ["read"]}]}, "t" * 20, 503),
        # ... or the user opens the path for a load balancer that sends none
        ({"tokens": [{"token": "t" * 20, "scopes": ["read"]}], "open_paths": ["/engines/*"]}, None, 503),
    ],
)
async def test_served_by_the_agent_app_with_its_auth(api: dict[str, Any], token: str | None, expected: int) -> None:
    from inferwatch.agent.node.app import Agent

    settings = _settings(api=api, collectors={"cpu": {"enabled": False}})
    agent = Agent(settings)
    _record(agent.state, findings=(_hung(),))
    headers = {"Authorization": f"Bearer {token}"} if token else {}
    transport = httpx.ASGITransport(app=agent.asgi())
    async with httpx.AsyncClient(transport=transport, base_url="http://agent") as c:
        r = await c.get("/engines/default/ready", headers=headers)
    assert r.status_code == expected, r.text
    if expected == 503:
        assert r.json()["reason"] == "hung"


def test_each_discovered_engine_answers_under_its_own_name() -> None:
    """Targets found by discovery (collectors ``engine:<name>``): one hung, one serving, the probe not theirs."""
    state = AgentState()
    for name, findings in (("llama-a", (_hung(),)), ("qwen-b", ())):
        health = next_health(CollectorHealth(f"engine:{name}", 2.0, 2.0), "ok", 0.01, time.time(), None)
        state.record(f"engine:{name}", health, Collection([], list(findings), {"hang": _ranks(1, 0)}))
    probe_fail = Finding("probe.openai.error", "fail", "openai probe failed (timeout): no token in 10s", {})
    state.record("probe", CollectorHealth("probe", 30, 10, runs=1, state="ok"), Collection([], [probe_fail], {}))
    only_targets = EngineSettings()  # no engine.metrics_url: discovery alone
    code, body = readiness(ReadinessSettings(), only_targets, state, "llama-a")
    assert (code, body["reason"], body["engine"]) == (503, "hung", "llama-a")
    code, body = readiness(ReadinessSettings(), only_targets, state, "qwen-b")
    assert (code, body["reason"]) == (200, "serving")  # the configured engine's probe does not fail it
    code, body = readiness(ReadinessSettings(), only_targets, state, "nope")
    assert (code, body["engines"]) == (404, ["llama-a", "qwen-b"])
