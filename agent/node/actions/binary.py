"""Binary compatibility of the runtime: missing shared libraries and glibc required vs. available.

Run at start and on demand only (never per cycle). The executable is ``binary.path`` or the runtime's
``/proc/PID/exe``; libraries a running process mapped and that are gone show as ``(deleted)`` in
``/proc/PID/maps``. ``ldd`` is run from a fixed path, with one validated argument (an absolute path
to a regular ELF file), a timeout, no shell, and only when the binary's ELF interpreter is the
system's (``ldd`` asks the interpreter to resolve libraries; a foreign interpreter is not run).
The glibc a binary requires is the highest ``GLIBC_x.y`` version it references.

:class:`BinaryCheck` is the action: started by the agent at start, again every ``binary.interval_s``
(default 5 min, so a restored library clears RuntimeHardwareMismatch without an agent restart; every agent
``interval_s`` while the runtime is not found, a procfs lookup with no program run), and by
``POST /api/v1/binary``; it posts
its result into the state as the ``binary`` record (``inferwatch.runtime.binary.*`` and the
``runtime.hardware_mismatch`` finding), which the sinks translate. Each discovered engine target whose process the
agent finds has a check of its own (agent/node/targets.py) on that process's executable, posted as
``binary:<target>`` with the target's identity on its series and findings; ``POST /api/v1/binary?target=<name>``
runs it.
"""

from __future__ import annotations

import os
import re
import struct
import subprocess
import threading
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from inferwatch.agent.common.samples import Attributes, Collection, Finding, Sample, attrs
from inferwatch.agent.config import BinarySettings, RuntimeSettings
from inferwatch.agent.errors import NoDataError, ToolError
from inferwatch.agent.node.host.runtime import RuntimeLocator
from inferwatch.agent.node.schedule import next_due
from inferwatch.agent.node.state import AgentState

LDD_CANDIDATES = (Path("/usr/bin/ldd"), Path("/bin/ldd"))
TRUSTED_INTERPRETERS = re.compile(
    r"^/(usr/)?lib(64|32|x32)?/([a-z0-9_-]+-linux-gnu[a-z0-9_]*/)?ld-linux[-a-z0-9_.]*\.so\.\d$"
)
_GLIBC = re.compile(rb"GLIBC_(\d+)\.(\d+)(?:\.(\d+))?")
_NOT_FOUND = re.compile(r"^\s*(\S+)\s+=>\s+not found", re.M)
_VERSION_MISSING = re.compile(r"version [`'](GLIBC_[\d.]+)' not found")
MAX_SCAN_BYTES = 512 << 20


@dataclass(frozen=True, slots=True)
class BinaryReport:
    path: str
    pid: int | None
    missing_libraries: list[str] = field(default_factory=list)
    deleted_mapped: list[str] = field(default_factory=list)  # libraries mapped by the process but deleted on disk
    glibc_required: str | None = None
    glibc_available: str | None = None
    missing_versions: list[str] = field(default_factory=list)
    interpreter: str | None = None
    note: str | None = None

    @property
    def compatible(self) -> bool:
        return not (self.missing_libraries or self.missing_versions or self.glibc_too_new)

    @property
    def glibc_too_new(self) -> bool:
        return bool(
            self.glibc_required
            and self.glibc_available
            and _vtuple(self.glibc_required) > _vtuple(self.glibc_available)
        )

    def as_dict(self) -> dict[str, Any]:
        return {
            "path": self.path,
            "pid": self.pid,
            "compatible": self.compatible,
            "missing_libraries": self.missing_libraries,
            "deleted_mapped": self.deleted_mapped,
            "glibc_required": self.glibc_required,
            "glibc_available": self.glibc_available,
            "missing_versions": self.missing_versions,
            "interpreter": self.interpreter,
            "note": self.note,
        }


def _vtuple(v: str) -> tuple[int, ...]:
    return tuple(int(x) for x in re.findall(r"\d+", v))


def glibc_available() -> str | None:
    try:
        value = os.confstr("CS_GNU_LIBC_VERSION")  # "glibc 2.36"
    except (ValueError, OSError, AttributeError):
        return None
    return value.split()[-1] if value and value.startswith("glibc") else None


