"""Many engines per agent: one set of collectors per discovered engine target, started and stopped as targets come
and go.

Part of the composition root. :class:`EngineTargets` is itself a collector the runner schedules at the agent's
interval: each run polls :class:`~inferwatch.agent.node.discovery.combined.Discovery` and applies the
:class:`~inferwatch.agent.node.discovery.target.TargetChanges` to the runner (:meth:`Runner.add` /
:meth:`Runner.remove`), so a target added, changed (a new IP or container id after a restart) or removed is running,
restarted or gone within one interval. Per target, built from the same classes as the single engine's:

- ``engine:<name>``: an :class:`~inferwatch.agent.node.collectors.engine.EngineCollector` of its own (its own
  windows, hang detector, /health probe, model-length question and HTTP client) on a lane (thread) of its own, so a
  slow or hung engine delays no other;
- ``runtime_profile:<name>``: a runtime-profile reader of its own, where the target has a profile URL;
- ``probe:<name>``: the streaming probe at the engine's API, with ``probe.targets``;
- ``spans:<name>``: with the span receiver on and a pod identity, the latency analytics and tail explainer of the
  requests whose spans' resource names its pod (:mod:`inferwatch.agent.node.analytics.pertarget`);
- ``process:<name>`` and ``simd:<name>``: the engine's process, where the target has a pod UID and container id:
  found through the container's cgroup (:mod:`inferwatch.agent.node.host.podprocess`), or for an engine on this
  host's loopback as the listener of its port, never a command-line pattern. Once found, the process is registered
  in :class:`~inferwatch.agent.node.actions.runtimes.Runtimes` under the target's name, where the actions (py-spy,
  evidence capture) find it when a request or a hang names the target, with a binary check of its own
  (``binary:<name>``).

Why a collector instance per target and not one collector that loops over targets: the runner already gives each
collector its timeout, its health record (``inferwatch.collector.success{collector="engine:<name>"}``), its failure
log lines and its adaptive cadence; a loop would have to re-implement all of them per target, and one target's hang
would hold up the others' reads.

Every series and finding of a target carries its identity (:data:`~inferwatch.agent.catalog.engine.TARGET_ATTRIBUTES`:
the target's name, and the engine's ``k8s.namespace.name``/``k8s.pod.name``/``k8s.container.name`` where it has them:
Prometheus ``namespace``/``pod``/``container``), stamped here on what its collectors return, so two engines serving
one model are two series, not one.
"""

from __future__ import annotations

import logging
import time
from collections.abc import Callable
from dataclasses import dataclass, replace
from pathlib import Path
from typing import Any, ClassVar
from urllib.parse import urlsplit

import msgspec

from inferwatch.agent.catalog.engine import TARGET_ATTRIBUTES
from inferwatch.agent.common.samples import AnySample, Attributes, Collection, Finding
from inferwatch.agent.config import DiscoverySettings, EngineSettings, ProbeSettings, RuntimeProfileSettings, Settings
from inferwatch.agent.errors import NoDataError, SourceFormatError
from inferwatch.agent.node.actions.binary import BinaryCheck
from inferwatch.agent.node.actions.evidence import EvidenceStore
from inferwatch.agent.node.actions.runtimes import Runtime, Runtimes, UnknownTargetError
from inferwatch.agent.node.analytics.pertarget import TargetSpanAnalytics, TargetSpans
from inferwatch.agent.node.collectors import HOST_LANE, Schedule, is_enabled, schedule
from inferwatch.agent.node.collectors.base import BaseCollector, CollectContext
from inferwatch.agent.node.collectors.engine import EngineCollector
from inferwatch.agent.node.collectors.probe import ProbeCollector
from inferwatch.agent.node.collectors.process import ProcessCollector
from inferwatch.agent.node.collectors.runtime_profile import RuntimeProfileCollector
from inferwatch.agent.node.collectors.simd import SimdCollector
from inferwatch.agent.node.debugprofile.reader import ProfileReader
from inferwatch.agent.node.discovery.combined import Discovery
from inferwatch.agent.node.discovery.target import EngineTarget
from inferwatch.agent.node.host.podprocess import find_container_processes
from inferwatch.agent.node.host.procfs import ReadLimits
from inferwatch.agent.node.host.runtime import RuntimeLocator, pid_listening_on
from inferwatch.agent.node.runner import Runner
from inferwatch.agent.node.simd.codescan import CodeScanCache
from inferwatch.agent.node.state import AgentState

