"""The settings root: every section under its name, the agent-wide values (listen address, interval, timeout,
series budget), the checks that span sections, and the old names read as the new ones."""

from __future__ import annotations

import logging
import os
from collections.abc import Mapping
from typing import Annotated, Any, Literal

from msgspec import Meta, Struct, field

from inferwatch.agent.config.sections import (
    AlertmanagerSettings,
    ApiSettings,
    BinarySettings,
    CollectorSettings,
    CPUSettings,
    DiscoverySettings,
    EngineSettings,
    EvidenceSettings,
    NodeSettings,
    OTLPSettings,
    PageCacheSettings,
    PathSettings,
    ProbeSettings,
    ProfilingSettings,
    ReadinessSettings,
    ReadLimitSettings,
    ReceiverSettings,
    RunbooksSettings,
    RuntimeProfileSettings,
    RuntimeSettings,
    SettingError,
    SimdSettings,
    SnapshotSettings,
)

log = logging.getLogger(__name__)


DEFAULT_LISTEN_ADDRESS = "127.0.0.1"
DEFAULT_LISTEN_PORT = 9435
DEFAULT_INTERVAL_S = 5.0
# The agent's own /metrics series (docs/cardinality.md): 64 models (engine.max_models) at the measured ~370 series
# per model (engine under traffic, spans and their histograms on) plus the node's own, with room for twice that.
DEFAULT_SERIES_BUDGET = 50_000
DEFAULT_TIMEOUT_S = 2.0
ENV_PREFIX = "INFERWATCH_"
ENV_NESTED_DELIMITER = "__"

# Timing keys that used to live in a collector's own section: read as collectors.NAME.KEY, with one warning.
DEPRECATED_TIMING = {("runtime_profile", "interval_s"): "runtime_profile", ("probe", "interval_s"): "probe"}


class Settings(Struct, frozen=True, forbid_unknown_fields=True, kw_only=True):
    """Every section under its name, and the agent-wide values. :meth:`from_values` converts and checks values read
    from the sources (:func:`~inferwatch.agent.config.loading.load_settings` reads them, highest first: flags, the
    environment, the config file); ``Settings()`` is the defaults, ``Settings(engine=EngineSettings(...))`` takes
    sections already made."""

    listen_address: str = DEFAULT_LISTEN_ADDRESS
    listen_port: Annotated[int, Meta(ge=0, le=65535)] = DEFAULT_LISTEN_PORT
    interval_s: Annotated[float, Meta(gt=0, le=3600)] = DEFAULT_INTERVAL_S
    timeout_s: Annotated[float, Meta(gt=0, le=600)] = DEFAULT_TIMEOUT_S
    # The agent's own /metrics series this node may hold before AgentSeriesBudgetExceeded (docs/cardinality.md).
    series_budget: Annotated[int, Meta(ge=100, le=100_000_000)] = DEFAULT_SERIES_BUDGET
    # A scrape of /metrics runs the collections due before the next scrape and waits for them (at most
    # scrape_wait_s; not for one whose last run took over 0.1 s, Runner.pull): fresh values, and one wake-up per
    # cycle instead of two (docs/collectors.md).
    collect_on_scrape: bool = True
    scrape_wait_s: Annotated[float, Meta(gt=0, le=60)] = 2.0
    log_level: Literal["debug", "info", "warning", "error"] = "info"
    path: PathSettings = PathSettings()
    read_limits: ReadLimitSettings = ReadLimitSettings()
    collectors: dict[str, CollectorSettings] = field(default_factory=dict)
    runtime: RuntimeSettings = RuntimeSettings()
    discovery: DiscoverySettings = DiscoverySettings()
    node: NodeSettings = NodeSettings()
    cpu: CPUSettings = CPUSettings()
    pagecache: PageCacheSettings = PageCacheSettings()
    otlp: OTLPSettings = OTLPSettings()
    engine: EngineSettings = EngineSettings()
    receiver: ReceiverSettings = ReceiverSettings()
    runbooks: RunbooksSettings = RunbooksSettings()
    alertmanager: AlertmanagerSettings = AlertmanagerSettings()
    readiness: ReadinessSettings = ReadinessSettings()

    runtime_profile: RuntimeProfileSettings = RuntimeProfileSettings()
    probe: ProbeSettings = ProbeSettings()
    api: ApiSettings = ApiSettings()
    profiling: ProfilingSettings = ProfilingSettings()
    snapshots: SnapshotSettings = SnapshotSettings()
    evidence: EvidenceSettings = EvidenceSettings()
    binary: BinarySettings = BinarySettings()
    simd: SimdSettings = SimdSettings()

    @classmethod
    def from_values(cls, values: Mapping[str, Any]) -> Settings:
        """The settings from ``values`` (nested mappings; sections already made are kept), converted and checked;
        :class:`~inferwatch.agent.errors.ConfigError` naming the setting when a value is refused."""
        from inferwatch.agent.config.convert import convert

        return convert(_deprecated_timing(values), cls)

    def __post_init__(self) -> None:
        for name in self.__struct_fields__:  # Settings(engine={...}): a section left a mapping would fail far away
            value = getattr(self, name)
            if isinstance(value, Mapping) and (
                name != "collectors" or any(isinstance(v, Mapping) for v in value.values())
            ):
                raise TypeError(f"Settings({name}=...) takes a section; values go through Settings.from_values")
        if not _is_loopback(self.listen_address) and not self.api.tokens and self.api.tokens_file is None:
            raise SettingError(
                None,
                f"listen_address {self.listen_address} is not a loopback address and no API token is configured; "
                "set api.tokens (or api.tokens_file) before exposing the agent, or bind 127.0.0.1",
            )

    def collector(self, name: str) -> CollectorSettings:
        return self.collectors.get(name, CollectorSettings())

    def otlp_enabled(self) -> bool:
        if self.otlp.enabled is not None:
            return self.otlp.enabled
        return bool(
            os.environ.get("OTEL_EXPORTER_OTLP_ENDPOINT") or os.environ.get("OTEL_EXPORTER_OTLP_METRICS_ENDPOINT")
        )


def _deprecated_timing(data: Mapping[str, Any]) -> dict[str, Any]:
    """Move each old timing key (:data:`DEPRECATED_TIMING`) to ``collectors.NAME``, with one warning each."""
    out = dict(data)
    for (section, key), name in DEPRECATED_TIMING.items():
        values = out.get(section)
        if not isinstance(values, Mapping) or key not in values:
            continue
        out[section] = {k: v for k, v in values.items() if k != key}
        collectors = dict(out.get("collectors") or {})
        entry = collectors.get(name) or {}
        if isinstance(entry, CollectorSettings):
            entry = {k: getattr(entry, k) for k in entry.__struct_fields__ if getattr(entry, k) is not None}
        entry = dict(entry)
        new = f"collectors.{name}.{key}"
        if entry.get(key) is not None:
            log.warning("%s.%s is deprecated and ignored: %s is set", section, key, new)
            continue
        entry[key] = values[key]
        collectors[name] = entry
        out["collectors"] = collectors
        log.warning("%s.%s is deprecated: read as %s; set that instead", section, key, new)
    return out


def _is_loopback(address: str) -> bool:
    import ipaddress

    if address == "localhost":
        return True
    try:
        return ipaddress.ip_address(address.strip("[]")).is_loopback
    except ValueError:
        return False
