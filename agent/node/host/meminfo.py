"""/proc/meminfo: ``Field:   1234 kB`` lines; sizes converted to bytes, HugePages_* kept as counts."""

from __future__ import annotations

from collections.abc import Iterable
from pathlib import Path

from inferwatch.agent.errors import NoDataError, SourceFormatError
from inferwatch.agent.node.host.procfs import DEFAULT_READ_LIMITS, MAX_FIELDS, ReadLimits, text_lines

KIB = 1024
_LEGACY_ROWS = frozenset({"total", "Mem", "Swap"})


def parse_meminfo(text: str | Iterable[str]) -> dict[str, int]:
    """Return every field of a /proc/meminfo text (or its lines); ``kB`` values in bytes; at most MAX_FIELDS."""
    out: dict[str, int] = {}
    for lineno, line in enumerate(text_lines(text), 1):
        if not line.strip():
            continue
        key, sep, rest = line.partition(":")
        parts = rest.split()
        key = key.strip()
        # Legacy kernels (< 2.6) open with a "total: used: free: ..." table and "Mem:"/"Swap:" rows.
        if not sep or not parts or key in _LEGACY_ROWS:
            continue
        try:
            value = int(parts[0])
        except ValueError:
            raise SourceFormatError(f"meminfo line {lineno}: {line.strip()!r} has no integer value") from None
        if len(parts) > 1 and parts[1].lower() == "kb":
            value *= KIB
        out[key] = value
        if len(out) > MAX_FIELDS:
            raise SourceFormatError(f"meminfo has more than {MAX_FIELDS} fields: not a meminfo")
    if "MemTotal" not in out:
        raise SourceFormatError("meminfo has no MemTotal field")
    return out


def read_meminfo(procfs: Path, limits: ReadLimits = DEFAULT_READ_LIMITS) -> dict[str, int]:
    path = procfs / "meminfo"
    try:
        return parse_meminfo(limits.lines(path, "meminfo"))
    except FileNotFoundError:
        raise NoDataError(f"{path} does not exist", hint="point --path.procfs at the host's /proc") from None


def mem_available(info: dict[str, int]) -> int:
    """MemAvailable, or the pre-3.14 estimate MemFree + Buffers + Cached when the kernel lacks it."""
    if "MemAvailable" in info:
        return info["MemAvailable"]
    return info.get("MemFree", 0) + info.get("Buffers", 0) + info.get("Cached", 0)
