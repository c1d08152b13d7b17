"""Per-process facts the SIMD analysis reads from procfs: the runtime's pid, its threads, CPU time,
``arch_status`` and environment.

- ``<procfs>/PID/task/TID/arch_status`` (x86 kernels >= 5.3 on CPUs with AVX-512): ``AVX512_elapsed_ms``
  is the milliseconds since the kernel last saw the thread's AVX-512 register state in use at a context
  switch, ``-1`` if never. It is a "last seen" time, not a cumulative one; a forked child's main thread
  inherits its parent's value, and glibc's own EVEX string functions set it on every thread unless
  ``GLIBC_TUNABLES=glibc.cpu.hwcaps=-AVX512F,-AVX512VL`` (verified minimum on glibc 2.36) is set.
- ``<procfs>/PID/task/TID/stat`` utime + stime (clock ticks → seconds).
- ``<procfs>/PID/environ`` for ``GLIBC_TUNABLES`` (readable by the same user or root).
- ``<procfs>/net/tcp{,6}`` and ``<procfs>/PID/fd`` to find the process listening on a TCP port.
"""

from __future__ import annotations

import os
import re
from dataclasses import dataclass
from pathlib import Path

from agent.config import RuntimeSettings
from agent.errors import NoDataError

CLOCK_TICKS_PER_S = os.sysconf("SC_CLK_TCK") if hasattr(os, "sysconf") else 100
GLIBC_AVX512_OFF = ("-AVX512F", "-AVX512VL")  # both needed: without -AVX512VL glibc still picks EVEX string code
RECOMMENDED_TUNABLES = "glibc.cpu.hwcaps=-AVX512F,-AVX512VL,-AVX512BW,-AVX512DQ,-AVX512CD"
MAX_SCAN_PIDS = 100_000


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
        raise NoDataError(f"cannot list {task}", hint="run the agent as the runtime's user or as root") from None
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


def _listening_inodes(procfs: Path, port: int) -> set[str]:
    inodes = set()
    for name in ("tcp", "tcp6"):
        try:
            lines = (procfs / "net" / name).read_text().splitlines()[1:]
        except OSError:
            continue
        for line in lines:
            parts = line.split()
            if len(parts) > 9 and parts[3] == "0A" and int(parts[1].rsplit(":", 1)[1], 16) == port:
                inodes.add(parts[9])
    return inodes


def pid_listening_on(procfs: Path, port: int) -> int | None:
    """The process holding a listening TCP socket on ``port`` (None when not found or not permitted)."""
    inodes = _listening_inodes(procfs, port)
    if not inodes:
        return None
    targets = {f"socket:[{i}]" for i in inodes}
    for entry in sorted(os.listdir(procfs))[:MAX_SCAN_PIDS]:
        if not entry.isdigit():
            continue
        try:
            fds = os.listdir(procfs / entry / "fd")
        except OSError:
            continue
        for fd in fds:
            try:
                if os.readlink(procfs / entry / "fd" / fd) in targets:
                    return int(entry)
            except OSError:
                continue
    return None


def start_time(procfs: Path, pid: int) -> int | None:
    """The process's start time (clock ticks after boot, /proc/<pid>/stat field 22); None when it is gone."""
    try:
        stat = (procfs / str(pid) / "stat").read_text(encoding="utf-8", errors="replace")
        return int(stat[stat.rfind(")") + 2 :].split()[19])
    except (OSError, IndexError, ValueError):
        return None


def locate_runtime(procfs: Path, runtime: RuntimeSettings, port: int | None = None) -> int:
    """The runtime's pid from settings (pid, pidfile, cmdline pattern) or the port it listens on."""
    if runtime.pid is not None:
        if not (procfs / str(runtime.pid)).is_dir():
            raise NoDataError(f"runtime pid {runtime.pid} is not running", hint="fix runtime.pid")
        return runtime.pid
    if runtime.pidfile is not None:
        try:
            pid = int(runtime.pidfile.read_text().strip())
        except (OSError, ValueError) as exc:
            raise NoDataError(f"cannot read a pid from {runtime.pidfile}: {exc}", hint="fix runtime.pidfile") from None
        if not (procfs / str(pid)).is_dir():
            raise NoDataError(f"runtime pid {pid} (from {runtime.pidfile}) is not running")
        return pid
    if runtime.cmdline_pattern:
        pattern = re.compile(runtime.cmdline_pattern)
        me = os.getpid()
        for entry in sorted(os.listdir(procfs), key=lambda e: int(e) if e.isdigit() else 0)[:MAX_SCAN_PIDS]:
            if not entry.isdigit() or int(entry) == me:
                continue
            try:
                cmdline = (procfs / entry / "cmdline").read_bytes().replace(b"\0", b" ").decode("utf-8", "replace")
            except OSError:
                continue
            if cmdline and pattern.search(cmdline):
                return int(entry)
        raise NoDataError(f"no process matches runtime.cmdline_pattern {runtime.cmdline_pattern!r}")
    if port is not None:
        listener = pid_listening_on(procfs, port)
        if listener is not None:
            return listener
        raise NoDataError(f"no process found listening on port {port}", hint="set runtime.pid or run as root")
    raise NoDataError(
        "no runtime process configured",
        hint="set runtime.pid, runtime.pidfile or runtime.cmdline_pattern (INFERWATCH_RUNTIME__CMDLINE_PATTERN)",
        permanent=True,
    )
