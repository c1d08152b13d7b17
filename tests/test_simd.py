"""SIMD utilisation: code scan, procfs parsing, glibc separation, PMU plumbing, the collector on real processes."""

from __future__ import annotations

import os
import platform
import struct
import subprocess
import sys
import time
from pathlib import Path

import pytest

from inferwatch.agent.config import RuntimeSettings, Settings, SimdSettings
from inferwatch.agent.errors import NoDataError
from inferwatch.agent.node.collectors.simd import SimdCollector
from inferwatch.agent.node.host.runtime import RuntimeLocator, pid_listening_on
from inferwatch.agent.node.runner import run_collection
from inferwatch.agent.node.simd import codescan, pmu
from inferwatch.agent.node.simd.analysis import SimdAnalyzer
from inferwatch.agent.node.simd.proc import glibc_avx512_disabled, read_arch_status, read_threads
from inferwatch.agent.node.wiring import collect_context
from tests.conftest import free_port
from tests.tools import require, skip_if_perf_events_forbidden

X86 = platform.machine() == "x86_64"
AVX512 = X86 and "avx512f" in Path("/proc/cpuinfo").read_text()
LIBC = Path("/lib/x86_64-linux-gnu/libc.so.6")
BUSY = "import sys,time\nt=time.time()\nwhile time.time()-t<float(sys.argv[1]): ('x'*100000).find('y')\n"


# EVEX vaddps zmm0,zmm1,zmm2 = 62 f1 74 48 58 c2 ; vpaddd ymm16, ymm17, ymm18 = 62 a1 75 20 fe c2
ZMM_ADD = bytes.fromhex("62f1744858c2")
YMM16_ADD = bytes.fromhex("62a17520fec2")
NOP = b"\x90"


def test_evex_clusters_counted_isolated_hits_ignored() -> None:
    dense = (ZMM_ADD + YMM16_ADD) * 50
    assert codescan.count_avx512(dense) == (100, 50)
    # one EVEX-looking byte pattern alone in a sea of other code is noise, not AVX-512 code
    lonely = NOP * 100 + ZMM_ADD + NOP * 100
    assert codescan.count_avx512(lonely) == (0, 0)
    # 0x62 followed by a P0 with reserved bits set is not EVEX
    assert codescan.count_avx512(bytes.fromhex("626c744858c2") * 20) == (0, 0)


def test_sve_words_counted() -> None:
    sve_add = 0x04A00000  # add z0.d, z0.d, z0.d family: op0 = 0010
    neon_add = 0x4EA08400  # add v0.4s, v0.4s, v0.4s: op0 = 0111
    assert codescan.count_sve(struct.pack("<4I", sve_add, sve_add + 1, neon_add, neon_add)) == 2
    assert codescan.count_sve(struct.pack("<3I", sve_add, neon_add, sve_add)) == 0


def _elf(machine: int, code: bytes) -> bytes:
    """A minimal 64-bit little-endian ELF with one executable PT_LOAD segment holding ``code``."""
    fields = (3, machine, 1, 0, 64, 0, 0, 64, 56, 1, 0, 0, 0)
    ehdr = b"\x7fELF\x02\x01\x01" + bytes(9) + struct.pack("<HHIQQQIHHHHHH", *fields)
    off = 64 + 56
    phdr = struct.pack("<IIQQQQQQ", 1, 5, off, 0, 0, len(code), len(code), 4096)
    return ehdr + phdr + code


def test_scan_file_reads_only_executable_segments(tmp_path: Path) -> None:
    f = tmp_path / "lib.so"
    f.write_bytes(_elf(62, (ZMM_ADD * 30)) + ZMM_ADD * 1000)  # trailing bytes are outside the segment
    r = codescan.scan_file(f)
    assert (r.machine, r.avx512, r.zmm, r.code_bytes) == ("x86_64", 30, 30, 180)
    f.write_bytes(b"not an elf at all" * 100)
    assert codescan.scan_file(f).avx512 == 0


@pytest.mark.skipif(not LIBC.exists(), reason="Debian x86-64 glibc path")
def test_scan_matches_objdump_on_real_libraries() -> None:
    """The heuristic agrees with the disassembler on glibc (has EVEX code) and libz (has none)."""
    require("objdump")
    from inferwatch.agent.node.simd.objdump import count_avx512_objdump

    libc = codescan.scan_file(LIBC).avx512
    exact = count_avx512_objdump(LIBC)
    assert exact > 1000
    assert 0.5 * exact <= libc <= 1.5 * exact
    libz = Path("/lib/x86_64-linux-gnu/libz.so.1")
    if libz.exists():
        assert codescan.scan_file(libz).avx512 == 0 == count_avx512_objdump(libz)


