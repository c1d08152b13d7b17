"""Which wide-SIMD instructions the code a process has mapped contains (AVX-512 on x86-64, SVE on AArch64).

Reads ``<procfs>/PID/maps`` for the files mapped executable, then each file's executable ``PT_LOAD``
segments (ELF program headers), and counts instruction encodings with a fast byte heuristic:

- x86-64 AVX-512: the EVEX prefix ``0x62 P0 P1 P2`` (``0x62`` is BOUND, invalid in 64-bit mode, so in
  64-bit code it always starts an EVEX instruction) with P0 bits 3:2 = 0 and map 1..3, P1 bit 2 = 1. A
  byte scan also hits ``0x62`` inside ModRM, displacement and immediate bytes, which satisfy the bit
  pattern about 1 time in 6, so isolated hits are noise; real AVX-512 code is dense. Only hits that
  have another hit within :data:`CLUSTER_BYTES` bytes are counted (a random hit has a ~1% chance of a
  neighbour). Measured against ``objdump -d``: llama.cpp's native ``libggml-cpu.so`` 31,109 (objdump
  31,967), glibc 2.36 2,357 (3,033), and 0-48 hits in libraries objdump finds none in (libllama,
  libmtmd, libstdc++, libz). ``zmm`` counts the subset with EVEX.L'L = 10 (512-bit).
- AArch64 SVE: 4-byte aligned words whose op0 (bits 28:25) is ``0010``, the SVE encoding group; counted
  only when two such words are adjacent (literal pools can hold anything).

This is a heuristic, not a disassembler: it can overcount by a handful and it never sees JIT code in
anonymous executable mappings (oneDNN, Inductor), which is reported as a count of such mappings. Use
``objdump -d`` (``inferwatch simd --objdump``) for an exact cross-check on demand.

Results are cached per file identity (device, inode, size, mtime), so the cost (~50 ms per 10 MB of code)
is paid once per library, not every collection; at most :data:`MAX_SEGMENT_BYTES` per file are read.
"""

from __future__ import annotations

import re
import struct
import threading
from dataclasses import dataclass
from pathlib import Path

from inferwatch.agent.errors import NoDataError

CLUSTER_BYTES = 24
MAX_SEGMENT_BYTES = 512 << 20
MAX_FILES = 256

# P0: R X B R' 0 0 m m with mm in 1..3; P1: W vvvv 1 pp.
_P0 = bytes(b for b in range(256) if (b & 0x0C) == 0 and (b & 0x03) != 0)
_P1 = bytes(b for b in range(256) if b & 0x04)
_EVEX = re.compile(b"\\x62[" + re.escape(_P0) + b"][" + re.escape(_P1) + b"](.)", re.DOTALL)

_PF_X = 1
_PT_LOAD = 1
_EM_X86_64 = 62
_EM_AARCH64 = 183


@dataclass(frozen=True, slots=True)
class CodeCount:
    """Wide-SIMD instructions found in one file's executable segments."""

    path: str
    machine: str  # x86_64 | aarch64 | other
    code_bytes: int
    avx512: int = 0
    zmm: int = 0
    sve: int = 0

    @property
    def count(self) -> int:
        return self.avx512 if self.machine == "x86_64" else self.sve


@dataclass(frozen=True, slots=True)
class Mapping:
    path: str
    identity: tuple[int, int]  # (device, inode) as /proc/PID/maps shows them


def executable_mappings(procfs: Path, pid: int) -> tuple[list[Mapping], int]:
    """Files mapped executable by ``pid`` (deduplicated) and the number of anonymous executable mappings."""
    try:
        text = (procfs / str(pid) / "maps").read_text(encoding="utf-8", errors="replace")
    except FileNotFoundError:
        raise NoDataError(f"process {pid} is gone") from None
    except PermissionError:
        raise NoDataError(
            f"cannot read {procfs}/{pid}/maps", hint="run the agent as the runtime's user or with CAP_SYS_PTRACE"
        ) from None
    seen: dict[str, Mapping] = {}
    anon = 0
    for line in text.splitlines():
        parts = line.split(None, 5)
        if len(parts) < 5 or "x" not in parts[1]:
            continue
        path = parts[5].strip() if len(parts) == 6 else ""
        if not path.startswith("/"):
            if path not in ("[vdso]", "[vsyscall]"):
                anon += 1
            continue
        if path.endswith(" (deleted)"):
            path = path[: -len(" (deleted)")]
        dev_major, _, dev_minor = parts[3].partition(":")
        try:
            identity = ((int(dev_major, 16) << 8) | int(dev_minor, 16), int(parts[4]))
        except ValueError:
            continue
        seen.setdefault(path, Mapping(path, identity))
    return list(seen.values())[:MAX_FILES], anon


