"""Which kernel wrote a procfs tree: its ``uname -m``, and where that answer came from.

A recorded tree (a dump from another machine, a test fixture) must not be read as the machine the agent
runs on: an arm64 dump read as x86 loses every feature and passes the gate. The sources, in order:

1. **given**: ``--machine`` (doctor, run) or the ``path.machine`` setting.
2. **running kernel**: only when the tree is the running kernel's: ``<procfs>`` is ``/proc``, or its
   ``sys/kernel/random/boot_id`` is the running kernel's (the host's /proc mounted in a container). The
   tree's own ``sys/kernel/arch`` where the kernel has one, else ``uname -m`` (the CPU probe).
3. **recorded uname**: what a recording kept: ``<procfs>/sys/kernel/arch`` (the kernel's own file, one
   word), or ``<procfs>/uname``, a file holding the output of ``uname -m`` or ``uname -a`` (the machine is
   the last token that names an architecture). Record a tree with ``uname -a > TREE/uname``.
4. **inferred from cpuinfo**: the layout each architecture's kernel prints (:func:`infer`): x86
   ``vendor_id`` + ``flags`` (``lm``: x86_64), arm64 ``Features`` with ``fp``/``asimd``, 32-bit ARM
   ``Features`` with ``half``/``thumb``/``vfp``/``neon`` and the ``(v7l)`` of its model name, s390x
   ``vendor_id: IBM/S390``, PowerPC ``cpu``/``revision (pvr ...)``, RISC-V ``isa: rv64...``, LoongArch
   ``CPU Family: Loongson-64bit``, SPARC ``type: sun4u``, MIPS ``cpu model: MIPS ...``.

``<procfs>/self/auxv`` does not name the architecture: AT_PLATFORM is a pointer into the recorded
process's memory, meaningless in a file, and AT_HWCAP's bits mean different things per architecture; it
is compared with cpuinfo once the architecture is known (:mod:`inferwatch.agent.node.host.hwcap`).

Every source present must agree with the others on the architecture family (an i686 kernel on an x86_64
CPU agrees; ppc64 and ppc64le agree, cpuinfo does not say the byte order): a tree whose cpuinfo reads as
arm64 while its ``sys/kernel/arch`` or ``--machine`` says x86_64 is a
:class:`~inferwatch.agent.errors.SourceFormatError` naming both, never a silent read as either. A tree with none of
them (not the running kernel's, nothing recorded, a cpuinfo of no known layout) is one too: its message
says to state the architecture with ``--machine``.
"""

from __future__ import annotations

import os
import re
from dataclasses import dataclass
from pathlib import Path

from inferwatch.agent.errors import SourceFormatError
from inferwatch.agent.node.host.cpuinfo import X86, Sections, normalise_arch
from inferwatch.agent.node.host.cpuprobe import CpuProbe, SyscallCpuProbe

GIVEN = "given"
RUNNING = "running kernel"
RECORDED = "recorded uname"
INFERRED = "inferred from cpuinfo"
SOURCES = (GIVEN, RUNNING, RECORDED, INFERRED)

LIVE_PROCFS = Path("/proc")
MAX_UNAME_BYTES = 4096
# A ``uname -m`` answer: lower-case letters, digits and underscores (x86_64, aarch64, armv7l, ppc64le, s390x).
MACHINE_RE = re.compile(r"^[a-z][a-z0-9_]{0,31}$")
# Tokens of ``uname -a`` that are a machine (scanned from the end: the host name comes second).
_UNAME_MACHINE = re.compile(
    r"^(x86_64|i[3-6]86|aarch64(_be)?|arm\w*|s390x?|ppc\w*|powerpc\w*|riscv\d+|loongarch\d+|sparc\w*|mips\w*"
    r"|alpha|ia64|parisc\w*|m68k|sh\d\w*|csky|arc\w*|microblaze\w*|xtensa|openrisc|or1k|nios2|hexagon)$"
)
# Features tokens only one ARM kernel prints (arch/arm64/kernel/cpuinfo.c hwcap_str, arch/arm/kernel/setup.c).
ARM64_ONLY = frozenset({"fp", "asimd"})
ARM32_ONLY = frozenset(
    {"swp", "half", "thumb", "26bit", "fastmult", "fpa", "vfp", "edsp", "java", "iwmmxt", "crunch", "thumbee"}
    | {"neon", "vfpv3", "vfpv3d16", "tls", "vfpv4", "idiva", "idivt", "vfpd32", "lpae"}
)
_ARM_ELF_PLATFORM = re.compile(r"\((v\d+[lb])\)\s*$")  # "ARMv7 Processor rev 4 (v7l)" -> armv7l
_POWER = re.compile(r"^POWER(\d+)", re.IGNORECASE)
_PPC64_CORES = ("PPC970", "Cell", "PA6T", "e5500", "e6500", "A2")
# Every x86 CPU since the Pentium Pro lists more flags than this; a shorter line was cut (a test capture).
X86_MIN_REAL_FLAGS = 16
POWER_LE_FROM = 8  # POWER8 is the first CPU Linux distributions run little-endian (ppc64le)


