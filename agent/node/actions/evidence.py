"""Evidence bundles: what a responder woken by "engine hung" needs, captured before anyone restarts the engine.

One bundle is one JSON document, redacted (the runtime_profile denylist policy) before it is written to its
own bounded ring (``evidence.dir``, ``evidence.max_count`` / ``max_bytes``, oldest evicted first):

- ``processes``: every process of the runtime (the runtime and its descendants): command line (redacted),
  state, and per thread its name, state, ``wchan`` and kernel stack where readable (threads in D state listed
  by name), plus a ``py-spy dump`` (all threads, no locals; :func:`inferwatch.agent.node.actions.pyspy.dump`) or the
  reason it is missing (no ptrace permission, not Python, timeout). With ``evidence.native`` (default) the dump is
  ``--native`` (native frames marked ``native``); when py-spy cannot (no libunwind, aarch64, a failure while
  unwinding) it is retried once without it within the same time limit, and ``mode`` / ``mode_reason`` /
  ``attempts`` say which mode the dump is and why (:func:`dump_process`);
- ``engine``: the last engine scrapes the agent kept (running, waiting, token counters and the hang verdict
  per rank), around the onset;
- ``runtime_profile``: a fresh snapshot of the runtime's debug profile (redacted as every snapshot);
- ``gpus``: NVML per GPU (through the injectable client), or why there is none;
- ``spans``: what is known of the requests in flight. An engine sends a request's span only when it ends, so a
  stuck request has none: instead ``in_flight`` (the engine's running / waiting gauges of the last scrape, counts
  without identities), ``probe`` (the streaming probe's last synthetic request) and ``recent_finished`` (the last
  finished requests' spans the OTLP receiver got, trace ids included, each marked before / after the onset), each
  with its source, or why it is absent (:func:`spans_section`);
- ``meta``: trigger (``hang`` | ``alert`` | ``api``), the alerts or finding behind it, wall time and CPU
  seconds of the capture (the agent thread and the py-spy children), a one-line ``summary``.

Triggers: :meth:`EvidenceStore.on_record` (a state listener) starts a capture in a thread the moment an
``engine_hung`` finding turns on; :meth:`EvidenceStore.on_alerts` for a webhook of firing critical alerts;
:meth:`EvidenceStore.capture` on an API request. Automatic captures are rate-limited per runtime process
(``evidence.min_interval_s``): a burst of alerts gives one bundle. A capture is bounded by
``evidence.time_limit_s`` (py-spy runs in parallel, each with what is left of it). Nothing here runs on the
collection path.
"""

from __future__ import annotations

import json
import logging
import os
import re
import resource
import threading
import time
from collections import deque
from collections.abc import Callable, Iterable, Mapping, Sequence
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Any

from inferwatch.agent.common.samples import Collection
from inferwatch.agent.config import Settings
from inferwatch.agent.errors import NoDataError
from inferwatch.agent.node.actions import pyspy
from inferwatch.agent.node.actions.ring import FileRing, new_id, valid_id
from inferwatch.agent.node.collectors.simd import engine_port
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
SCRAPES_KEPT = 12  # 3 minutes of engine scrapes at 15 s
MAX_THREADS_PER_PROCESS = 512
MAX_KERNEL_STACK_LINES = 32
MAX_FRAMES = 64
PY_SPY_WORKERS = 4
DEADLINE_MARGIN_S = 0.5  # kept back from each py-spy run for writing the bundle
MIN_DUMP_S = 0.2  # less time than this left: no py-spy run is started
# The --native attempt gets this share of the time left, so that the retry without it still fits in the limit.
NATIVE_SHARE = 0.6
# py-spy failures that a dump without --native would hit the same way: no retry.
SAME_WITHOUT_NATIVE = frozenset({"permission", "no_process", "not_python", "missing", "invalid_pid"})
NATIVE_OK = "--native: Python and native frames (C extensions, CUDA/NCCL, libc); the process was paused for the dump"
NATIVE_OFF = "evidence.native is false: Python frames only (non-blocking)"
RECENT_SPANS_SHOWN = 32
SPANS_NOTE = (
    "an engine sends a request's span only when the request ends, so requests in flight (the stuck ones) have no "
    "span: in_flight counts them from the engine's gauges (no identities), probe is the agent's own last synthetic "
    "request, recent_finished the last finished requests' spans the OTLP receiver got before the capture"
)
THREAD_STATES = {
    "R": "running",
    "S": "sleeping",
    "D": "disk sleep",
    "T": "stopped",
    "t": "tracing stop",
    "Z": "zombie",
    "X": "dead",
    "I": "idle",
}


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


