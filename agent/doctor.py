"""Host checks run once by ``inferwatch doctor`` (the CI/CD hardware gate).

Each check returns :class:`~agent.samples.Finding` values with status ok | warn | fail | skip. A check
that finds its data absent (NoDataError) is a ``skip`` carrying the hint; a check that crashes is a
``fail`` naming the error, so a broken host never passes the gate silently.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass, field

from agent.config import Settings
from agent.errors import NoDataError
from agent.host.meminfo import read_meminfo
from agent.host.pagecache import pagecache_verdict
from agent.host.pressure import read_pressure
from agent.samples import Finding


@dataclass
class DoctorContext:
    settings: Settings
    require: list[str] = field(default_factory=list)  # CPU features that must be present
    engine_url: str | None = None  # runtime base URL: the streaming probe runs once against it
    profile_url: str | None = None  # debug runtime_profile URL


CheckFn = Callable[[DoctorContext], list[Finding]]


def check_pagecache(ctx: DoctorContext) -> list[Finding]:
    procfs = ctx.settings.path.procfs
    info = read_meminfo(procfs)
    try:
        pressure = read_pressure(procfs / "pressure" / "memory")
    except NoDataError:
        pressure = None
    return [pagecache_verdict(info, ctx.settings.pagecache.inactive_file_threshold_bytes, pressure)]


def check_runtime(ctx: DoctorContext) -> list[Finding]:
    from agent.diag.doctor_checks import runtime_checks

    return runtime_checks(ctx)


# The explicit list of checks, in the order doctor prints them.
CHECKS: list[tuple[str, CheckFn]] = [
    ("pagecache", check_pagecache),
    ("runtime", check_runtime),
]


def run_checks(ctx: DoctorContext, checks: list[tuple[str, CheckFn]] | None = None) -> list[Finding]:
    findings: list[Finding] = []
    for check_id, fn in checks or CHECKS:
        try:
            findings.extend(fn(ctx))
        except NoDataError as exc:
            findings.append(Finding(check_id, "skip", str(exc.args[0]), {"hint": exc.hint}))
        except Exception as exc:
            findings.append(Finding(check_id, "fail", f"check failed: {type(exc).__name__}: {exc}"))
    return findings


def exit_code(findings: list[Finding]) -> int:
    return 1 if any(f.status == "fail" for f in findings) else 0


def as_json(findings: list[Finding]) -> dict[str, object]:
    return {
        "checks": [
            {"id": f.id, "status": f.status, "summary": f.summary, "evidence": dict(f.evidence), "runbook": f.runbook}
            for f in findings
        ]
    }
