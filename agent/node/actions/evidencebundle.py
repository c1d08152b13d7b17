"""An evidence bundle as a document: redacted before it is stored (:func:`redact`), its one-line summary
(:func:`summarise`, where the process is stuck: :func:`top_frame`), and the whole of it for a terminal
(:func:`render_text`, what ``inferwatch evidence show`` and ``/api/v1/evidence/{id}?format=text`` give).
"""

from __future__ import annotations

import re
import time
from collections.abc import Mapping
from pathlib import Path
from typing import Any

from inferwatch.agent.node.debugprofile.redaction import RedactionPolicy

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


def redact(bundle: dict[str, Any], policy: RedactionPolicy) -> dict[str, Any]:
    """``policy`` (the snapshots' denylist) over everything but the already-redacted ``runtime_profile``; command
    lines by the policy's argv rule."""
    profile = bundle.pop("runtime_profile")
    for p in bundle["processes"]:
        if "cmdline" in p:
            p["cmdline"] = policy.redact_cmdline(p["cmdline"])
    out, _paths = policy.redact(bundle)
    out["runtime_profile"] = profile
    return dict(out)
