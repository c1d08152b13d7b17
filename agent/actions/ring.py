"""A bounded on-disk ring of files (snapshots, profiles): oldest evicted beyond a count or byte budget.

Files are written atomically (temp file + rename) as ``<sequence>-<id><suffix>``; the sequence keeps
order across restarts. Ids are validated (hex) before they touch a path.
"""

from __future__ import annotations

import os
import re
import secrets
import threading
from dataclasses import dataclass
from pathlib import Path

_ID = re.compile(r"^[0-9a-f]{12,32}$")
_NAME = re.compile(r"^(\d{12})-([0-9a-f]{12,32})(\.[a-z.]+)$")


def new_id() -> str:
    return secrets.token_hex(8)


def valid_id(value: str) -> bool:
    return bool(_ID.match(value))


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
        directory.mkdir(parents=True, exist_ok=True)
        os.chmod(directory, 0o700)

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
        """Store ``data``; raise ValueError when one entry alone exceeds the byte budget."""
        if len(data) > self.max_bytes:
            raise ValueError(f"{len(data)} bytes exceed the ring's budget of {self.max_bytes} bytes")
        entry_id = entry_id or new_id()
        if not valid_id(entry_id):
            raise ValueError(f"invalid id {entry_id!r}")
        with self._lock:
            existing = self.entries()
            seq = (existing[-1].sequence + 1) if existing else 1
            path = self.directory / f"{seq:012d}-{entry_id}{suffix}"
            tmp = path.with_name(f".{path.name}.tmp")
            fd = os.open(tmp, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o600)
            with os.fdopen(fd, "wb") as f:
                f.write(data)
            os.replace(tmp, path)
            self._evict()
        return RingEntry(entry_id, path, len(data), seq)

    def adopt(self, source: Path, suffix: str, entry_id: str) -> RingEntry:
        """Move a finished file (e.g. a py-spy output) into the ring."""
        return self.put(source.read_bytes(), suffix, entry_id)

    def _evict(self) -> None:
        entries = self.entries()
        total = sum(e.size_bytes for e in entries)
        while entries and (len(entries) > self.max_count or total > self.max_bytes):
            victim = entries.pop(0)
            total -= victim.size_bytes
            victim.path.unlink(missing_ok=True)
