"""Per-process facts the SIMD analysis reads from procfs: the runtime's pid, its threads, CPU time,
``arch_status`` and environment.

- ``<procfs>/PID/task/TID/arch_status`` (x86 kernels >= 5.3 on CPUs with AVX-512): ``AVX512_elapsed_ms``
  is the milliseconds since the kernel last saw the thread's AVX-512 register state in use at a context
  switch, ``-1`` if never. It is a "last seen" time, not a cumulative one; a forked child's main thread
  inherits its parent's value, and glibc's own EVEX string functions set it on every thread unless
  ``GLIBC_TUNABLES=glibc.cpu.hwcaps=-AVX512F,-AVX512VL`` (verified minimum on glibc 2.36) is set.
- ``<procfs>/PID/task/TID/stat`` utime + stime (clock ticks → seconds).
- ``<procfs>/PID/environ`` for ``GLIBC_TUNABLES`` (readable by the same user or root).
"""

from __future__ import annotations

import os
import re
from dataclasses import dataclass
from pathlib import Path

from inferwatch.agent.errors import NoDataError
from inferwatch.agent.node.host.privilege import unless_root

CLOCK_TICKS_PER_S = os.sysconf("SC_CLK_TCK") if hasattr(os, "sysconf") else 100
GLIBC_AVX512_OFF = ("-AVX512F", "-AVX512VL")  # both needed: without -AVX512VL glibc still picks EVEX string code
RECOMMENDED_TUNABLES = "glibc.cpu.hwcaps=-AVX512F,-AVX512VL,-AVX512BW,-AVX512DQ,-AVX512CD"


@dataclass(frozen=True, slots=True)
class ThreadSample:
    """One thread: name, CPU seconds so far, and AVX-512 last-seen age (None: no arch_status here)."""

    tid: int
    name: str
    cpu_s: float
    avx512_elapsed_ms: int | None


def read_threads(procfs: Path, pid: int) -> list[ThreadSample]:
    """Every thread of ``pid`` with its CPU time and ``AVX512_elapsed_ms``."""
    task = procfs / str(pid) / "task"
    try:
        tids = sorted(int(t) for t in os.listdir(task) if t.isdigit())
    except FileNotFoundError:
        raise NoDataError(f"process {pid} is gone") from None
    except PermissionError:
        hint = unless_root(
            "run the agent as the runtime's user or as root",
            "the agent runs as root already: a security module (AppArmor, SELinux) or a user namespace denies it",
        )
        raise NoDataError(f"cannot list {task}", hint=hint) from None
    out = []
    for tid in tids:
        base = task / str(tid)
        try:
            stat = (base / "stat").read_text(encoding="utf-8", errors="replace")
        except OSError:
            continue  # thread ended between listdir and read
        name = stat[stat.find("(") + 1 : stat.rfind(")")]
        fields = stat[stat.rfind(")") + 2 :].split()
        try:
            cpu_s = (int(fields[11]) + int(fields[12])) / CLOCK_TICKS_PER_S
        except (IndexError, ValueError):
            continue
        out.append(ThreadSample(tid, name, cpu_s, read_arch_status(base / "arch_status")))
    return out


def read_arch_status(path: Path) -> int | None:
    try:
        text = path.read_text(encoding="ascii", errors="replace")
    except OSError:
        return None
    m = re.search(r"AVX512_elapsed_ms:\s*(-?\d+)", text)
    return int(m.group(1)) if m else None


def glibc_tunables(procfs: Path, pid: int) -> str | None:
    """The runtime's ``GLIBC_TUNABLES`` value, ``""`` if unset, None if the environment is unreadable."""
    try:
        raw = (procfs / str(pid) / "environ").read_bytes()
    except OSError:
        return None
    for entry in raw.split(b"\0"):
        if entry.startswith(b"GLIBC_TUNABLES="):
            return entry.split(b"=", 1)[1].decode("utf-8", "replace")
    return ""


def glibc_avx512_disabled(tunables: str | None) -> bool:
    if not tunables:
        return False
    hwcaps = [item.split("=", 1)[1] for item in tunables.split(":") if item.startswith("glibc.cpu.hwcaps=")]
    masked = {flag.strip().upper() for h in hwcaps for flag in h.split(",")}
    return all(flag in masked for flag in GLIBC_AVX512_OFF)


def start_time(procfs: Path, pid: int) -> int | None:
    """The process's start time (clock ticks after boot, /proc/<pid>/stat field 22); None when it is gone."""
    try:
        stat = (procfs / str(pid) / "stat").read_text(encoding="utf-8", errors="replace")
        return int(stat[stat.rfind(")") + 2 :].split()[19])
    except (OSError, IndexError, ValueError):
        return None
