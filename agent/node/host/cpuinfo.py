"""/proc/cpuinfo: ``key : value`` lines (tabs or spaces before the colon), read for the kernel's architecture.

The architecture is the kernel's ``uname -m``, passed in by the caller (:mod:`inferwatch.agent.node.host.machine`
decides it for a procfs tree: given, the running kernel's, a recorded one, or inferred from this file's layout as a
whole). A single line says nothing reliable about it (LoongArch prints a ``Features`` line and is not
arm64; a 32-bit ARM kernel on a Cortex-A72 prints ``CPU part 0xd08`` like a 64-bit one).

- x86 (``x86_64``, ``i686``): one block per logical CPU (``processor``, ``vendor_id``, ``cpu family``,
  ``model``, ``model name``, ``stepping``, ``flags``).
- ARM (``aarch64``, 32-bit ``armv7l`` ...): ``CPU implementer``, ``CPU part``, ``CPU variant``,
  ``Features``; no model name. Old kernels print a ``Processor :`` line and no ``processor :`` line, or
  the ``Features``/``CPU part`` lines once after the blocks: such lines apply to every CPU.
- anything else (s390x, ppc64le, riscv64, loongarch64, sparc64, mips ...): no table of expectations;
  read for a name, flags and a CPU count where the layout has them, and never rejected.

Flags are exact tokens; the node's flags are the **intersection** over every processor block, because
on heterogeneous CPUs (big.LITTLE) a runtime can only rely on what every core has. A file with nothing
recognisable is a :class:`~inferwatch.agent.errors.SourceFormatError` only on x86 and arm64, where the kernel's
layout is known; elsewhere the result is an unknown CPU.

The file is read a line at a time (:meth:`inferwatch.agent.node.host.procfs.ReadLimits.lines`) into :class:`Sections`,
which keeps the first block, the lines outside blocks, counts and running intersections, never the
blocks: a 10 MB cpuinfo (7,200 blocks) costs about one block of memory, not a copy per parsing step.
"""

from __future__ import annotations

import io
from collections.abc import Iterable
from dataclasses import dataclass
from pathlib import Path

from inferwatch.agent.errors import NoDataError, SourceFormatError
from inferwatch.agent.node.host.procfs import DEFAULT_READ_LIMITS, ReadLimits

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


_FLAG_KEYS = ("flags", "Features", "features", "cpucaps")
_CORE_KEYS = ("CPU implementer", "CPU part", "CPU variant")
_NAME_KEYS = ("model name", "Model Name", "cpu model", "cpu", "uarch", "Processor", "machine")
_COUNT_KEYS = ("# processors", "ncpus active", "ncpus probed")
_X86_KEYS = ("vendor_id", "cpu family", "model", "stepping")
# Lines the readers below and the architecture inference (inferwatch.agent.node.host.machine) look at; every other line
# is dropped as it is read, so a section holds a few dozen values whatever the file holds.
KEPT_KEYS = frozenset(
    {"processor", *_FLAG_KEYS, *_CORE_KEYS, *_NAME_KEYS, *_COUNT_KEYS, *_X86_KEYS}
    | {"CPU architecture", "CPU Family", "ISA", "isa", "type", "platform", "revision", "timebase", "MMU", "hart"}
    | {"system type"}
)
MAX_CORE_TYPES = 64  # distinct (implementer, part, variant) kept: SoCs have up to ~4 core types


def _tokens(raw: str | None) -> frozenset[str]:
    return frozenset(raw.split()) if raw is not None else frozenset()


class Sections:
    """A cpuinfo read once, line by line, into what the readers need, in memory bounded by one block.

    Kept: the first processor block, the lines outside any block (``common``, first value wins), the counts,
    per flag key the intersection of every block's tokens (a block without the key takes ``common``'s,
    as the lines an old ARM kernel prints once apply to every CPU) and the distinct ARM core triples.
    Blocks themselves are not kept, and a block whose flags line repeats the previous one (the usual case:
    every CPU of a socket prints the same line) costs no set operation.
    """

    def __init__(self) -> None:
        self.first: dict[str, str] = {}  # the first processor block (KEPT_KEYS only)
        self.common: dict[str, str] = {}
        self.blocks = 0  # processor blocks
        self.processors = 0  # 'processor' lines
        self._flags: dict[str, frozenset[str]] = {}  # key -> intersection over the blocks that print it
        self._last: dict[str, str] = {}  # key -> the previous block's raw value (repeats are skipped)
        self._lacking: set[str] = set()  # flag keys some block does not print
        self._cores: dict[tuple[str | None, ...], None] = {}  # raw (implementer, part, variant), first seen first

    def _block(self, block: dict[str, str]) -> None:
        if not self.blocks:
            self.first = block
        self.blocks += 1
        for key in _FLAG_KEYS:
            raw = block.get(key)
            if raw is None:
                self._lacking.add(key)
            elif self._last.get(key) != raw:
                self._last[key] = raw
                tokens = _tokens(raw)
                self._flags[key] = self._flags[key] & tokens if key in self._flags else tokens
        if len(self._cores) < MAX_CORE_TYPES:
            self._cores.setdefault(tuple(block.get(k) for k in _CORE_KEYS), None)

    def _outside(self, lines: dict[str, str]) -> None:
        for k, v in lines.items():
            self.common.setdefault(k, v)

    def flags(self, key: str, from_common: bool = True) -> frozenset[str]:
        """Tokens of ``key`` every block reports (a block without it: ``common``'s when ``from_common``)."""
        parts = [self._flags[key]] if key in self._flags else []
        if key in self._lacking:
            parts.append(_tokens(self.common.get(key)) if from_common else frozenset())
        return frozenset.intersection(*parts) if parts else frozenset()

    def core_triples(self) -> list[tuple[str | None, ...]]:
        """Each block's (implementer, part, variant), a missing one taken from ``common``, first seen first."""
        out: dict[tuple[str | None, ...], None] = {}
        for triple in self._cores:
            resolved = (v if v is not None else self.common.get(k) for k, v in zip(_CORE_KEYS, triple, strict=True))
            out.setdefault(tuple(resolved))
        return list(out)