@dataclass(frozen=True, slots=True)
class Machine:
    """The kernel's ``uname -m`` for a procfs tree, the source (one of :data:`SOURCES`) and what it read."""

    machine: str
    source: str
    evidence: str

    def describe(self) -> str:
        return f"{self.machine} ({self.source}: {self.evidence})"


def family(machine: str) -> str:
    """The architecture family, for agreement between sources (x86_64 and i686 agree; ppc64 and ppc64le do)."""
    arch = normalise_arch(machine)
    if arch in X86:
        return "x86"
    for prefix, name in (
        ("ppc", "ppc"),
        ("powerpc", "ppc"),
        ("riscv", "riscv"),
        ("sparc", "sparc"),
        ("s390", "s390"),
        ("mips", "mips"),
        ("loongarch", "loongarch"),
    ):
        if arch.startswith(prefix):
            return name
    return arch


def _tokens(raw: str | None) -> frozenset[str]:
    return frozenset(raw.split()) if raw else frozenset()


def _arm(first: dict[str, str]) -> Machine | None:
    features = _tokens(first.get("Features"))
    a64, a32 = features & ARM64_ONLY, features & ARM32_ONLY
    name = first.get("model name") or first.get("Processor") or ""
    if a64 and not a32:
        return Machine("aarch64", INFERRED, f"Features: {' '.join(sorted(a64))} (arm64 hwcaps)")
    if a32 and not a64:
        m = _ARM_ELF_PLATFORM.search(name)
        if m:
            return Machine(f"arm{m.group(1)}", INFERRED, f"Features: {' '.join(sorted(a32)[:4])} ...; {name}")
        arch = (first.get("CPU architecture") or "").strip()
        level = arch if arch.isdigit() else "7"
        return Machine(f"armv{level}l", INFERRED, f"Features: {' '.join(sorted(a32)[:4])} ... (32-bit ARM hwcaps)")
    if not features and ("aarch64" in name.lower() or first.get("CPU architecture", "").strip() == "8"):
        return Machine("aarch64", INFERRED, name or "CPU architecture: 8")
    return None  # no Features, or both vocabularies: not told


def _ppc(first: dict[str, str]) -> Machine:
    cpu = first.get("cpu", "")
    power = _POWER.match(cpu)
    if power and int(power.group(1)) >= POWER_LE_FROM:
        return Machine("ppc64le", INFERRED, f"cpu: {cpu} (POWER8 and later: little-endian Linux; byte order assumed)")
    if power or cpu.startswith(_PPC64_CORES) or first.get("platform") in ("pSeries", "PowerNV") or "MMU" in first:
        return Machine("ppc64", INFERRED, f"cpu: {cpu}")
    return Machine("ppc", INFERRED, f"cpu: {cpu}")


def infer(sec: Sections) -> Machine | None:
    """The architecture a cpuinfo's layout says, or None when it does not say one (see the module docstring)."""
    first = {**sec.common, **sec.first}
    vendor = first.get("vendor_id", "")
    if vendor.startswith("IBM/S390"):
        return Machine("s390x", INFERRED, f"vendor_id: {vendor}")
    family_line, isa_line = first.get("CPU Family", ""), first.get("ISA", "")
    if "loongson" in family_line.lower() or "loongarch" in isa_line.lower():
        bits = "64" if "loongarch64" in isa_line.split() or "64" in family_line else "32"
        return Machine(f"loongarch{bits}", INFERRED, f"CPU Family: {family_line}; ISA: {isa_line}".strip("; "))
    if vendor and "flags" in first and "cpu family" in first:
        flags = _tokens(first["flags"])
        no_lm = "lm" not in flags and len(flags) >= X86_MIN_REAL_FLAGS  # a whole line without long mode
        why = "no lm: a 32-bit CPU" if no_lm else "lm" if "lm" in flags else "flags cut short, x86_64 assumed"
        return Machine("i686" if no_lm else "x86_64", INFERRED, f"vendor_id: {vendor}, cpu family, flags ({why})")
    if "Features" in first or "CPU implementer" in first:
        return _arm(first)
    isa = first.get("isa", "")
    if isa.startswith(("rv64", "rv32")):
        return Machine(f"riscv{isa[2:4]}", INFERRED, f"isa: {isa.split('_')[0]}")
    cpu, kind = first.get("cpu", ""), first.get("type", "")
    if "sparc" in cpu.lower() or kind.startswith("sun4"):
        machine = "sparc64" if kind in ("sun4u", "sun4v") or "ultrasparc" in cpu.lower() else "sparc"
        return Machine(machine, INFERRED, f"cpu: {cpu}; type: {kind}".strip("; "))
    if cpu and ("pvr" in first.get("revision", "") or "timebase" in first or "platform" in first):
        return _ppc(first)
    model = first.get("cpu model", "")
    if model.upper().startswith("MIPS") or isa.startswith("mips"):
        machine = "mips64" if any(t.startswith("mips64") for t in isa.split()) else "mips"
        return Machine(machine, INFERRED, f"cpu model: {model}".strip())
    return None


