"""Evidence bundles: what a responder woken by "engine hung" needs, captured before anyone restarts the engine.

One bundle is one JSON document, redacted (the runtime_profile denylist policy) before it is written to its
own bounded ring (``evidence.dir``, ``evidence.max_count`` / ``max_bytes``, oldest evicted first):

- ``processes``: every process of the runtime (the runtime and its descendants): command line (redacted),
  state, and per thread its name, state, ``wchan`` and kernel stack where readable (threads in D state listed
  by name), plus a ``py-spy dump`` (all threads, no locals; :func:`inferwatch.agent.node.actions.pyspy.dump`) or the
  reason it is missing (no ptrace permission, not Python, timeout). With ``evidence.native`` (default) the dump is
  ``--native`` (native frames marked ``native``); when py-spy cannot (no libunwind, aarch64, a failure while
  unwinding) it is retried once without it within the same time limit, and ``mode`` / ``mode_reason`` /
  ``attempts`` say which mode the dump is and why
  (:func:`~inferwatch.agent.node.actions.evidencecapture.dump_process`);
- ``engine``: the last engine scrapes the agent kept (running, waiting, token counters and the hang verdict
  per rank), around the onset;
- ``runtime_profile``: a fresh snapshot of the runtime's debug profile (redacted as every snapshot);
- ``gpus``: NVML per GPU (through the injectable client), or why there is none;
- ``spans``: what is known of the requests in flight. An engine sends a request's span only when it ends, so a
  stuck request has none: instead ``in_flight`` (the engine's running / waiting gauges of the last scrape, counts
  without identities), ``probe`` (the streaming probe's last synthetic request) and ``recent_finished`` (the last
  finished requests' spans the OTLP receiver got, trace ids included, each marked before / after the onset), each
  with its source, or why it is absent (:func:`~inferwatch.agent.node.actions.evidencecapture.spans_section`);
- ``meta``: trigger (``hang`` | ``alert`` | ``api``), the alerts or finding behind it, wall time and CPU
  seconds of the capture (the agent thread and the py-spy children), a one-line ``summary``.

Per engine: with discovered engine targets (agent/node/targets.py) each target's engine scrapes and probe result are
kept apart (its collectors ``engine:<target>``, ``probe:<target>``), and a bundle is of one engine: its ``meta.target``
names it (``""``: the configured runtime), its processes are that target's runtime (found through its container's
cgroup or its port, :mod:`inferwatch.agent.node.actions.runtimes`), its engine scrapes, probe and runtime profile
that target's. A hang of target X captures X's process, never the node's other engines'.

Triggers: :meth:`EvidenceStore.on_record` (a state listener) starts a capture in a thread the moment an
``engine_hung`` finding turns on (of the engine whose collector found it); :meth:`EvidenceStore.on_alerts` for a
webhook of firing critical alerts;
:meth:`EvidenceStore.capture` on an API request. Automatic captures are rate-limited per runtime process
(``evidence.min_interval_s``): a burst of alerts gives one bundle. A capture is bounded by
``evidence.time_limit_s`` (py-spy runs in parallel, each with what is left of it). Nothing here runs on the
collection path.

Here: the triggers, the rate limit, the capture's order and time limit, the ring and the listing. What a capture
reads from the world is :mod:`inferwatch.agent.node.actions.evidencecapture`; the bundle as a document (redaction,
the summary line, the terminal text) is :mod:`inferwatch.agent.node.actions.evidencebundle`.
"""

from __future__ import annotations

import json
import logging
import resource
import threading
import time
from collections import deque
from collections.abc import Callable, Iterable, Mapping, Sequence
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Any

from inferwatch.agent.catalog.engine import TARGET_ATTRIBUTES
from inferwatch.agent.common.samples import Collection
from inferwatch.agent.config import EvidenceSettings
from inferwatch.agent.errors import NoDataError
from inferwatch.agent.node.actions import pyspy
from inferwatch.agent.node.actions.evidencebundle import redact, summarise
from inferwatch.agent.node.actions.evidencecapture import (
    dump_process,
    name_threads,
    nvml_state,
    process_info,
    spans_section,
    thread_states,
)
from inferwatch.agent.node.actions.ring import FileRing, new_id, valid_id
from inferwatch.agent.node.actions.runtimes import DEFAULT, Runtime, Runtimes, UnknownTargetError
from inferwatch.agent.node.debugprofile.reader import ProfileReader
from inferwatch.agent.node.host.nvml import NVMLClient
from inferwatch.agent.node.host.runtime import RuntimeLocator