def elf_interpreter(path: Path) -> str | None:
    """PT_INTERP of an ELF file (None for static binaries); raise ToolError when not ELF."""
    with open(path, "rb") as f:
        ident = f.read(64)
        if ident[:4] != b"\x7fELF":
            raise ToolError(f"{path} is not an ELF executable")
        is64 = ident[4] == 2
        end = "<" if ident[5] == 1 else ">"
        if is64:
            phoff, phentsize, phnum = (
                struct.unpack(end + "Q", ident[32:40])[0],
                *struct.unpack(end + "HH", ident[54:58]),
            )
        else:
            phoff, phentsize, phnum = (
                struct.unpack(end + "I", ident[28:32])[0],
                *struct.unpack(end + "HH", ident[42:46]),
            )
        for i in range(min(phnum, 256)):
            f.seek(phoff + i * phentsize)
            ph = f.read(phentsize)
            if len(ph) < phentsize:
                break
            if struct.unpack(end + "I", ph[:4])[0] != 3:  # PT_INTERP
                continue
            if is64:
                off, size = struct.unpack(end + "Q", ph[8:16])[0], struct.unpack(end + "Q", ph[32:40])[0]
            else:
                off, size = struct.unpack(end + "I", ph[4:8])[0], struct.unpack(end + "I", ph[16:20])[0]
            f.seek(off)
            return f.read(min(size, 4096)).rstrip(b"\0").decode("utf-8", "replace")
    return None


def glibc_required(path: Path) -> str | None:
    """Highest ``GLIBC_x.y`` version string referenced by the binary (its version needs)."""
    best: tuple[int, ...] | None = None
    with open(path, "rb") as f:
        data = f.read(MAX_SCAN_BYTES)
    for m in _GLIBC.finditer(data):
        v = tuple(int(g) for g in m.groups() if g is not None)
        if best is None or v > best:
            best = v
    return ".".join(str(x) for x in best) if best else None


def deleted_mappings(procfs: Path, pid: int) -> list[str]:
    try:
        text = (procfs / str(pid) / "maps").read_text(errors="replace")
    except OSError:
        return []
    out = set()
    for line in text.splitlines():
        if line.endswith("(deleted)") and ".so" in line:
            out.add(line.split(None, 5)[-1].removesuffix(" (deleted)"))
    return sorted(out)


def same_mount_namespace(procfs: Path, pid: int) -> bool:
    """Whether ``pid`` sees the agent's files (its ``ns/mnt`` is the agent's); True where the links cannot be read
    (no namespace to tell apart, as on a host without them)."""
    try:
        return os.readlink(procfs / str(pid) / "ns" / "mnt") == os.readlink(procfs / "self" / "ns" / "mnt")
    except OSError:
        return True


def _ldd() -> Path:
    for candidate in LDD_CANDIDATES:
        if candidate.is_file():
            return candidate
    raise ToolError("ldd is not installed (Debian: apt-get install libc-bin)")


def check_binary(
    path: Path, pid: int | None = None, procfs: Path = Path("/proc"), timeout_s: float = 10.0
) -> BinaryReport:
    """Check ``path`` (absolute, regular file) with ldd and the ELF headers; raise ToolError when unreadable."""
    if not path.is_absolute():
        raise ToolError(f"binary path must be absolute, got {path}")
    try:
        resolved = path.resolve(strict=True)
    except OSError as exc:
        raise ToolError(f"cannot resolve runtime binary {path}: {exc.strerror or exc}") from None
    if not resolved.is_file():
        raise ToolError(f"runtime binary {resolved} is not a regular file")
    interp = elf_interpreter(resolved)
    required = glibc_required(resolved)
    available = glibc_available()
    deleted = deleted_mappings(procfs, pid) if pid else []
    if interp is None:
        return BinaryReport(str(resolved), pid, [], deleted, required, available, [], None, "statically linked")
    if not TRUSTED_INTERPRETERS.match(interp) or not Path(interp).exists():
        return BinaryReport(
            str(resolved), pid, [], deleted, required, available, [], interp,
            f"ELF interpreter {interp} is not this system's dynamic loader; ldd not run",
        )  # fmt: skip
    try:
        proc = subprocess.run(
            [str(_ldd()), "--", str(resolved)],
            capture_output=True,
            text=True,
            timeout=timeout_s,
            check=False,
            shell=False,
            env={"PATH": "/usr/bin:/bin", "LC_ALL": "C"},
        )
    except subprocess.TimeoutExpired:
        raise ToolError(f"ldd did not finish within {timeout_s:g}s on {resolved}") from None
    output = proc.stdout + proc.stderr
    missing = sorted(set(_NOT_FOUND.findall(output)))
    versions = sorted(set(_VERSION_MISSING.findall(output)))
    if proc.returncode != 0 and not missing and not versions:
        raise ToolError(f"ldd failed on {resolved}: {output.strip()[:300]}")
    return BinaryReport(str(resolved), pid, missing, deleted, required, available, versions, interp)