def test_cache_scans_each_file_once(tmp_path: Path) -> None:
    f = tmp_path / "lib.so"
    f.write_bytes(_elf(62, ZMM_ADD * 10))
    cache = codescan.CodeScanCache()
    assert cache.get(f).avx512 == 10
    assert cache.get(f).avx512 == 10
    assert cache.scans == 1
    time.sleep(0.01)
    f.write_bytes(_elf(62, ZMM_ADD * 20))
    assert cache.get(f).avx512 == 20
    assert cache.scans == 2


def test_maps_parsing(tmp_path: Path) -> None:
    proc = tmp_path / "proc" / "42"
    proc.mkdir(parents=True)
    (proc / "maps").write_text(
        "7f00-7f10 r-xp 00000000 08:01 1234 /usr/lib/libggml-cpu.so\n"
        "7f10-7f20 r--p 00010000 08:01 1234 /usr/lib/libggml-cpu.so\n"
        "7f20-7f30 r-xp 00000000 08:01 99 /usr/lib/libc.so.6 (deleted)\n"
        "7f30-7f40 rwxp 00000000 00:00 0 \n"
        "7f40-7f50 r-xp 00000000 00:00 0 [vdso]\n"
        "garbage line\n"
    )
    maps, anon = codescan.executable_mappings(tmp_path / "proc", 42)
    assert [m.path for m in maps] == ["/usr/lib/libggml-cpu.so", "/usr/lib/libc.so.6"]
    assert anon == 1
    with pytest.raises(NoDataError):
        codescan.executable_mappings(tmp_path / "proc", 43)


def test_glibc_tunables_separation() -> None:
    assert glibc_avx512_disabled("glibc.cpu.hwcaps=-AVX512F,-AVX512VL,-AVX512BW,-AVX512DQ,-AVX512CD")
    assert glibc_avx512_disabled("glibc.malloc.arena_max=2:glibc.cpu.hwcaps=-AVX512VL,-AVX512F")
    # verified on glibc 2.36: masking only one of them leaves EVEX string functions selected
    assert not glibc_avx512_disabled("glibc.cpu.hwcaps=-AVX512F")
    assert not glibc_avx512_disabled("glibc.cpu.hwcaps=-AVX512BW,-AVX512VL")
    assert not glibc_avx512_disabled("")
    assert not glibc_avx512_disabled(None)


def test_arch_status_parsing(tmp_path: Path) -> None:
    f = tmp_path / "arch_status"
    f.write_text("AVX512_elapsed_ms:\t-1\n")
    assert read_arch_status(f) == -1
    f.write_text("AVX512_elapsed_ms:\t24\n")
    assert read_arch_status(f) == 24
    f.write_bytes(b"\xff\xfe garbage")
    assert read_arch_status(f) is None
    assert read_arch_status(tmp_path / "missing") is None


def _spawn(seconds: float, tunables: str | None) -> subprocess.Popen[bytes]:
    env = {k: v for k, v in os.environ.items() if k != "GLIBC_TUNABLES"}
    if tunables:
        env["GLIBC_TUNABLES"] = tunables
    return subprocess.Popen([sys.executable, "-c", BUSY, str(seconds)], env=env)


@pytest.mark.skipif(not AVX512, reason="needs an x86 CPU with AVX-512 and arch_status")
def test_glibc_marks_threads_unless_tunables_disable_it() -> None:
    """The caveat, measured: a plain Python loop shows AVX-512 use (glibc); with the tunable it does not."""
    results = {}
    for tunables in (None, "glibc.cpu.hwcaps=-AVX512F,-AVX512VL"):
        proc = _spawn(3.0, tunables)
        try:
            time.sleep(0.3)  # the main thread's inherited last use (the parent's, before fork) falls before the window
            analyzer = SimdAnalyzer(Path("/proc"), proc.pid, busy_cpu=0.01)
            analyzer.observe()
            time.sleep(1.5)
            (report,) = analyzer.observe()
        finally:
            proc.kill()
            proc.wait()
        results[tunables] = report
    plain, masked = results[None], results["glibc.cpu.hwcaps=-AVX512F,-AVX512VL"]
    assert plain.libc_instructions > 1000 and plain.code_instructions == 0
    assert plain.threads_active and plain.threads_active >= 1 and not plain.attributable
    assert masked.threads_active == 0 and masked.attributable
    # no AVX-512 code outside libc: "unused" either way, and the finding says why
    for r in (plain, masked):
        assert (r.verdict, r.used) == ("unused", False), r


