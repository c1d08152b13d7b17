"""py-spy, run on explicit request only: a fixed executable, validated arguments, a timeout, no shell.

py-spy exits 1 for every error; :func:`classify` reads its stderr (facts in
shared/reference/hardware.md §5) and turns it into a :class:`PySpyError` whose message says the fix.
"""

from __future__ import annotations

import json
import shutil
import subprocess
import sys
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from agent.errors import ToolError

FORMATS = {"speedscope": ".speedscope.json", "flamegraph": ".svg", "raw": ".txt"}
MAX_RATE_HZ = 1000
DUMP_TIMEOUT_S = 15.0
PERMISSION_FIX = (
    "py-spy needs ptrace on the runtime: run the agent as root or with CAP_SYS_PTRACE "
    "(docker: cap_add: [SYS_PTRACE]; kubernetes: securityContext.capabilities.add: [SYS_PTRACE]) and in the "
    "runtime's pid namespace (docker: pid: host or pid: service:<runtime>; kubernetes: shareProcessNamespace: true)"
)


class PySpyError(ToolError):
    def __init__(self, kind: str, message: str) -> None:
        super().__init__(message)
        self.kind = kind  # permission | no_process | not_python | timeout | missing | failed


def resolve_executable(configured: Path | None) -> Path:
    """py-spy next to the agent's interpreter, else on PATH; resolved once, then used as a fixed path."""
    if configured is not None:
        candidate: Path | None = configured
    else:
        sibling = Path(sys.executable).parent / "py-spy"
        found = shutil.which("py-spy")
        candidate = sibling if sibling.is_file() else (Path(found) if found else None)
    if candidate is None or not candidate.is_file():
        raise PySpyError(
            "missing", "py-spy is not installed (pip install 'py-spy>=0.4.2') or profiling.py_spy is wrong"
        )
    return candidate.resolve()


def classify(stderr: str, pid: int) -> PySpyError:
    text = stderr.lower()
    if "permission denied" in text or "operation not permitted" in text:
        return PySpyError("permission", f"permission denied attaching to pid {pid}: {PERMISSION_FIX}")
    if "failed to find python version" in text or "not a python" in text or "unsupported version" in text:
        first = next((ln for ln in stderr.splitlines() if "python" in ln.lower()), "").strip()
        return PySpyError(
            "not_python", f"pid {pid} is not a Python process py-spy can read (py-spy profiles Python only): {first}"
        )
    if "failed to get process executable name" in text or "no such process" in text:
        if "permission denied" in text:
            return PySpyError("permission", f"permission denied reading pid {pid}: {PERMISSION_FIX}")
        return PySpyError(
            "no_process",
            f"pid {pid} is not running or not visible in the agent's pid namespace (to profile a runtime in another "
            "container share its pid namespace: docker pid: host or pid: service:<runtime>; kubernetes "
            "shareProcessNamespace: true)",
        )
    head = "\n".join(stderr.strip().splitlines()[:3])
    return PySpyError("failed", f"py-spy failed on pid {pid}: {head}")


def _check_pid(pid: int) -> None:
    if not isinstance(pid, int) or isinstance(pid, bool) or pid <= 0:
        raise PySpyError("failed", f"invalid pid {pid!r}")


@dataclass(frozen=True, slots=True)
class RecordOptions:
    duration_s: float = 5.0
    rate_hz: int = 100
    fmt: str = "speedscope"
    native: bool = False
    nonblocking: bool = False

    def validate(self, cap_s: float) -> None:
        if not 0 < self.duration_s <= cap_s:
            raise ValueError(f"duration must be in (0, {cap_s:g}] seconds, got {self.duration_s:g}")
        if not 1 <= self.rate_hz <= MAX_RATE_HZ:
            raise ValueError(f"rate must be 1..{MAX_RATE_HZ} Hz, got {self.rate_hz}")
        if self.fmt not in FORMATS:
            raise ValueError(f"format must be one of {', '.join(FORMATS)}, got {self.fmt!r}")


def _run(argv: list[str], timeout_s: float, pid: int) -> subprocess.CompletedProcess[str]:
    try:
        proc = subprocess.run(argv, capture_output=True, text=True, timeout=timeout_s, check=False, shell=False)
    except subprocess.TimeoutExpired:
        raise PySpyError("timeout", f"py-spy did not finish within {timeout_s:g}s on pid {pid}") from None
    except OSError as exc:
        raise PySpyError("missing", f"cannot run py-spy: {exc}") from exc
    if proc.returncode != 0:
        raise classify(proc.stderr, pid)
    return proc


def dump(exe: Path, pid: int, timeout_s: float = DUMP_TIMEOUT_S, nonblocking: bool = True) -> list[dict[str, Any]]:
    """``py-spy dump --json`` of ``pid``: one entry per thread (no locals)."""
    _check_pid(pid)
    argv = [str(exe), "dump", "--pid", str(pid), "--json"] + (["--nonblocking"] if nonblocking else [])
    proc = _run(argv, timeout_s, pid)
    try:
        data = json.loads(proc.stdout)
    except ValueError as exc:
        raise PySpyError("failed", f"py-spy dump printed non-JSON output: {exc}") from exc
    return data if isinstance(data, list) else []


def record(exe: Path, pid: int, opts: RecordOptions, output: Path, cap_s: float) -> Path:
    """``py-spy record`` to ``output``; bounded by the duration cap plus a grace period."""
    _check_pid(pid)
    opts.validate(cap_s)
    argv = [
        str(exe), "record", "--pid", str(pid), "--output", str(output), "--format", opts.fmt,
        "--duration", str(max(1, round(opts.duration_s))), "--rate", str(opts.rate_hz),
    ]  # fmt: skip
    if opts.native:
        argv.append("--native")
    if opts.nonblocking:
        argv.append("--nonblocking")
    _run(argv, opts.duration_s + 30.0, pid)
    if not output.is_file():
        raise PySpyError("failed", f"py-spy finished but wrote no file for pid {pid} (did the process exit at once?)")
    return output