def binary_findings(report: BinaryReport) -> list[Any]:
    from inferwatch.agent.common.samples import Finding

    ev = report.as_dict()
    if report.missing_libraries or report.missing_versions or report.glibc_too_new:
        parts = []
        if report.missing_libraries:
            parts.append("missing shared libraries: " + ", ".join(report.missing_libraries))
        if report.missing_versions:
            parts.append("missing symbol versions: " + ", ".join(report.missing_versions))
        if report.glibc_too_new:
            parts.append(f"needs glibc {report.glibc_required}, host has {report.glibc_available}")
        return [
            Finding(
                "runtime.hardware_mismatch",
                "fail",
                f"runtime binary {report.path} does not match this host: " + "; ".join(parts),
                ev,
                "RuntimeHardwareMismatch",  # runbook named after the alert (runbooks/)
            )
        ]
    summary = f"runtime binary {report.path}: all shared libraries resolve"
    if report.glibc_required:
        summary += f"; glibc required {report.glibc_required}, available {report.glibc_available}"
    if report.deleted_mapped:
        return [
            Finding("runtime.binary", "warn", summary + "; deleted on disk: " + ", ".join(report.deleted_mapped), ev)
        ]
    if report.note:
        summary += f" ({report.note})"
    return [Finding("runtime.binary", "ok", summary, ev)]


NAME = "binary"  # its record in the state


def binary_configured(enabled: bool | None, cfg: BinarySettings, rt: RuntimeSettings) -> bool:
    """Whether the check runs in this agent: ``enabled`` (``collectors.binary.enabled``) when set, else whether a
    binary (``binary.path``) or the runtime (``runtime.*``) is configured."""
    if enabled is not None:
        return enabled
    return bool(cfg.path or rt.pid or rt.pidfile or rt.cmdline_pattern)


