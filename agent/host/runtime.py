"""Finding the inference runtime process: by pid, pidfile or command-line pattern (first configured wins).

Shared by the ``process`` and ``gpu`` collectors through ``ctx.services["runtime"]``. The process found
is cached and re-checked every call (``psutil.Process.is_running`` compares the start time, so a
reused pid is not mistaken for the runtime); when it is gone the locator discovers again, and a
different (pid, start time) counts as a restart. psutil reads ``psutil.PROCFS_PATH``, which is set to
``--path.procfs`` (one procfs root per agent process).
"""

from __future__ import annotations

import os
import re
import threading
from pathlib import Path

import psutil

from agent.config import RuntimeSettings
from agent.errors import NoDataError

HINT_CONFIGURE = (
    "set runtime.pid, runtime.pidfile or runtime.cmdline_pattern "
    "(e.g. INFERWATCH_RUNTIME__CMDLINE_PATTERN='vllm serve')"
)
MAX_PIDFILE_BYTES = 64


class RuntimeLocator:
    """Thread-safe; ``find`` raises NoDataError (with a hint) when the runtime is not running."""

    def __init__(self, settings: RuntimeSettings, procfs: Path = Path("/proc")) -> None:
        self.settings = settings
        self.procfs = procfs
        if str(procfs) != psutil.PROCFS_PATH and procfs != Path("/proc"):
            psutil.PROCFS_PATH = str(procfs)
        self._pattern = re.compile(settings.cmdline_pattern) if settings.cmdline_pattern else None
        self._lock = threading.Lock()
        self._proc: psutil.Process | None = None
        self._last_identity: tuple[int, float] | None = None
        self.restarts = 0

    @property
    def configured(self) -> bool:
        return bool(self.settings.pid or self.settings.pidfile or self._pattern)

    @property
    def name(self) -> str:
        return self.settings.name

    def find(self) -> psutil.Process:
        with self._lock:
            proc = self._proc
            if proc is not None and self._still_valid(proc):
                return proc
            proc = self._discover()
            identity = (proc.pid, proc.create_time())
            if self._last_identity is not None and identity != self._last_identity:
                self.restarts += 1
            self._last_identity = identity
            self._proc = proc
            return proc

    def pids(self) -> set[int]:
        """The runtime's pid and its descendants' (workers hold the GPU memory); empty when not running."""
        try:
            proc = self.find()
            return {proc.pid} | {c.pid for c in proc.children(recursive=True)}
        except (NoDataError, psutil.Error):
            return set()

    def _still_valid(self, proc: psutil.Process) -> bool:
        try:
            if not proc.is_running() or proc.status() == psutil.STATUS_ZOMBIE:
                return False
        except psutil.Error:
            return False
        if self.settings.pid is None and self.settings.pidfile is not None:
            return self._read_pidfile() == proc.pid
        return True

    def _read_pidfile(self) -> int:
        path = self.settings.pidfile
        assert path is not None
        try:
            with open(path, "rb") as fh:
                text = fh.read(MAX_PIDFILE_BYTES).decode("ascii", errors="replace").strip()
        except OSError as exc:
            raise NoDataError(
                f"runtime pidfile {path} cannot be read ({exc.strerror})",
                hint="start the runtime, or fix runtime.pidfile",
            ) from None
        if not text.isdigit() or int(text) <= 0:
            raise NoDataError(f"runtime pidfile {path} holds {text[:20]!r}, not a pid", hint="fix runtime.pidfile")
        return int(text)

    def _process(self, pid: int, source: str) -> psutil.Process:
        try:
            proc = psutil.Process(pid)
            if proc.status() == psutil.STATUS_ZOMBIE:
                raise psutil.NoSuchProcess(pid)
            return proc
        except psutil.NoSuchProcess:
            raise NoDataError(
                f"runtime {self.name} is not running (no process {pid} from {source})",
                hint="start the runtime, or fix " + source,
            ) from None

    def _discover(self) -> psutil.Process:
        s = self.settings
        if s.pid is not None:
            return self._process(s.pid, "runtime.pid")
        if s.pidfile is not None:
            return self._process(self._read_pidfile(), f"runtime.pidfile {s.pidfile}")
        if self._pattern is None:
            raise NoDataError("no runtime process configured", hint=HINT_CONFIGURE)
        me = os.getpid()
        matches: list[tuple[float, int, psutil.Process]] = []
        try:
            procs = list(psutil.process_iter(["cmdline", "create_time"]))
        except IndexError:  # psutil on a procfs root without any pid directory
            procs = []
        for proc in procs:
            if proc.pid == me:
                continue
            cmdline = proc.info.get("cmdline") or []
            if cmdline and self._pattern.search(" ".join(cmdline)):
                matches.append((proc.info.get("create_time") or 0.0, proc.pid, proc))
        if not matches:
            raise NoDataError(
                f"runtime {self.name} is not running (no process matches {self._pattern.pattern!r})",
                hint="start the runtime, or fix runtime.cmdline_pattern",
            )
        # The oldest match is the parent: runtimes fork workers whose command lines match too.
        return min(matches, key=lambda m: (m[0], m[1]))[2]


def runtime_locator(services: dict[str, object], settings: RuntimeSettings, procfs: Path) -> RuntimeLocator:
    """The one locator shared by every collector of this agent (created on first use)."""
    loc = services.get("runtime")
    if isinstance(loc, RuntimeLocator):
        return loc
    created = RuntimeLocator(settings, procfs)
    got = services.setdefault("runtime", created)
    return got if isinstance(got, RuntimeLocator) else created