# --- /proc readers (pure functions of a procfs root) --------------------------------------------------------


def _read(path: Path) -> tuple[str | None, str | None]:
    """(text, None) or (None, why not)."""
    try:
        return path.read_text(errors="replace"), None
    except PermissionError:
        return None, "permission denied (needs root / CAP_SYS_ADMIN for kernel stacks, ptrace access otherwise)"
    except FileNotFoundError:
        return None, "gone (the thread or process exited)"
    except OSError as exc:
        return None, exc.strerror or str(exc)


def _stat_fields(text: str) -> tuple[str, str, int]:
    """(comm, state letter, ppid) from /proc/PID/stat (comm may hold spaces and parentheses)."""
    lpar, rpar = text.find("("), text.rfind(")")
    rest = text[rpar + 2 :].split()
    return text[lpar + 1 : rpar], rest[0], int(rest[1])


def thread_states(procfs: Path, pid: int) -> list[dict[str, Any]]:
    """Per thread of ``pid``: tid, name, state, wchan and kernel stack (or why each is missing)."""
    task = procfs / str(pid) / "task"
    try:
        tids = sorted(int(t) for t in os.listdir(task) if t.isdigit())
    except OSError as exc:
        return [{"error": f"cannot list {task}: {exc.strerror or exc}"}]
    out: list[dict[str, Any]] = []
    for tid in tids[:MAX_THREADS_PER_PROCESS]:
        base = task / str(tid)
        entry: dict[str, Any] = {"tid": tid}
        stat, why = _read(base / "stat")
        if stat is None:
            entry["error"] = why
            out.append(entry)
            continue
        name, state, _ppid = _stat_fields(stat)
        entry |= {"name": name, "state": state, "state_name": THREAD_STATES.get(state, state)}
        wchan, why = _read(base / "wchan")
        entry["wchan"] = wchan.strip() if wchan is not None and wchan.strip() not in ("", "0") else None
        if wchan is None:
            entry["wchan_error"] = why
        stack, why = _read(base / "stack")
        if stack is not None:
            entry["kernel_stack"] = stack.strip().splitlines()[:MAX_KERNEL_STACK_LINES]
        else:
            entry["kernel_stack_error"] = why
        out.append(entry)
    return out


def process_info(procfs: Path, pid: int) -> dict[str, Any]:
    stat, why = _read(procfs / str(pid) / "stat")
    if stat is None:
        return {"pid": pid, "error": why}
    comm, state, ppid = _stat_fields(stat)
    raw, why = _read(procfs / str(pid) / "cmdline")
    info: dict[str, Any] = {"pid": pid, "ppid": ppid, "comm": comm, "state": state}
    if raw is not None:
        info["cmdline"] = [a for a in raw.split("\0") if a]
    else:
        info["cmdline_error"] = why
    return info


