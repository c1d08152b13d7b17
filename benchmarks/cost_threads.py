"""benchmarks/cost_profile.py with each agent's CPU split by thread: where a cycle's CPU goes, measured, not sampled.

py-spy's share of samples is not a share of CPU: a thread waiting for the interpreter, or in a socket call, is
sampled as busy (the span receiver's HTTP thread looked like 19-27 % of everything on, mostly its event loop). This
runs cost_profile.py unchanged (same arguments, same rows) and adds to each row's ``profile`` the CPU
(user+system, ``/proc/PID/task/TID/stat``, 10 ms ticks) each of the agent's threads used over the window, by thread
name (``py-spy dump`` names them: ``otlp-http`` the receiver with its intake, ``collect-engine``,
``collect-host`` the span analytics with the host collectors, ``OtelPeriodicExportingMetricReader`` the OTLP
collection and export, ``MainThread`` the API and ``/metrics``), in ms per 5 s cycle: ``threads_ms_per_cycle``.

    .venv/bin/python benchmarks/cost_threads.py --venv build/cost-venv-new --installed \\
        --baseline-venv build/cost-venv-base --baseline-label COMMIT --cases all --out /tmp/threads.json
"""

from __future__ import annotations

import os
import re
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

import benchmarks.cost_profile as cp

TICK_S = 1 / os.sysconf("SC_CLK_TCK")
THREAD = re.compile(r'Thread (\d+) \((\w+)\): "([^"]+)"')


def thread_cpu(pid: int) -> dict[int, float]:
    """CPU seconds (user+system) of each thread of ``pid``, by OS thread id."""
    out: dict[int, float] = {}
    for tid in os.listdir(f"/proc/{pid}/task"):
        try:
            fields = Path(f"/proc/{pid}/task/{tid}/stat").read_text().rsplit(")", 1)[1].split()
        except OSError:  # the thread ended in between
            continue
        out[int(tid)] = (int(fields[11]) + int(fields[12])) * TICK_S
    return out


def thread_names(pid: int) -> dict[int, str]:
    """Python's name of each of ``pid``'s threads (py-spy dump, not pausing it), by OS thread id."""
    spy = str(cp.SPY if cp.SPY.exists() else "py-spy")
    dump = subprocess.run([spy, "dump", "--pid", str(pid), "--nonblocking"], capture_output=True, text=True, timeout=60)
    return {int(m.group(1)): m.group(3) for m in THREAD.finditer(dump.stdout)}


_spy_start, _spy_end = cp.spy_start, cp.spy_end


def spy_start(folder: Path | None, build: str, window_s: float, pid: int, label: str) -> Any:
    names = thread_names(pid)
    return _spy_start(folder, build, window_s, pid, label), pid, names, thread_cpu(pid), time.monotonic()


def spy_end(spy: Any) -> dict[str, Any]:
    inner, pid, names, cpu0, t0 = spy
    cpu1, cycles = thread_cpu(pid), (time.monotonic() - t0) / 5.0
    names.update({tid: n for tid, n in thread_names(pid).items() if tid not in names})
    used: dict[str, float] = {}
    for tid, s in cpu1.items():
        name = names.get(tid, "other (no Python name)")
        used[name] = used.get(name, 0.0) + s - cpu0.get(tid, 0.0)
    out = _spy_end(inner) or {}
    out["threads_ms_per_cycle"] = {
        n: round(1000 * s / cycles, 2) for n, s in sorted(used.items(), key=lambda x: -x[1]) if s
    }
    return out


if __name__ == "__main__":
    cp.spy_start, cp.spy_end = spy_start, spy_end
    sys.exit(cp.main())