if TYPE_CHECKING:  # the receiver is imported only when it is on (inferwatch.agent.node.app)
    from inferwatch.agent.node.receiver.intake import FinishedSpan

log = logging.getLogger(__name__)
FORMAT = 1
SUFFIX = ".json"
ENGINE_SOURCE = "engine"
PROBE_SOURCE = "probe"
HANG_FINDING = "engine_hung"
HANG_ALERT = "EngineHungButHealthy"
ENGINE_NAME_LABEL = TARGET_ATTRIBUTES["inferwatch.engine.name"]  # an alert's label naming a discovered engine target
SCRAPES_KEPT = 12  # 3 minutes of engine scrapes at 15 s
PY_SPY_WORKERS = 4


@dataclass(frozen=True, slots=True)
class EvidenceMeta:
    """One bundle as listed: id, when (Unix s), trigger, the one-line summary, its size."""

    id: str
    captured_at: float
    trigger: str
    summary: str
    size_bytes: int
    alertnames: tuple[str, ...] = ()

    def as_dict(self) -> dict[str, Any]:
        return {
            "id": self.id,
            "captured_at": self.captured_at,
            "trigger": self.trigger,
            "summary": self.summary,
            "size_bytes": self.size_bytes,
            "alertnames": list(self.alertnames),
        }


Clock = Callable[[], float]