log = logging.getLogger(__name__)

SUPERVISOR_TIMEOUT_S = 30.0  # one run of the supervisor: building the targets' clients, closing the removed ones
PROCESS_RETRY_S = 60.0  # a target whose process was not found (a container starting) is looked for again this often
DEFAULT_FIND_TIMEOUT_S = 15.0  # find_target: how long a one-off command waits for the Kubernetes list
FIND_POLL_S = 0.5
PROCESS_KINDS = ("process", "simd")  # a target's collectors on its process's pid: found, and lost, together


def discovery_configured(settings: DiscoverySettings) -> bool:
    """Whether any target source is set: the agent then watches the discovered engines (and the single configured
    ``engine.metrics_url`` too, where it is set, as before)."""
    return bool(settings.targets or settings.file is not None or settings.kubernetes)


def target_attributes(target: EngineTarget) -> dict[str, str]:
    """The identity every series and finding of ``target`` carries (catalog ``TARGET_ATTRIBUTES``), where known."""
    engine = target.resource_attributes()
    return {"inferwatch.engine.name": target.name, **{k: v for k, v in engine.items() if k in TARGET_ATTRIBUTES}}


def origin(url: str) -> str:
    """``scheme://host:port`` of ``url``: where an engine serves its API beside its metrics."""
    parts = urlsplit(url)
    return f"{parts.scheme}://{parts.netloc}"


LOOPBACK_HOSTS = frozenset({"127.0.0.1", "localhost", "::1", "[::1]"})


def local_port(target: EngineTarget) -> int | None:
    """The metrics URL's port when its host is this host's loopback (an engine beside the agent), else None."""
    url = urlsplit(target.metrics_url)
    try:
        port = url.port or (443 if url.scheme == "https" else 80)
    except ValueError:
        return None
    return port if (url.hostname or "") in LOOPBACK_HOSTS else None


def process_findable(target: EngineTarget) -> bool:
    """Whether the agent can tell the target's process apart from other engines': by its container (Kubernetes), or
    as the listener of its port on this host's loopback."""
    ident = target.identity
    return bool(ident.pod_uid and ident.container_id) or local_port(target) is not None


def target_pid(target: EngineTarget, procfs: Path, limits: ReadLimits) -> int:
    """The engine's process: through its container's cgroup on Kubernetes (a pod UID and container id); else, for
    an engine on this host's loopback, the process listening on its metrics port. Never a command-line pattern: two
    engines on one node would match one pattern. NoDataError (or SourceFormatError) when not found."""
    ident = target.identity
    if ident.pod_uid and ident.container_id:
        return find_container_processes(procfs, ident.pod_uid, ident.container_id, limits).pid
    port = local_port(target)
    pid = pid_listening_on(procfs, port) if port is not None else None
    if pid is None:
        raise NoDataError(
            f"no process listening on port {port} of this host",
            hint="run the agent as root in the engine's network and PID namespaces",
        )
    return pid


def find_target(settings: DiscoverySettings, name: str, timeout_s: float = DEFAULT_FIND_TIMEOUT_S) -> EngineTarget:
    """Target ``name`` from a discovery of its own (a one-off command with no agent running): the static and file
    targets at once, the Kubernetes pods once listed (waited for up to ``timeout_s``). UnknownTargetError listing the
    targets found when there is no such target."""
    discovery = Discovery(settings)
    discovery.start()
    try:
        deadline = time.monotonic() + timeout_s
        while True:
            poll = discovery.poll()
            if name in poll.targets:
                return poll.targets[name]
            if not settings.kubernetes or time.monotonic() >= deadline:
                raise UnknownTargetError(name, sorted(poll.targets))
            time.sleep(FIND_POLL_S)
    finally:
        discovery.stop()


def stamp(samples: list[AnySample] | tuple[AnySample, ...], identity: Attributes) -> list[AnySample]:
    """``samples`` with ``identity`` added to each one's attributes (kept sorted, as :func:`attrs` makes them)."""
    return [replace(s, attributes=tuple(sorted((*s.attributes, *identity)))) for s in samples]


