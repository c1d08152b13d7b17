"""One bounded read for procfs and sysfs text files, shared by every parser in :mod:`agent.host`.

A procfs file is small (meminfo ~1.5 KiB, vmstat ~5 KiB, PSI ~150 B), cpuinfo the exception (~2 KiB per
logical CPU: ~0.5 MiB on a 256-thread host), but the path is configurable (``--path.procfs``) and a
recorded or hostile tree can hold anything: a 50 MB file, or a link to ``/dev/zero`` that never ends. So
every read asks for at most ``limit + 1`` bytes and raises :class:`~agent.errors.ReadLimitError` (a
SourceFormatError) when more came: memory stays bounded by the limit, and the error names the file and
the setting to raise. The limits are settings (``read_limits.max_file_bytes``,
``read_limits.max_cpuinfo_bytes``, defaults in :mod:`agent.config`); each hit is counted in
``inferwatch.source.limit_hits{source,limit}`` (:class:`LimitHits`, built once by the composition root)
and logged once per file and limit. ``FileNotFoundError`` and other ``OSError`` propagate, so callers keep
mapping absence to :class:`~agent.errors.NoDataError` as before.
"""

from __future__ import annotations

import logging
import os
import threading
from dataclasses import dataclass, field
from pathlib import Path

from agent.config import DEFAULT_MAX_CPUINFO_READ_BYTES, DEFAULT_MAX_PROCFS_READ_BYTES, ReadLimitSettings
from agent.errors import ReadLimitError
from agent.samples import AnySample, Sample, attrs

log = logging.getLogger(__name__)

MAX_PROCFS_READ_BYTES = DEFAULT_MAX_PROCFS_READ_BYTES  # the defaults, by their historic names
MAX_CPUINFO_READ_BYTES = DEFAULT_MAX_CPUINFO_READ_BYTES
FILE_LIMIT = "read_limits.max_file_bytes"  # values of the ``limit`` attribute: the setting that bounds the read
CPUINFO_LIMIT = "read_limits.max_cpuinfo_bytes"


class LimitHits:
    """Reads refused by a limit, by (source file, limit setting); thread-safe, logged once per pair."""

    def __init__(self) -> None:
        self._lock = threading.Lock()
        self._counts: dict[tuple[str, str], int] = {}

    def add(self, source: str, limit: str, error: ReadLimitError) -> None:
        with self._lock:
            first = (source, limit) not in self._counts
            self._counts[(source, limit)] = self._counts.get((source, limit), 0) + 1
        if first:
            log.warning("%s (counted in inferwatch_source_limit_hits_total; logged once)", error)

    def samples(self) -> list[AnySample]:
        with self._lock:
            counts = sorted(self._counts.items())
        return [Sample("inferwatch.source.limit_hits", n, attrs(source=s, limit=lim)) for (s, lim), n in counts]


@dataclass(frozen=True, slots=True)
class ReadLimits:
    """Byte limits of one read per file (see the module docstring); ``hits`` counts refusals when given."""

    max_file_bytes: int = DEFAULT_MAX_PROCFS_READ_BYTES
    max_cpuinfo_bytes: int = DEFAULT_MAX_CPUINFO_READ_BYTES
    hits: LimitHits | None = field(default=None, compare=False)

    @classmethod
    def of(cls, cfg: ReadLimitSettings, hits: LimitHits | None = None) -> ReadLimits:
        return cls(cfg.max_file_bytes, cfg.max_cpuinfo_bytes, hits)

    def text(self, path: Path, source: str, cpuinfo: bool = False) -> str:
        """``path`` as ASCII text (undecodable bytes replaced), at most the file (or cpuinfo) limit."""
        limit, setting = (self.max_cpuinfo_bytes, CPUINFO_LIMIT) if cpuinfo else (self.max_file_bytes, FILE_LIMIT)
        try:
            return read_bounded(path, limit, setting).decode("ascii", errors="replace")
        except ReadLimitError as exc:
            if self.hits is not None:
                self.hits.add(source, setting, exc)
            raise


DEFAULT_READ_LIMITS = ReadLimits()


def read_bounded(path: Path, limit: int = MAX_PROCFS_READ_BYTES, setting: str = FILE_LIMIT) -> bytes:
    """At most ``limit`` bytes of ``path``; ReadLimitError (naming ``setting``) when the file holds more.

    procfs files say ``st_size`` 0 and ``/dev/zero`` never ends, so ``limit + 1`` bytes are asked for; a
    regular file (a recorded tree) that says it is larger is refused unread.
    """
    with path.open("rb") as fh:
        data = None if os.fstat(fh.fileno()).st_size > limit else fh.read(limit + 1)
    if data is not None and len(data) <= limit:
        return data
    raise ReadLimitError(
        f"{path} is larger than {limit} bytes: not a procfs file (read limit; raise {setting} if it is real)",
        setting,
    )


def read_text(path: Path, limit: int = MAX_PROCFS_READ_BYTES) -> str:
    """:func:`read_bounded` decoded as ASCII, undecodable bytes replaced (procfs text is ASCII)."""
    return read_bounded(path, limit).decode("ascii", errors="replace")
