"""What the hang detector's verdicts become: samples, an ``engine_hung`` finding per hung rank, details.

A rank is hung *but healthy* when it is stalled past its allowance and the engine does not fail its
``/health`` check (:func:`hung`); the health URL defaults to the metrics URL's origin + ``/health``.
"""

from __future__ import annotations

from inferwatch.agent.catalog.engine import MODEL
from inferwatch.agent.common.samples import Finding, Sample, attrs
from inferwatch.agent.node.engine.hang import RankVerdict

HANG_FINDING = "engine_hung"
HANG_RUNBOOK = "EngineHungButHealthy"


def health_url(metrics_url: str | None, configured: str | None) -> str:
    """``engine.health_url``, else the metrics URL's origin + ``/health`` ("" when there is neither)."""
    if configured is not None:
        return configured
    if not metrics_url:
        return ""
    import httpx  # an engine URL is configured: its collector's client imports httpx too

    u = httpx.URL(metrics_url)
    return str(u.copy_with(path="/health", query=None, fragment=None))


def hung(v: RankVerdict, health: str) -> bool:
    """Stalled past the allowance and the engine does not fail its health check (hung *but healthy*)."""
    return v.stalled and health != "failed"


def hang_samples(verdicts: list[RankVerdict], health: str) -> list[Sample]:
    out: list[Sample] = []
    for v in verdicts:
        a = attrs({MODEL: v.model}, rank=v.rank)
        out.append(Sample("inferwatch.engine.stall", v.stall_s, a))
        out.append(Sample("inferwatch.engine.stall.allowance", v.allowance_s, a))
        out.append(Sample("inferwatch.engine.hung", 1 if hung(v, health) else 0, a))
    return out


def hang_dict(v: RankVerdict) -> dict[str, object]:
    return {
        "model": v.model,
        "rank": v.rank,
        "running": v.running,
        "waiting": v.waiting,
        "stall_s": round(v.stall_s, 3),
        "allowance_s": round(v.allowance_s, 3),
        "stalled": v.stalled,
        "prefill_s_per_token": v.prefill_s_per_token,
        "max_model_len": v.max_model_len,
        "fast": v.fast,
    }


def hang_findings(verdicts: list[RankVerdict], health: str, url: str) -> list[Finding]:
    """One ``engine_hung`` finding per hung rank (status fail); none while every rank progresses."""
    out = []
    for v in verdicts:
        if not hung(v, health):
            continue
        out.append(
            Finding(
                HANG_FINDING,
                "fail",
                f"engine rank {v.rank} of {v.model}: {v.running:.0f} running, {v.waiting:.0f} waiting, no token for "
                f"{v.stall_s:.0f}s ({'fast path' if v.fast else 'allowance'} {v.allowance_s:.0f}s); /health {health}",
                {**hang_dict(v), "health": health, "health_url": url},
                HANG_RUNBOOK,
            )
        )
    return out
