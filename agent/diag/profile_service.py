"""Capture of runtime_profile snapshots: fetch → enrich → redact → store (ring) → export (OTLP logs).

Used by the ``runtime_profile`` collector on its slow interval and by ``POST /api/v1/snapshots`` on
demand (one capture at a time). Nothing leaves this module unredacted: the profile goes through the
configured policy, the enrichment (runtime process, CPU capability, py-spy dump) through the denylist.
"""

from __future__ import annotations

import json
import logging
import secrets
import threading
import time
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any, Protocol

from agent.config import Settings
from agent.diag import pyspy, runtime_proc
from agent.diag.fetch import FETCH_REASONS, ProfileFetchError, fetch_json, parse_header
from agent.diag.redaction import RedactionPolicy, load_or_create_key
from agent.diag.ring import FileRing, new_id
from agent.errors import NoDataError
from agent.samples import Finding

log = logging.getLogger(__name__)
MAX_GAUGE_FIELDS = 64
DOCS = "docs/diagnostics.md#runtime-profile"
# Runbooks are named after the alerts that watch the same signal (alerts/inferwatch.rules.yml).
RUNBOOK_EMPTY = "RuntimeProfileUnavailable"
RUNBOOK_PRODUCTION = "DebugProfileEnabledInProduction"
ENABLE_HINT = (
    "debug mode is only read at runtime start: restart the runtime with its debug profile enabled "
    "(the inferwatch simulator: --debug-profile; other runtimes: their debug/profile start flag), "
    "and never leave it on in production"
)


class LogSink(Protocol):
    def emit(self, snapshot: dict[str, Any]) -> None: ...


@dataclass(frozen=True, slots=True)
class CaptureResult:
    id: str
    outcome: str  # available | empty | error
    captured_at: float
    reason: str | None = None  # fetch error reason
    message: str | None = None
    fields: int = 0
    redacted: int = 0
    gauges: dict[str, float] = field(default_factory=dict)


