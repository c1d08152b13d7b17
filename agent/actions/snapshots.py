"""Runtime_profile snapshots: kept in a bounded on-disk ring and sent to the OTLP log sink.

Two ways in. The ``runtime_profile`` collector's interval reads reach the state as a collection whose
``events`` hold the redacted document; :meth:`SnapshotStore.on_record`, a state listener, stores and
exports it (the collector knows no sink). ``POST /api/v1/snapshots`` calls :meth:`SnapshotStore.capture`,
an explicit request: it reads one snapshot now, with the py-spy dump enrichment when ``profiling.enabled``
(at most once per ``runtime_profile.interval_s``), and stores and exports it the same way. py-spy never
runs on the collection path.
"""

from __future__ import annotations

import json
import logging
import threading
import time
from pathlib import Path
from typing import Any, Protocol

from agent.actions import pyspy
from agent.actions.ring import FileRing
from agent.config import Settings
from agent.debugprofile.reader import CaptureResult, ProfileReader
from agent.samples import Collection

log = logging.getLogger(__name__)
SOURCE = "runtime_profile"  # the collector whose events are snapshots
MAX_DUMP_FRAMES = 64


class LogSink(Protocol):
    def emit(self, snapshot: dict[str, Any]) -> None: ...


class SnapshotStore:
    """The ring of snapshots and the optional OTLP log sink; thread-safe."""

    def __init__(self, settings: Settings, reader: ProfileReader, log_sink: LogSink | None = None) -> None:
        self.settings = settings
        self.reader = reader
        self.log_sink = log_sink
        self.store_errors = 0
        self._lock = threading.Lock()
        self._ring: FileRing | None = None
        self._last_dump_at = -float("inf")

    @property
    def directory(self) -> Path:
        return self.settings.snapshots.dir.expanduser()

    def ring(self) -> FileRing:
        with self._lock:
            if self._ring is None:
                snap = self.settings.snapshots
                self._ring = FileRing(self.directory, snap.max_count, snap.max_bytes)
            return self._ring

    def on_record(self, name: str, collection: Collection) -> None:
        """State listener: keep and export the snapshots a runtime_profile collection carries."""
        if name != SOURCE:
            return
        for document in collection.events:
            self.keep(dict(document))

    def keep(self, document: dict[str, Any]) -> None:
        meta = document.get("meta", {})
        data = json.dumps(document, sort_keys=True, default=str).encode()
        try:
            self.ring().put(data, ".json", str(meta.get("id")))
        except (OSError, ValueError) as exc:
            with self._lock:
                self.store_errors += 1
            log.warning("cannot store runtime_profile snapshot in %s: %s", self.directory, exc)
        if self.log_sink is not None:
            try:
                self.log_sink.emit(document)
            except Exception:
                log.debug("OTLP log emit failed", exc_info=True)

    def capture(self, trigger: str = "api") -> CaptureResult:
        """Read one snapshot now (NoDataError when runtime_profile.url is unset), keep and export it."""
        snapshot = self.reader.read(trigger, self._dump if self.settings.profiling.enabled else None)
        self.keep(snapshot.document)
        return snapshot.result

    def _dump(self, pid: int) -> dict[str, Any]:
        """The py-spy dump enrichment, at most once per runtime_profile interval."""
        now = time.monotonic()
        with self._lock:
            if now - self._last_dump_at < self.settings.runtime_profile.interval_s:
                return {}
            self._last_dump_at = now
        try:
            pid = pyspy.PidScope(self.reader.locator).check(pid)  # the runtime's pid: checked all the same
            threads = pyspy.dump(pyspy.resolve_executable(self.settings.profiling.py_spy), pid)
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