def test_pmu_software_counter_on_a_real_process() -> None:
    """perf_event_open plumbing, checked with the task-clock software event (x86 VMs have no hardware PMU)."""
    if platform.machine() not in ("x86_64", "aarch64"):
        pytest.skip("perf_event_open is wired for x86_64 and aarch64 CPUs only")
    proc = _spawn(2.0, None)
    counters = pmu.ThreadCounters((pmu.Event("clock", pmu.PERF_TYPE_SOFTWARE, pmu.PERF_COUNT_SW_TASK_CLOCK),))
    try:
        tids = [t.tid for t in read_threads(Path("/proc"), proc.pid)]
        try:
            counters.sample(tids)
        except NoDataError as exc:
            skip_if_perf_events_forbidden(exc)  # skips only for a kernel setting or sandbox; otherwise fails
        time.sleep(0.5)
        delta = counters.sample(tids)
    finally:
        counters.close()
        proc.kill()
        proc.wait()
    assert delta["clock"] > 1_000_000  # ns of task clock in 0.5 s of a busy loop


def test_pmu_raw_sve_event_absent_on_x86() -> None:
    if platform.machine() != "x86_64":
        pytest.skip("x86 only")
    counters = pmu.ThreadCounters(pmu.SVE_EVENTS)
    try:
        with pytest.raises(NoDataError):
            counters.sample([os.getpid()])
    finally:
        counters.close()


def locate_runtime(procfs: Path, runtime: RuntimeSettings, port: int | None = None) -> int:
    """What ``inferwatch simd`` and the simd collector do: the agent's one locator, the port as fallback."""
    return int(RuntimeLocator(runtime, procfs).find_serving(port).pid)


def test_locate_runtime(tmp_path: Path) -> None:
    proc = _spawn(5.0, None)
    try:
        procfs = Path("/proc")
        assert locate_runtime(procfs, RuntimeSettings(pid=proc.pid)) == proc.pid
        pidfile = tmp_path / "pid"
        pidfile.write_text(f"{proc.pid}\n")
        assert locate_runtime(procfs, RuntimeSettings(pidfile=pidfile)) == proc.pid
        pidfile.write_text("not a pid")
        with pytest.raises(NoDataError):
            locate_runtime(procfs, RuntimeSettings(pidfile=pidfile))
        with pytest.raises(NoDataError, match="no runtime process configured"):
            locate_runtime(procfs, RuntimeSettings())
    finally:
        proc.kill()
        proc.wait()


def test_pid_listening_on_finds_a_real_server() -> None:
    import socket

    port = free_port()
    with socket.socket() as s:
        s.bind(("127.0.0.1", port))
        s.listen()
        assert pid_listening_on(Path("/proc"), port) == os.getpid()
    assert pid_listening_on(Path("/proc"), port) is None


def test_collector_absent_without_runtime_and_valid_with_one() -> None:
    ctx = collect_context(Settings())
    with pytest.raises(NoDataError):
        SimdCollector(ctx, SimdSettings()).collect()
    proc = _spawn(4.0, "glibc.cpu.hwcaps=-AVX512F,-AVX512VL")
    settings = Settings.from_values(dict(runtime={"pid": proc.pid}, simd={"busy_cpu_cores": 0.01}))
    collector = SimdCollector(collect_context(settings), settings.simd)
    try:
        run_collection(collector)
        time.sleep(1.0)
        result = run_collection(collector)  # validated against the catalog
    finally:
        collector.close()
        proc.kill()
        proc.wait()
    names = {s.name for s in result.samples}
    assert "inferwatch.runtime.simd.runtime_cpu" in names
    if X86:
        assert {"inferwatch.runtime.simd.capable", "inferwatch.runtime.simd.code_present"} <= names
        (finding,) = result.findings
        assert finding.id == "simd.avx512"
        if AVX512:
            assert finding.status == "warn" and finding.runbook == "SIMDUnusedWhileServing"


def test_collector_finds_the_runtime_once_and_again_after_a_restart(tmp_path) -> None:
    marker = f"inferwatch-locator-{os.getpid()}"
    cmd = [sys.executable, "-c", "import time; time.sleep(60)", marker]
    first = subprocess.Popen(cmd)
    try:
        ctx = collect_context(Settings(runtime=RuntimeSettings(cmdline_pattern=marker)))
        collector = SimdCollector(ctx, SimdSettings())
        assert [collector.collect().details["pid"] for _ in range(3)] == [first.pid] * 3
        locator = ctx.locator  # the agent's one locator, shared with process and gpu
        assert locator.restarts == 0  # the same process all along
        first.kill()
        first.wait()
        second = subprocess.Popen(cmd)
        try:
            assert collector.collect().details["pid"] == second.pid
            assert locator.restarts == 1
        finally:
            collector.close()
            second.kill()
            second.wait()
    finally:
        first.kill()
        first.wait()
