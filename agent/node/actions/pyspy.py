"""py-spy, run on explicit request only: a fixed executable, validated arguments, a timeout, no shell.

py-spy exits 1 for every error; :func:`classify` reads its stderr (the messages it matches are listed in
docs/diagnostics.md, "Profiling with py-spy") and turns it into a :class:`PySpyError` whose message says the fix.

What the agent profiles on a request (the API, the snapshot enrichment) is bounded by :class:`PidScope`:
the configured runtime (found by the one :class:`~inferwatch.agent.node.host.runtime.RuntimeLocator`) and its
descendants run by the runtime's user — never the agent itself, pid 1 or anyone else's process, whatever
ptrace rights the agent holds. A pid is a positive integer (:func:`validate_pid`), never a string, a
float or a boolean.
"""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from inferwatch.agent.errors import NoDataError, ToolError
from inferwatch.agent.node.host.runtime import RuntimeLocator

FORMATS = {"speedscope": ".speedscope.json", "flamegraph": ".svg", "raw": ".txt"}
MAX_RATE_HZ = 1000
DUMP_TIMEOUT_S = 15.0
PERMISSION_FIX = (
    "py-spy needs ptrace on the runtime: run the agent as root or with CAP_SYS_PTRACE "
    "(docker: cap_add: [SYS_PTRACE]; kubernetes: securityContext.capabilities.add: [SYS_PTRACE]) and in the "
    "runtime's pid namespace (docker: pid: host or pid: service:<runtime>; kubernetes: shareProcessNamespace: true)"
)


PID_MAX = 1 << 22  # Linux's PID_MAX_LIMIT: no pid is larger


class PySpyError(ToolError):
    def __init__(self, kind: str, message: str) -> None:
        super().__init__(message)
        # permission | no_process | not_python | native_unsupported | timeout | missing | failed, and before py-spy
        # runs: invalid_pid (not a positive integer) | not_runtime (outside the runtime's processes) | no_runtime
        self.kind = kind


def validate_pid(value: object) -> int:
    """``value`` as a pid: an int in 1..PID_MAX (``True``, ``"1; rm"``, ``12.0`` are refused: invalid_pid)."""
    if not isinstance(value, int) or isinstance(value, bool) or not 0 < value <= PID_MAX:
        raise PySpyError("invalid_pid", f"a pid is a positive integer up to {PID_MAX}, not {value!r:.40}")
    return value


class PidScope:
    """The processes py-spy may attach to on a request: the runtime and its descendants of the same user.

    Checked against the live process tree on every request (psutil, under ``--path.procfs``): a pid that
    left the tree, or another user's process, is refused even if it was the runtime's child earlier.
    """

    def __init__(self, locator: RuntimeLocator, agent_pid: int | None = None) -> None:
        self.locator = locator
        self.agent_pid = agent_pid if agent_pid is not None else os.getpid()

    def check(self, value: object) -> int:
        """The validated pid; PySpyError invalid_pid, not_runtime or no_runtime otherwise."""
        import psutil  # here, on a profiling request: an agent that is never asked does not load it

        pid = validate_pid(value)
        name = self.locator.name
        if pid == self.agent_pid:
            raise PySpyError("not_runtime", f"pid {pid} is the agent itself: py-spy profiles only the runtime {name}")
        try:
            runtime = self.locator.find()
            if pid == runtime.pid:
                return pid
            children = {c.pid: c for c in runtime.children(recursive=True)}
            child = children.get(pid)
            if child is None:
                raise PySpyError(
                    "not_runtime",
                    f"pid {pid} is not the runtime {name} (pid {runtime.pid}) or one of its child processes: "
                    "py-spy profiles only those",
                )
            if child.uids().real != runtime.uids().real:
                raise PySpyError(
                    "not_runtime",
                    f"pid {pid} is a child of the runtime {name} but runs as another user (uid {child.uids().real}, "
                    f"the runtime's {runtime.uids().real}): py-spy profiles only the runtime user's processes",
                )
        except NoDataError as exc:
            raise PySpyError("no_runtime", f"no runtime to profile: {exc}") from None
        except psutil.Error as exc:
            raise PySpyError("not_runtime", f"pid {pid} cannot be checked against the runtime: {exc}") from None
        return pid


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
    if "native" in text and ("not supported" in text or "can't get native" in text):
        # This build or platform cannot unwind native stacks (no libunwind, aarch64, macOS), or --native was asked
        # for together with --nonblocking: the Python-only dump still works.
        first = next((ln for ln in stderr.splitlines() if "native" in ln.lower()), "").strip()
        return PySpyError("native_unsupported", f"py-spy cannot read native stacks of pid {pid}: {first}")
    head = "\n".join(stderr.strip().splitlines()[:3])
    return PySpyError("failed", f"py-spy failed on pid {pid}: {head}")


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


def dump(
    exe: Path, pid: int, timeout_s: float = DUMP_TIMEOUT_S, nonblocking: bool = True, native: bool = False
) -> list[dict[str, Any]]:
    """``py-spy dump --json`` of ``pid``: one entry per thread (no locals).

    ``native``: ``--native``, native frames (C extensions, CUDA/NCCL, libc) interleaved with the Python ones, each
    native frame with its shared object in ``module`` (None on a Python frame). py-spy refuses ``--native`` with
    ``--nonblocking``, so a native dump pauses the process while it reads it (``nonblocking`` is ignored); where the
    build or platform cannot unwind, it fails with kind ``native_unsupported``.
    """
    validate_pid(pid)
    argv = [str(exe), "dump", "--pid", str(pid), "--json"]
    if native:
        argv.append("--native")
    elif nonblocking:
        argv.append("--nonblocking")
    proc = _run(argv, timeout_s, pid)
    try:
        data = json.loads(proc.stdout)
    except ValueError as exc:
        raise PySpyError("failed", f"py-spy dump printed non-JSON output: {exc}") from exc
    return data if isinstance(data, list) else []


def record(exe: Path, pid: int, opts: RecordOptions, output: Path, cap_s: float) -> Path:
    """``py-spy record`` to ``output``; bounded by the duration cap plus a grace period."""
    validate_pid(pid)
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
