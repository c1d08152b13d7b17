"""``inferwatch doctor`` (the CI/CD hardware gate): the registered collectors run once, as in the agent.

The doctor builds the agent's dependencies (:func:`inferwatch.agent.node.wiring.build_deps`: the same runtime locator,
NVML client and CPU probe; an ephemeral redaction key, nothing written), instantiates every collector the
registry enables for these settings (:func:`inferwatch.agent.node.collectors.enabled_collectors`, as the agent does),
runs each once through the runner's own validation (:func:`inferwatch.agent.node.runner.run_collection`) in registry
order, and prints the findings the collectors reach; a registered collector that is not enabled is a ``skip`` saying
how to enable it. No check is implemented twice: what the doctor adds is a view of a collector's result
(the engine's, :mod:`inferwatch.agent.doctor.engine`; the probe's 404 as a skip) and what only a gate asks:
``--require`` CPU features, and, with ``--engine-url``, short completions sent to a llama.cpp engine while
the ``simd`` collector measures its window. The binary check runs once as the action it is.

A collector that finds its data absent (NoDataError) is a ``skip`` carrying the hint; one that crashes
is a ``fail`` naming the error, so a broken host never passes the gate silently.
"""

from __future__ import annotations

import contextlib
import functools
import time
from collections.abc import Callable, Iterator, Sequence
from dataclasses import dataclass, field

from inferwatch.agent.common.redact import redact_text
from inferwatch.agent.common.samples import Collection, Finding
from inferwatch.agent.doctor.engine import SIMD_WINDOW_S, EngineRun, engine_findings, load, split_url
from inferwatch.agent.errors import NoDataError
from inferwatch.agent.node.collectors import REGISTRY, build, enabled_collectors
from inferwatch.agent.node.collectors.base import Collector
from inferwatch.agent.node.host.cpucap import read_cpu_capability, require_verdict
from inferwatch.agent.node.probe.client import PROTOCOLS
from inferwatch.agent.node.runner import run_collection
from inferwatch.agent.node.wiring import Deps

# The check id a collector's absence, failure or "not enabled" is reported under, where it is not the
# collector's name (the ids doctor has always printed).
CHECK_IDS = {"probe": "runtime.probe", "runtime_profile": "runtime.profile", "simd": "engine.simd"}
# The doctor's flag that configures a collector, and the setting it sets (named in the hint of its skip).
FLAGS = {
    "engine": ("--engine-url", "engine.metrics_url"),
    "probe": ("--engine-url", "probe.url"),
    "runtime_profile": ("--profile-url", "runtime_profile.url"),
    "simd": ("--engine-url", "runtime.*"),
}
# Collectors that report a rate over the time between two runs: run twice, this many seconds apart.
WINDOWS_S = {"simd": SIMD_WINDOW_S}
NOT_SERVED = (404, 405)  # a protocol the runtime does not serve: a skip in the doctor, not a failure


@dataclass(frozen=True)
class DoctorRequest:
    """What the command line asks besides the settings."""

    require: Sequence[str] = field(default_factory=tuple)  # CPU features that must be present (lower case)
    engine_url: str | None = None  # runtime base URL: engine checks, and the streaming probe once


def doctor_overrides(engine_url: str | None, profile_url: str | None, machine: str | None = None) -> dict[str, object]:
    """Settings overrides for the flags: the probe (every protocol) and runtime_profile point at the runtime;
    ``--machine`` states the architecture of a recorded procfs tree."""
    out: dict[str, object] = {}
    if machine:
        out["path"] = {"machine": machine}
    if engine_url:
        base, metrics_url = split_url(engine_url)
        out["probe"] = {"url": base, "protocols": list(PROTOCOLS)}
        out["engine"] = {"metrics_url": metrics_url}  # the engine collector; simd finds the engine by its port
    if profile_url:
        out["runtime_profile"] = {"url": profile_url}
    return out


def check_id(name: str) -> str:
    return CHECK_IDS.get(name, name)


def check_collector(deps: Deps, name: str) -> list[Finding]:
    """Run one registered collector once, as the agent would; return its findings (raises as it does)."""
    collector = build(name, deps.collect_context(), deps.settings)
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
        cap = read_cpu_capability(
            src.procfs, src.sysfs, s.cpu.expect_features, src.cpu_probe, s.path.machine, src.read_limits
        )
    except NoDataError as exc:
        return [Finding("cpu.require", "fail", f"cannot check required CPU features: {exc}", {"hint": exc.hint})]
    return [require_verdict(cap, list(require))]


def check_binary(deps: Deps) -> list[Finding]:
    deps.binary.check()
    if deps.binary.absent is not None:
        raise deps.binary.absent
    return deps.binary.findings()


