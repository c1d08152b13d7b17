"""The composition root: builds the agent's dependencies once, typed, and hands them to the constructors.

:func:`build_deps` creates every boundary with the OS or hardware and every shared service exactly once —
procfs/sysfs roots, the NVML client, the CPU probe, the engine's HTTP client (optional), the one runtime
locator, the profile reader, the API authenticator and the actions (binary check,
snapshot store, py-spy profile manager, evidence store) — into one frozen :class:`Deps`. Nothing else creates them: a
collector gets a :class:`~inferwatch.agent.node.collectors.base.CollectContext` (:meth:`Deps.collect_context`), the API
an :class:`~inferwatch.agent.node.api.server.ApiServices`; tests replace a piece by passing it to :func:`build_deps`.
This module and agent/node/app.py are where the whole ``Settings`` is read: every part is handed its section (a
collector its registry entry's ``sections``). Validated settings are never rewritten here: per-collector scheduling
defaults live in the registry (:mod:`inferwatch.agent.node.collectors`).
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import TYPE_CHECKING

from inferwatch.agent.config import Settings
from inferwatch.agent.node.actions.alertpush import AlertPusher
from inferwatch.agent.node.actions.binary import BinaryCheck, binary_configured
from inferwatch.agent.node.actions.evidence import EvidenceStore
from inferwatch.agent.node.actions.profiles import ProfileManager
from inferwatch.agent.node.actions.pyspy import PidScope
from inferwatch.agent.node.actions.runtimes import Runtime, Runtimes
from inferwatch.agent.node.actions.snapshots import SnapshotStore
from inferwatch.agent.node.api.auth import Authenticator
from inferwatch.agent.node.api.server import ApiServices
from inferwatch.agent.node.collectors import schedule
from inferwatch.agent.node.collectors.base import CollectContext
from inferwatch.agent.node.debugprofile.reader import ProfileReader
from inferwatch.agent.node.host.cpuprobe import CpuProbe, SyscallCpuProbe
from inferwatch.agent.node.host.nvml import NVMLClient, PynvmlClient
from inferwatch.agent.node.host.procfs import LimitHits, ReadLimits
from inferwatch.agent.node.host.runtime import RuntimeLocator, url_port
from inferwatch.agent.node.state import AgentState

if TYPE_CHECKING:  # a given engine client's type; the agent's own is made by the engine collector when it has a URL
    import httpx


@dataclass(frozen=True, slots=True)
class Deps:
    """Everything the agent shares, built once (:func:`build_deps`).

    ``sources`` is what every collector gets (procfs/sysfs roots, NVML client, CPU probe, runtime
    locator, profile reader, engine HTTP client); the rest is for sinks and actions.
    """

    settings: Settings
    state: AgentState
    sources: CollectContext
    auth: Authenticator
    binary: BinaryCheck
    snapshots: SnapshotStore
    profiles: ProfileManager
    evidence: EvidenceStore
    alertpush: AlertPusher  # off (no thread, no sends) unless alertmanager.urls is set
    runtimes: Runtimes  # the configured runtime and each engine target's, for the actions (agent/node/targets.py)

    def collect_context(self) -> CollectContext:
        return self.sources

    def api_services(self) -> ApiServices:
        return ApiServices(self.auth, self.binary, self.snapshots, self.profiles, self.sources.locator, self.evidence)


def build_deps(
    settings: Settings,
    *,
    nvml: NVMLClient | None = None,
    cpu_probe: CpuProbe | None = None,
    engine_http: httpx.Client | None = None,
    locator: RuntimeLocator | None = None,
    persist_key: bool = True,
) -> Deps:
    """The agent's dependencies; a given piece replaces the real one (a fake NVML client in tests).

    Raises ConfigError for a bad ``api.tokens_file``. Nothing touches disk, the network or a program here.
    ``persist_key`` False (doctor): the redaction key is ephemeral and nothing is written.
    """
    state = AgentState(environment=settings.node.environment)
    locator = locator or RuntimeLocator(settings.runtime, settings.path.procfs)
    reader = profile_reader(settings, locator, persist_key=persist_key)
    sources = CollectContext(
        procfs=settings.path.procfs,
        sysfs=settings.path.sysfs,
        nvml=nvml or PynvmlClient(),
        cpu_probe=cpu_probe or SyscallCpuProbe(),
        locator=locator,
        profile_reader=reader,
        engine_http=engine_http,
        read_limits=ReadLimits.of(settings.read_limits, LimitHits()),
    )
    runtimes = Runtimes(Runtime(locator, url_port(settings.engine.metrics_url), reader))
    evidence = EvidenceStore(
        settings.evidence,
        locator,
        reader,
        sources.nvml,
        procfs=settings.path.procfs,
        engine_port=url_port(settings.engine.metrics_url),
        py_spy=settings.profiling.py_spy,
        runtimes=runtimes,
    )
    binary_on = binary_configured(settings.collector("binary").enabled, settings.binary, settings.runtime)
    binary = BinaryCheck(
        settings.binary,
        locator,
        absent_interval_s=settings.interval_s,
        engine_port=url_port(settings.engine.metrics_url),
        state=state if binary_on else None,
    )
    # the py-spy dump enrichment of a snapshot at most once per runtime_profile collection
    dump_interval_s = schedule("runtime_profile", settings).interval_s
    return Deps(
        settings=settings,
        state=state,
        sources=sources,
        auth=Authenticator(settings.api),
        binary=binary,
        snapshots=SnapshotStore(settings.snapshots, reader, settings.profiling, dump_interval_s),
        profiles=ProfileManager(settings.profiling, PidScope(locator), settings.snapshots.dir, runtimes),
        evidence=evidence,
        runtimes=runtimes,
        alertpush=AlertPusher(
            settings.alertmanager,
            state,
            settings.runbooks.url,
            on_fire=evidence.on_alerts,
            engine_timeout_s=settings.engine.timeout_s,
        ),
    )


def profile_reader(settings: Settings, locator: RuntimeLocator, *, persist_key: bool = True) -> ProfileReader:
    """The runtime-profile reader of these settings: its section, the snapshot directory for the hash key, the
    environment its production finding reads, and the procfs the enrichment reads."""
    return ProfileReader(
        settings.runtime_profile,
        locator,
        key_dir=settings.snapshots.dir,
        environment=settings.node.environment,
        procfs=settings.path.procfs,
        read_limits=ReadLimits.of(settings.read_limits),
        persist_key=persist_key,
    )


def collect_context(
    settings: Settings,
    *,
    nvml: NVMLClient | None = None,
    cpu_probe: CpuProbe | None = None,
    engine_http: httpx.Client | None = None,
    locator: RuntimeLocator | None = None,
) -> CollectContext:
    """A collector's context as the agent would build it (tests, the doctor, one-off CLI commands)."""
    return build_deps(
        settings, nvml=nvml, cpu_probe=cpu_probe, engine_http=engine_http, locator=locator
    ).collect_context()
