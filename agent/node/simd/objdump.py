"""Exact cross-check of the byte-scan heuristic with binutils' ``objdump -d`` (on demand only, never on the
collection path): counts disassembled instructions that name a zmm register, an opmask register (k0-k7) or
an EVEX-only ymm/xmm register (16-31) — i.e. AVX-512 instructions. x86-64 only.
"""

from __future__ import annotations

import re
import shutil
import subprocess
from pathlib import Path

from inferwatch.agent.errors import ToolError

OBJDUMP_TIMEOUT_S = 120.0
_AVX512_OPERAND = re.compile(rb"%zmm\d|%k[0-7]\b|%[xy]mm(1[6-9]|2\d|3[01])\b|\{1to\d+\}")


def count_avx512_objdump(path: Path, timeout_s: float = OBJDUMP_TIMEOUT_S) -> int:
    """AVX-512 instructions in ``path`` according to ``objdump -d``; raise ToolError when it cannot run."""
    exe = shutil.which("objdump")
    if exe is None:
        raise ToolError("objdump not found (Debian: apt-get install binutils)")
    if not path.is_file():
        raise ToolError(f"{path} is not a file")
    try:
        proc = subprocess.run(
            [exe, "-d", "--no-show-raw-insn", "--", str(path)],
            capture_output=True,
            timeout=timeout_s,
            check=False,
        )
    except subprocess.TimeoutExpired:
        raise ToolError(f"objdump on {path} took longer than {timeout_s:g}s") from None
    if proc.returncode != 0:
        raise ToolError(f"objdump failed on {path}: {proc.stderr.decode(errors='replace').strip()[:200]}")
    return sum(1 for line in proc.stdout.splitlines() if _AVX512_OPERAND.search(line))
