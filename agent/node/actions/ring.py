"""A bounded on-disk ring of files (snapshots, profiles): oldest evicted beyond a count or byte budget.

Files are written as ``<sequence>-<id><suffix>``: the data goes to a hidden temp file
(``.<name>.tmp``), is fsync'd, renamed over the final name and the directory fsync'd, so an entry is
either whole on disk or absent. Every failure (full disk, quota, file-size limit, unwritable directory)
removes the temp file and raises :class:`~inferwatch.agent.errors.StorageError` with a reason
(:func:`write_reason`); temp files a crash left behind are swept when the ring opens and by
:func:`sweep_temp_files` at agent start. The sequence keeps order across restarts. Ids are validated
(hex) before they touch a path.
"""

from __future__ import annotations

import contextlib
import os
import re
import secrets
import threading
from dataclasses import dataclass
from pathlib import Path

from inferwatch.agent.errors import StorageError

_ID = re.compile(r"^[0-9a-f]{12,32}$")
_NAME = re.compile(r"^(\d{12})-([0-9a-f]{12,32})(\.[a-z.]+)$")
_TEMP = re.compile(r"^\.\d{12}-[0-9a-f]{12,32}\.[a-z.]+\.tmp$")  # written by put(), never by anyone else
# Reasons of a failed write (the ``reason`` of inferwatch.snapshot.write_errors), by errno in StorageError.of:
# the storage is full (ENOSPC), over a quota (EDQUOT) or over the process's file-size limit (EFBIG,
# RLIMIT_FSIZE) — "insufficient storage", HTTP 507 — or the directory cannot be written (HTTP 500).
WRITE_REASONS = ("no_space", "unwritable", "too_large", "io_error")


def new_id() -> str:
    return secrets.token_hex(8)


def valid_id(value: str) -> bool:
    return bool(_ID.match(value))


def _storage_error(directory: Path, exc: OSError) -> StorageError:
    return StorageError.of(exc, f"cannot write to {directory}")


def sweep_temp_files(directory: Path) -> int:
    """Remove the temp files an interrupted :meth:`FileRing.put` left in ``directory``; how many went."""
    removed = 0
    with contextlib.suppress(OSError):
        for p in directory.iterdir():
            if _TEMP.match(p.name):
                with contextlib.suppress(OSError):
                    p.unlink()
                    removed += 1
    return removed


@dataclass(frozen=True, slots=True)
class RingEntry:
    id: str
    path: Path
    size_bytes: int
    sequence: int


class FileRing:
    def __init__(self, directory: Path, max_count: int, max_bytes: int) -> None:
        self.directory = directory
        self.max_count = max_count
        self.max_bytes = max_bytes
        self._lock = threading.Lock()
        try:
            directory.mkdir(parents=True, exist_ok=True)
            os.chmod(directory, 0o700)
        except OSError as exc:
            raise _storage_error(directory, exc) from exc
        sweep_temp_files(directory)

    def entries(self) -> list[RingEntry]:
        """Entries oldest first."""
        out = []
        for p in self.directory.iterdir():
            m = _NAME.match(p.name)
            if m and p.is_file():
                out.append(RingEntry(m.group(2), p, p.stat().st_size, int(m.group(1))))
        return sorted(out, key=lambda e: e.sequence)

    def get(self, entry_id: str) -> RingEntry | None:
        if not valid_id(entry_id):
            return None
        return next((e for e in self.entries() if e.id == entry_id), None)

    def put(self, data: bytes, suffix: str, entry_id: str | None = None) -> RingEntry:
        """Store ``data`` durably; StorageError (reason ``too_large`` past the byte budget, or by errno).

        ValueError for an invalid id (a caller's bug, not storage). On any failure nothing is left behind.
        """
        if len(data) > self.max_bytes:
            raise StorageError("too_large", f"{len(data)} bytes exceed the ring's budget of {self.max_bytes} bytes")
        entry_id = entry_id or new_id()
        if not valid_id(entry_id):
            raise ValueError(f"invalid id {entry_id!r}")
        with self._lock:
            try:
                existing = self.entries()
            except OSError as exc:
                raise _storage_error(self.directory, exc) from exc
            seq = (existing[-1].sequence + 1) if existing else 1
            path = self.directory / f"{seq:012d}-{entry_id}{suffix}"
            tmp = path.with_name(f".{path.name}.tmp")
            try:
                _write_durably(tmp, path, data)
            except OSError as exc:
                with contextlib.suppress(OSError):
                    tmp.unlink()
                raise _storage_error(self.directory, exc) from exc
            self._evict()
        return RingEntry(entry_id, path, len(data), seq)

    def adopt(self, source: Path, suffix: str, entry_id: str) -> RingEntry:
        """Move a finished file (e.g. a py-spy output) into the ring."""
        return self.put(source.read_bytes(), suffix, entry_id)

    def _evict(self) -> None:  # unlinking frees space: never fails for lack of it
        entries = self.entries()
        total = sum(e.size_bytes for e in entries)
        while entries and (len(entries) > self.max_count or total > self.max_bytes):
            victim = entries.pop(0)
            total -= victim.size_bytes
            victim.path.unlink(missing_ok=True)


def _write_durably(tmp: Path, path: Path, data: bytes) -> None:
    """``data`` to ``tmp``, fsync'd, renamed to ``path``, the directory fsync'd (raises OSError)."""
    fd = os.open(tmp, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o600)
    with os.fdopen(fd, "wb") as f:
        f.write(data)
        f.flush()
        os.fsync(f.fileno())
    os.replace(tmp, path)
    try:
        dir_fd = os.open(path.parent, os.O_RDONLY | os.O_DIRECTORY)
        try:
            os.fsync(dir_fd)
        finally:
            os.close(dir_fd)
    except OSError:
        path.unlink(missing_ok=True)  # not known durable: no entry rather than one the caller was told failed
        raise
