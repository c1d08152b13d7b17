"""Describe the runtime process from procfs (without its environment), for a snapshot's enrichment.

The process is found by the agent's one :class:`~inferwatch.agent.node.host.runtime.RuntimeLocator`. The description
never includes ``/proc/PID/environ``; the command line is passed through the redaction policy by the caller.
"""

from __future__ import annotations

import os
from dataclasses import dataclass
from pathlib import Path

from inferwatch.agent.errors import SourceFormatError
from inferwatch.agent.node.host.procfs import DEFAULT_READ_LIMITS, ReadLimits


@dataclass(frozen=True, slots=True)
class RuntimeProcess:
    pid: int
    name: str
    exe: str | None  # resolved /proc/PID/exe, None when unreadable
    cmdline: list[str]
    threads: int | None
    rss_bytes: int | None


def read_cmdline(procfs: Path, pid: int) -> list[str]:
    try:
        raw = (procfs / str(pid) / "cmdline").read_bytes()
    except OSError:
        return []
    return [a.decode("utf-8", "replace") for a in raw.split(b"\0") if a]


def describe(procfs: Path, pid: int) -> RuntimeProcess:
    base = procfs / str(pid)
    try:
        name = (base / "comm").read_text().strip()
    except OSError:
        name = ""
    try:
        exe: str | None = os.readlink(base / "exe")
    except OSError:
        exe = None
    threads = rss = None
    try:
        for line in (base / "status").read_text().splitlines():
            if line.startswith("Threads:"):
                threads = int(line.split()[1])
            elif line.startswith("VmRSS:"):
                rss = int(line.split()[1]) * 1024
    except (OSError, ValueError, IndexError):
        pass
    return RuntimeProcess(pid, name, exe, read_cmdline(procfs, pid), threads, rss)


def cpu_capability(procfs: Path, limits: ReadLimits = DEFAULT_READ_LIMITS) -> dict[str, object]:
    """The SIMD features an inference runtime cares about, from ``/proc/cpuinfo`` (empty if unreadable)."""
    wanted = ("avx", "avx2", "avx512f", "avx512_bf16", "avx512_vnni", "amx_tile", "amx_bf16", "f16c", "fma")
    wanted_arm = ("asimd", "sve", "sve2", "bf16", "i8mm", "asimddp")
    flags: set[str] = set()
    model = ""
    try:  # a line at a time, to the first block's flags and model name: never the whole file in memory
        for line in limits.lines(procfs / "cpuinfo", "cpuinfo", cpuinfo=True):
            key, _, value = line.partition(":")
            key = key.strip()
            if key in ("flags", "Features") and not flags:
                flags = set(value.split())
            elif key == "model name" and not model:
                model = value.strip()
            if flags and (model or key == "Features"):
                break
    except (OSError, SourceFormatError):
        return {}
    present = sorted(f for f in (*wanted, *wanted_arm) if f in flags)
    return {"model": model, "features": present, "cpus": os.cpu_count()}