def _segments(data: bytes) -> tuple[str, list[tuple[int, int]]]:
    """(machine, [(offset, size)]) of the executable PT_LOAD segments of a 64-bit little-endian ELF image."""
    if len(data) < 64 or data[:4] != b"\x7fELF" or data[4] != 2 or data[5] != 1:
        return "other", []
    machine_id = struct.unpack_from("<H", data, 18)[0]
    machine = {_EM_X86_64: "x86_64", _EM_AARCH64: "aarch64"}.get(machine_id, "other")
    (phoff,) = struct.unpack_from("<Q", data, 32)
    phentsize, phnum = struct.unpack_from("<HH", data, 54)
    out = []
    for i in range(min(phnum, 64)):
        off = phoff + i * phentsize
        if off + 56 > len(data):
            break
        p_type, p_flags, p_offset, _vaddr, _paddr, p_filesz = struct.unpack_from("<IIQQQQ", data, off)
        if p_type == _PT_LOAD and p_flags & _PF_X and p_filesz:
            out.append((p_offset, min(p_filesz, MAX_SEGMENT_BYTES)))
    return machine, out


def count_avx512(code: bytes) -> tuple[int, int]:
    """(EVEX instructions, of which 512-bit) in x86-64 code, counting only clustered hits (see module doc)."""
    hits = [(m.start(), (m.group(1)[0] >> 5) & 0x3 == 0x2) for m in _EVEX.finditer(code)]
    total = zmm = 0
    for i, (pos, wide) in enumerate(hits):
        near = (i > 0 and pos - hits[i - 1][0] <= CLUSTER_BYTES) or (
            i + 1 < len(hits) and hits[i + 1][0] - pos <= CLUSTER_BYTES
        )
        if near:
            total += 1
            zmm += wide
    return total, zmm


def count_sve(code: bytes) -> int:
    """SVE-group instruction words in AArch64 code, counting only words with an SVE neighbour."""
    n = len(code) // 4
    words = struct.unpack_from(f"<{n}I", code)
    sve = [((w >> 25) & 0xF) == 0b0010 and w != 0 for w in words]
    return sum(1 for i, s in enumerate(sve) if s and ((i > 0 and sve[i - 1]) or (i + 1 < n and sve[i + 1])))


def scan_file(path: Path) -> CodeCount:
    """Count wide-SIMD instructions in the executable segments of one ELF file."""
    with open(path, "rb") as f:
        head = f.read(4096)
        machine, segments = _segments(head)
        avx512 = zmm = sve = code_bytes = 0
        for offset, size in segments:
            f.seek(offset)
            code = f.read(size)
            code_bytes += len(code)
            if machine == "x86_64":
                a, z = count_avx512(code)
                avx512 += a
                zmm += z
            elif machine == "aarch64":
                sve += count_sve(code)
    return CodeCount(str(path), machine, code_bytes, avx512, zmm, sve)


class CodeScanCache:
    """Scan results per file identity; a file is read again only when it changes. Thread-safe."""

    def __init__(self) -> None:
        self._lock = threading.Lock()
        self._cache: dict[tuple[str, int, int, int, int], CodeCount] = {}
        self.scans = 0

    def get(self, path: Path, root: Path = Path("/")) -> CodeCount:
        """Scan ``path`` (as seen from ``root``, e.g. ``/proc/PID/root``) or return the cached result."""
        real = root / str(path).lstrip("/")
        st = real.stat()
        key = (str(path), st.st_dev, st.st_ino, st.st_size, st.st_mtime_ns)
        with self._lock:
            hit = self._cache.get(key)
        if hit is not None:
            return hit
        result = scan_file(real)
        result = CodeCount(str(path), result.machine, result.code_bytes, result.avx512, result.zmm, result.sve)
        with self._lock:
            self._cache[key] = result
            self.scans += 1
        return result
