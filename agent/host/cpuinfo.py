"""/proc/cpuinfo: ``key : value`` lines (tabs or spaces before the colon), read for the kernel's architecture.

The architecture is the kernel's (``uname -m``, or ``<procfs>/sys/kernel/arch``), passed in by the
caller: which lines a file has says nothing reliable about it (LoongArch prints a ``Features`` line and
is not arm64; a 32-bit ARM kernel on a Cortex-A72 prints ``CPU part 0xd08`` like a 64-bit one).

- x86 (``x86_64``, ``i686``): one block per logical CPU (``processor``, ``vendor_id``, ``cpu family``,
  ``model``, ``model name``, ``stepping``, ``flags``).
- ARM (``aarch64``, 32-bit ``armv7l`` ...): ``CPU implementer``, ``CPU part``, ``CPU variant``,
  ``Features``; no model name. Old kernels print a ``Processor :`` line and no ``processor :`` line, or
  the ``Features``/``CPU part`` lines once after the blocks: such lines apply to every CPU.
- anything else (s390x, ppc64le, riscv64, loongarch64, sparc64, mips ...): no table of expectations;
  read for a name, flags and a CPU count where the layout has them, and never rejected.

Flags are exact tokens; the node's flags are the **intersection** over every processor block, because
on heterogeneous CPUs (big.LITTLE) a runtime can only rely on what every core has. A file with nothing
recognisable is a :class:`~agent.errors.SourceFormatError` only on x86 and arm64, where the kernel's
layout is known; elsewhere the result is an unknown CPU.
"""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path

from agent.errors import NoDataError, SourceFormatError
from agent.host.procfs import DEFAULT_READ_LIMITS, MAX_CPUINFO_READ_BYTES, ReadLimits

MAX_CPUINFO_BYTES = MAX_CPUINFO_READ_BYTES  # kept for callers of the old name

LAYOUT_BLOCKS = "processor blocks"
LAYOUT_NO_PROCESSOR = "no 'processor' lines"  # old ARM: 'Processor :' and one set of lines for all CPUs
LAYOUT_OTHER = "not read"  # an architecture without a reader here: name and flags only, where present


@dataclass(frozen=True, slots=True)
class CoreType:
    """One ARM core type: implementer and part as integers (``0x41``/``0xd40``), variant as printed."""

    implementer: int
    part: int
    variant: int = 0


@dataclass(frozen=True, slots=True)
class CpuInfo:
    """What /proc/cpuinfo says about the node. ``flags`` = tokens every processor block reports."""

    arch: str  # the kernel's architecture, normalised: x86_64 | aarch64 | arm | s390x | ppc64le | ... | unknown
    vendor: str  # GenuineIntel, AuthenticAMD, the ARM implementer's name, IBM/S390 ...
    model_name: str  # x86 "model name"; other architectures' own name line where there is one
    family: int | None  # x86 only
    model: int | None  # x86 only
    stepping: int | None  # x86 only
    core_types: tuple[CoreType, ...]  # ARM only, in first-seen order
    flags: frozenset[str]
    logical_cpus: int
    layout: str = LAYOUT_BLOCKS
    machine: str = ""  # the kernel's machine as given (uname -m): armv7l, ppc64le ...


# uname -m spellings -> the architecture names used here.
_ARCH_ALIASES = {"amd64": "x86_64", "x64": "x86_64", "arm64": "aarch64", "aarch64_be": "aarch64"}
X86 = frozenset({"x86_64", "i386", "i486", "i586", "i686", "x86"})


def normalise_arch(machine: str) -> str:
    """``uname -m`` to an architecture name: x86_64, aarch64, arm (any 32-bit ARM), or the machine itself."""
    m = machine.strip().lower()
    if not m:
        return "unknown"
    m = _ARCH_ALIASES.get(m, m)
    if m.startswith("arm") or m in ("sa110", "sa1100"):
        return "arm"
    return m


def _int(value: str | None) -> int | None:
    if value is None:
        return None
    try:
        return int(value.strip(), 0)
    except ValueError:
        return None


def _sections(text: str) -> tuple[list[dict[str, str]], dict[str, str], int]:
    """(processor blocks, lines outside any block (first value wins), count of 'processor' lines)."""
    blocks: list[dict[str, str]] = []
    common: dict[str, str] = {}
    current: dict[str, str] = {}
    processors = 0

    def close() -> None:
        nonlocal current
        if "processor" in current:
            blocks.append(current)
        else:
            for k, v in current.items():
                common.setdefault(k, v)
        current = {}

    for line in text.splitlines():
        if not line.strip():
            close()
            continue
        key, sep, value = line.partition(":")
        if not sep:
            continue
        key = key.strip()
        if key == "processor":
            processors += 1
            if "processor" in current:  # blocks without a blank line between them
                close()
            elif current:  # lines before the first 'processor' of a section: the old 'Processor :' header
                for k, v in current.items():
                    common.setdefault(k, v)
                current = {}
        current[key] = value.strip()
    close()
    return blocks, common, processors