def nvml_state(nvml: NVMLClient) -> dict[str, Any]:
    """Per GPU what NVML says now, or the reason there is nothing."""
    try:
        nvml.init()
    except Exception as exc:
        return {"absent": f"NVML unavailable: {exc}"}
    gpus: list[dict[str, Any]] = []
    try:
        for i in range(nvml.device_count()):
            g: dict[str, Any] = {"index": i}
            for key, call in (
                ("name", nvml.name),
                ("uuid", nvml.uuid),
                ("utilization_percent", nvml.utilization_percent),
                ("memory_used_total_bytes", nvml.memory_bytes),
                ("sm_clock_mhz", nvml.sm_clock_mhz),
                ("power_milliwatts", nvml.power_milliwatts),
                ("temperature_celsius", nvml.temperature_celsius),
                ("clock_event_reasons", nvml.clock_event_reasons),
            ):
                try:
                    g[key] = call(i)
                except Exception as exc:
                    g[key + "_error"] = str(exc)
            try:
                g["processes"] = [
                    {"pid": p.pid, "used_memory_bytes": p.used_memory_bytes} for p in nvml.compute_processes(i)
                ]
            except Exception as exc:
                g["processes_error"] = str(exc)
            gpus.append(g)
    except Exception as exc:
        return {"absent": f"NVML failed: {exc}", "gpus": gpus}
    finally:
        try:
            nvml.shutdown()
        except Exception:
            log.debug("NVML shutdown failed", exc_info=True)
    return {"gpus": gpus} if gpus else {"absent": "NVML reports no GPU"}


def _frame(f: dict[str, Any]) -> dict[str, Any]:
    """A frame's name and location; ``native: true`` on a native one (py-spy names its shared object in ``module``)."""
    out = {k: f.get(k) for k in ("name", "filename", "line")}
    if f.get("module") is not None:
        out["native"] = True
    return out


def py_thread(t: Any) -> dict[str, Any]:
    """A py-spy thread with its OS thread id (to join /proc's threads) and frame names/locations; never locals.

    Not :func:`inferwatch.agent.node.actions.snapshots._strip_thread`: that one drops ``os_thread_id``, which names
    /proc's threads.
    """
    if not isinstance(t, dict):
        return {}
    frames = [_frame(f) for f in t.get("frames", []) if isinstance(f, dict)]
    keep = ("thread_id", "os_thread_id", "thread_name", "active", "owns_gil")
    return {k: t.get(k) for k in keep} | {"frames": frames[:MAX_FRAMES]}


def name_threads(process: dict[str, Any]) -> None:
    """Give /proc's threads their Python names from the py-spy dump (Python does not set OS thread names)."""
    names = {t.get("os_thread_id"): t.get("thread_name") for t in process.get("py_spy", {}).get("threads", [])}
    for t in process.get("threads", []):
        if names.get(t.get("tid")):
            t["python_name"] = names[t["tid"]]


_STDLIB = re.compile(r"/lib/python3\.\d+/(?!site-packages/|dist-packages/)")
# Innermost frames of a thread that waits for work rather than being stuck (an event loop, an idle executor).
IDLE_FRAMES = frozenset({"select", "poll", "epoll", "_worker", "accept", "serve_forever"})


def python_frames(frames: list[dict[str, Any]]) -> list[dict[str, Any]]:
    """The Python frames of a stack (a ``--native`` dump interleaves native ones)."""
    return [f for f in frames if not f.get("native")]


def _app_frame(frames: list[dict[str, Any]]) -> dict[str, Any] | None:
    """The innermost Python frame outside the standard library (the application's own code)."""
    frames = python_frames(frames)
    return next((f for f in frames if not _STDLIB.search(str(f.get("filename")))), frames[0] if frames else None)


def top_frame(threads: list[dict[str, Any]]) -> str | None:
    """Where the process is stuck: the innermost application frame of its most telling thread.

    Threads idling in an event loop's selector or an executor's queue come last; before them, threads running an
    asyncio event loop's callbacks (a loop that runs callbacks is serving, not stuck: the hang this evidence is
    for left /health answering, and a dump that lands while the loop accepts a scrape must not name that); then
    threads holding the GIL or active; the main thread after the others (a server's main thread serves, its
    workers do the work).
    """

    def rank(t: dict[str, Any]) -> tuple[bool, bool, bool, bool]:
        frames = python_frames(t.get("frames") or []) or [{}]
        names = [str(f.get("name", "")) for f in frames]
        idle = names[0].rsplit(".", 1)[-1] in IDLE_FRAMES or any(n.endswith("serve_forever") for n in names)
        serving = any(n.rsplit(".", 1)[-1] == "_run_once" for n in names)
        return (idle, serving, not (t.get("active") or t.get("owns_gil")), t.get("thread_name") == "MainThread")

    for t in sorted(threads, key=rank):
        f = _app_frame(t.get("frames") or [])
        if f is not None:
            return f"{f.get('name')} ({Path(str(f.get('filename'))).name}:{f.get('line')})"
    return None


