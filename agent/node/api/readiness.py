"""Whether an engine serves, for routers and probes: ``GET /engines/{name}/ready``, answered from the agent state.

200 only while the engine serves; 503 with a JSON reason otherwise:

| reason | when |
|---|---|
| ``pending`` | the engine collector has not run yet |
| ``down`` | its last read of the engine's /metrics failed (refused, timed out, unparseable) |
| ``stale`` | its last successful read is older than ``readiness.max_age_s`` (the agent cannot vouch for it) |
| ``hung`` | a rank has requests and produces no token (the hang finding, agent/node/engine/hang.py) |
| ``probe_failed`` | the agent's streaming probe (``probe.url``) failed, or was refused with ``hardware_mismatch`` |
| ``saturated`` | only with load shedding on (``readiness.shed_waiting`` > 0): that many requests or more are waiting |

A saturated engine is ready unless load shedding is asked for: a router that drains a busy replica moves its load
to the others and a probe that fails it restarts a replica that was only busy. Nothing here talks to the engine
(the collector's latest reading is the answer): it never blocks on a hung engine, and it answers in microseconds.
The configured engine is ``engine.name`` (``default``); each discovered engine target answers under its own name
(its collector ``engine:<name>``, agent/node/targets.py), the same way less the probe, which reads the configured
engine only. Another name answers 404 with the names known.
"""

from __future__ import annotations

import time
from typing import Any

from inferwatch.agent.config import EngineSettings, ReadinessSettings
from inferwatch.agent.node.state import AgentState

ENGINE = "engine"
TARGET_PREFIX = "engine:"  # a discovered engine target's collector (agent/node/targets.py)
PROBE = "probe"
HANG_FINDING = "engine_hung"


def readiness(
    cfg: ReadinessSettings, engine_cfg: EngineSettings, state: AgentState, name: str, now: float | None = None
) -> tuple[int, dict[str, Any]]:
    """(HTTP status, body) for engine ``name``: 200 ``{"ready": true, ...}``, 503 with ``reason``, 404 unknown."""
    now = time.time() if now is None else now
    every = state.health()
    targets = sorted(c.removeprefix(TARGET_PREFIX) for c in every if c.startswith(TARGET_PREFIX))
    configured = name == engine_cfg.name
    if not configured and name not in targets:
        known = [engine_cfg.name] if engine_cfg.metrics_url or not targets else []
        return 404, {"error": "unknown_engine", "engine": name, "engines": [*known, *targets]}
    collector = ENGINE if configured else TARGET_PREFIX + name
    body: dict[str, Any] = {"engine": name, "ready": False}
    health = every.get(collector)
    if health is None or (configured and not engine_cfg.metrics_url):
        return 503, {**body, "reason": "not_configured", "detail": "engine.metrics_url is not set"}
    if health.runs == 0:
        return 503, {**body, "reason": "pending", "detail": "the engine has not been read yet"}
    if health.state == "failed":
        return 503, {**body, "reason": "down", "detail": health.last_error or "the engine's /metrics read failed"}
    age = now - (health.last_success_at or 0.0)
    # never below two of the collector's longest intervals: an engine read at the slow pace is not stale
    if age > max(cfg.max_age_s, 2 * health.interval_s):
        return 503, {**body, "reason": "stale", "detail": f"the engine was last read {age:.1f}s ago"}
    collections = state.collections()
    engine = collections.get(collector)
    hung = [f for f in (engine.findings if engine else ()) if f.id == HANG_FINDING]
    if hung:
        hung_ranks = [{"model": f.evidence.get("model"), "rank": f.evidence.get("rank")} for f in hung]
        return 503, {**body, "reason": "hung", "detail": hung[0].summary, "ranks": hung_ranks}
    probe = collections.get(PROBE) if configured else None
    failed = [
        f
        for f in (probe.findings if probe else ())
        if f.status == "fail" and (f.id == "runtime.hardware_mismatch" or f.id.endswith(".error"))
    ]
    if failed:
        return 503, {**body, "reason": "probe_failed", "detail": failed[0].summary}
    ranks: list[dict[str, Any]] = list(engine.details.get("hang", [])) if engine else []
    waiting = sum(float(r.get("waiting", 0)) for r in ranks)
    shed = cfg.shed_waiting
    if shed > 0 and waiting >= shed:
        return 503, {**body, "reason": "saturated", "detail": f"{waiting:.0f} requests waiting (shed at {shed})"}
    return 200, {"engine": name, "ready": True, "reason": "serving", "age_s": round(age, 3), "waiting": waiting}
