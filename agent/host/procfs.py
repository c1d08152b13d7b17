"""One bounded read for procfs and sysfs text files, shared by every parser in :mod:`agent.host`.

A procfs file is small (meminfo ~1.5 KiB, vmstat ~5 KiB, a 4096-CPU cpuinfo ~7 MiB), but the path is
configurable (``--path.procfs``) and a recorded or hostile tree can hold anything: a 50 MB file, or a
link to ``/dev/zero`` that never ends. So every read asks for at most ``limit + 1`` bytes and raises
:class:`~agent.errors.SourceFormatError` when more came: memory stays bounded by the named limit, and
the error says which file and which limit. ``FileNotFoundError`` and other ``OSError`` propagate, so
callers keep mapping absence to :class:`~agent.errors.NoDataError` as before.
"""

from __future__ import annotations

from pathlib import Path

from agent.errors import SourceFormatError

MAX_PROCFS_READ_BYTES = 1 << 20  # 1 MiB: meminfo, vmstat, PSI and friends are a few KiB
MAX_CPUINFO_READ_BYTES = 16 << 20  # 16 MiB: ~1.7 KiB per x86 CPU with every flag, 8192 CPUs fit


def read_bounded(path: Path, limit: int = MAX_PROCFS_READ_BYTES) -> bytes:
    """At most ``limit`` bytes of ``path``; SourceFormatError when the file holds more."""
    with path.open("rb") as fh:
        data = fh.read(limit + 1)
    if len(data) > limit:
        raise SourceFormatError(f"{path} is larger than {limit} bytes: not a procfs file (read limit)")
    return data


def read_text(path: Path, limit: int = MAX_PROCFS_READ_BYTES) -> str:
    """:func:`read_bounded` decoded as ASCII, undecodable bytes replaced (procfs text is ASCII)."""
    return read_bounded(path, limit).decode("ascii", errors="replace")