def summarise(bundle: dict[str, Any]) -> str:
    """One line: trigger, processes, threads (D state named), py-spy outcome, innermost frames, cost."""
    procs = bundle.get("processes", [])
    threads = [t for p in procs for t in p.get("threads", []) if "state" in t]
    d_state = [f"{t.get('python_name') or t.get('name')}({t['tid']})" for t in threads if t.get("state") == "D"]
    dumped = [p for p in procs if isinstance(p.get("py_spy"), dict) and "threads" in p["py_spy"]]
    errors = sorted(
        {p["py_spy"].get("error", "?") for p in procs if isinstance(p.get("py_spy"), dict) and "error" in p["py_spy"]}
    )
    frames = [f for f in (top_frame(p["py_spy"]["threads"]) for p in dumped) if f]
    modes = sorted({str(p["py_spy"]["mode"]) for p in dumped if p["py_spy"].get("mode")})
    meta = bundle.get("meta", {})
    parts = [
        f"{meta.get('trigger')}: {meta.get('reason') or ''}".strip().rstrip(":"),
        f"{len(procs)} process(es), {len(threads)} thread(s)"
        + (f", {len(d_state)} in D state: {', '.join(d_state[:5])}" if d_state else ", none in D state"),
        f"py-spy {len(dumped)}/{len(procs)}"
        + (f" ({', '.join(errors)})" if errors else "")
        + (f" [{', '.join(modes)}]" if modes else ""),
    ]
    if frames:
        parts.append("stuck in " + "; ".join(dict.fromkeys(frames[:3])))
    parts.append(f"{meta.get('wall_s', 0):.2f} s wall, {meta.get('cpu_s', {}).get('total', 0):.2f} s CPU")
    return " | ".join(parts)


def render_text(bundle: Mapping[str, Any]) -> str:
    """The bundle for a terminal: summary, then per process its threads, states and Python stacks."""
    meta = bundle.get("meta", {})
    when = time.strftime("%Y-%m-%d %H:%M:%S UTC", time.gmtime(meta.get("captured_at", 0)))
    lines = [
        f"evidence {meta.get('id')}  captured {when}",
        f"  {meta.get('summary')}",
        "",
    ]
    if meta.get("alerts"):
        lines.append("alerts: " + ", ".join(f"{a.get('alertname')}{a.get('labels', {})}" for a in meta["alerts"]))
    for p in bundle.get("processes", []):
        lines.append(
            f"process {p.get('pid')} ({p.get('comm')}) state {p.get('state')}: {' '.join(p.get('cmdline', []))[:200]}"
        )
        spy = p.get("py_spy", {})
        stacks = {t.get("thread_id"): t for t in spy.get("threads", [])} if "threads" in spy else {}
        if "error" in spy:
            lines.append(f"  py-spy: {spy['error']}: {spy.get('message')}")
        elif spy.get("mode"):
            lines.append(f"  py-spy {spy['mode']}: {spy.get('mode_reason')}")
        for t in p.get("threads", []):
            wchan = f" wchan={t['wchan']}" if t.get("wchan") else ""
            name = t.get("python_name") or t.get("name")
            lines.append(f"  thread {t.get('tid')} {name!s:16} {t.get('state_name', t.get('error'))}{wchan}")
            for k in t.get("kernel_stack", [])[:6]:
                lines.append(f"      kernel {k}")
        for t in stacks.values():
            name = t.get("thread_name") or t.get("thread_id")
            lines.append(f"  python thread {name} (active={t.get('active')}, gil={t.get('owns_gil')})")
            for f in t.get("frames", [])[:24]:
                where = Path(str(f.get("filename"))).name if f.get("native") else f.get("filename")
                mark = " [native]" if f.get("native") else ""
                lines.append(f"      {f.get('name')} ({where}:{f.get('line')}){mark}")
    eng = bundle.get("engine", {})
    if eng.get("scrapes"):
        lines.append("")
        lines.append("engine scrapes (oldest first):")
        for s in eng["scrapes"]:
            ranks = ", ".join(
                f"{r['model']}/{r['rank']}: run {r['running']:.0f} wait {r['waiting']:.0f} stall {r['stall_s']:.0f}s"
                for r in s.get("ranks", [])
            )
            lines.append(f"  {time.strftime('%H:%M:%S', time.gmtime(s.get('at', 0)))} {ranks}")
    gpus = bundle.get("gpus", {})
    lines.append("")
    lines.append("gpus: " + (gpus["absent"] if "absent" in gpus else f"{len(gpus.get('gpus', []))} GPU(s)"))
    for g in gpus.get("gpus", []):
        lines.append(
            f"  gpu {g.get('index')} {g.get('name')} util {g.get('utilization_percent')}% procs {g.get('processes')}"
        )
    rp = bundle.get("runtime_profile", {})
    lines.append("runtime_profile: " + (rp["absent"] if "absent" in rp else f"snapshot {rp.get('meta', {}).get('id')}"))
    lines += ["", *render_spans(bundle.get("spans", {}))]
    return "\n".join(lines) + "\n"