IMPLEMENTERS: dict[int, str] = {
    0x41: "ARM",
    0x42: "Broadcom",
    0x43: "Cavium",
    0x46: "Fujitsu",
    0x48: "HiSilicon",
    0x4E: "NVIDIA",
    0x50: "APM",
    0x51: "Qualcomm",
    0x53: "Samsung",
    0x61: "Apple",
    0x6D: "Microsoft",
    0xC0: "Ampere",
}
_ARM_KEYS = ("CPU implementer", "CPU part", "Features", "Processor")


def _tokens(raw: str | None) -> frozenset[str]:
    return frozenset(raw.split()) if raw is not None else frozenset()


def _arm(blocks: list[dict[str, str]], common: dict[str, str], processors: int, arch: str, machine: str) -> CpuInfo:
    layout = LAYOUT_BLOCKS
    if not blocks:
        if not any(k in common for k in _ARM_KEYS):
            raise SourceFormatError("cpuinfo has no 'processor' block and no ARM CPU lines")
        blocks, layout = [common], LAYOUT_NO_PROCESSOR
    merged = [{**common, **b} for b in blocks]  # lines printed once (old kernels) apply to every CPU
    flags = frozenset.intersection(*(_tokens(b.get("Features")) for b in merged))
    seen: dict[CoreType, None] = {}
    for b in merged:
        impl, part = _int(b.get("CPU implementer")), _int(b.get("CPU part"))
        if impl is not None and part is not None:
            seen.setdefault(CoreType(impl, part, _int(b.get("CPU variant")) or 0), None)
    cores = tuple(seen)
    vendor = IMPLEMENTERS.get(cores[0].implementer, f"0x{cores[0].implementer:02x}") if cores else ""
    name = common.get("Processor", "") if arch == "arm" else ""
    return CpuInfo(arch, vendor, name, None, None, None, cores, flags, max(processors, 1), layout, machine)


def _x86(blocks: list[dict[str, str]], arch: str, machine: str) -> CpuInfo:
    if not blocks:
        raise SourceFormatError("cpuinfo has no 'processor' block")
    flags = frozenset.intersection(*(_tokens(b.get("flags")) for b in blocks))
    first = blocks[0]
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
        machine=machine,
    )


_NAME_KEYS = ("model name", "Model Name", "cpu model", "cpu", "uarch", "Processor", "machine")
_FLAG_KEYS = ("flags", "Features", "features", "cpucaps")
_COUNT_KEYS = ("# processors", "ncpus active", "ncpus probed")


def _other(blocks: list[dict[str, str]], common: dict[str, str], arch: str, machine: str) -> CpuInfo:
    """Architectures without a reader: what a layout shares (a name, flags, a CPU count), never an error."""
    first = {**common, **(blocks[0] if blocks else {})}
    name = next((" ".join(first[k].split()) for k in _NAME_KEYS if first.get(k)), "")
    key = next((k for k in _FLAG_KEYS if k in first), None)
    if blocks and key is not None:
        flags = frozenset.intersection(*(_tokens({**common, **b}.get(key)) for b in blocks))
    else:
        flags = _tokens(first.get(key)) if key is not None else frozenset()
    count = len(blocks)
    if not count:
        count = next((n for k in _COUNT_KEYS if (n := _int(common.get(k))) is not None and n > 0), 0)
    layout = LAYOUT_BLOCKS if blocks else LAYOUT_OTHER
    vendor = first.get("vendor_id", "")
    return CpuInfo(arch, vendor, name, None, None, None, (), flags, count, layout, machine)


def parse_cpuinfo(text: str, machine: str) -> CpuInfo:
    """Parse a /proc/cpuinfo text written by a kernel whose ``uname -m`` is ``machine``.

    Raises SourceFormatError only for x86 and arm64 files with no block the kernel would print.
    """
    arch = normalise_arch(machine)
    blocks, common, processors = _sections(text)
    if arch in X86:
        return _x86(blocks, "x86_64" if arch == "x86_64" else arch, machine)
    if arch in ("aarch64", "arm"):
        return _arm(blocks, common, processors, arch, machine)
    return _other(blocks, common, arch, machine)


def read_cpuinfo(procfs: Path, machine: str, limits: ReadLimits = DEFAULT_READ_LIMITS) -> CpuInfo:
    """``<procfs>/cpuinfo`` (at most ``limits.max_cpuinfo_bytes``) as the kernel of ``machine`` writes it."""
    path = procfs / "cpuinfo"
    try:
        text = limits.text(path, "cpuinfo", cpuinfo=True)
    except FileNotFoundError:
        raise NoDataError(f"{path} does not exist", hint="point --path.procfs at the host's /proc") from None
    return parse_cpuinfo(text, machine)