class TargetCollector(BaseCollector):
    """One of a target's collectors under the name ``<kind>:<target>``, its output stamped with the target's
    identity. Timeouts and hangs the runner decides reach the inner collector (the engine's ``up`` says so)."""

    name: ClassVar[str] = "target"  # shadowed per instance: see __init__

    def __init__(self, inner: BaseCollector, target: EngineTarget) -> None:
        super().__init__(inner.ctx)
        self.inner = inner
        self.target = target
        self.name = f"{inner.name}:{target.name}"  # type: ignore[misc]  # one collector (and health) per target
        self.kind = inner.name
        self.identity: Attributes = tuple(sorted(target_attributes(target).items()))

    def collect(self) -> Collection:
        try:
            c = self.inner.collect()
        except NoDataError as exc:
            if exc.samples:
                exc.samples = stamp(list(exc.samples), self.identity)
            raise
        findings = [self._finding(f) for f in c.findings]
        details = {**c.details, "target": target_dict(self.target)}
        events = tuple({**e, "meta": {**e.get("meta", {}), **dict(self.identity)}} for e in c.events)  # snapshots
        return Collection(stamp(list(c.samples), self.identity), findings, details, events)

    def _finding(self, f: Finding) -> Finding:
        evidence = {**f.evidence, **dict(self.identity)}
        return Finding(f.id, f.status, f"{self.target.name}: {f.summary}", evidence, f.runbook)

    def status_samples(self) -> list[AnySample]:
        status = getattr(self.inner, "status_samples", None)
        return stamp(status(), self.identity) if callable(status) else []

    def run_failed(self, reason: str) -> None:
        self.inner.run_failed(reason)

    def read_again_in(self) -> float | None:
        """The inner collector's (the engine's: a hang verdict due before its next timed run), for the runner."""
        hook = getattr(self.inner, "read_again_in", None)
        return hook() if callable(hook) else None

    def close(self) -> None:
        self.inner.close()


def target_dict(t: EngineTarget) -> dict[str, Any]:
    """A target as the status API shows it."""
    ident = t.identity
    return {
        "name": t.name,
        "kind": t.kind,
        "source": t.source,
        "metrics_url": t.metrics_url,
        "namespace": ident.namespace,
        "pod": ident.pod,
        "container": ident.container,
    }


@dataclass
class _Running:
    target: EngineTarget
    names: list[str]  # its collectors' names on the runner
    process_looked_at: float = float("-inf")
    process_error: str | None = None
    binary: BinaryCheck | None = None  # its process's binary check, while the process is known