def render_spans(spans: Mapping[str, Any]) -> list[str]:
    """The ``spans`` section for a terminal: in flight by rank, the probe, the last finished requests."""
    lines = ["requests in flight:"]
    fl = spans.get("in_flight", {})
    if "absent" in fl:
        lines.append(f"  engine: {fl['absent']}")
    else:
        when = time.strftime("%H:%M:%S", time.gmtime(fl.get("at", 0)))
        lines.append(f"  engine at {when}: {fl.get('running', 0):.0f} running, {fl.get('waiting', 0):.0f} waiting")
    probe = spans.get("probe", {})
    if "absent" in probe:
        lines.append(f"  probe: {probe['absent']}")
    for proto, r in sorted(probe.get("protocols", {}).items()):
        outcome = "ok" if r.get("ok") else f"{r.get('error_type')}: {r.get('error_message')}"
        lines.append(f"  probe {proto}: {outcome} (ttft {r.get('ttft_s')} s, duration {r.get('duration_s')} s)")
    recent = spans.get("recent_finished", {})
    if "absent" in recent:
        lines.append(f"last finished requests: {recent['absent']}")
        return lines
    lines.append(f"last finished requests (newest first, {len(recent.get('requests', []))}):")
    for r in recent.get("requests", [])[:10]:
        end = r.get("end_unix_s") or r.get("received_at") or 0
        before = {True: " before onset", False: " after onset"}.get(r.get("ended_before_onset"), "")
        lines.append(
            f"  {time.strftime('%H:%M:%S', time.gmtime(end))}{before} {r.get('request_id') or '-'} "
            f"trace {r.get('trace_id')} e2e {r.get('seconds', {}).get('e2e')} s"
        )
    return lines


# --- py-spy and spans ---------------------------------------------------------------------------------------