class BinaryCheck:
    """Runs the check when asked (:meth:`check`) and keeps the last result; posts it to ``state`` when given.

    The binary is ``cfg.path``, else the runtime's executable: the process ``locator`` finds, or (``runtime.*`` unset)
    the one listening on ``engine_port``, read under the locator's procfs. While the runtime is absent the check
    looks again every ``absent_interval_s`` (the agent's interval), else every ``cfg.interval_s``.
    """

    def __init__(
        self,
        cfg: BinarySettings,
        locator: RuntimeLocator,
        *,
        absent_interval_s: float,
        engine_port: int | None = None,
        state: AgentState | None = None,
        identity: Attributes = (),
        record: str = NAME,
    ) -> None:
        """``identity``: an engine target's attributes, added to every series and finding (empty: the configured
        runtime); ``record``: the name its result is posted under (``binary:<target>`` for a target)."""
        self.cfg = cfg
        self.identity = identity
        self.record = record
        self.absent_interval_s = absent_interval_s
        self.engine_port = engine_port
        self.locator = locator
        self.state = state
        self._lock = threading.Lock()
        self._stop = threading.Event()
        self._thread: threading.Thread | None = None
        self.report: BinaryReport | None = None
        self.error: str | None = None
        self.absent: NoDataError | None = None
        self.checks = 0

    def start(self) -> None:
        """The check at start, on a thread of its own, then on its schedule (:meth:`next_check_in`)."""
        if self._thread is None:
            self._thread = threading.Thread(target=self._scheduled, name=f"{self.record}-check", daemon=True)
            self._thread.start()

    def stop(self, timeout_s: float = 5.0) -> None:
        """Safe to call twice; a check in progress is bounded by ``binary.timeout_s``. Once this returns, no check
        posts to the state: one in progress posts nothing after the stop (so a target's removed record stays
        removed), and this waits for it to end."""
        self._stop.set()
        if self._thread is not None:
            self._thread.join(timeout_s)
        if self._lock.acquire(timeout=max(timeout_s, self.cfg.timeout_s)):  # a check past the join ends, unposted
            self._lock.release()

    def interval_s(self) -> float:
        """Seconds between scheduled checks: the agent's interval while the runtime is absent, else binary's."""
        return self.absent_interval_s if self.absent is not None else self.cfg.interval_s

    def _scheduled(self) -> None:
        while not self._stop.is_set():
            started = time.monotonic()
            self.check()
            # On the shared grid of its interval (agent/node/schedule.py), as the collectors are.
            self._stop.wait(max(0.0, next_due(started, self.interval_s(), time.monotonic()) - time.monotonic()))

    def check(self) -> BinaryReport | None:
        """Run the check now (bounded by binary.timeout_s); keep, post and return the report."""
        with self._lock:
            started = time.monotonic()
            self.checks += 1
            pid = None
            procfs = self.locator.procfs
            try:
                path = self.cfg.path
                if path is None:
                    # runtime.* when set, else the process listening on engine.metrics_url's port (as simd does)
                    pid = self.locator.find_serving(self.engine_port).pid
                    try:
                        exe = os.readlink(procfs / str(pid) / "exe")
                    except OSError:
                        raise NoDataError(
                            f"cannot read {procfs}/{pid}/exe",
                            hint="the agent needs the same pid namespace and permission to read it, or set binary.path",
                        ) from None
                    path = Path(exe.removesuffix(" (deleted)"))
                    if not same_mount_namespace(procfs, pid):
                        raise NoDataError(
                            f"the runtime (pid {pid}) runs in another mount namespace (a container): its {path} and "
                            "its libraries are not the agent's, and ldd would resolve them against the agent's files",
                            hint="run `inferwatch doctor` inside the engine's image, or set binary.path to a copy",
                        )
                self.report = check_binary(path, pid, procfs, self.cfg.timeout_s)
                self.error = None
                self.absent = None
            except NoDataError as exc:
                self.absent, self.report = exc, None
            except ToolError as exc:
                self.error, self.report = str(exc), None
            self._post(time.monotonic() - started)
            return self.report

    def findings(self) -> list[Finding]:
        if self.report is not None:
            found = list(binary_findings(self.report))
        elif self.error is not None:
            found = [Finding("runtime.binary", "fail", f"binary check failed: {self.error}")]
        else:
            return []
        if not self.identity:
            return found
        who = dict(self.identity)
        name = who.get("inferwatch.engine.name", "")
        return [Finding(f.id, f.status, f"{name}: {f.summary}", {**f.evidence, **who}, f.runbook) for f in found]

    def collection(self) -> Collection | None:
        """The last result as the state keeps it (None before the first check or while the runtime is absent)."""
        report = self.report
        if report is None:
            return None if self.error is None else Collection((), self.findings(), {"error": self.error})
        runtime = tuple(sorted((*attrs(runtime=self.locator.name), *self.identity)))
        samples = [
            Sample("inferwatch.runtime.binary.missing_libraries", len(report.missing_libraries), runtime),
            Sample("inferwatch.runtime.binary.compatible", 1 if report.compatible else 0, runtime),
        ]
        return Collection(samples, self.findings(), report.as_dict())

    def _post(self, duration_s: float) -> None:
        if self.state is None or self._stop.is_set():
            return
        if self.absent is not None:
            absent = self.absent
            self.state.post(self.record, Collection(), "absent", duration_s, str(absent.args[0]), absent.hint)
        elif self.error is not None:
            self.state.post(self.record, self.collection(), "exception", duration_s, self.error)
        else:
            self.state.post(self.record, self.collection(), "ok", duration_s)
