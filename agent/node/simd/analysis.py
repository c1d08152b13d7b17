"""Is the runtime executing its wide-SIMD path while it serves? Evidence combined into one verdict.

Inputs per observation window (between two calls of :meth:`SimdAnalyzer.observe`):

- capable: the CPU flag (``avx512f`` on x86, ``sve`` on AArch64) reported by every CPU in ``<procfs>/cpuinfo``,
  read for the kernel's architecture (``machine``, by default :func:`platform.machine`), never guessed from
  which lines the file has;
- code present: AVX-512 / SVE instructions in the executable code the runtime has mapped, outside the C
  library, the dynamic loader and other system libraries with their own AVX-512 code (OpenSSL, zlib: see
  ``_SYSTEM``) (:mod:`inferwatch.agent.node.simd.codescan`, cached per file);
- threads active (x86): threads whose ``AVX512_elapsed_ms`` says AVX-512 state was in use since the
  previous observation (last-use time = now − elapsed > previous observation time);
- attributable (x86): thread activity means engine compute only when glibc's own AVX-512 string code is
  off in the runtime (``GLIBC_TUNABLES`` masks AVX512F and AVX512VL) or the C library holds no AVX-512;
- PMU (AArch64): ``SVE_INST_RETIRED`` > 0 over the window (:mod:`inferwatch.agent.node.simd.pmu`), where permitted;
- serving: the runtime used at least ``busy_cpu`` cores of CPU time over the window.

Verdict per feature: ``used`` | ``unused`` (capable, serving, wide path not executed) | ``idle`` (not
serving: no conclusion) | ``not_capable`` | ``unknown`` (no per-thread signal or PMU, and code present).
``used`` is True/False only for a determinate verdict, None otherwise (the metric is then absent).
"""

from __future__ import annotations

import platform
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from inferwatch.agent.errors import InferwatchError, NoDataError
from inferwatch.agent.node.host.cpuinfo import read_cpuinfo
from inferwatch.agent.node.simd import codescan, pmu
from inferwatch.agent.node.simd.proc import (
    RECOMMENDED_TUNABLES,
    glibc_avx512_disabled,
    glibc_tunables,
    read_threads,
)

DEFAULT_BUSY_CPU = 0.05  # cores: below this the runtime is idle and no verdict is drawn
# Per file, fewer heuristic hits than this (absolute, and per MiB of code) are treated as noise. Measured:
# libraries without AVX-512 (objdump: 0) score 0-48 hits, <= 35 per MiB (llama.cpp's libllama, libmtmd,
# libllama-common; Go's prometheus 43 in 21 MiB); the native libggml-cpu.so scores 31,109 (objdump: 31,967),
# ~23,000 per MiB. See agent/node/simd/codescan.py and docs/llamacpp.md.
MIN_FILE_INSTRUCTIONS = 64
ARCH_STATUS_SLACK_MS = 20.0  # AVX512_elapsed_ms resolution is a jiffy (up to 10 ms at HZ=100)
MIN_FILE_INSTRUCTIONS_PER_MIB = 100


def _present(c: codescan.CodeCount) -> bool:
    mib = max(c.code_bytes / (1 << 20), 1e-9)
    return c.count >= MIN_FILE_INSTRUCTIONS and c.count / mib >= MIN_FILE_INSTRUCTIONS_PER_MIB


_GLIBC_CORE = ("libc.so", "libc-", "ld-linux", "ld64.so", "libc.musl", "ld-musl")
# System libraries with AVX-512 code of their own that is not the runtime's compute (string functions, TLS
# and hashing, compression). Measured: llama-server maps libcrypto.so.3 (1,704 AVX-512 instructions, used only
# for TLS), so without this list an AVX2-only build would look like it had AVX-512 code.
_SYSTEM = (
    *_GLIBC_CORE,
    "libcrypto.so",
    "libssl.so",
    "libgcrypt.so",
    "libnettle.so",
    "libhogweed.so",
    "libgnutls.so",
    "libz.so",
    "libzstd.so",
    "liblzma.so",
    "libsystemd.so",
)


def _is_glibc_core(path: str) -> bool:
    name = path.rsplit("/", 1)[-1]
    return any(name.startswith(p) for p in _GLIBC_CORE)


def _is_system(path: str) -> bool:
    name = path.rsplit("/", 1)[-1]
    return any(name.startswith(p) for p in _SYSTEM)


@dataclass(frozen=True, slots=True)
class FeatureReport:
    """What one observation window says about one SIMD feature of the runtime."""

    feature: str  # avx512 | sve
    capable: bool
    code_instructions: int  # outside the C library / loader
    libc_instructions: int
    threads_total: int
    threads_active: int | None  # None: no per-thread signal on this kernel/arch
    attributable: bool
    pmu_ratio: float | None  # SVE / all instructions retired over the window, where the PMU permits
    busy_cpu: float  # cores used by the runtime over the window
    serving: bool
    used: bool | None
    verdict: str
    summary: str
    evidence: dict[str, Any] = field(default_factory=dict)

    @property
    def code_present(self) -> bool:
        return self.code_instructions > 0


