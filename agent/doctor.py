"""``inferwatch doctor`` (the CI/CD hardware gate): the registered collectors run once, as in the agent.

The doctor builds the agent's dependencies (:func:`agent.wiring.build_deps`: the same runtime locator,
NVML client and CPU probe; an ephemeral redaction key, nothing written), runs each collector of
:data:`COLLECTORS` once through the runner's own validation (:func:`agent.runner.run_collection`) and
prints the findings the collectors reach. The binary check runs once as the action it is. What only a
gate asks is checked here and nowhere else: ``--require`` CPU features, and ``--engine-url``'s engine
checks (reachable, engine kind, metric families, quantities it cannot give; the SIMD verdict under load,
:mod:`agent.doctor_engine`).

A collector that finds its data absent (NoDataError) is a ``skip`` carrying the hint; one that crashes
is a ``fail`` naming the error, so a broken host never passes the gate silently.
"""

from __future__ import annotations

import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field

from agent.collectors import REGISTRY
from agent.errors import NoDataError
from agent.host.cpucap import read_cpu_capability, require_verdict
from agent.probe.client import PROTOCOLS
from agent.redact import redact_text
from agent.runner import run_collection
from agent.samples import Collection, Finding
from agent.wiring import Deps

# Collector → the check id its absence or failure is reported under, in the order doctor prints them.
COLLECTORS: tuple[tuple[str, str], ...] = (
    ("pagecache", "pagecache"),
    ("cpu", "cpu"),
    ("gpu", "gpu"),
    ("probe", "runtime.probe"),
    ("runtime_profile", "runtime.profile"),
)
NOT_SERVED = (404, 405)  # a protocol the runtime does not serve: a skip in the doctor, not a failure


@dataclass(frozen=True)
class DoctorRequest:
    """What the command line asks besides the settings."""

    require: Sequence[str] = field(default_factory=tuple)  # CPU features that must be present (lower case)
    engine_url: str | None = None  # runtime base URL: engine checks, and the streaming probe once


def doctor_overrides(engine_url: str | None, profile_url: str | None) -> dict[str, object]:
    """Settings overrides for the flags: the probe (every protocol) and runtime_profile point at the runtime."""
    out: dict[str, object] = {}
    if engine_url:
        base = engine_url.rstrip("/").removesuffix("/metrics")
        out["probe"] = {"url": base, "protocols": list(PROTOCOLS)}
        out["engine"] = {"metrics_url": base + "/metrics"}  # the simd collector finds the engine by its port
    if profile_url:
        out["runtime_profile"] = {"url": profile_url}
    return out


def check_collector(deps: Deps, name: str) -> list[Finding]:
    """Run one registered collector once, as the agent would; return its findings (raises as it does)."""
    collector = REGISTRY[name].cls(deps.collect_context())
    try:
        collection = run_collection(collector)
    finally:
        collector.close()
    return _as_doctor(name, collection)


def _as_doctor(name: str, collection: Collection) -> list[Finding]:
    if name != "probe":
        return list(collection.findings)
    out: list[Finding] = []
    for finding in collection.findings:
        protocol = finding.id.split(".")[1] if finding.id.startswith("probe.") else None
        result = collection.details.get(protocol or "", {})
        if isinstance(result, dict) and result.get("status_code") in NOT_SERVED:
            out.append(Finding(f"probe.{protocol}", "skip", f"the runtime does not serve {result.get('url')}"))
        else:
            out.append(finding)
    return out


def check_require(deps: Deps, require: Sequence[str]) -> list[Finding]:
    """``--require``: the features must be present; a gate that cannot read the CPU fails."""
    s = deps.settings
    try:
        src = deps.sources
        cap = read_cpu_capability(src.procfs, src.sysfs, s.cpu.expect_features, src.cpu_probe, limits=src.read_limits)
    except NoDataError as exc:
        return [Finding("cpu.require", "fail", f"cannot check required CPU features: {exc}", {"hint": exc.hint})]
    return [require_verdict(cap, list(require))]


def check_binary(deps: Deps) -> list[Finding]:
    deps.binary.check()
    if deps.binary.absent is not None:
        raise deps.binary.absent
    return deps.binary.findings()


def check_engine(deps: Deps, url: str | None) -> list[Finding]:
    """Engine reachable, which engine, its metrics present, which quantities it cannot give (--engine-url)."""
    from agent.doctor_engine import engine_findings

    if not url:
        raise NoDataError("no engine URL", hint="pass --engine-url http://HOST:PORT")
    return engine_findings(url)


def check_engine_simd(deps: Deps, url: str | None) -> list[Finding]:
    """Is the engine's process executing AVX-512 / SVE while it serves? (--engine-url)

    The ``simd`` collector, run as the agent runs it (the runtime from the one locator: ``runtime.*``,
    else the engine port's listener), twice :data:`~agent.doctor_engine.SIMD_WINDOW_S` apart under load.
    """
    from agent.doctor_engine import SIMD_WINDOW_S, load

    if not url:
        raise NoDataError("no engine URL", hint="pass --engine-url http://HOST:PORT")
    collector = REGISTRY["simd"].cls(deps.collect_context())
    try:
        with load(url):
            run_collection(collector)
            time.sleep(SIMD_WINDOW_S)
            collection = run_collection(collector)
    finally:
        collector.close()
    return list(collection.findings)


def run_checks(deps: Deps, request: DoctorRequest | None = None) -> list[Finding]:
    request = request or DoctorRequest()
    checks: list[tuple[str, Callable[[], list[Finding]]]] = []
    for name, check_id in COLLECTORS:
        checks.append((check_id, lambda name=name: check_collector(deps, name)))  # type: ignore[misc]
        if name == "cpu" and request.require:
            checks.append(("cpu.require", lambda: check_require(deps, request.require)))
    checks += [
        ("runtime.binary", lambda: check_binary(deps)),
        ("engine", lambda: check_engine(deps, request.engine_url)),
        ("engine.simd", lambda: check_engine_simd(deps, request.engine_url)),
    ]
    findings: list[Finding] = []
    for check_id, fn in checks:
        try:
            findings.extend(fn())
        except NoDataError as exc:
            if check_id == "cpu" and request.require:
                continue  # the require check says it, as a failure
            findings.append(Finding(check_id, "skip", redact_text(str(exc.args[0])), {"hint": redact_text(exc.hint)}))
        except Exception as exc:
            findings.append(Finding(check_id, "fail", redact_text(f"check failed: {type(exc).__name__}: {exc}")))
    return findings


def exit_code(findings: list[Finding]) -> int:
    return 1 if any(f.status == "fail" for f in findings) else 0


def as_json(findings: list[Finding]) -> dict[str, object]:
    from agent.api.routes import finding_dict

    return {"checks": [finding_dict(f) for f in findings]}
