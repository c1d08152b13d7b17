"""One bounded read for procfs and sysfs text files, shared by every parser in :mod:`inferwatch.agent.node.host`.

A procfs file is small (meminfo ~1.5 KiB, vmstat ~5 KiB, PSI ~150 B), cpuinfo the exception (~2 KiB per
logical CPU: ~0.5 MiB on a 256-thread host), but the path is configurable (``--path.procfs``) and a
recorded or hostile tree can hold anything: a 50 MB file, or a link to ``/dev/zero`` that never ends. So
every read asks for at most ``limit + 1`` bytes and raises :class:`~inferwatch.agent.errors.ReadLimitError` (a
SourceFormatError) when more came: memory stays bounded by the limit, and the error names the file and
the setting to raise. The limits are settings (``read_limits.max_file_bytes``,
``read_limits.max_cpuinfo_bytes``, defaults in :mod:`inferwatch.agent.config`); each hit is counted in
``inferwatch.source.limit_hits{source,limit}`` (:class:`LimitHits`, built once by the composition root)
and logged once per file and limit. ``FileNotFoundError`` and other ``OSError`` propagate, so callers keep
mapping absence to :class:`~inferwatch.agent.errors.NoDataError` as before.

A byte limit alone does not bound memory: a 10 MB cpuinfo read whole, decoded and split into lines and
dicts held ~150 MB at once. So a large file (cpuinfo) is read with :meth:`ReadLimits.lines`, one line at a
time, each line at most :data:`MAX_LINE_BYTES`: the reader keeps what it needs of each line and the file
costs one line of memory plus the reader's buffer.
"""

from __future__ import annotations

import logging
import os
import threading
from collections.abc import Iterable, Iterator
from dataclasses import dataclass, field
from pathlib import Path

from inferwatch.agent.common.samples import AnySample, Sample, attrs
from inferwatch.agent.config import DEFAULT_MAX_CPUINFO_READ_BYTES, DEFAULT_MAX_PROCFS_READ_BYTES, ReadLimitSettings
from inferwatch.agent.errors import ReadLimitError, SourceFormatError

log = logging.getLogger(__name__)

MAX_PROCFS_READ_BYTES = DEFAULT_MAX_PROCFS_READ_BYTES  # the defaults, by their historic names
MAX_CPUINFO_READ_BYTES = DEFAULT_MAX_CPUINFO_READ_BYTES
FILE_LIMIT = "read_limits.max_file_bytes"  # values of the ``limit`` attribute: the setting that bounds the read
CPUINFO_LIMIT = "read_limits.max_cpuinfo_bytes"
# One line of a procfs text file: the longest real ones are x86 cpuinfo ``flags``/``bugs`` lines, ~2 KiB with
# every AVX-512 and AMX flag (tests/fixtures/cpuinfo): 64 KiB is 30 times that.
MAX_LINE_BYTES = 64 << 10
# Fields one small procfs/sysfs file may have: meminfo has ~55, memory.stat ~70, vmstat ~180 (of which the
# agent keeps a few). 4,096 is twenty times any real one; past it the file is refused, not kept.
MAX_FIELDS = 4096


def text_lines(text: str | Iterable[str]) -> Iterable[str]:
    """A parser's input as lines: a whole text (tests, recorded strings) or :meth:`ReadLimits.lines`."""
    return text.splitlines() if isinstance(text, str) else text


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

    def lines(self, path: Path, source: str, cpuinfo: bool = False) -> Iterator[str]:
        """``path``'s lines (ASCII, undecodable bytes replaced, without the line end), read one at a time.

        The same byte limit as :meth:`text` (ReadLimitError, counted, once the total passes it); a line longer
        than :data:`MAX_LINE_BYTES` is skipped unkept and, at the end, a SourceFormatError: no procfs text
        file has one, so the file is not what it is named.
        """
        limit, setting = (self.max_cpuinfo_bytes, CPUINFO_LIMIT) if cpuinfo else (self.max_file_bytes, FILE_LIMIT)
        try:
            yield from bounded_lines(path, limit, setting)
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
    raise _too_large(path, limit, setting)


def _too_large(path: Path, limit: int, setting: str) -> ReadLimitError:
    return ReadLimitError(
        f"{path} is larger than {limit} bytes: not a procfs file (read limit; raise {setting} if it is real)",
        setting,
    )


def bounded_lines(path: Path, limit: int = MAX_PROCFS_READ_BYTES, setting: str = FILE_LIMIT) -> Iterator[str]:
    """:func:`read_bounded`'s bytes as lines, one at a time (see :meth:`ReadLimits.lines`)."""
    total = number = too_long = 0
    with path.open("rb") as fh:
        if os.fstat(fh.fileno()).st_size > limit:
            raise _too_large(path, limit, setting)
        while raw := fh.readline(MAX_LINE_BYTES + 1):
            total += len(raw)
            number += 1
            if total > limit:
                raise _too_large(path, limit, setting)
            if len(raw) > MAX_LINE_BYTES and not raw.endswith(b"\n"):
                too_long = too_long or number
                while raw and not raw.endswith(b"\n"):  # the rest of the line, counted, never kept
                    raw = fh.readline(MAX_LINE_BYTES)
                    total += len(raw)
                    if total > limit:
                        raise _too_large(path, limit, setting)
                continue
            yield raw.decode("ascii", errors="replace").rstrip("\r\n")
    if too_long:
        raise SourceFormatError(f"{path}: line {too_long} is longer than {MAX_LINE_BYTES} bytes: not a procfs file")


def read_text(path: Path, limit: int = MAX_PROCFS_READ_BYTES) -> str:
    """:func:`read_bounded` decoded as ASCII, undecodable bytes replaced (procfs text is ASCII)."""
    return read_bounded(path, limit).decode("ascii", errors="replace")