class SimdAnalyzer:
    """Stateful per runtime process: keeps the previous observation to form a window."""

    def __init__(
        self,
        procfs: Path,
        pid: int,
        busy_cpu: float = DEFAULT_BUSY_CPU,
        cache: codescan.CodeScanCache | None = None,
        machine: str | None = None,
    ) -> None:
        self.procfs = procfs
        self.pid = pid
        self.busy_cpu = busy_cpu
        self.cache = cache or codescan.CodeScanCache()
        self.machine = machine or platform.machine()
        self._prev: tuple[float, float] | None = None  # (monotonic time, runtime CPU seconds)
        self._pmu: pmu.ThreadCounters | None = None
        self._pmu_error: str | None = None
        # Read once per runtime process: the kernel's CPU flags change only with a reboot, and on x86 every
        # read of /proc/cpuinfo asks each CPU for its frequency (an interrupt on every core the runtime uses).
        self._flags: set[str] | None = None
        # Per mapping as /proc/PID/maps names it (path, device, inode): the file this process maps does not
        # change under it, so a cycle re-reads maps but stats and scans nothing it has seen. The shared cache
        # (keyed by stat, size and mtime) serves a new process mapping the same files.
        self._scanned: dict[tuple[str, tuple[int, int]], codescan.CodeCount] = {}
        # glibc reads GLIBC_TUNABLES once, at the process's start: read it once per process too.
        self._tunables: str | None = None

    def _cpu_flags(self) -> set[str]:
        """Flags every CPU reports, read as the kernel of ``machine`` writes cpuinfo (bounded read)."""
        try:
            return set(read_cpuinfo(self.procfs, self.machine).flags)
        except (InferwatchError, OSError):
            return set()

    def close(self) -> None:
        if self._pmu is not None:
            self._pmu.close()
            self._pmu = None

    def code(self) -> tuple[list[codescan.CodeCount], int, list[str]]:
        """Scan results for every executable file the runtime maps, anonymous exec mappings, errors."""
        mappings, anon = codescan.executable_mappings(self.procfs, self.pid)
        out, errors = [], []
        root = self.procfs / str(self.pid) / "root"
        if len(self._scanned) > 4 * codescan.MAX_FILES:  # libraries loaded and unloaded over a long life
            self._scanned.clear()
        for m in mappings:
            key = (m.path, m.identity)
            hit = self._scanned.get(key)
            if hit is not None:
                out.append(hit)
                continue
            try:
                hit = self.cache.get(Path(m.path), root)
            except OSError:
                try:
                    hit = self.cache.get(Path(m.path))
                except OSError as exc:
                    errors.append(f"{m.path}: {exc.strerror or exc}")
                    continue
            self._scanned[key] = hit
            out.append(hit)
        return out, anon, errors

    def observe(self) -> list[FeatureReport]:
        """One observation; the window is the time since the previous call (first call: window of 0)."""
        now = time.monotonic()
        threads = read_threads(self.procfs, self.pid)
        cpu_s = sum(t.cpu_s for t in threads)
        prev = self._prev
        self._prev = (now, cpu_s)
        window_s = now - prev[0] if prev else 0.0
        busy = (cpu_s - prev[1]) / window_s if prev and window_s > 0 else 0.0
        serving = prev is not None and busy >= self.busy_cpu
        if self._flags is None:
            self._flags = self._cpu_flags()
        flags = self._flags
        counts, anon, errors = self.code()
        code_by_file = {c.path: c.count for c in counts if _present(c)}
        noise = {c.path: c.count for c in counts if c.count and not _present(c)}
        compute = sum(n for p, n in code_by_file.items() if not _is_system(p))
        libc = sum(n for p, n in code_by_file.items() if _is_glibc_core(p))
        evidence_system = {p: n for p, n in code_by_file.items() if _is_system(p)}
        evidence: dict[str, Any] = {
            "pid": self.pid,
            "window_s": round(window_s, 3),
            "busy_cpu": round(busy, 3),
            "code_by_file": {p: n for p, n in code_by_file.items() if not _is_system(p)},
            "system_code_by_file": evidence_system,
            "anonymous_exec_mappings": anon,
        }
        if noise:
            evidence["below_threshold"] = noise
        if errors:
            evidence["unreadable"] = errors
        if self.machine in ("x86_64", "AMD64"):
            return [self._avx512(flags, threads, window_s, prev, busy, serving, compute, libc, evidence)]
        if self.machine == "aarch64":
            return [self._sve(flags, threads, busy, serving, compute, libc, evidence)]
        return []

    def _avx512(
        self,
        flags: set[str],
        threads: list[Any],
        window_s: float,
        prev: tuple[float, float] | None,
        busy: float,
        serving: bool,
        compute: int,
        libc: int,
        evidence: dict[str, Any],
    ) -> FeatureReport:
        capable = "avx512f" in flags
        has_signal = any(t.avx512_elapsed_ms is not None for t in threads)
        active_threads = []
        if has_signal and prev is not None:
            # last use inside the window: elapsed < window. The kernel counts in jiffies (4-10 ms), and a
            # child's main thread inherits its parent's last use from just before the fork, so a use exactly
            # at the window's start is not counted.
            window_ms = window_s * 1000.0 - ARCH_STATUS_SLACK_MS
            active_threads = [
                t for t in threads if t.avx512_elapsed_ms is not None and 0 <= t.avx512_elapsed_ms < window_ms
            ]
        tunables = self._tunables
        if tunables is None:
            tunables = self._tunables = glibc_tunables(self.procfs, self.pid)  # None (unreadable): next cycle
        attributable = glibc_avx512_disabled(tunables) or libc == 0
        evidence.update(
            glibc_tunables=tunables,
            threads_active=[f"{t.tid}:{t.name}:{t.avx512_elapsed_ms}ms" for t in active_threads][:32],
        )
        n_active = len(active_threads) if has_signal else None

        def report(used: bool | None, verdict: str, summary: str) -> FeatureReport:
            return FeatureReport(
                "avx512",
                capable,
                compute,
                libc,
                len(threads),
                n_active,
                attributable,
                None,
                busy,
                serving,
                used,
                verdict,
                summary,
                evidence,
            )

        if not capable:
            return report(None, "not_capable", "the CPU has no AVX-512 (avx512f not in cpuinfo flags)")
        if not serving:
            return report(None, "idle", f"runtime idle ({busy:.2f} cores over the window): no verdict")
        if compute == 0:
            return report(
                False,
                "unused",
                "capable but unused while serving: the runtime's mapped code has no AVX-512 instructions "
                "(a build without AVX-512, e.g. GGML_NATIVE=OFF); any AVX-512 activity is glibc's string code",
            )
        if n_active is None:
            return report(None, "unknown", f"AVX-512 code present ({compute} instructions); no arch_status here")
        if n_active == 0:
            return report(
                False,
                "unused",
                f"capable but unused while serving: AVX-512 code is mapped ({compute} instructions) but no thread "
                "ran AVX-512 in the window (fallback kernel or not dispatched)",
            )
        if attributable:
            return report(True, "used", f"{n_active} thread(s) ran AVX-512 while serving; code present ({compute})")
        return report(
            True,
            "used",
            f"{n_active} thread(s) show AVX-512 state and AVX-512 code is mapped ({compute}); glibc's own AVX-512 "
            f"is not separated (start the runtime with GLIBC_TUNABLES={RECOMMENDED_TUNABLES} for certainty)",
        )

    def _sve(
        self,
        flags: set[str],
        threads: list[Any],
        busy: float,
        serving: bool,
        compute: int,
        libc: int,
        evidence: dict[str, Any],
    ) -> FeatureReport:
        capable = "sve" in flags
        ratio: float | None = None
        if capable and self._pmu_error is None:
            try:
                if self._pmu is None:
                    self._pmu = pmu.ThreadCounters(pmu.SVE_EVENTS)
                delta = self._pmu.sample([t.tid for t in threads])
                if delta["all"] > 0:
                    ratio = delta["sve"] / delta["all"]
                evidence["pmu"] = delta
            except NoDataError as exc:
                self._pmu_error = str(exc)
                self.close()
        if self._pmu_error:
            evidence["pmu_error"] = self._pmu_error

        def report(used: bool | None, verdict: str, summary: str) -> FeatureReport:
            return FeatureReport(
                "sve",
                capable,
                compute,
                libc,
                len(threads),
                None,
                ratio is not None,
                ratio,
                busy,
                serving,
                used,
                verdict,
                summary,
                evidence,
            )

        if not capable:
            return report(None, "not_capable", "the CPU has no SVE (sve not in cpuinfo Features)")
        if not serving:
            return report(None, "idle", f"runtime idle ({busy:.2f} cores over the window): no verdict")
        if compute == 0:
            return report(False, "unused", "capable but unused while serving: no SVE code in the runtime's mapped code")
        if ratio is None:
            return report(None, "unknown", f"SVE code present ({compute} words); PMU not available to confirm use")
        if ratio > 0:
            return report(True, "used", f"SVE is {ratio:.1%} of retired instructions while serving")
        return report(False, "unused", "capable but unused while serving: SVE code mapped but no SVE retired")