def dump_process(exe: Path, pid: int, deadline: float, native: bool) -> dict[str, Any]:
    """The ``py_spy`` entry of one process, py-spy finishing before ``deadline`` (``time.monotonic``).

    With ``native``: ``py-spy dump --native`` first, with :data:`NATIVE_SHARE` of the time left; when it fails for
    a reason a Python-only dump need not share (``native_unsupported``, ``failed``, ``timeout``), once more without
    ``--native`` with what is left. ``mode`` (``native`` | ``python``) and ``mode_reason`` say what the dump is and
    why, ``attempts`` lists each run (mode, seconds, error); with no dump, ``error`` / ``message`` are the last run's.
    """
    attempts: list[dict[str, Any]] = []
    modes = ("native", "python") if native else ("python",)
    for mode in modes:
        left = deadline - time.monotonic() - DEADLINE_MARGIN_S
        if left <= MIN_DUMP_S:
            attempts.append({"mode": mode, "error": "timeout", "message": "no time left within evidence.time_limit_s"})
            break
        budget = min(left, pyspy.DUMP_TIMEOUT_S) * (NATIVE_SHARE if mode == "native" else 1.0)
        t0 = time.monotonic()
        try:
            threads = pyspy.dump(exe, pid, timeout_s=budget, native=mode == "native")
        except pyspy.PySpyError as exc:
            attempts.append(
                {"mode": mode, "wall_s": round(time.monotonic() - t0, 3), "error": exc.kind, "message": str(exc)}
            )
            if exc.kind in SAME_WITHOUT_NATIVE:
                break
            continue
        attempts.append({"mode": mode, "wall_s": round(time.monotonic() - t0, 3)})
        if mode == "native":
            reason = NATIVE_OK
        elif native:
            first = attempts[0]
            reason = f"--native failed ({first['error']}: {first['message']}); retried without it: Python frames only"
        else:
            reason = NATIVE_OFF
        return {"mode": mode, "mode_reason": reason, "attempts": attempts, "threads": [py_thread(t) for t in threads]}
    last = attempts[-1]
    return {"error": last["error"], "message": last["message"], "attempts": attempts}


def in_flight(scrapes: Sequence[Mapping[str, Any]]) -> dict[str, Any]:
    """Requests in flight from the engine's running / waiting gauges of the last scrape (counts, no identities)."""
    if not scrapes:
        return {"absent": "no engine scrape kept yet (the engine collector is off or has not scraped since start)"}
    last = scrapes[-1]
    keep = ("model", "rank", "running", "waiting", "stall_s", "allowance_s", "stalled")
    ranks = [{k: r.get(k) for k in keep} for r in last.get("ranks", [])]
    if not ranks:
        return {"absent": f"the last engine scrape ({last.get('engine')}) had no running / waiting gauges per rank"}
    return {
        "source": "engine gauges (vllm:num_requests_running / _waiting or the engine's own) of the last scrape",
        "at": last.get("at"),
        "running": sum(float(r.get("running") or 0) for r in ranks),
        "waiting": sum(float(r.get("waiting") or 0) for r in ranks),
        "ranks": ranks,
    }


def onset_of(scrapes: Sequence[Mapping[str, Any]]) -> float | None:
    """When progress stopped (Unix s): the newest scrape with a stalled rank, less its stall; None if none stalled."""
    for s in reversed(scrapes):
        stalls = [float(r.get("stall_s") or 0) for r in s.get("ranks", []) if r.get("stalled")]
        if stalls:
            return float(s.get("at", 0)) - max(stalls)
    return None


def spans_section(
    scrapes: Sequence[Mapping[str, Any]],
    probe: Mapping[str, Any] | None,
    recent: Sequence[FinishedSpan] | None,
) -> dict[str, Any]:
    """The bundle's ``spans``: in flight (engine gauges), the probe's last request, the last finished spans.

    ``recent`` None: no receiver attached (``receiver.enabled`` false). Each finished request is marked
    ``ended_before_onset`` when an onset is known (:func:`onset_of`).
    """
    out: dict[str, Any] = {"note": SPANS_NOTE, "in_flight": in_flight(scrapes)}
    if probe is None:
        out["probe"] = {"absent": "no streaming probe result yet (probe.url is not set, or no run finished)"}
    else:
        out["probe"] = {
            "source": "the streaming probe's last synthetic request per protocol (a run still waiting is not shown)",
            **probe,
        }
    if recent is None:
        out["recent_finished"] = {
            "absent": "the OTLP trace receiver is off (receiver.enabled): no request spans are received"
        }
        return out
    if not recent:
        out["recent_finished"] = {
            "absent": "the OTLP receiver has received no request span since the agent started (is the engine "
            "exporting them, e.g. vLLM --otlp-traces-endpoint?)"
        }
        return out
    onset = onset_of(scrapes)
    requests = []
    for span in recent[:RECENT_SPANS_SHOWN]:
        r = span.as_dict()
        if onset is not None:
            r["ended_before_onset"] = (r.get("end_unix_s") or r["received_at"]) < onset
        requests.append(r)
    out["recent_finished"] = {
        "source": "OTLP receiver: the last finished requests' spans received before the capture (newest first); "
        "a request still in flight is not among them",
        "onset_at": onset,
        "requests": requests,
    }
    return out


