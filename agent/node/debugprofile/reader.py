"""Reading a runtime_profile snapshot: fetch → enrich → redact, into one :class:`Snapshot` value.

Used by the ``runtime_profile`` collector on its slow interval and by the snapshot action
(:mod:`inferwatch.agent.node.actions.snapshots`, ``POST /api/v1/snapshots``) on demand, one read at a time. It stores
nothing and exports nothing: the snapshot store and the OTLP log sink take the document from the state.
Nothing leaves this module unredacted: the profile goes through the configured policy, the enrichment
(runtime process, CPU capability, and what the caller adds, e.g. the action's py-spy dump) through the
denylist. It never runs a program.
"""

from __future__ import annotations

import logging
import secrets
import threading
import time
from collections.abc import Callable
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any

from inferwatch.agent.common.redact import redact_url
from inferwatch.agent.common.samples import Finding
from inferwatch.agent.config import RuntimeProfileSettings
from inferwatch.agent.errors import NoDataError, StorageError
from inferwatch.agent.node.debugprofile import process
from inferwatch.agent.node.debugprofile.fetch import FETCH_REASONS, ProfileFetchError, fetch_json, parse_header
from inferwatch.agent.node.debugprofile.redaction import RedactionPolicy, load_or_create_key
from inferwatch.agent.node.host.procfs import ReadLimits
from inferwatch.agent.node.host.runtime import RuntimeLocator

log = logging.getLogger(__name__)
MAX_GAUGE_FIELDS = 64
# Runbooks are named after the alerts that watch the same signal (alerts/inferwatch.rules.yml); the status page
# links a finding's runbook as runbooks/<name>, so a finding names a served runbook or none.
RUNBOOK_EMPTY = "RuntimeProfileUnavailable"  # an empty profile, and a profile the agent could not fetch
RUNBOOK_PRODUCTION = "DebugProfileEnabledInProduction"
ENABLE_HINT = (
    "debug mode is only read at runtime start: restart the runtime with its debug profile enabled "
    "(the inferwatch simulator: --debug-profile; other runtimes: their debug/profile start flag), "
    "and never leave it on in production"
)


Enricher = Callable[[int], dict[str, Any]]  # runtime pid -> extra enrichment (redacted with the denylist)


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


@dataclass(frozen=True, slots=True)
class Snapshot:
    """One read: its result and the redacted document (``meta``, ``profile``, ``enrichment``)."""

    result: CaptureResult
    document: dict[str, Any]


class ProfileReader:
    """Reads the runtime's debug profile (``cfg``: its URL, header, limits and redaction).

    ``key_dir`` holds the redaction hash key (the snapshot directory, so hashes stay comparable across restarts);
    ``persist_key`` False (doctor): an ephemeral key, nothing written. ``environment`` is ``node.environment``, which
    the production finding reads; ``procfs`` and ``read_limits`` bound the enrichment's reads.
    """

    def __init__(
        self,
        cfg: RuntimeProfileSettings,
        locator: RuntimeLocator,
        *,
        key_dir: Path,
        environment: str,
        procfs: Path,
        read_limits: ReadLimits,
        persist_key: bool = True,
    ) -> None:
        self.persist_key = persist_key
        self.cfg = cfg
        self.key_dir = key_dir
        self.environment = environment
        self.procfs = procfs
        self.read_limits = read_limits
        self.locator = locator
        self.errors: dict[str, int] = dict.fromkeys(FETCH_REASONS, 0)
        self.last: CaptureResult | None = None
        self._capture_lock = threading.Lock()
        self._state_lock = threading.Lock()
        self._policy: RedactionPolicy | None = None
        self._enrich_policy: RedactionPolicy | None = None

    @property
    def directory(self) -> Path:
        """Where the hash key lives (beside the snapshots, so hashes stay comparable across restarts)."""
        return self.key_dir.expanduser()

    def policy(self) -> RedactionPolicy:
        if self._policy is None:
            try:
                key = load_or_create_key(self.directory) if self.persist_key else secrets.token_bytes(32)
            except OSError as exc:
                raise StorageError.of(exc, f"cannot keep the redaction key in {self.directory}") from exc
            allow = [*self.cfg.allow_keys, *self.cfg.gauge_fields]
            self._policy = RedactionPolicy.build(key, self.cfg.redaction, self.cfg.deny_keys, allow)
            self._enrich_policy = RedactionPolicy.build(key, "denylist", self.cfg.deny_keys)
        return self._policy

    def enrich_policy(self) -> RedactionPolicy:
        self.policy()
        assert self._enrich_policy is not None
        return self._enrich_policy

    # --- read ---
    def read(self, trigger: str = "interval", enrich: Enricher | None = None) -> Snapshot:
        """Fetch, enrich and redact one snapshot (one at a time); ``enrich`` adds to the enrichment."""
        if not self.cfg.url:
            raise NoDataError("runtime_profile.url is not set", hint="set runtime_profile.url to the debug endpoint")
        with self._capture_lock:
            return self._read(self.cfg.url, trigger, enrich)

    def _read(self, url: str, trigger: str, enrich: Enricher | None) -> Snapshot:
        policy = self.policy()
        snap_id = secrets.token_hex(8)  # the ring's id format (inferwatch.agent.node.actions.ring.valid_id)
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
        enrichment, enrich_paths = self.enrich_policy().redact(self._enrichment(enrich))
        snapshot = {
            "meta": {
                "id": snap_id,
                "captured_at": now,
                "trigger": trigger,
                "url": redact_url(url),
                "outcome": outcome,
                "error": {"reason": reason, "message": message} if reason else None,
                "redaction": {"mode": policy.mode, "marker": "[REDACTED hmac:<hmac-sha256 of value, 16 hex>]"},
                "redacted_paths": sorted(redacted_paths + [f"enrichment.{p}" for p in enrich_paths]),
                "environment": self.environment,
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
        with self._state_lock:
            self.last = result
        return Snapshot(result, snapshot)

    def _enrichment(self, enrich: Enricher | None) -> dict[str, Any]:
        procfs = self.procfs
        out: dict[str, Any] = {"cpu": process.cpu_capability(procfs, self.read_limits)}
        try:
            pid = self.locator.find().pid
        except NoDataError as exc:
            out["runtime_process"] = {"absent": str(exc)}
            return out
        proc = process.describe(procfs, pid)
        desc = asdict(proc)
        desc["cmdline"] = self.enrich_policy().redact_cmdline(proc.cmdline)
        out["runtime_process"] = desc
        if enrich is not None:
            out.update(enrich(pid))
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
        ev: dict[str, object] = {"url": redact_url(self.cfg.url or ""), "snapshot": last.id}
        env = self.environment
        if last.outcome == "error":
            ev["reason"] = last.reason
            summary = f"runtime_profile fetch failed: {last.message}"
            return [Finding("runtime_profile.fetch", "fail", summary, ev, RUNBOOK_EMPTY)]
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


def _count_leaves(obj: Any) -> int:
    if isinstance(obj, dict):
        return sum(_count_leaves(v) for v in obj.values())
    if isinstance(obj, list):
        return sum(_count_leaves(v) for v in obj)
    return 1