class EvidenceStore:
    """Captures and keeps evidence bundles; thread-safe. See the module docstring."""

    def __init__(
        self,
        cfg: EvidenceSettings,
        locator: RuntimeLocator,
        reader: ProfileReader,
        nvml: NVMLClient,
        procfs: Path = Path("/proc"),
        engine_port: int | None = None,
        py_spy: Path | None = None,
        monotonic: Clock = time.monotonic,
        runtimes: Runtimes | None = None,
    ) -> None:
        """``cfg``: the evidence section; ``procfs``: the host's /proc; ``engine_port``: the port of the engine whose
        process is the runtime (the locator's serving process); ``py_spy``: profiling.py_spy (None: resolved);
        ``runtimes``: the configured runtime and the engine targets' (None: the configured one alone)."""
        self.cfg = cfg
        self.locator = locator
        self.reader = reader
        self.runtimes = runtimes or Runtimes(Runtime(locator, engine_port, reader))
        self.nvml = nvml
        self.procfs = procfs
        self.engine_port = engine_port
        self.py_spy = py_spy
        self.monotonic = monotonic
        self.captures = {"hang": 0, "alert": 0, "api": 0}
        self.rate_limited = 0
        self.store_errors = 0
        self._lock = threading.Lock()
        self._capture_lock = threading.Lock()
        self._ring: FileRing | None = None
        # per scrape: (time, engine, the ranks' keys, each rank's values in that order): a tuple a rank, where a
        # dict took ~250 bytes more (at 200 models x 2 ranks, 12 scrapes held ~1.2 MB more); dicts again in scrapes()
        # per engine target (DEFAULT: the configured engine)
        self._scrapes: dict[str, deque[tuple[float, Any, tuple[str, ...], list[tuple[Any, ...] | dict[str, Any]]]]]
        self._scrapes = {}
        self._hung: dict[str, set[tuple[str, str]]] = {}
        self._last_by_pid: dict[int, tuple[float, str]] = {}
        self._threads: list[threading.Thread] = []
        self._probe: dict[str, dict[str, Any]] = {}
        self._recent_spans: Callable[[], Sequence[FinishedSpan]] | None = None

    def attach_spans(self, recent: Callable[[], Sequence[FinishedSpan]]) -> None:
        """The OTLP receiver's last finished requests (:meth:`~inferwatch.agent.node.receiver.Receiver.recent_spans`),
        when it is on."""
        self._recent_spans = recent

    @property
    def directory(self) -> Path:
        return self.cfg.dir.expanduser()

    def ring(self) -> FileRing:
        with self._lock:
            if self._ring is None:
                self._ring = FileRing(self.directory, self.cfg.max_count, self.cfg.max_bytes)
            return self._ring

    # --- triggers ---
    def on_record(self, name: str, collection: Collection) -> None:
        """State listener: keep each engine's scrapes and probe result (the configured engine's ``engine`` and
        ``probe``, a target's ``engine:<target>`` and ``probe:<target>``); start a capture of that engine when a
        rank's hang finding turns on."""
        source, _, target = name.partition(":")
        if source == PROBE_SOURCE:
            self._probe[target] = {"at": time.time(), "protocols": dict(collection.details)}
            return
        if source != ENGINE_SOURCE:
            return
        ranks = collection.details.get("hang", [])
        keys = tuple(ranks[0]) if ranks else ()
        rows = [tuple(r.values()) if tuple(r) == keys else dict(r) for r in ranks]  # a rank of other keys: as it is
        with self._lock:
            kept = self._scrapes.setdefault(target, deque(maxlen=SCRAPES_KEPT))
        kept.append((time.time(), collection.details.get("engine"), keys, rows))
        hung = {
            (str(f.evidence.get("model")), str(f.evidence.get("rank"))): f
            for f in collection.findings
            if f.id == HANG_FINDING
        }
        with self._lock:
            onset = set(hung) - self._hung.get(target, set())
            self._hung[target] = set(hung)
        if onset and self.cfg.enabled and self.cfg.on_hang:
            first = hung[sorted(onset)[0]]
            self.trigger_async(
                "hang", first.summary, target=target, alertnames=(HANG_ALERT,), finding=dict(first.evidence)
            )

    def forget(self, target: str) -> None:
        """Drop what is kept of an engine target that is gone (its scrapes, probe result and hang state)."""
        with self._lock:
            self._scrapes.pop(target, None)
            self._probe.pop(target, None)
            self._hung.pop(target, None)

    def scrapes(self, target: str = DEFAULT) -> list[dict[str, Any]]:
        """Engine ``target``'s scrapes kept (DEFAULT: the configured engine's), oldest first: ``{"at", "engine",
        "ranks": [the rank's hang verdict dict]}``."""
        with self._lock:
            kept = list(self._scrapes.get(target, ()))
        return [
            {
                "at": at,
                "engine": engine,
                "ranks": [dict(zip(keys, r, strict=True)) if isinstance(r, tuple) else dict(r) for r in rows],
            }
            for at, engine, keys, rows in kept
        ]

    def on_alerts(self, payload: Mapping[str, Any]) -> dict[str, Any]:
        """An Alertmanager webhook: a capture for its firing critical alerts for this node (``evidence.instances``;
        rate-limited), else nothing. An alert about a discovered engine target (its ``engine_name`` label) captures
        that target; one naming a target this agent does not watch captures nothing."""
        alerts = [a for a in payload.get("alerts", []) if isinstance(a, Mapping)]
        mine = set(self.cfg.instances)
        firing = [
            a
            for a in alerts
            if a.get("status") == "firing"
            and (a.get("labels") or {}).get("severity") == "critical"
            and (not mine or (a.get("labels") or {}).get("instance") in mine)
        ]
        if not firing or not self.cfg.enabled:
            why = "no firing critical alert for this node" if self.cfg.enabled else "evidence off"
            return {"captured": None, "reason": why}
        by_target: dict[str, list[Mapping[str, Any]]] = {}
        for a in firing:
            by_target.setdefault(str(a["labels"].get(ENGINE_NAME_LABEL) or DEFAULT), []).append(a)
        unknown = sorted(t for t in by_target if t and self._runtime(t) is None and t not in self._scrapes)
        answers = {t: self._on_target_alerts(t, group) for t, group in by_target.items() if t not in unknown}
        if not answers:
            return {"captured": None, "reason": f"engine targets not watched by this agent: {', '.join(unknown)}"}
        started = [a for a in answers.values() if a["captured"]]
        limited = [a["latest"] for a in answers.values() if a["rate_limited"]]
        out: dict[str, Any] = {"captured": "started" if started else None, "rate_limited": not started}
        if limited and not started:
            out["latest"] = limited[0]
        if set(by_target) != {DEFAULT}:
            out["targets"] = answers
        if unknown:
            out["not_watched"] = unknown
        return out

    def _on_target_alerts(self, target: str, firing: list[Mapping[str, Any]]) -> dict[str, Any]:
        names = tuple(sorted({str(a["labels"].get("alertname")) for a in firing}))
        brief = [
            {
                "alertname": a["labels"].get("alertname"),
                "labels": dict(a.get("labels") or {}),
                "startsAt": a.get("startsAt"),
                "fingerprint": a.get("fingerprint"),
            }
            for a in firing
        ]
        existing = self._limited(target)
        if existing is not None:
            return {"captured": None, "rate_limited": True, "latest": existing}
        self.trigger_async("alert", ", ".join(names), target=target, alertnames=names, alerts=brief)
        return {"captured": "started", "rate_limited": False}

    def _limited(self, target: str) -> str | None:
        """The id of this engine's process's bundle when one was captured within ``min_interval_s``, else None."""
        pids = self._pids(target)
        now = self.monotonic()
        with self._lock:
            recent = [self._last_by_pid[p] for p in pids if p in self._last_by_pid]
            if pids and recent and all(now - at < self.cfg.min_interval_s for at, _ in recent):
                self.rate_limited += 1
                return recent[0][1]
            if not pids and (last := self._last_by_pid.get(0)) and now - last[0] < self.cfg.min_interval_s:
                self.rate_limited += 1
                return last[1]
        return None

    def trigger_async(
        self, trigger: str, reason: str, target: str = DEFAULT, **context: Any
    ) -> threading.Thread | None:
        """An automatic capture of engine ``target`` in its own thread, unless rate-limited (see :meth:`_limited`)."""
        if self._limited(target) is not None:
            return None
        kwargs = {**context, "target": target}
        t = threading.Thread(
            target=self._capture_logged, args=(trigger, reason), kwargs=kwargs, daemon=True, name=f"evidence-{trigger}"
        )
        with self._lock:
            self._threads = [x for x in self._threads if x.is_alive()] + [t]
        t.start()
        return t

    def wait(self, timeout_s: float = 30.0) -> None:
        """Wait for captures in flight (tests, shutdown)."""
        with self._lock:
            threads = list(self._threads)
        for t in threads:
            t.join(timeout_s)

    def _capture_logged(self, trigger: str, reason: str, **context: Any) -> None:
        try:
            meta = self.capture(trigger, reason, **context)
            log.warning("evidence bundle %s captured: %s", meta.id, meta.summary)
        except Exception:
            log.exception("evidence capture (%s) failed", trigger)

    # --- the capture ---
    def _runtime(self, target: str) -> Runtime | None:
        """Engine ``target``'s runtime; None for a target whose process is not known (not on this host, not found
        yet)."""
        try:
            return self.runtimes.get(target)
        except UnknownTargetError:
            return None

    def _pids(self, target: str = DEFAULT) -> list[int]:
        """Engine ``target``'s runtime and its descendants (the configured one: runtime.* when set, else the engine
        port's listener; a target's: its process found through its container or port)."""
        runtime = self._runtime(target)
        return runtime.pids() if runtime is not None else []

    def capture(self, trigger: str, reason: str = "", target: str = DEFAULT, **context: Any) -> EvidenceMeta:
        """Capture one bundle of engine ``target`` now (DEFAULT: the configured runtime), redact it, store it; returns
        its listing entry. One capture at a time. UnknownTargetError for a target the agent knows nothing of."""
        if target and self._runtime(target) is None and target not in self._scrapes:
            raise UnknownTargetError(target, sorted({*self.runtimes.names(), *(t for t in self._scrapes if t)}))
        with self._capture_lock:
            return self._capture(trigger, reason, target, context)

    def _capture(self, trigger: str, reason: str, target: str, context: dict[str, Any]) -> EvidenceMeta:
        t0, cpu0, kids0 = time.monotonic(), time.thread_time(), resource.getrusage(resource.RUSAGE_CHILDREN)
        deadline = t0 + self.cfg.time_limit_s
        bundle_id = new_id()
        runtime = self._runtime(target)
        pids = self._pids(target)
        processes = [process_info(self.procfs, pid) | {"threads": thread_states(self.procfs, pid)} for pid in pids]
        if self.cfg.py_spy and processes:
            self._py_spy(processes, deadline)
            for p in processes:
                name_threads(p)
        elif processes:
            for p in processes:
                p["py_spy"] = {"error": "off", "message": "evidence.py_spy is false"}
        bundle: dict[str, Any] = {
            "meta": {
                "format": FORMAT,
                "id": bundle_id,
                "captured_at": time.time(),
                "trigger": trigger,
                "reason": reason,
                "alertnames": list(context.get("alertnames", ())),
                "alerts": context.get("alerts", []),
                "finding": context.get("finding"),
                "time_limit_s": self.cfg.time_limit_s,
                "target": target,
                "identity": dict(runtime.identity) if runtime is not None else {},
            },
            "processes": processes,
            "engine": {"scrapes": self.scrapes(target)},
            "runtime_profile": self._runtime_profile(runtime),
            "gpus": nvml_state(self.nvml),
            "spans": self._spans(target),
        }
        if not pids and not target:
            bundle["processes_absent"] = (
                "no runtime process found: set runtime.pid / runtime.pidfile / runtime.cmdline_pattern, or run the "
                "agent where it can see the process listening on engine.metrics_url's port"
            )
        elif not pids:
            bundle["processes_absent"] = (
                f"engine target {target}'s process is not known: it is found through its container's cgroup "
                "(Kubernetes: the host's /proc at path.procfs) or, off Kubernetes, as the listener of its metrics "
                "port on this host's loopback"
            )
        kids = resource.getrusage(resource.RUSAGE_CHILDREN)
        agent_cpu = time.thread_time() - cpu0
        child_cpu = (kids.ru_utime - kids0.ru_utime) + (kids.ru_stime - kids0.ru_stime)
        bundle["meta"]["wall_s"] = round(time.monotonic() - t0, 3)
        bundle["meta"]["cpu_s"] = {
            "agent_thread": round(agent_cpu, 3),
            "py_spy_children": round(child_cpu, 3),
            "total": round(agent_cpu + child_cpu, 3),
        }
        bundle["meta"]["over_time_limit"] = bundle["meta"]["wall_s"] > self.cfg.time_limit_s
        redacted = redact(bundle, self.reader.enrich_policy())
        redacted["meta"]["summary"] = summarise(redacted)
        data = json.dumps(redacted, sort_keys=True, default=str).encode()
        try:
            entry = self.ring().put(data, SUFFIX, bundle_id)
        except (OSError, ValueError) as exc:
            with self._lock:
                self.store_errors += 1
            raise NoDataError(f"cannot store the evidence bundle in {self.directory}: {exc}") from exc
        now = self.monotonic()
        with self._lock:
            self.captures[trigger] = self.captures.get(trigger, 0) + 1
            for pid in pids or [0]:
                self._last_by_pid[pid] = (now, bundle_id)
        return EvidenceMeta(
            bundle_id,
            redacted["meta"]["captured_at"],
            trigger,
            redacted["meta"]["summary"],
            entry.size_bytes,
            tuple(redacted["meta"]["alertnames"]),
        )

    def _py_spy(self, processes: list[dict[str, Any]], deadline: float) -> None:
        try:
            exe = pyspy.resolve_executable(self.py_spy)
        except pyspy.PySpyError as exc:
            for p in processes:
                p["py_spy"] = {"error": exc.kind, "message": str(exc)}
            return

        def one(p: dict[str, Any]) -> None:
            p["py_spy"] = dump_process(exe, int(p["pid"]), deadline, self.cfg.native)

        with ThreadPoolExecutor(max_workers=PY_SPY_WORKERS, thread_name_prefix="evidence-py-spy") as pool:
            list(pool.map(one, processes))

    def _spans(self, target: str = DEFAULT) -> dict[str, Any]:
        probe = self._probe.get(target)
        try:
            recent = self._recent_spans() if self._recent_spans is not None else None
        except Exception as exc:
            out = spans_section(self.scrapes(target), probe, [])
            out["recent_finished"] = {"absent": f"reading the receiver's spans failed: {exc}"}
            return out
        return spans_section(self.scrapes(target), probe, recent)

    def _runtime_profile(self, runtime: Runtime | None) -> dict[str, Any]:
        reader = runtime.reader if runtime is not None else None
        if reader is None:
            return {"absent": "this engine target has no runtime profile (inferwatch.io/profile-path)"}
        try:
            return dict(reader.read("evidence").document)
        except NoDataError as exc:
            return {"absent": str(exc)}
        except Exception as exc:
            return {"absent": f"runtime_profile read failed: {exc}"}

    # --- reading ---
    def list(self) -> list[EvidenceMeta]:
        """Bundles newest first (an unreadable file is listed with its error as the summary)."""
        if not self.directory.is_dir():
            return []
        out = []
        for e in reversed(self.ring().entries()):
            try:
                meta = json.loads(e.path.read_bytes()).get("meta", {})
            except (OSError, ValueError) as exc:
                meta = {"summary": f"unreadable: {exc}"}
            out.append(
                EvidenceMeta(
                    e.id,
                    meta.get("captured_at", 0.0),
                    meta.get("trigger", "?"),
                    meta.get("summary", ""),
                    e.size_bytes,
                    tuple(meta.get("alertnames", ())),
                )
            )
        return out

    def get(self, bundle_id: str) -> dict[str, Any] | None:
        if not valid_id(bundle_id) or not self.directory.is_dir():
            return None
        entry = self.ring().get(bundle_id)
        if entry is None:
            return None
        try:
            return dict(json.loads(entry.path.read_bytes()))
        except (OSError, ValueError):
            return None

    def latest(self, alertname: str | None = None) -> dict[str, Any] | None:
        """The newest bundle naming ``alertname`` (or the newest of all when none does)."""
        metas = self.list()
        pick = next((m for m in metas if alertname and alertname in m.alertnames), metas[0] if metas else None)
        return self.get(pick.id) if pick else None

    def counts(self) -> Iterable[tuple[str, int]]:
        with self._lock:
            return [
                *sorted(self.captures.items()),
                ("rate_limited", self.rate_limited),
                ("store_error", self.store_errors),
            ]