# --- the store ----------------------------------------------------------------------------------------------


Clock = Callable[[], float]


class EvidenceStore:
    """Captures and keeps evidence bundles; thread-safe. See the module docstring."""

    def __init__(
        self,
        settings: Settings,
        locator: RuntimeLocator,
        reader: ProfileReader,
        nvml: NVMLClient,
        monotonic: Clock = time.monotonic,
    ) -> None:
        self.settings = settings
        self.cfg = settings.evidence
        self.locator = locator
        self.reader = reader
        self.nvml = nvml
        self.procfs = settings.path.procfs
        self.monotonic = monotonic
        self.captures = {"hang": 0, "alert": 0, "api": 0}
        self.rate_limited = 0
        self.store_errors = 0
        self._lock = threading.Lock()
        self._capture_lock = threading.Lock()
        self._ring: FileRing | None = None
        # per scrape: (time, engine, the ranks' keys, each rank's values in that order): a tuple a rank, where a
        # dict took ~250 bytes more (at 200 models x 2 ranks, 12 scrapes held ~1.2 MB more); dicts again in scrapes()
        self._scrapes: deque[tuple[float, Any, tuple[str, ...], list[tuple[Any, ...] | dict[str, Any]]]] = deque(
            maxlen=SCRAPES_KEPT
        )
        self._hung: set[tuple[str, str]] = set()
        self._last_by_pid: dict[int, tuple[float, str]] = {}
        self._threads: list[threading.Thread] = []
        self._probe: dict[str, Any] | None = None
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
        """State listener: keep the engine scrapes and the probe's last result; start a capture when a rank's hang
        finding turns on."""
        if name == PROBE_SOURCE:
            self._probe = {"at": time.time(), "protocols": dict(collection.details)}
            return
        if name != ENGINE_SOURCE:
            return
        ranks = collection.details.get("hang", [])
        keys = tuple(ranks[0]) if ranks else ()
        rows = [tuple(r.values()) if tuple(r) == keys else dict(r) for r in ranks]  # a rank of other keys: as it is
        self._scrapes.append((time.time(), collection.details.get("engine"), keys, rows))
        hung = {
            (str(f.evidence.get("model")), str(f.evidence.get("rank"))): f
            for f in collection.findings
            if f.id == HANG_FINDING
        }
        with self._lock:
            onset = set(hung) - self._hung
            self._hung = set(hung)
        if onset and self.cfg.enabled and self.cfg.on_hang:
            first = hung[sorted(onset)[0]]
            self.trigger_async("hang", first.summary, alertnames=(HANG_ALERT,), finding=dict(first.evidence))

    def scrapes(self) -> list[dict[str, Any]]:
        """The engine scrapes kept, oldest first: ``{"at", "engine", "ranks": [the rank's hang verdict dict]}``."""
        return [
            {
                "at": at,
                "engine": engine,
                "ranks": [dict(zip(keys, r, strict=True)) if isinstance(r, tuple) else dict(r) for r in rows],
            }
            for at, engine, keys, rows in list(self._scrapes)
        ]

    def on_alerts(self, payload: Mapping[str, Any]) -> dict[str, Any]:
        """An Alertmanager webhook: a capture for its firing critical alerts for this node (``evidence.instances``;
        rate-limited), else nothing."""
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
        reason = ", ".join(names)
        existing = self._limited()
        if existing is not None:
            return {"captured": None, "rate_limited": True, "latest": existing}
        self.trigger_async("alert", reason, alertnames=names, alerts=brief)
        return {"captured": "started", "rate_limited": False}

    def _limited(self) -> str | None:
        """The id of this process's bundle when one was captured within ``min_interval_s``, else None."""
        pids = self._pids()
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

    def trigger_async(self, trigger: str, reason: str, **context: Any) -> threading.Thread | None:
        """An automatic capture in its own thread, unless rate-limited (see :meth:`_limited`)."""
        if self._limited() is not None:
            return None
        t = threading.Thread(
            target=self._capture_logged, args=(trigger, reason), kwargs=context, daemon=True, name=f"evidence-{trigger}"
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
    def _pids(self) -> list[int]:
        """The runtime and its descendants: runtime.* when configured, else the engine port's listener."""
        try:
            if self.locator.configured:
                return sorted(self.locator.pids())
            proc = self.locator.find_serving(engine_port(self.settings))
            return sorted({proc.pid} | {c.pid for c in proc.children(recursive=True)})
        except Exception:
            return []

    def capture(self, trigger: str, reason: str = "", **context: Any) -> EvidenceMeta:
        """Capture one bundle now, redact it, store it; returns its listing entry. One capture at a time."""
        with self._capture_lock:
            return self._capture(trigger, reason, context)

    def _capture(self, trigger: str, reason: str, context: dict[str, Any]) -> EvidenceMeta:
        t0, cpu0, kids0 = time.monotonic(), time.thread_time(), resource.getrusage(resource.RUSAGE_CHILDREN)
        deadline = t0 + self.cfg.time_limit_s
        bundle_id = new_id()
        pids = self._pids()
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
            },
            "processes": processes,
            "engine": {"scrapes": self.scrapes()},
            "runtime_profile": self._runtime_profile(),
            "gpus": nvml_state(self.nvml),
            "spans": self._spans(),
        }
        if not pids:
            bundle["processes_absent"] = (
                "no runtime process found: set runtime.pid / runtime.pidfile / runtime.cmdline_pattern, or run the "
                "agent where it can see the process listening on engine.metrics_url's port"
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
        redacted = self._redact(bundle)
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
            exe = pyspy.resolve_executable(self.settings.profiling.py_spy)
        except pyspy.PySpyError as exc:
            for p in processes:
                p["py_spy"] = {"error": exc.kind, "message": str(exc)}
            return

        def one(p: dict[str, Any]) -> None:
            p["py_spy"] = dump_process(exe, int(p["pid"]), deadline, self.cfg.native)

        with ThreadPoolExecutor(max_workers=PY_SPY_WORKERS, thread_name_prefix="evidence-py-spy") as pool:
            list(pool.map(one, processes))

    def _spans(self) -> dict[str, Any]:
        try:
            recent = self._recent_spans() if self._recent_spans is not None else None
        except Exception as exc:
            out = spans_section(self.scrapes(), self._probe, [])
            out["recent_finished"] = {"absent": f"reading the receiver's spans failed: {exc}"}
            return out
        return spans_section(self.scrapes(), self._probe, recent)

    def _runtime_profile(self) -> dict[str, Any]:
        try:
            return dict(self.reader.read("evidence").document)
        except NoDataError as exc:
            return {"absent": str(exc)}
        except Exception as exc:
            return {"absent": f"runtime_profile read failed: {exc}"}

    def _redact(self, bundle: dict[str, Any]) -> dict[str, Any]:
        """The denylist policy of the snapshots over everything but the already-redacted runtime_profile."""
        policy = self.reader.enrich_policy()
        profile = bundle.pop("runtime_profile")
        for p in bundle["processes"]:
            if "cmdline" in p:
                p["cmdline"] = policy.redact_cmdline(p["cmdline"])
        out, _paths = policy.redact(bundle)
        out["runtime_profile"] = profile
        return dict(out)

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