class RuntimeProfileService:
    def __init__(self, settings: Settings, log_sink: LogSink | None = None, store: bool = True) -> None:
        self.store = store  # False (doctor): nothing written, an ephemeral hash key
        self.settings = settings
        self.cfg = settings.runtime_profile
        self.log_sink = log_sink
        self.errors: dict[str, int] = dict.fromkeys(FETCH_REASONS, 0)
        self.store_errors = 0
        self.last: CaptureResult | None = None
        self._capture_lock = threading.Lock()
        self._state_lock = threading.Lock()
        self._ring: FileRing | None = None
        self._policy: RedactionPolicy | None = None
        self._enrich_policy: RedactionPolicy | None = None
        self._last_dump_at = 0.0

    @property
    def directory(self) -> Path:
        return self.settings.snapshots.dir.expanduser()

    def ring(self) -> FileRing:
        if self._ring is None:
            snap = self.settings.snapshots
            self._ring = FileRing(self.directory, snap.max_count, snap.max_bytes)
        return self._ring

    def policy(self) -> RedactionPolicy:
        if self._policy is None:
            key = load_or_create_key(self.directory) if self.store else secrets.token_bytes(32)
            allow = [*self.cfg.allow_keys, *self.cfg.gauge_fields]
            self._policy = RedactionPolicy.build(key, self.cfg.redaction, self.cfg.deny_keys, allow)
            self._enrich_policy = RedactionPolicy.build(key, "denylist", self.cfg.deny_keys)
        return self._policy

    def enrich_policy(self) -> RedactionPolicy:
        self.policy()
        assert self._enrich_policy is not None
        return self._enrich_policy

    # --- capture ---
    def capture(self, trigger: str = "interval") -> CaptureResult:
        if not self.cfg.url:
            raise NoDataError("runtime_profile.url is not set", hint="set runtime_profile.url to the debug endpoint")
        with self._capture_lock:
            return self._capture(self.cfg.url, trigger)

    def _capture(self, url: str, trigger: str) -> CaptureResult:
        policy = self.policy()
        snap_id = new_id()
        now = time.time()
        profile: Any = None
        reason = message = None
        try:
            raw = fetch_json(url, parse_header(self.cfg.header), self.cfg.timeout_s, self.cfg.max_bytes)
            if not isinstance(raw, dict):
                raise ProfileFetchError("not_json", f"profile is JSON {type(raw).__name__}, not an object")
            profile = raw
            outcome = "available" if raw else "empty"
        except ProfileFetchError as exc:
            outcome, reason, message = "error", exc.reason, str(exc)
            with self._state_lock:
                self.errors[exc.reason] = self.errors.get(exc.reason, 0) + 1
        redacted_paths: list[str] = []
        red_profile = None
        if profile is not None:
            red_profile, redacted_paths = policy.redact(profile)
        enrichment, enrich_paths = self.enrich_policy().redact(self._enrichment())
        snapshot = {
            "meta": {
                "id": snap_id,
                "captured_at": now,
                "trigger": trigger,
                "url": url,
                "outcome": outcome,
                "error": {"reason": reason, "message": message} if reason else None,
                "redaction": {"mode": policy.mode, "marker": "[REDACTED hmac:<hmac-sha256 of value, 16 hex>]"},
                "redacted_paths": sorted(redacted_paths + [f"enrichment.{p}" for p in enrich_paths]),
                "environment": self.settings.node.environment,
            },
            "profile": red_profile,
            "enrichment": enrichment,
        }
        result = CaptureResult(
            snap_id,
            outcome,
            now,
            reason,
            message,
            fields=_count_leaves(profile) if profile is not None else 0,
            redacted=len(redacted_paths),
            gauges=self._gauges(red_profile) if isinstance(red_profile, dict) else {},
        )
        data = json.dumps(snapshot, sort_keys=True, default=str).encode()
        try:
            if self.store:
                self.ring().put(data, ".json", snap_id)
        except (OSError, ValueError) as exc:
            with self._state_lock:
                self.store_errors += 1
            log.warning("cannot store runtime_profile snapshot in %s: %s", self.directory, exc)
        if self.log_sink is not None:
            try:
                self.log_sink.emit(snapshot)
            except Exception:
                log.debug("OTLP log emit failed", exc_info=True)
        with self._state_lock:
            self.last = result
        return result

    def _enrichment(self) -> dict[str, Any]:
        procfs = self.settings.path.procfs
        out: dict[str, Any] = {"cpu": runtime_proc.cpu_capability(procfs)}
        try:
            pid = runtime_proc.find_runtime_pid(procfs, self.settings.runtime)
        except NoDataError as exc:
            out["runtime_process"] = {"absent": str(exc)}
            return out
        proc = runtime_proc.describe(procfs, pid)
        desc = asdict(proc)
        desc["cmdline"] = self.enrich_policy().redact_cmdline(proc.cmdline)
        out["runtime_process"] = desc
        prof = self.settings.profiling
        if prof.enabled and time.monotonic() - self._last_dump_at >= self.cfg.interval_s:
            self._last_dump_at = time.monotonic()
            try:
                threads = pyspy.dump(pyspy.resolve_executable(prof.py_spy), pid)
                out["py_spy_dump"] = [_strip_thread(t) for t in threads]
            except pyspy.PySpyError as exc:
                out["py_spy_dump"] = {"error": exc.kind, "message": str(exc)}
        return out

    def _gauges(self, profile: dict[str, Any]) -> dict[str, float]:
        wanted = set(self.cfg.gauge_fields)
        out: dict[str, float] = {}

        def walk(obj: Any, path: str) -> None:
            if len(out) >= MAX_GAUGE_FIELDS:
                return
            if isinstance(obj, dict):
                for k, v in obj.items():
                    child = f"{path}.{k}" if path else str(k)
                    if (k in wanted or child in wanted) and isinstance(v, (int, float)) and not isinstance(v, bool):
                        out[child] = float(v)
                    else:
                        walk(v, child)
            elif isinstance(obj, list):
                for i, v in enumerate(obj[:MAX_GAUGE_FIELDS]):
                    walk(v, f"{path}[{i}]")

        walk(profile, "")
        return out

    # --- readers ---
    def findings(self) -> list[Finding]:
        last = self.last
        if last is None:
            return []
        ev: dict[str, object] = {"url": self.cfg.url, "snapshot": last.id}
        env = self.settings.node.environment
        if last.outcome == "error":
            ev["reason"] = last.reason
            return [Finding("runtime_profile.fetch", "fail", f"runtime_profile fetch failed: {last.message}", ev, DOCS)]
        if last.outcome == "empty":
            return [
                Finding(
                    "runtime_profile.empty",
                    "warn",
                    "the runtime answered the debug profile request with {}: debug mode was not enabled at start; "
                    + ENABLE_HINT,
                    {**ev, "hint": ENABLE_HINT},
                    RUNBOOK_EMPTY,
                )
            ]
        out = [
            Finding(
                "runtime_profile.available",
                "ok",
                f"debug profile available ({last.fields} fields, {last.redacted} redacted)",
                ev,
                DOCS,
            )
        ]
        if env == "production":
            out.append(
                Finding(
                    "runtime_profile.debug_in_production",
                    "fail",
                    "the runtime answers its debug profile on a node whose environment is production: restart it "
                    "without debug mode (debug profiles expose internals such as cpu_affinity_mask)",
                    {**ev, "environment": env},
                    RUNBOOK_PRODUCTION,
                )
            )
        return out


def _strip_thread(t: Any) -> dict[str, Any]:
    """Keep a py-spy thread's identity and frame names/locations; never locals."""
    if not isinstance(t, dict):
        return {}
    frames = [{k: f.get(k) for k in ("name", "filename", "line")} for f in t.get("frames", []) if isinstance(f, dict)][
        :64
    ]
    return {k: t.get(k) for k in ("thread_id", "thread_name", "active", "owns_gil")} | {"frames": frames}


def _count_leaves(obj: Any) -> int:
    if isinstance(obj, dict):
        return sum(_count_leaves(v) for v in obj.values())
    if isinstance(obj, list):
        return sum(_count_leaves(v) for v in obj)
    return 1