def not_enabled(deps: Deps, name: str) -> Finding:
    """A registered collector these settings do not enable: a skip that says how to enable it."""
    if deps.settings.collector(name).enabled is False:
        summary, hint = f"collector {name} is disabled", f"collectors.{name}.enabled: true"
    elif name in FLAGS:
        flag, setting = FLAGS[name]
        summary, hint = f"{setting} is not set: collector {name} is off", f"pass {flag} URL (or set {setting})"
    else:
        summary, hint = f"collector {name} is off", f"collectors.{name}.enabled: true"
    return Finding(check_id(name), "skip", summary, {"hint": hint})


def _guarded(cid: str, fn: Callable[[], list[Finding]], request: DoctorRequest, name: str = "") -> list[Finding]:
    """``fn``'s findings; its absence a skip with the hint, anything it raises a fail naming the error."""
    try:
        return fn()
    except NoDataError as exc:
        if cid == "cpu" and request.require:
            return []  # the require check says it, as a failure
        hint = redact_text(exc.hint)
        if name in FLAGS and FLAGS[name][0] not in hint:  # the doctor's own way to configure it
            hint = "; ".join(h for h in (hint, f"doctor: {FLAGS[name][0]} URL") if h)
        return [Finding(cid, "skip", redact_text(str(exc.args[0])), {"hint": hint})]
    except Exception as exc:
        return [Finding(cid, "fail", redact_text(f"check failed: {type(exc).__name__}: {exc}"))]


class _Doctor:
    """One doctor run over the enabled collectors; the engine's result is kept for the SIMD window's load."""

    def __init__(self, deps: Deps, request: DoctorRequest) -> None:
        self.deps, self.request = deps, request
        self.engine_kind: str | None = None

    def run(self, collector: Collector) -> list[Finding]:
        name = collector.name
        if name == "engine":
            return self._engine(collector)
        if name in WINDOWS_S:
            with self._load():
                run_collection(collector)  # the window's start (an absence ends it here)
                time.sleep(WINDOWS_S[name])
                return list(run_collection(collector).findings)
        return _as_doctor(name, run_collection(collector))

    def _engine(self, collector: Collector) -> list[Finding]:
        started = time.perf_counter()
        try:
            collection: Collection | None = run_collection(collector)
            error: Exception | None = None
        except NoDataError:
            raise
        except Exception as exc:
            collection, error = None, exc
        url = self.deps.settings.engine.metrics_url or ""
        run = EngineRun(url, time.perf_counter() - started, collection, error)
        if collection is not None:
            self.engine_kind = str(collection.details.get("engine") or "") or None
        return engine_findings(run)

    @contextlib.contextmanager
    def _load(self) -> Iterator[None]:
        """With ``--engine-url``: the engine serves short completions while the window runs (llama.cpp only)."""
        if not self.request.engine_url:
            yield
            return
        with load(self.request.engine_url, self.engine_kind):
            yield


def run_checks(deps: Deps, request: DoctorRequest | None = None) -> list[Finding]:
    """Every registered collector, in registry order: the enabled ones run once, the others a skip."""
    request = request or DoctorRequest()
    doctor = _Doctor(deps, request)
    collectors = {c.name: c for c in enabled_collectors(deps.collect_context(), deps.settings)}
    findings: list[Finding] = []
    try:
        for name in REGISTRY:
            collector = collectors.get(name)
            if collector is None:
                findings.append(not_enabled(deps, name))
            else:
                findings.extend(_guarded(check_id(name), functools.partial(doctor.run, collector), request, name))
            if name == "cpu" and request.require:
                findings.extend(_guarded("cpu.require", lambda: check_require(deps, request.require), request))
    finally:
        for collector in collectors.values():
            with contextlib.suppress(Exception):
                collector.close()
    findings.extend(_guarded("runtime.binary", lambda: check_binary(deps), request))
    return findings


def exit_code(findings: list[Finding]) -> int:
    return 1 if any(f.status == "fail" for f in findings) else 0


def machine_of(findings: list[Finding]) -> dict[str, object] | None:
    """The architecture the CPU checks read the procfs tree as, and its source (None when cpuinfo was not read)."""
    for f in findings:
        ev = f.evidence
        if f.id == "cpu.features" and "arch_source" in ev:
            return {k: ev[k] for k in ("machine", "arch", "arch_source", "arch_evidence") if k in ev}
    return None


def machine_line(findings: list[Finding]) -> str:
    """One line under the doctor's table: which architecture the tree was read as, and why."""
    m = machine_of(findings)
    if m is None:
        return "architecture: not read (see the cpu check)"
    return f"architecture: {m.get('machine') or m.get('arch')} ({m['arch_source']}: {m.get('arch_evidence', '')})"


def as_json(findings: list[Finding]) -> dict[str, object]:
    from inferwatch.agent.node.api.routes import finding_dict

    out: dict[str, object] = {"checks": [finding_dict(f) for f in findings]}
    machine = machine_of(findings)
    if machine is not None:
        out["machine"] = machine
    return out
