"""The one runtime locator: by pid, pidfile or command-line pattern (first configured wins), else (for a
caller that knows the engine's port, :meth:`RuntimeLocator.find_serving`) the process listening on it.

The agent builds one (:mod:`inferwatch.agent.node.wiring`) and shares it: the ``process``, ``gpu`` and ``simd``
collectors, the binary check, the snapshot enrichment, the doctor and the CLI commands. The process found
is cached and re-checked every call (``psutil.Process.is_running`` compares the start time, so a
reused pid is not mistaken for the runtime); when it is gone the locator discovers again, and a
different (pid, start time) counts as a restart. Of several processes matching the pattern the oldest
wins (the parent: runtimes fork workers whose command lines match too). The port lookup reads
``<procfs>/net/tcp{,6}`` and every ``<procfs>/PID/fd``, so its answer is kept the same way. psutil
reads ``psutil.PROCFS_PATH``, which is set to ``--path.procfs`` (one procfs root per agent process).

psutil is imported by the first lookup that can find a process (a runtime configured, or a port to look at): an
agent with neither, the default, never loads it (~1.5 MB: docs/benchmarks.md, "Where the megabytes go").
"""

from __future__ import annotations

import os
import re
import threading
from pathlib import Path
from typing import TYPE_CHECKING
from urllib.parse import urlsplit

from inferwatch.agent.config import RuntimeSettings
from inferwatch.agent.errors import NoDataError
from inferwatch.agent.node.host.privilege import unless_root

if TYPE_CHECKING:
    import psutil

HINT_CONFIGURE = (
    "set runtime.pid, runtime.pidfile or runtime.cmdline_pattern "
    "(e.g. INFERWATCH_RUNTIME__CMDLINE_PATTERN='vllm serve')"
)
MAX_PIDFILE_BYTES = 64
MAX_SCAN_PIDS = 100_000


def url_port(url: str | None) -> int | None:
    """The TCP port of ``url`` (``engine.metrics_url``) when it is set: where to look for the runtime (its listener)
    when ``runtime.*`` is not set (the simd collector, the binary check, the doctor)."""
    if not url:
        return None
    try:
        parts = urlsplit(str(url))
        return parts.port or (443 if parts.scheme == "https" else 80)
    except ValueError:
        return None


class RuntimeLocator:
    """Thread-safe; ``find`` raises NoDataError (with a hint) when the runtime is not running."""

    def __init__(self, settings: RuntimeSettings, procfs: Path = Path("/proc")) -> None:
        self.settings = settings
        self.procfs = procfs
        self._pattern = re.compile(settings.cmdline_pattern) if settings.cmdline_pattern else None
        self._lock = threading.Lock()
        self._proc: psutil.Process | None = None
        self._last_identity: tuple[int, float] | None = None
        self._by_port: dict[int, psutil.Process] = {}
        self.restarts = 0

    @property
    def configured(self) -> bool:
        return bool(self.settings.pid or self.settings.pidfile or self._pattern)

    @property
    def name(self) -> str:
        return self.settings.name

    def _use_procfs(self) -> None:
        """Point psutil at ``--path.procfs`` on first use (not at construction: building the agent's
        dependencies, e.g. for a test on a recorded tree, must not change psutil for everyone). A locator on
        /proc points it back: psutil's root is one global, and whoever uses it last must find its own tree."""
        import psutil

        if str(self.procfs) != psutil.PROCFS_PATH:
            psutil.PROCFS_PATH = str(self.procfs)

    def find(self) -> psutil.Process:
        if not self.configured:  # before psutil: nothing to look for
            raise NoDataError("no runtime process configured", hint=HINT_CONFIGURE)
        self._use_procfs()
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

    def find_serving(self, port: int | None) -> psutil.Process:
        """The runtime as :meth:`find` has it; when ``runtime.*`` is not set, the process listening on ``port``."""
        if self.configured or port is None:
            return self.find()
        self._use_procfs()
        with self._lock:
            proc = self._by_port.get(port)
            if proc is not None and self._still_valid(proc):
                return proc
            pid = pid_listening_on(self.procfs, port)
            if pid is None:
                hint = unless_root(
                    "set runtime.pid or run as root (another user's sockets are not attributed to their process)",
                    "set runtime.pid: nothing in this pid and network namespace listens there (the agent runs as "
                    "root already; share the runtime's namespaces, e.g. docker pid: service:<runtime>)",
                )
                raise NoDataError(f"no process found listening on port {port}", hint=hint)
            proc = self._by_port[port] = self._process(pid, f"the listener on port {port}")
            return proc

    def pids(self) -> set[int]:
        """The runtime's pid and its descendants' (workers hold the GPU memory); empty when not running."""
        if not self.configured:
            return set()
        import psutil

        try:
            proc = self.find()
            return {proc.pid} | {c.pid for c in proc.children(recursive=True)}
        except (NoDataError, psutil.Error):
            return set()

    def _still_valid(self, proc: psutil.Process) -> bool:
        import psutil

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
        import psutil

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
        import psutil

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


# /proc/net/tcp is read line by line, never whole: a busy host's is tens of MB (~150 bytes a socket). A line
# is cut at MAX_NET_TCP_LINE_BYTES and the scan stops after MAX_NET_TCP_SCAN_BYTES, so a file that never ends
# (a link to /dev/zero in a recorded tree) costs bounded time and one line of memory.
MAX_NET_TCP_LINE_BYTES = 512
MAX_NET_TCP_SCAN_BYTES = 64 << 20  # ~450k sockets; an endless file stops here (5 s on a loaded CI box)


def _listening_inodes(procfs: Path, port: int) -> set[str]:
    inodes = set()
    for name in ("tcp", "tcp6"):
        try:
            with (procfs / "net" / name).open("rb") as fh:
                fh.readline(MAX_NET_TCP_LINE_BYTES)  # the header
                scanned = 0
                while scanned < MAX_NET_TCP_SCAN_BYTES and (raw := fh.readline(MAX_NET_TCP_LINE_BYTES)):
                    scanned += len(raw)
                    parts = raw.split()
                    if len(parts) > 9 and parts[3] == b"0A" and _port(parts[1]) == port:
                        inodes.add(parts[9].decode("ascii", errors="replace"))
        except OSError:
            continue
    return inodes


def _port(address: bytes) -> int | None:
    """The port of a /proc/net/tcp ``local_address`` (``0100007F:1F90``), None when it is not hex."""
    try:
        return int(address.rsplit(b":", 1)[1], 16)
    except (IndexError, ValueError):
        return None


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
