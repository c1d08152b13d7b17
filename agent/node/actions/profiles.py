"""py-spy recordings on demand (CLI and ``POST /api/v1/profiles``): asynchronous, one per target.

A request is validated (pid, duration ≤ ``profiling.max_duration_s``, rate, format), refused unless the
pid is the runtime's or one of its descendants' (:class:`~inferwatch.agent.node.actions.pyspy.PidScope`; the runtime
of the engine target the request names, else the configured one), refused while
a recording of the same pid runs, recorded on a worker thread, then moved into a bounded ring (count and
bytes). Never started from the collection path.
"""

from __future__ import annotations

import tempfile
import threading
import time
from dataclasses import dataclass, field, replace
from pathlib import Path
from typing import Any

from inferwatch.agent.config import ProfilingSettings
from inferwatch.agent.errors import StorageError
from inferwatch.agent.node.actions import pyspy
from inferwatch.agent.node.actions.ring import FileRing, new_id, valid_id
from inferwatch.agent.node.actions.runtimes import DEFAULT, Runtimes

MAX_JOBS_KEPT = 100


class ProfileBusyError(Exception):
    pass


@dataclass(frozen=True, slots=True)
class ProfileJob:
    id: str
    pid: int
    options: pyspy.RecordOptions
    state: str = "running"  # running | done | failed
    created_at: float = field(default_factory=time.time)
    finished_at: float | None = None
    error: str | None = None
    error_kind: str | None = None
    size_bytes: int | None = None
    target: str = DEFAULT  # the engine target whose runtime it is ("": the configured runtime)

    def as_dict(self) -> dict[str, Any]:
        return {
            "id": self.id,
            "pid": self.pid,
            "target": self.target,
            "state": self.state,
            "format": self.options.fmt,
            "duration_s": self.options.duration_s,
            "rate_hz": self.options.rate_hz,
            "native": self.options.native,
            "nonblocking": self.options.nonblocking,
            "created_at": self.created_at,
            "finished_at": self.finished_at,
            "error": self.error,
            "error_kind": self.error_kind,
            "size_bytes": self.size_bytes,
        }


class ProfileManager:
    """py-spy profiles on request (``cfg``: on or off, py-spy, duration cap, ring); ``snapshots_dir``: the snapshot
    directory, beside which profiles are kept (``../profiles``) when ``profiling.dir`` is unset; ``runtimes``: the
    engine targets' runtimes a request may name (None: only the configured one, ``scope``'s)."""

    def __init__(
        self, cfg: ProfilingSettings, scope: pyspy.PidScope, snapshots_dir: Path, runtimes: Runtimes | None = None
    ) -> None:
        self.cfg = cfg
        self.snapshots_dir = snapshots_dir
        self.scope = scope
        self.runtimes = runtimes
        self._lock = threading.Lock()
        self._jobs: dict[str, ProfileJob] = {}
        self._busy: set[int] = set()
        self._ring: FileRing | None = None

    def directory(self) -> Path:
        if self.cfg.dir is not None:
            return self.cfg.dir.expanduser()
        return self.snapshots_dir.expanduser().parent / "profiles"

    def ring(self) -> FileRing:
        if self._ring is None:
            self._ring = FileRing(self.directory(), self.cfg.ring_count, self.cfg.ring_bytes)
        return self._ring

    def scope_of(self, target: str = DEFAULT) -> pyspy.PidScope:
        """The processes a request for engine ``target`` may profile: that target's runtime and its descendants
        (UnknownTargetError for a target whose process is not known)."""
        if not target:
            return self.scope
        if self.runtimes is None:
            raise ValueError("this agent watches no discovered engine targets: leave target out")
        return pyspy.PidScope(self.runtimes.get(target).locator, self.scope.agent_pid)

    def start(self, pid: object, options: pyspy.RecordOptions, target: str = DEFAULT) -> ProfileJob:
        """Validate and start a recording of a process of engine ``target``'s runtime (DEFAULT: the configured
        one); raise ValueError (bad request), ProfileBusyError, PySpyError (``invalid_pid``, ``not_runtime``,
        ``no_runtime`` before anything runs), UnknownTargetError."""
        options.validate(self.cfg.max_duration_s)
        pid = self.scope_of(target).check(pid)
        exe = pyspy.resolve_executable(self.cfg.py_spy)
        with self._lock:
            if pid in self._busy:
                raise ProfileBusyError(f"a profile of pid {pid} is already running; one at a time per target")
            self._busy.add(pid)
            job = ProfileJob(new_id(), pid, options, target=target)
            self._jobs[job.id] = job
            while len(self._jobs) > MAX_JOBS_KEPT:
                self._jobs.pop(next(iter(self._jobs)))
        threading.Thread(target=self._record, args=(job, exe), name=f"py-spy-{pid}", daemon=True).start()
        return job

    def _record(self, job: ProfileJob, exe: Path) -> None:
        suffix = pyspy.FORMATS[job.options.fmt]
        try:
            with tempfile.TemporaryDirectory(prefix="inferwatch-profile-") as tmp:
                out = Path(tmp) / f"profile{suffix}"
                pyspy.record(exe, job.pid, job.options, out, self.cfg.max_duration_s)
                entry = self.ring().adopt(out, suffix, job.id)
            done = replace(job, state="done", finished_at=time.time(), size_bytes=entry.size_bytes)
        except pyspy.PySpyError as exc:
            done = replace(job, state="failed", finished_at=time.time(), error=str(exc), error_kind=exc.kind)
        except StorageError as exc:
            done = replace(job, state="failed", finished_at=time.time(), error=str(exc), error_kind=exc.reason)
        except (OSError, ValueError) as exc:
            done = replace(job, state="failed", finished_at=time.time(), error=str(exc), error_kind="failed")
        with self._lock:
            self._jobs[job.id] = done
            self._busy.discard(job.pid)

    def get(self, job_id: str) -> ProfileJob | None:
        if not valid_id(job_id):
            return None
        with self._lock:
            return self._jobs.get(job_id)

    def result_path(self, job_id: str) -> Path | None:
        try:
            entry = self.ring().get(job_id)
        except (StorageError, OSError):  # the directory went away or became unreadable: the result is gone
            return None
        return entry.path if entry else None

    def jobs(self) -> list[ProfileJob]:
        with self._lock:
            return list(self._jobs.values())
