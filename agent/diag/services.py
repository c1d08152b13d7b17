"""The diagnostic services the agent shares between collectors, the API and the CLI, and their wiring.

``build_services`` creates them (nothing touches disk or runs a program until used); ``start_sinks``
attaches the OTLP log sink when OTLP is on; ``collector_timing`` gives the ``runtime_profile`` and
``probe`` collectors their own interval and timeout from their sections unless set per collector.
"""

from __future__ import annotations

import logging
import threading
from typing import Any

from agent.config import CollectorSettings, Settings
from agent.diag import binary, pyspy, runtime_proc
from agent.diag.profile_service import RuntimeProfileService
from agent.diag.profiles import ProfileManager
from agent.errors import NoDataError, ToolError
from agent.samples import Finding

log = logging.getLogger(__name__)
TIMING_MARGIN_S = 5.0


class BinaryService:
    """Runs the binary check at start and when asked; the ``binary`` collector only reads the result."""

    def __init__(self, settings: Settings) -> None:
        self.settings = settings
        self._lock = threading.Lock()
        self.report: binary.BinaryReport | None = None
        self.error: str | None = None
        self.absent: NoDataError | None = None
        self.checks = 0
        self._requested = True  # the first collection is the check at start

    def request(self) -> None:
        self._requested = True

    def due(self) -> bool:
        return self._requested

    def check(self) -> binary.BinaryReport | None:
        """Run the check now (bounded by binary.timeout_s); keep and return the report."""
        with self._lock:
            self._requested = False
            self.checks += 1
            pid = None
            procfs = self.settings.path.procfs
            try:
                path = self.settings.binary.path
                if path is None:
                    pid = runtime_proc.find_runtime_pid(procfs, self.settings.runtime)
                    exe = runtime_proc.describe(procfs, pid).exe
                    if exe is None:
                        raise NoDataError(
                            f"cannot read {procfs}/{pid}/exe",
                            hint="the agent needs the same pid namespace and permission to read it, or set binary.path",
                        )
                    from pathlib import Path

                    path = Path(exe.removesuffix(" (deleted)"))
                self.report = binary.check_binary(path, pid, procfs, self.settings.binary.timeout_s)
                self.error = None
                self.absent = None
            except NoDataError as exc:
                self.absent, self.report = exc, None
                self._requested = True  # look for the runtime again next cycle (a procfs scan; ldd not run)
            except ToolError as exc:
                self.error, self.report = str(exc), None
            return self.report

    def findings(self) -> list[Finding]:
        if self.report is not None:
            return list(binary.binary_findings(self.report))
        if self.error is not None:
            return [Finding("runtime.binary", "fail", f"binary check failed: {self.error}")]
        return []


def build_services(settings: Settings) -> dict[str, Any]:
    from agent.diag.auth import Authenticator

    return {
        "auth": Authenticator(settings.api),  # raises ConfigError for a bad api.tokens_file
        "runtime_profile": RuntimeProfileService(settings),
        "binary": BinaryService(settings),
        "profiles": ProfileManager(settings),
    }


def start_sinks(services: dict[str, Any], settings: Settings, resource: Any) -> Any:
    """Attach the OTLP log sink for snapshots when OTLP export is on; return it (or None)."""
    if not settings.otlp_enabled() or not settings.runtime_profile.url:
        return None
    from exporters.otlp_logs import SnapshotLogSink, make_log_exporter

    sink = SnapshotLogSink(resource, make_log_exporter())
    services["runtime_profile"].log_sink = sink
    return sink


def collector_timing(settings: Settings) -> Settings:
    """Switch runtime_profile, probe and binary on when configured (unless ``collectors.NAME.enabled`` says
    otherwise) and give them their section's interval and a timeout that fits one run."""
    collectors = dict(settings.collectors)
    wanted = {
        "runtime_profile": (
            settings.runtime_profile.interval_s,
            settings.runtime_profile.timeout_s
            + TIMING_MARGIN_S
            + (pyspy.DUMP_TIMEOUT_S if settings.profiling.enabled else 0.0),
        ),
        "probe": (
            settings.probe.interval_s,
            settings.probe.timeout_s * len(settings.probe.protocols) + TIMING_MARGIN_S,
        ),
        "binary": (None, settings.binary.timeout_s + TIMING_MARGIN_S),
    }
    rt = settings.runtime
    configured = {
        "runtime_profile": bool(settings.runtime_profile.url),
        "probe": bool(settings.probe.url),
        "binary": bool(settings.binary.path or rt.pid or rt.pidfile or rt.cmdline_pattern),
    }
    for name, (interval, timeout) in wanted.items():
        cur = collectors.get(name, CollectorSettings())
        collectors[name] = cur.model_copy(
            update={
                "enabled": cur.enabled if cur.enabled is not None else (configured[name] or None),
                "interval_s": cur.interval_s or interval,
                "timeout_s": cur.timeout_s or (min(timeout, 600) if timeout else None),
            }
        )
    return settings.model_copy(update={"collectors": collectors})