def scan(lines: Iterable[str]) -> Sections:
    """Blocks are separated by blank lines or start at a ``processor`` line; other sections are ``common``."""
    sec = Sections()
    current: dict[str, str] = {}

    def close() -> None:
        nonlocal current
        if "processor" in current:
            sec._block(current)
        else:
            sec._outside(current)
        current = {}

    for line in lines:
        if not line.strip():
            close()
            continue
        key, sep, value = line.partition(":")
        if not sep:
            continue
        key = key.strip()
        if key == "processor":
            sec.processors += 1
            if "processor" in current:  # blocks without a blank line between them
                close()
            elif current:  # lines before the first 'processor' of a section: the old 'Processor :' header
                sec._outside(current)
                current = {}
        if key in KEPT_KEYS:
            current[key] = value.strip()
    close()
    return sec


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


def _arm(sec: Sections, arch: str, machine: str) -> CpuInfo:
    layout = LAYOUT_BLOCKS
    common = sec.common
    if not sec.blocks:
        if not any(k in common for k in _ARM_KEYS):
            raise SourceFormatError("cpuinfo has no 'processor' block and no ARM CPU lines")
        layout = LAYOUT_NO_PROCESSOR
        flags = _tokens(common.get("Features"))
        triples = [tuple(common.get(k) for k in _CORE_KEYS)]
    else:  # lines printed once (old kernels) apply to every CPU
        flags, triples = sec.flags("Features"), sec.core_triples()
    seen: dict[CoreType, None] = {}
    for impl_text, part_text, variant_text in triples:
        impl, part = _int(impl_text), _int(part_text)
        if impl is not None and part is not None:
            seen.setdefault(CoreType(impl, part, _int(variant_text) or 0), None)
    cores = tuple(seen)
    vendor = IMPLEMENTERS.get(cores[0].implementer, f"0x{cores[0].implementer:02x}") if cores else ""
    name = common.get("Processor", "") if arch == "arm" else ""
    return CpuInfo(arch, vendor, name, None, None, None, cores, flags, max(sec.processors, 1), layout, machine)


def _x86(sec: Sections, arch: str, machine: str) -> CpuInfo:
    if not sec.blocks:
        raise SourceFormatError("cpuinfo has no 'processor' block")
    first = sec.first
    return CpuInfo(
        arch=arch,
        vendor=first.get("vendor_id", ""),
        model_name=" ".join(first.get("model name", "").split()),
        family=_int(first.get("cpu family")),
        model=_int(first.get("model")),
        stepping=_int(first.get("stepping")),
        core_types=(),
        flags=sec.flags("flags", from_common=False),
        logical_cpus=sec.blocks,
        machine=machine,
    )


def _other(sec: Sections, arch: str, machine: str) -> CpuInfo:
    """Architectures without a reader: what a layout shares (a name, flags, a CPU count), never an error."""
    common = sec.common
    first = {**common, **sec.first}
    name = next((" ".join(first[k].split()) for k in _NAME_KEYS if first.get(k)), "")
    key = next((k for k in _FLAG_KEYS if k in first), None)
    if sec.blocks and key is not None:
        flags = sec.flags(key)
    else:
        flags = _tokens(first.get(key)) if key is not None else frozenset()
    count = sec.blocks
    if not count:
        count = next((n for k in _COUNT_KEYS if (n := _int(common.get(k))) is not None and n > 0), 0)
    layout = LAYOUT_BLOCKS if sec.blocks else LAYOUT_OTHER
    vendor = first.get("vendor_id", "")
    return CpuInfo(arch, vendor, name, None, None, None, (), flags, count, layout, machine)


def cpuinfo_of(sec: Sections, machine: str) -> CpuInfo:
    """The scanned file read as the kernel whose ``uname -m`` is ``machine`` writes it.

    Raises SourceFormatError only for x86 and arm64 files with no block the kernel would print.
    """
    arch = normalise_arch(machine)
    if arch in X86:
        return _x86(sec, "x86_64" if arch == "x86_64" else arch, machine)
    if arch in ("aarch64", "arm"):
        return _arm(sec, arch, machine)
    return _other(sec, arch, machine)


def parse_cpuinfo(text: str, machine: str) -> CpuInfo:
    """Parse a /proc/cpuinfo text written by a kernel whose ``uname -m`` is ``machine`` (see :func:`cpuinfo_of`)."""
    return cpuinfo_of(scan(io.StringIO(text)), machine)


def scan_file(procfs: Path, limits: ReadLimits = DEFAULT_READ_LIMITS) -> Sections:
    """``<procfs>/cpuinfo`` (at most ``limits.max_cpuinfo_bytes``), scanned a line at a time."""
    path = procfs / "cpuinfo"
    try:
        return scan(limits.lines(path, "cpuinfo", cpuinfo=True))
    except FileNotFoundError:
        raise NoDataError(f"{path} does not exist", hint="point --path.procfs at the host's /proc") from None


def read_cpuinfo(procfs: Path, machine: str, limits: ReadLimits = DEFAULT_READ_LIMITS) -> CpuInfo:
    """``<procfs>/cpuinfo`` (at most ``limits.max_cpuinfo_bytes``) as the kernel of ``machine`` writes it."""
    return cpuinfo_of(scan_file(procfs, limits), machine)
