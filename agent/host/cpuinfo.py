"""/proc/cpuinfo: one block per logical CPU, ``key : value`` lines (tabs or spaces before the colon).

Both shapes are read: x86 (``vendor_id``, ``cpu family``, ``model``, ``model name``, ``stepping``,
``flags``) and arm64 (``CPU implementer``, ``CPU part``, ``CPU variant``, ``Features``; no model name).
Flags are exact tokens; the node's flags are the **intersection** over every processor block, because
on heterogeneous CPUs (big.LITTLE) a runtime can only rely on what every core has.
"""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path

from agent.errors import NoDataError, SourceFormatError

MAX_CPUINFO_BYTES = 64 << 20  # 64 MiB: thousands of CPUs fit; anything bigger is not a cpuinfo


@dataclass(frozen=True, slots=True)
class CoreType:
    """One arm64 core type: implementer and part as integers (``0x41``/``0xd40``), variant as printed."""

    implementer: int
    part: int
    variant: int = 0


@dataclass(frozen=True, slots=True)
class CpuInfo:
    """What /proc/cpuinfo says about the node. ``flags`` = tokens every processor block reports."""

    arch: str  # x86_64 | aarch64 | unknown
    vendor: str  # GenuineIntel, AuthenticAMD, or the arm64 implementer's name
    model_name: str  # x86 "model name"; empty on arm64 (the kernel prints none)
    family: int | None  # x86 only
    model: int | None  # x86 only
    stepping: int | None  # x86 only
    core_types: tuple[CoreType, ...]  # arm64 only, in first-seen order
    flags: frozenset[str]
    logical_cpus: int


def _int(value: str | None) -> int | None:
    if value is None:
        return None
    try:
        return int(value, 0)
    except ValueError:
        return None


def _blocks(text: str) -> list[dict[str, str]]:
    blocks: list[dict[str, str]] = []
    current: dict[str, str] = {}
    for line in text.splitlines():
        if not line.strip():
            if current:
                blocks.append(current)
                current = {}
            continue
        key, sep, value = line.partition(":")
        if not sep:
            continue
        key = key.strip()
        if key == "processor" and "processor" in current:  # blocks without a blank line between them
            blocks.append(current)
            current = {}
        current[key] = value.strip()
    if current:
        blocks.append(current)
    return [b for b in blocks if "processor" in b]


IMPLEMENTERS: dict[int, str] = {
    0x41: "ARM",
    0x42: "Broadcom",
    0x43: "Cavium",
    0x46: "Fujitsu",
    0x48: "HiSilicon",
    0x4E: "NVIDIA",
    0x50: "APM",
    0x51: "Qualcomm",
    0x61: "Apple",
    0x6D: "Microsoft",
    0xC0: "Ampere",
}


def parse_cpuinfo(text: str) -> CpuInfo:
    """Parse a /proc/cpuinfo text; raise SourceFormatError when it holds no processor block."""
    blocks = _blocks(text)
    if not blocks:
        raise SourceFormatError("cpuinfo has no 'processor' block")
    flag_sets = []
    for b in blocks:
        raw = b.get("flags", b.get("Features"))
        flag_sets.append(frozenset(raw.split()) if raw is not None else frozenset())
    flags = frozenset.intersection(*flag_sets)
    first = blocks[0]
    if "CPU implementer" in first or "Features" in first:
        seen: dict[CoreType, None] = {}
        for b in blocks:
            impl, part = _int(b.get("CPU implementer")), _int(b.get("CPU part"))
            if impl is not None and part is not None:
                seen.setdefault(CoreType(impl, part, _int(b.get("CPU variant")) or 0), None)
        cores = tuple(seen)
        vendor = IMPLEMENTERS.get(cores[0].implementer, f"0x{cores[0].implementer:02x}") if cores else ""
        return CpuInfo("aarch64", vendor, "", None, None, None, cores, flags, len(blocks))
    arch = "x86_64" if "vendor_id" in first or "flags" in first else "unknown"
    return CpuInfo(
        arch=arch,
        vendor=first.get("vendor_id", ""),
        model_name=" ".join(first.get("model name", "").split()),
        family=_int(first.get("cpu family")),
        model=_int(first.get("model")),
        stepping=_int(first.get("stepping")),
        core_types=(),
        flags=flags,
        logical_cpus=len(blocks),
    )


def read_cpuinfo(procfs: Path) -> CpuInfo:
    path = procfs / "cpuinfo"
    try:
        with path.open("rb") as fh:
            data = fh.read(MAX_CPUINFO_BYTES + 1)
    except FileNotFoundError:
        raise NoDataError(f"{path} does not exist", hint="point --path.procfs at the host's /proc") from None
    if len(data) > MAX_CPUINFO_BYTES:
        raise SourceFormatError(f"{path} is larger than {MAX_CPUINFO_BYTES} bytes")
    return parse_cpuinfo(data.decode("ascii", errors="replace"))
