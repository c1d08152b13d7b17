"""Runtime_profile snapshots: kept in a bounded on-disk ring and sent to the OTLP log sink.

Two ways in. The ``runtime_profile`` collector's interval reads reach the state as a collection whose
``events`` hold the redacted document; :meth:`SnapshotStore.on_record`, a state listener, stores and
exports it (the collector knows no sink). ``POST /api/v1/snapshots`` calls :meth:`SnapshotStore.capture`,
an explicit request: it reads one snapshot now, with the py-spy dump enrichment when ``profiling.enabled``
(at most once per ``collectors.runtime_profile.interval_s``), and stores and exports it the same way. py-spy never
runs on the collection path.

A snapshot the ring cannot write (full disk, quota, file-size limit, unwritable directory, over the
ring's byte budget) is counted in ``inferwatch.snapshot.write_errors{reason}``, logged once when writes
start failing and once when they work again, and :meth:`SnapshotStore.capture` raises the
:class:`~inferwatch.agent.errors.StorageError`: the API answers 507 or 500, never an id that is not on disk.
"""

from __future__ import annotations

import json
import logging
import threading
import time
from pathlib import Path
from typing import Any, Protocol

from inferwatch.agent.common.samples import AnySample, Collection, Sample, attrs
from inferwatch.agent.config import ProfilingSettings, SnapshotSettings
from inferwatch.agent.errors import StorageError
from inferwatch.agent.node.actions import pyspy
from inferwatch.agent.node.actions.ring import WRITE_REASONS, FileRing, RingEntry, sweep_temp_files, valid_id
from inferwatch.agent.node.debugprofile.reader import CaptureResult, ProfileReader

log = logging.getLogger(__name__)
SOURCE = "runtime_profile"  # the collector whose events are snapshots
MAX_DUMP_FRAMES = 64


class LogSink(Protocol):
    def emit(self, snapshot: dict[str, Any]) -> None: ...


class SnapshotStore:
    """The ring of snapshots and the optional OTLP log sink; thread-safe.

    ``profiling``: whether (``enabled``) and with which py-spy a capture adds a dump of the runtime, at most once per
    ``dump_interval_s`` (the runtime_profile collector's interval).
    """

    def __init__(
        self,
        cfg: SnapshotSettings,
        reader: ProfileReader,
        profiling: ProfilingSettings,
        dump_interval_s: float,
        log_sink: LogSink | None = None,
    ) -> None:
        self.cfg = cfg
        self.profiling = profiling
        self.dump_interval_s = dump_interval_s
        self.reader = reader
        self.log_sink = log_sink
        self.write_errors: dict[str, int] = dict.fromkeys(WRITE_REASONS, 0)
        self._failing: str | None = None  # the reason while writes fail: log once at start, once at the end
        self._lock = threading.Lock()
        self._ring: FileRing | None = None
        self._last_dump_at = -float("inf")

    def sweep(self) -> int:
        """At agent start: remove temp files a crash left in the snapshot directory (if it exists)."""
        return sweep_temp_files(self.directory)

    def samples(self) -> list[AnySample]:
        """``inferwatch.snapshot.write_errors`` by reason (a state source)."""
        with self._lock:
            counts = dict(self.write_errors)
        return [Sample("inferwatch.snapshot.write_errors", n, attrs(reason=r)) for r, n in counts.items()]

    @property
    def directory(self) -> Path:
        return self.cfg.dir.expanduser()

    def ring(self) -> FileRing:
        with self._lock:
            if self._ring is None:
                snap = self.cfg
                self._ring = FileRing(self.directory, snap.max_count, snap.max_bytes)
            return self._ring

    def entries(self) -> list[RingEntry]:
        """The stored snapshots, oldest first; StorageError when the directory cannot be read."""
        try:
            return self.ring().entries()
        except OSError as exc:
            raise StorageError.of(exc, f"cannot read {self.directory}") from exc

    def get(self, snap_id: str) -> RingEntry | None:
        """The snapshot with this id, None for an unknown or invalid id; StorageError as :meth:`entries`."""
        if not valid_id(snap_id):
            return None
        return next((e for e in self.entries() if e.id == snap_id), None)

    def on_record(self, name: str, collection: Collection) -> None:
        """State listener: keep and export the snapshots a runtime_profile collection carries."""
        if name != SOURCE and not name.startswith(SOURCE + ":"):  # the single engine's, or an engine target's
            return
        for document in collection.events:
            self.keep(dict(document))

    def keep(self, document: dict[str, Any]) -> StorageError | None:
        """Store and export one snapshot; the StorageError when it could not be stored (counted, logged)."""
        meta = document.get("meta", {})
        data = json.dumps(document, sort_keys=True, default=str).encode()
        failure: StorageError | None = None
        try:
            self.ring().put(data, ".json", str(meta.get("id")))
        except StorageError as exc:
            failure = exc
        except ValueError as exc:  # an id the ring refuses: never from the reader, but never a listener crash
            failure = StorageError("io_error", str(exc))
        self._note(failure)
        if self.log_sink is not None:
            try:
                self.log_sink.emit(document)
            except Exception:
                log.debug("OTLP log emit failed", exc_info=True)
        return failure

    def _note(self, failure: StorageError | None) -> None:
        with self._lock:
            was = self._failing
            if failure is not None:
                self.write_errors[failure.reason] = self.write_errors.get(failure.reason, 0) + 1
            self._failing = failure.reason if failure is not None else None
        if failure is not None and was != failure.reason:
            log.warning("cannot store runtime_profile snapshots (%s): %s", failure.reason, failure)
        elif failure is None and was is not None:
            log.warning("runtime_profile snapshots are stored again in %s", self.directory)

    def capture(self, trigger: str = "api") -> CaptureResult:
        """Read one snapshot now, keep and export it.

        Raises NoDataError when runtime_profile.url is unset, StorageError when the snapshot was not stored.
        """
        try:
            snapshot = self.reader.read(trigger, self._dump if self.profiling.enabled else None)
        except StorageError as exc:  # the redaction key, kept in the snapshot directory, cannot be written
            self._note(exc)
            raise
        failure = self.keep(snapshot.document)
        if failure is not None:
            raise failure
        return snapshot.result

    def _dump(self, pid: int) -> dict[str, Any]:
        """The py-spy dump enrichment, at most once per runtime_profile interval."""
        now = time.monotonic()
        with self._lock:
            if now - self._last_dump_at < self.dump_interval_s:
                return {}
            self._last_dump_at = now
        try:
            pid = pyspy.PidScope(self.reader.locator).check(pid)  # the runtime's pid: checked all the same
            threads = pyspy.dump(pyspy.resolve_executable(self.profiling.py_spy), pid)
        except pyspy.PySpyError as exc:
            return {"py_spy_dump": {"error": exc.kind, "message": str(exc)}}
        return {"py_spy_dump": [_strip_thread(t) for t in threads]}


def _strip_thread(t: Any) -> dict[str, Any]:
    """Keep a py-spy thread's identity and frame names/locations; never locals."""
    if not isinstance(t, dict):
        return {}
    frames = [{k: f.get(k) for k in ("name", "filename", "line")} for f in t.get("frames", []) if isinstance(f, dict)]
    return {k: t.get(k) for k in ("thread_id", "thread_name", "active", "owns_gil")} | {
        "frames": frames[:MAX_DUMP_FRAMES]
    }
