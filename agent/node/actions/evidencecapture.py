"""What an evidence bundle reads from the world: the runtime's processes and threads (/proc), a py-spy dump of
each, the GPUs (NVML), and what is known of the requests in flight. Plain functions of their inputs (a procfs
root, the NVML client, py-spy's path, the kept engine scrapes); the store
(:mod:`inferwatch.agent.node.actions.evidence`) calls them on a capture, never on the collection path.

- :func:`process_info` and :func:`thread_states`: per process its command line and state, per thread its name, state,
  ``wchan`` and kernel stack, or why each is missing (permission, the thread exited);
- :func:`dump_process`: the ``py_spy`` entry, ``--native`` first when asked and retried once without it when py-spy
  cannot unwind natively, within the capture's time limit; ``mode`` / ``mode_reason`` / ``attempts`` say which dump
  it is and why;
- :func:`nvml_state`: per GPU what NVML says now, or why there is nothing;
- :func:`spans_section`: an engine sends a request's span only when it ends, so a stuck request has none: the
  engine's running / waiting gauges (counts), the probe's last request and the last finished spans, each marked
  before / after the onset of the hang.
"""

from __future__ import annotations

import logging
import os
import time
from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import TYPE_CHECKING, Any

from inferwatch.agent.node.actions import pyspy
from inferwatch.agent.node.host.nvml import NVMLClient

if TYPE_CHECKING:  # the receiver is imported only when it is on (inferwatch.agent.node.app)
    from inferwatch.agent.node.receiver.intake import FinishedSpan

log = logging.getLogger(__name__)
MAX_THREADS_PER_PROCESS = 512
MAX_KERNEL_STACK_LINES = 32
MAX_FRAMES = 64
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