class EngineTargets(BaseCollector):
    """The supervisor: run by the runner like a collector (``discovery``); applies each poll's changes."""

    name: ClassVar[str] = "discovery"
    description: ClassVar[str] = "Engine targets (static list, file_sd, Kubernetes pods): collectors per engine"

    def __init__(
        self,
        settings: Settings,
        ctx: CollectContext,
        state: AgentState,
        runner: Runner,
        discovery: Discovery,
        clock: Callable[[], float] = time.monotonic,
        runtimes: Runtimes | None = None,
        evidence: EvidenceStore | None = None,
        spans: TargetSpans | None = None,
    ) -> None:
        """``runtimes``: where each target's process is registered for the actions once found; ``evidence``: told
        when a target goes, to drop what it kept of it; ``spans``: the span receiver's sink (receiver on), where
        each target with a pod gets span analytics of its own."""
        super().__init__(ctx)
        self.settings = settings
        self.state = state
        self.runner = runner
        self.discovery = discovery
        self.runtimes = runtimes
        self.evidence = evidence
        self.spans = spans
        self._clock = clock
        self._running: dict[str, _Running] = {}
        self._failing: set[str] = set()  # targets whose collectors could not be built at the last run
        self._code_scans = CodeScanCache()  # the SIMD checks' library scans, shared: engines map the same libraries

    def plan(self) -> Schedule:
        """Its own schedule: the agent's interval, on a lane of its own, with time to start and stop targets (a
        stopped engine collector waits up to its model-length question's timeout for that thread)."""
        return Schedule(self.settings.interval_s, SUPERVISOR_TIMEOUT_S, self.name)

    def start(self) -> None:
        self.discovery.start()

    def collect(self) -> Collection:
        poll = self.discovery.poll()
        # What runs is brought to what was discovered (not replayed from the poll's diff): a target whose start
        # failed, or a run the runner gave up on, is put right at the next run.
        for name, running in list(self._running.items()):
            wanted = poll.targets.get(name)
            if wanted != running.target:
                self._stop(name, "removed" if wanted is None else "changed")
        failed: dict[str, str] = {}
        for name, target in poll.targets.items():
            if name not in self._running:
                try:
                    self._start(target)
                except Exception as exc:  # one target that cannot start keeps none of the others from starting
                    self._stop(name, "failed to start")
                    failed[name] = f"{type(exc).__name__}: {exc}"
                    if name not in self._failing:  # logged once when it starts failing, not every interval
                        log.warning("engine target %s cannot start: %s", name, failed[name])
        self._failing = set(failed)
        now = self._clock()
        for running in self._running.values():
            if now - running.process_looked_at < PROCESS_RETRY_S:
                continue
            # not found yet (a container starting, an engine not listening), or gone (restarted: a new pid)
            if running.process_error is not None or self._process_gone(running):
                self._add_process(running)
        details = {
            "targets": [
                {
                    **target_dict(r.target),
                    "collectors": r.names,
                    "process": (r.process_error or "found") if process_findable(r.target) else "not_on_this_host",
                }
                for r in self._running.values()
            ],
            "errors": {**poll.errors, **{f"start:{name}": message for name, message in failed.items()}},
            "problems": poll.problems,
        }
        return Collection(details=details)

    def _engine(self, target: EngineTarget) -> EngineSettings:
        """The target's engine section: the agent's, with the target's URLs and kind."""
        update = {"metrics_url": target.metrics_url, "kind": target.kind, "health_url": target.health_url}
        return msgspec.structs.replace(self.settings.engine, **update)

    def _profile(self, target: EngineTarget) -> RuntimeProfileSettings:
        return msgspec.structs.replace(self.settings.runtime_profile, url=target.profile_url)

    def _probe(self, target: EngineTarget) -> ProbeSettings:
        """The target's streaming probe: the agent's section at the engine's API (its metrics URL's origin: vLLM,
        SGLang, TGI and llama.cpp serve both on one port), asking the engine for its own model (``probe.model``
        names the configured engine's)."""
        return msgspec.structs.replace(self.settings.probe, url=origin(target.metrics_url), model=None)

    def _ctx(self, target: EngineTarget, locator: RuntimeLocator | None = None) -> CollectContext:
        s = self.settings
        loc = locator or self.ctx.locator
        reader = self.ctx.profile_reader
        if target.profile_url:
            reader = ProfileReader(
                self._profile(target),
                loc,
                key_dir=s.snapshots.dir,
                environment=s.node.environment,
                procfs=self.ctx.procfs,
                read_limits=self.ctx.read_limits,
            )
        return replace(self.ctx, locator=loc, profile_reader=reader)

    def _add(self, running: _Running, inner: BaseCollector) -> None:
        collector = TargetCollector(inner, running.target)
        plan = schedule(inner.name, self.settings)
        if plan.lane != "host":  # a network source: a lane (thread) per target, so one engine never waits on another
            plan = replace(plan, lane=collector.name)
        plan = replace(plan, absence_final=False)  # the target says there is something to watch
        self.runner.add(collector, plan)
        self.state.add_source(f"{collector.name}.status", collector.status_samples)
        running.names.append(collector.name)

    def _start(self, target: EngineTarget) -> None:
        running = self._running[target.name] = _Running(target, [])
        ctx = self._ctx(target)
        self._add(running, EngineCollector(ctx, self._engine(target)))
        if target.profile_url:
            self._add(running, RuntimeProfileCollector(ctx, self._profile(target)))
        if self.settings.probe.targets:
            self._add(running, ProbeCollector(ctx, self._probe(target)))
        engine_spans = self.spans.add(target.name, target_attributes(target)) if self.spans is not None else None
        if engine_spans is not None:  # its requests' latencies apart from the node's other engines'
            s = self.settings
            processor = TargetSpanAnalytics(engine_spans, self.state, tuple(sorted(target_attributes(target).items())))
            self.runner.add(processor, Schedule(s.interval_s, min(s.timeout_s, s.interval_s), HOST_LANE, True))
            running.names.append(processor.name)
        if process_findable(target):
            self._add_process(running)
        log.info("engine target %s (%s) started: %s", target.name, target.source, target.metrics_url)

    def _add_process(self, running: _Running) -> None:
        """The target's process (:meth:`_find_pid`) and a process collector on it; not found: looked for again
        later."""
        target = running.target
        running.process_looked_at = self._clock()
        try:
            pid = self._find_pid(target)
        except (NoDataError, SourceFormatError) as exc:
            if running.process_error is None:
                log.info("engine target %s: process not found: %s", target.name, exc)
            running.process_error = str(exc.args[0] if exc.args else exc)
            return
        running.process_error = None
        runtime = msgspec.structs.replace(
            self.settings.runtime, pid=pid, pidfile=None, cmdline_pattern=None, name=target.name
        )
        locator = RuntimeLocator(runtime, self.ctx.procfs)
        ctx = self._ctx(target, locator)
        self._add(running, ProcessCollector(ctx, self.settings.pagecache))
        if is_enabled("simd", self.settings):  # the SIMD check on this engine's own process, not the node's runtime
            self._add(running, SimdCollector(ctx, self.settings.simd, cache=self._code_scans))
        if self.runtimes is not None:
            identity = tuple(sorted(target_attributes(target).items()))
            if self.settings.collector("binary").enabled is not False:  # off only where collectors.binary says so
                running.binary = BinaryCheck(
                    self.settings.binary,
                    locator,
                    absent_interval_s=self.settings.interval_s,
                    state=self.state,
                    identity=identity,
                    record=f"binary:{target.name}",
                )
                running.binary.start()
            reader = ctx.profile_reader if target.profile_url else None
            self.runtimes.register(target.name, Runtime(locator, None, reader, identity, running.binary))

    def _find_pid(self, target: EngineTarget) -> int:
        return target_pid(target, self.ctx.procfs, self.ctx.read_limits)

    def _process_gone(self, running: _Running) -> bool:
        """Whether the target's process collector finds its pid gone; if so it and the collectors on the same pid
        (``PROCESS_KINDS``) are taken off, to be found again."""
        name = f"process:{running.target.name}"
        health = self.state.health().get(name)
        if name not in running.names or health is None or health.state != "absent":
            return False
        for kind in PROCESS_KINDS:
            self._remove(running, f"{kind}:{running.target.name}")
        self._drop_runtime(running)
        return True

    def _drop_runtime(self, running: _Running) -> None:
        """The target's process is no longer the actions' to act on: unregistered, its binary check stopped."""
        name = running.target.name
        if self.runtimes is not None:
            self.runtimes.drop(name)
        if running.binary is not None:
            running.binary.stop()
            running.binary = None
            self.state.forget(f"binary:{name}")

    def _remove(self, running: _Running, name: str) -> None:
        if name not in running.names:
            return
        collector = self.runner.remove(name)
        self.state.forget(name)
        running.names.remove(name)
        if collector is not None:
            collector.close()

    def _stop(self, name: str, why: str) -> None:
        running = self._running.pop(name, None)
        if running is None:
            return
        self._drop_runtime(running)
        if self.evidence is not None:
            self.evidence.forget(name)
        if self.spans is not None:
            self.spans.remove(name)
        for collector_name in running.names:
            collector = self.runner.remove(collector_name)
            self.state.forget(collector_name)
            if collector is not None:
                try:
                    collector.close()
                except Exception:  # one target's close must not keep the others from stopping
                    log.debug("closing %s failed", collector_name, exc_info=True)
        log.info("engine target %s %s: its collectors stopped", name, why)

    def close(self) -> None:
        """Stop discovery (its watch threads) and the targets' binary checks; the runner closes the targets'
        collectors with its own."""
        self.discovery.stop()
        for running in list(self._running.values()):
            self._drop_runtime(running)