def _read(path: Path, limit: int = MAX_UNAME_BYTES) -> str:
    try:
        with path.open("rb") as fh:
            return fh.read(limit).decode("ascii", errors="replace").strip()
    except OSError:
        return ""


def uname_machine(text: str) -> str:
    """The machine in a recorded ``uname -m`` (one word) or ``uname -a`` output; "" when none is named."""
    words = text.split()
    if len(words) == 1:
        return words[0].lower() if MACHINE_RE.match(words[0].lower()) else ""
    return next((w for w in reversed(words) if _UNAME_MACHINE.match(w)), "")


def recorded(procfs: Path) -> list[Machine]:
    """What the tree recorded: ``sys/kernel/arch`` and/or ``uname``; a ``uname`` naming no machine is an error."""
    out = []
    arch = _read(procfs / "sys" / "kernel" / "arch", 64)
    if arch:
        out.append(Machine(arch, RECORDED, "<procfs>/sys/kernel/arch"))
    text = _read(procfs / "uname")
    if text:
        machine = uname_machine(text)
        if not machine:
            raise SourceFormatError(f"{procfs / 'uname'} names no machine (want `uname -m` or `uname -a` output)")
        out.append(Machine(machine, RECORDED, "<procfs>/uname"))
    return out


def is_running_kernels(procfs: Path, probe: CpuProbe) -> str:
    """Why ``procfs`` is the running kernel's tree ("" when it is not): it is /proc, or its boot_id is ours."""
    try:
        if os.path.realpath(procfs) == str(LIVE_PROCFS):
            return "<procfs> is /proc"
    except OSError:
        pass
    running = probe.boot_id()
    if running and _read(procfs / "sys" / "kernel" / "random" / "boot_id", 64) == running:
        return "<procfs>/sys/kernel/random/boot_id is the running kernel's"
    return ""


def resolve(procfs: Path, sec: Sections, probe: CpuProbe | None = None, given: str | None = None) -> Machine:
    """The tree's machine by the order above; SourceFormatError when its sources disagree or none says one."""
    probe = probe if probe is not None else SyscallCpuProbe()
    candidates: list[Machine] = []
    if given:
        candidates.append(Machine(given.strip(), GIVEN, "--machine / path.machine"))
    tree = recorded(procfs)
    live = is_running_kernels(procfs, probe)
    if live:
        own = next((m for m in tree if m.evidence == "<procfs>/sys/kernel/arch"), None)
        candidates.append(
            Machine(own.machine, RUNNING, f"{live}; its sys/kernel/arch")
            if own is not None
            else Machine(probe.machine(), RUNNING, f"{live}; uname -m")
        )
        tree = [m for m in tree if m is not own]
    candidates.extend(tree)
    inferred = infer(sec)
    if inferred is not None:
        candidates.append(inferred)
    if not candidates:
        raise SourceFormatError(
            f"{procfs}: the architecture of this recorded tree is not known: it is not the running kernel's, "
            "records none (sys/kernel/arch, uname) and its cpuinfo has no layout this agent knows; "
            "state it with --machine (path.machine), e.g. --machine aarch64"
        )
    chosen = candidates[0]
    against = [m for m in candidates[1:] if family(m.machine) != family(chosen.machine)]
    if against:
        said = "; ".join(m.describe() for m in (chosen, *against))
        raise SourceFormatError(
            f"{procfs}: its architecture is contradictory: {said}. The tree mixes machines, or --machine is "
            "wrong: fix the tree (or remove its wrong sys/kernel/arch / uname), or state the right one with --machine"
        )
    return chosen
