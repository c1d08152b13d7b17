"""AT_HWCAP / AT_HWCAP2 from ``<procfs>/self/auxv``, decoded to the kernel's feature names on arm64.

The auxiliary vector is an array of native ``(unsigned long key, unsigned long value)`` pairs ending
with ``AT_NULL`` (``include/uapi/linux/auxvec.h``); ``os.getauxval`` does not exist in CPython 3.11,
so the file is parsed with ``struct.iter_unpack("@LL", ...)``. HWCAPs are system-wide, so the agent's
own auxv describes what every process on this kernel may use.

On arm64 the bits are the kernel's hwcaps (``arch/arm64/include/uapi/asm/hwcap.h``) and the names are
exactly the ``Features`` tokens of /proc/cpuinfo (``hwcap_str[]`` in ``arch/arm64/kernel/cpuinfo.c``),
which the kernel prints from the same bits: the two are independent reads of one fact, so a
disagreement says the cpuinfo read is not this kernel's. On x86 AT_HWCAP is CPUID leaf 1 EDX (pre-AVX
features) and AT_HWCAP2 holds two unrelated bits; the raw values are reported, not compared.
"""

from __future__ import annotations

import struct
from dataclasses import dataclass
from pathlib import Path

from inferwatch.agent.errors import SourceFormatError

AT_NULL = 0
AT_HWCAP = 16
AT_HWCAP2 = 26
MAX_AUXV_BYTES = 64 << 10  # a real auxv holds ~25 pairs (~400 bytes); cap garbage reads
_PAIR = struct.Struct("@LL")

# Bit i of AT_HWCAP / AT_HWCAP2 -> /proc/cpuinfo Features token (Linux 6.15 hwcap_str[]).
ARM64_HWCAP: tuple[str, ...] = (
    "fp", "asimd", "evtstrm", "aes", "pmull", "sha1", "sha2", "crc32",
    "atomics", "fphp", "asimdhp", "cpuid", "asimdrdm", "jscvt", "fcma", "lrcpc",
    "dcpop", "sha3", "sm3", "sm4", "asimddp", "sha512", "sve", "asimdfhm",
    "dit", "uscat", "ilrcpc", "flagm", "ssbs", "sb", "paca", "pacg",
    "gcs", "cmpbr", "fprcvt", "f8mm8", "f8mm4", "svef16mm", "sveeltperm", "sveaes2",
    "svebfscale", "sve2p2", "sme2p2", "smesbitperm", "smeaes", "smesfexpa", "smestmop", "smesmop4",
)  # fmt: skip
ARM64_HWCAP2: tuple[str, ...] = (
    "dcpodp", "sve2", "sveaes", "svepmull", "svebitperm", "svesha3", "svesm4", "flagm2",
    "frint", "svei8mm", "svef32mm", "svef64mm", "svebf16", "i8mm", "bf16", "dgh",
    "rng", "bti", "mte", "ecv", "afp", "rpres", "mte3", "sme",
    "smei16i64", "smef64f64", "smei8i32", "smef16f32", "smeb16f32", "smef32f32", "smefa64", "wfxt",
    "ebf16", "sveebf16", "cssc", "rprfm", "sve2p1", "sme2", "sme2p1", "smei16i32",
    "smebi32i32", "smeb16b16", "smef16f16", "mops", "hbc", "sveb16b16", "lrcpc3", "lse128",
    "fpmr", "lut", "faminmax", "f8cvt", "f8fma", "f8dp4", "f8dp2", "f8e4m3",
    "f8e5m2", "smelutv2", "smef8f16", "smef8f32", "smesf8fma", "smesf8dp4", "smesf8dp2", "poe",
)  # fmt: skip
KNOWN_ARM64 = frozenset(ARM64_HWCAP) | frozenset(ARM64_HWCAP2)


@dataclass(frozen=True, slots=True)
class Hwcaps:
    """The two hwcap words of this kernel; ``features`` decoded on arm64 only (None elsewhere)."""

    hwcap: int
    hwcap2: int
    features: frozenset[str] | None
    unknown_bits: tuple[str, ...] = ()  # set bits newer than our table: "AT_HWCAP bit 48"


def parse_auxv(data: bytes) -> dict[int, int]:
    """Native ``(key, value)`` pairs up to ``AT_NULL``; a trailing partial pair is a format error."""
    if len(data) % _PAIR.size:
        raise SourceFormatError(f"auxv is {len(data)} bytes, not a multiple of {_PAIR.size}")
    out: dict[int, int] = {}
    for key, value in _PAIR.iter_unpack(data):
        if key == AT_NULL:
            break
        out[key] = value
    return out


def _bits(word: int, names: tuple[str, ...], label: str) -> tuple[set[str], list[str]]:
    found: set[str] = set()
    unknown: list[str] = []
    for bit in range(word.bit_length()):
        if word >> bit & 1:
            if bit < len(names):
                found.add(names[bit])
            else:
                unknown.append(f"{label} bit {bit}")
    return found, unknown


def decode(hwcap: int, hwcap2: int, arch: str) -> Hwcaps:
    if arch != "aarch64":
        return Hwcaps(hwcap, hwcap2, None)
    f1, u1 = _bits(hwcap, ARM64_HWCAP, "AT_HWCAP")
    f2, u2 = _bits(hwcap2, ARM64_HWCAP2, "AT_HWCAP2")
    return Hwcaps(hwcap, hwcap2, frozenset(f1 | f2), tuple(u1 + u2))


def read_hwcaps(procfs: Path, arch: str) -> Hwcaps | None:
    """Read ``<procfs>/self/auxv``; None when it is absent or unreadable (recorded procfs trees)."""
    try:
        with (procfs / "self" / "auxv").open("rb") as fh:
            data = fh.read(MAX_AUXV_BYTES + 1)
    except OSError:
        return None
    if len(data) > MAX_AUXV_BYTES:
        raise SourceFormatError(f"{procfs / 'self' / 'auxv'} is larger than {MAX_AUXV_BYTES} bytes")
    aux = parse_auxv(data)
    if AT_HWCAP not in aux:
        return None
    return decode(aux[AT_HWCAP], aux.get(AT_HWCAP2, 0), arch)


def compare(hw: Hwcaps, cpuinfo_flags: frozenset[str]) -> tuple[list[str], list[str]]:
    """(in AT_HWCAP but not cpuinfo, in cpuinfo but not AT_HWCAP), over tokens the table knows."""
    if hw.features is None:
        return [], []
    known_flags = cpuinfo_flags & KNOWN_ARM64
    return sorted(hw.features - cpuinfo_flags), sorted(known_flags - hw.features)


def pack_auxv(pairs: dict[int, int]) -> bytes:
    """Build native auxv bytes (tests, recorded trees): the pairs, then AT_NULL."""
    return b"".join(_PAIR.pack(k, v) for k, v in pairs.items()) + _PAIR.pack(AT_NULL, 0)
