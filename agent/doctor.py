"""Host checks run once by ``inferwatch doctor`` (the CI/CD hardware gate).

Each check returns :class:`~agent.samples.Finding` values with status ok | warn | fail | skip. A check
that finds its data absent (NoDataError) is a ``skip`` carrying the hint; a check that crashes is a
``fail`` naming the error, so a broken host never passes the gate silently.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

from agent.config import Settings
from agent.errors import NoDataError
from agent.host.cpucap import amx_verdict, cpu_feature_verdict, read_cpu_capability, require_verdict
from agent.host.cpuprobe import cpu_probe
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
    services: dict[str, Any] = field(default_factory=dict)  # injected clients (nvml), as CollectContext


CheckFn = Callable[[DoctorContext], list[Finding]]


def check_pagecache(ctx: DoctorContext) -> list[Finding]:
    procfs = ctx.settings.path.procfs
    info = read_meminfo(procfs)
    try:
        pressure = read_pressure(procfs / "pressure" / "memory")
    except NoDataError:
        pressure = None
    return [pagecache_verdict(info, ctx.settings.pagecache.inactive_file_threshold_bytes, pressure)]


def check_cpu(ctx: DoctorContext) -> list[Finding]:
    """SIMD features expected for this CPU model, and ``--require`` features, against /proc/cpuinfo; AMX OS state."""
    try:
        cap = read_cpu_capability(
            ctx.settings.path.procfs, ctx.settings.path.sysfs, ctx.settings.cpu.expect_features, cpu_probe(ctx.services)
        )
    except NoDataError as exc:
        if not ctx.require:
            raise
        # A gate that cannot read the CPU must not pass: the required features are unverified.
        return [Finding("cpu.require", "fail", f"cannot check required CPU features: {exc}", {"hint": exc.hint})]
    findings = [cpu_feature_verdict(cap)]
    amx = amx_verdict(cap)  # only on x86_64 when --path.procfs is the running kernel's
    if amx is not None:
        findings.append(amx)
    if ctx.require:
        findings.append(require_verdict(cap, ctx.require))
    return findings


def check_gpu(ctx: DoctorContext) -> list[Finding]:
    """Every GPU NVML sees, flagged when its clocks are held down (power cap, thermal, hardware slowdown)."""
    from agent.collectors.gpu import nvml_client, throttle_finding
    from agent.host.nvml import CLOCK_EVENT_REASONS, NVMLUnsupported

    nv = nvml_client(ctx.services)
    nv.init()
    try:
        count = nv.device_count()
        if count == 0:
            raise NoDataError("NVML found no GPU", hint="check nvidia-smi; in a container pass --gpus all")
        findings = []
        for i in range(count):
            try:
                reasons = nv.clock_event_reasons(i)
            except NVMLUnsupported:
                findings.append(Finding(f"gpu{i}.throttle", "skip", f"GPU {i} does not report clock-event reasons"))
                continue
            active = [r for r, bit in CLOCK_EVENT_REASONS.items() if reasons & bit]
            findings.append(throttle_finding(i, nv.uuid(i), nv.name(i), active))
        return findings
    finally:
        nv.shutdown()


def check_runtime(ctx: DoctorContext) -> list[Finding]:
    from agent.diag.doctor_checks import runtime_checks

    return runtime_checks(ctx)


def check_engine(ctx: DoctorContext) -> list[Finding]:
    """Engine reachable, which engine, its metrics present, which quantities it cannot give (--engine-url)."""
    from agent.doctor_engine import engine_findings

    url = ctx.engine_url
    if not url:
        raise NoDataError("no engine URL", hint="pass --engine-url http://HOST:PORT")
    return engine_findings(url)


def check_engine_simd(ctx: DoctorContext) -> list[Finding]:
    """Is the engine's process executing AVX-512 / SVE while it serves? (--engine-url)"""
    from agent.doctor_engine import simd_findings

    url = ctx.engine_url
    if not url:
        raise NoDataError("no engine URL", hint="pass --engine-url http://HOST:PORT")
    s = ctx.settings
    return simd_findings(url, s.path.procfs, s.runtime, s.simd.busy_cpu_cores)


# The explicit list of checks, in the order doctor prints them.
CHECKS: list[tuple[str, CheckFn]] = [
    ("pagecache", check_pagecache),
    ("cpu", check_cpu),
    ("gpu", check_gpu),
    ("runtime", check_runtime),
    ("engine", check_engine),
    ("engine.simd", check_engine_simd),
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
