"""What the kernel itself says about the CPU: AT_HWCAP/AT_HWCAP2 from auxv, AMX tile state, SVE vector length.

Synthetic auxv bytes are packed natively (as the kernel writes them); the live-kernel answers come from
an injected probe for every branch, and from the real system calls on this machine.
"""

from __future__ import annotations

import errno
import json
import platform
import struct
import subprocess
from dataclasses import dataclass
from pathlib import Path

import pytest

from inferwatch.agent.common.samples import Finding
from inferwatch.agent.config import load_settings
from inferwatch.agent.doctor.checks import check_collector, check_require
from inferwatch.agent.errors import SourceFormatError
from inferwatch.agent.node.collectors.cpu import CPUCollector
from inferwatch.agent.node.host.cpucap import read_cpu_capability
from inferwatch.agent.node.host.cpuinfo import parse_cpuinfo
from inferwatch.agent.node.host.cpuprobe import (
    ARCH_GET_XCOMP_PERM,
    ARCH_GET_XCOMP_SUPP,
    SyscallCpuProbe,
    read_amx,
    read_sve_vl,
)
from inferwatch.agent.node.host.hwcap import (
    ARM64_HWCAP,
    ARM64_HWCAP2,
    AT_HWCAP,
    AT_HWCAP2,
    KNOWN_ARM64,
    decode,
    pack_auxv,
    parse_auxv,
    read_hwcaps,
)
from inferwatch.agent.node.runner import validate
from inferwatch.agent.node.wiring import build_deps, collect_context
from tests.conftest import FIXTURES, PYTHON, ROOT
from tests.test_cpu import machine_of

CPU = FIXTURES / "cpuinfo"
ARM_FIXTURES = sorted(p.stem for p in CPU.glob("*.txt") if machine_of(p.read_text()) == "aarch64")
BOOT_ID = "5b1d3c1e-0000-4000-8000-000000000001"
SPR = "x86_sapphirerapids_xeon_platinum_8480plus"
# XSAVE masks: x87|SSE|AVX|opmask|ZMM_Hi256|Hi16_ZMM = 0xe7 (an AVX-512 host); + XTILECFG (17), XTILEDATA (18)
XSTATE_AVX512 = 0xE7
XSTATE_AMX = XSTATE_AVX512 | 1 << 17 | 1 << 18


def _words(tokens: set[str] | frozenset[str]) -> tuple[int, int]:
    """AT_HWCAP/AT_HWCAP2 for these Features tokens, from the kernel header's bit numbers."""
    w1 = sum(1 << ARM64_HWCAP.index(t) for t in tokens if t in ARM64_HWCAP)
    w2 = sum(1 << ARM64_HWCAP2.index(t) for t in tokens if t in ARM64_HWCAP2)
    return w1, w2


def _drop(text: str, *tokens: str) -> str:
    out = []
    for line in text.splitlines():
        key, sep, value = line.partition(":")
        if sep and key.strip() in ("flags", "Features"):
            line = f"{key}:{' '.join(t for t in value.split() if t not in tokens)}"
        out.append(line)
    return "\n".join(out) + "\n"


def _tree(tmp_path: Path, cpuinfo: str, auxv: bytes | None = None, boot_id: str | None = BOOT_ID, **extra: str) -> Path:
    root = tmp_path / "proc"
    root.mkdir(parents=True, exist_ok=True)
    (root / "cpuinfo").write_text(cpuinfo)
    extra.setdefault("sys/kernel/arch", machine_of(cpuinfo) + "\n")  # the kernel's architecture, as recorded
    if auxv is not None:
        (root / "self").mkdir(exist_ok=True)
        (root / "self" / "auxv").write_bytes(auxv)
    if boot_id is not None:
        extra["sys/kernel/random/boot_id"] = boot_id + "\n"
    for rel, content in extra.items():
        dest = root / rel
        dest.parent.mkdir(parents=True, exist_ok=True)
        dest.write_text(content)
    return root


@dataclass
class FakeProbe:
    """The live-kernel boundary with canned answers; an int errno raises OSError like the real one."""

    arch: str = "x86_64"
    boot: str = BOOT_ID
    supp: int = XSTATE_AMX
    perm: int = XSTATE_AVX512 | 1 << 17
    vl: int = 32

    def machine(self) -> str:
        return self.arch

    def boot_id(self) -> str:
        return self.boot

    def arch_prctl_get(self, code: int) -> int:
        value = {ARCH_GET_XCOMP_SUPP: self.supp, ARCH_GET_XCOMP_PERM: self.perm}[code]
        if value < 0:
            raise OSError(-value, "refused")
        return value

    def sve_get_vl(self) -> int:
        if self.vl < 0:
            raise OSError(-self.vl, "refused")
        return self.vl


Samples = dict[tuple[str, tuple[tuple[str, str], ...]], float]


def _collect(procfs: Path, probe: FakeProbe) -> tuple[Samples, list[Finding]]:
    settings = load_settings(overrides={"path": {"procfs": str(procfs), "sysfs": str(procfs.parent / "nosys")}})
    result = validate(
        CPUCollector(collect_context(settings, cpu_probe=probe), settings.cpu, settings.path.machine).collect()
    )
    return {(s.name, s.attributes): s.value for s in result.samples}, list(result.findings)


def _doctor(procfs: Path, probe: FakeProbe) -> dict[str, Finding]:
    settings = load_settings(overrides={"path": {"procfs": str(procfs), "sysfs": str(procfs.parent / "nosys")}})
    deps = build_deps(settings, cpu_probe=probe)
    return {f.id: f for f in check_collector(deps, "cpu") + check_require(deps, [])}


# --- auxv and the arm64 bit table ---------------------------------------------------------------------


def test_auxv_pairs_are_native_and_end_at_at_null() -> None:
    data = pack_auxv({6: 4096, AT_HWCAP: 0x1F8BFBFF, AT_HWCAP2: 0x2}) + struct.pack("@LL", 99, 1)
    assert parse_auxv(data) == {6: 4096, AT_HWCAP: 0x1F8BFBFF, AT_HWCAP2: 0x2}  # nothing after AT_NULL
    assert len(data) % struct.calcsize("@LL") == 0
    with pytest.raises(SourceFormatError):
        parse_auxv(data[:-3])


def test_kernel_header_bit_numbers() -> None:
    # arch/arm64/include/uapi/asm/hwcap.h
    hw = decode(1 << 1 | 1 << 20 | 1 << 22, 1 << 1 | 1 << 9 | 1 << 12 | 1 << 13 | 1 << 14, "aarch64")
    assert hw.features == {"asimd", "asimddp", "sve", "sve2", "svei8mm", "svebf16", "i8mm", "bf16"}
    hw = decode(0, 1 << 23 | 1 << 36 | 1 << 37 | 1 << 63, "aarch64")
    assert hw.features == {"sme", "sve2p1", "sme2", "poe"} and hw.unknown_bits == ()
    assert decode(1 << 50, 0, "aarch64").unknown_bits == ("AT_HWCAP bit 50",)
    assert decode(0x1F8BFBFF, 2, "x86_64").features is None  # x86 AT_HWCAP is CPUID.1:EDX, not decoded


@pytest.mark.parametrize("name", ARM_FIXTURES)
def test_table_matches_recorded_features_lines(name: str) -> None:
    """The kernel prints Features in hwcap_str[] order (AT_HWCAP bits, then AT_HWCAP2 bits): every recorded
    token is in the table, in that order, so the table's bit numbers agree with real kernels."""
    for line in (CPU / f"{name}.txt").read_text().splitlines():
        key, _, value = line.partition(":")
        if key.strip() != "Features":
            continue
        tokens = value.split()
        assert set(tokens) <= KNOWN_ARM64
        order = [ARM64_HWCAP.index(t) if t in ARM64_HWCAP else 64 + ARM64_HWCAP2.index(t) for t in tokens]
        assert order == sorted(order), tokens


def test_real_auxv_on_this_machine() -> None:
    machine = platform.machine()
    hw = read_hwcaps(Path("/proc"), machine)
    assert hw is not None
    flags = parse_cpuinfo(Path("/proc/cpuinfo").read_text(), platform.machine()).flags
    if machine == "x86_64":
        # AT_HWCAP is CPUID leaf 1 EDX here: bit 25 SSE, bit 26 SSE2, as /proc/cpuinfo says
        assert hw.features is None
        assert bool(hw.hwcap >> 25 & 1) == ("sse" in flags) and bool(hw.hwcap >> 26 & 1) == ("sse2" in flags)
    elif machine == "aarch64":
        assert hw.features is not None and flags & KNOWN_ARM64 == hw.features & flags


# --- corroboration through doctor (real CLI, recorded trees with synthetic auxv) ----------------------


def _cli(procfs: Path) -> dict[str, dict[str, object]]:
    cmd = [PYTHON, "-m", "inferwatch.agent", "doctor", "--json", "--path.procfs", str(procfs)]
    r = subprocess.run(cmd, cwd=ROOT, capture_output=True, text=True, timeout=60)
    assert r.returncode in (0, 1), r.stderr
    return {c["id"]: c for c in json.loads(r.stdout)["checks"]}


def test_hwcap_agrees_with_a_healthy_graviton3(tmp_path: Path) -> None:
    text = (CPU / "graviton3_neoverse_v1.txt").read_text()
    w1, w2 = _words(parse_cpuinfo(text, machine_of(text)).flags)
    checks = _cli(_tree(tmp_path, text, pack_auxv({AT_HWCAP: w1, AT_HWCAP2: w2})))
    cpu = checks["cpu.features"]
    assert cpu["status"] == "ok"
    hw = cpu["evidence"]["hwcap"]
    assert hw["agrees_with_cpuinfo"] is True and "sve" in hw["features"] and "sve2" not in hw["features"]
    assert hw["at_hwcap"] == hex(w1)
    # a recorded tree is not the running kernel: its answers are never attributed to it
    assert cpu["evidence"]["kernel_probe"].startswith("skipped")
    assert "cpu.amx" not in checks


def test_hwcap_has_sve_that_cpuinfo_lacks(tmp_path: Path) -> None:
    text = (CPU / "graviton3_neoverse_v1.txt").read_text()
    w1, w2 = _words(parse_cpuinfo(text, machine_of(text)).flags)
    checks = _cli(_tree(tmp_path, _drop(text, "sve"), pack_auxv({AT_HWCAP: w1, AT_HWCAP2: w2})))
    cpu = checks["cpu.features"]
    assert cpu["status"] == "fail" and cpu["evidence"]["missing"] == ["sve"]
    assert cpu["evidence"]["hwcap"]["not_in_cpuinfo"] == ["sve"]
    assert any("AT_HWCAP" in h and "sve" in h for h in cpu["evidence"]["hints"])


def test_cpuinfo_has_sve2_that_hwcap_lacks(tmp_path: Path) -> None:
    text = (CPU / "neoverse_v2_likely_graviton4.txt").read_text()
    w1, w2 = _words(parse_cpuinfo(text, machine_of(text)).flags - {"sve2"})
    cpu = _cli(_tree(tmp_path, text, pack_auxv({AT_HWCAP: w1, AT_HWCAP2: w2})))["cpu.features"]
    assert cpu["status"] == "ok"
    assert cpu["evidence"]["hwcap"]["not_in_hwcap"] == ["sve2"]
    assert cpu["evidence"]["hwcap"]["agrees_with_cpuinfo"] is False


def test_garbage_auxv_is_reported_not_fatal(tmp_path: Path) -> None:
    text = (CPU / "graviton3_neoverse_v1.txt").read_text()
    cpu = _cli(_tree(tmp_path, text, b"\xff" * 13))["cpu.features"]
    assert cpu["status"] == "ok" and "not a multiple" in cpu["evidence"]["hwcap"]["error"]


# --- AMX: every branch through the injected probe ------------------------------------------------------


def test_amx_enabled(tmp_path: Path) -> None:
    procfs = _tree(tmp_path, (CPU / f"{SPR}.txt").read_text())
    by, findings = _collect(procfs, FakeProbe())
    assert by[("inferwatch.cpu.amx.permitted", ())] == 1
    amx = {f.id: f for f in findings}["cpu.amx"]
    assert amx.status == "ok" and amx.evidence["xcomp_supp"] == hex(XSTATE_AMX)
    assert amx.evidence["cpuinfo_amx"] == ["amx_bf16", "amx_int8", "amx_tile"]


def test_amx_in_cpuinfo_but_not_enabled_by_the_kernel(tmp_path: Path) -> None:
    procfs = _tree(tmp_path, (CPU / f"{SPR}.txt").read_text(), **{"sys/kernel/osrelease": "6.8.0"})
    by, findings = _collect(procfs, FakeProbe(supp=XSTATE_AVX512))
    assert by[("inferwatch.cpu.amx.permitted", ())] == 0
    f = {f.id: f for f in findings}
    assert f["cpu.features"].status == "ok"  # cpuinfo has every flag: only the kernel check catches it
    assert f["cpu.amx"].status == "fail" and "not enabled by the OS" in f["cpu.amx"].summary
    assert "0xe7" in f["cpu.amx"].summary and f["cpu.amx"].evidence["hints"]
    assert _doctor(procfs, FakeProbe(supp=XSTATE_AVX512))["cpu.amx"].status == "fail"


def test_amx_on_a_kernel_without_dynamic_xstate(tmp_path: Path) -> None:
    procfs = _tree(tmp_path, (CPU / f"{SPR}.txt").read_text(), **{"sys/kernel/osrelease": "5.15.0"})
    by, findings = _collect(procfs, FakeProbe(supp=-errno.EINVAL))
    assert by[("inferwatch.cpu.amx.permitted", ())] == 0
    amx = {f.id: f for f in findings}["cpu.amx"]
    assert amx.status == "fail" and "EINVAL" in amx.summary and "5.16" in amx.summary
    assert any("older than 5.16" in h for h in amx.evidence["hints"])


def test_amx_enabled_by_the_kernel_but_masked_in_cpuinfo(tmp_path: Path) -> None:
    text = _drop((CPU / f"{SPR}.txt").read_text(), "amx_tile", "amx_bf16", "amx_int8")
    found = _doctor(_tree(tmp_path, text), FakeProbe())
    assert found["cpu.features"].status == "fail"
    assert any("enables AMX tile state" in h for h in found["cpu.features"].evidence["hints"])
    assert found["cpu.amx"].status == "warn"
    found = _doctor(_tree(tmp_path, text), FakeProbe(supp=XSTATE_AVX512))
    assert any("does not enable AMX tile state either" in h for h in found["cpu.features"].evidence["hints"])


def test_no_amx_anywhere_is_clean_absence(tmp_path: Path) -> None:
    found = _doctor(_tree(tmp_path, (CPU / "x86_amd_epyc_9654_zen4.txt").read_text()), FakeProbe(supp=XSTATE_AVX512))
    assert found["cpu.features"].status == "ok"
    assert found["cpu.amx"].status == "ok" and "no AMX" in found["cpu.amx"].summary


@pytest.mark.parametrize("probe", [FakeProbe(boot="another-boot"), FakeProbe(boot=""), FakeProbe(arch="aarch64")])
def test_answers_of_another_kernel_are_not_attributed(tmp_path: Path, probe: FakeProbe) -> None:
    by, findings = _collect(_tree(tmp_path, (CPU / f"{SPR}.txt").read_text()), probe)
    assert not any(name == "inferwatch.cpu.amx.permitted" for name, _ in by)
    assert [f.id for f in findings] == ["cpu.features"]
    assert findings[0].evidence["kernel_probe"].startswith("skipped")
    assert "amx" not in findings[0].evidence


def test_a_32_bit_arm_kernel_is_the_same_kernel_as_its_uname(tmp_path: Path) -> None:
    """uname says armv7l, the architecture is "arm": that is the running kernel, not another one."""
    text = "processor\t: 0\nFeatures\t: half thumb neon\nCPU implementer\t: 0x41\nCPU part\t: 0xd08\n"
    procfs = _tree(tmp_path, text, **{"sys/kernel/arch": "armv7l\n"})
    cap = read_cpu_capability(procfs, tmp_path / "nosys", probe=FakeProbe(arch="armv7l"))
    assert cap.info.arch == "arm" and cap.live is not None and cap.live_note == ""
    assert cap.cpu_model == "Arm Cortex-A72"  # never "AWS Graviton" without DMI


# --- SVE vector length through prctl -------------------------------------------------------------------


def test_sve_vl_from_prctl_masks_the_flag_bits(tmp_path: Path) -> None:
    procfs = _tree(tmp_path, (CPU / "graviton3_neoverse_v1.txt").read_text())
    cap = read_cpu_capability(procfs, tmp_path / "nosys", probe=FakeProbe(arch="aarch64", vl=32 | 1 << 17))
    assert cap.live is not None and cap.live.amx is None
    _, findings = _collect(procfs, FakeProbe(arch="aarch64", vl=32 | 1 << 17))
    assert findings[0].evidence["sve_thread_vector_length_bytes"] == 32
    assert [f.id for f in findings] == ["cpu.features"]


def test_sve_absence_confirmed_or_contradicted_by_prctl(tmp_path: Path) -> None:
    text = _drop((CPU / "graviton3_neoverse_v1.txt").read_text(), "sve", "svei8mm", "svebf16")
    procfs = _tree(tmp_path, text)
    gone = _doctor(procfs, FakeProbe(arch="aarch64", vl=-errno.EINVAL))["cpu.features"]
    assert gone.status == "fail" and gone.evidence["sve_prctl"] == "prctl(PR_SVE_GET_VL): EINVAL"
    assert any("EINVAL, which confirms it" in h for h in gone.evidence["hints"])
    there = _doctor(procfs, FakeProbe(arch="aarch64", vl=16))["cpu.features"]
    assert any("this kernel runs SVE" in h for h in there.evidence["hints"])


# --- the real system calls on this machine -------------------------------------------------------------


def test_real_sve_prctl_is_absent_off_arm64() -> None:
    vl = read_sve_vl(SyscallCpuProbe())
    if platform.machine() == "aarch64":
        assert vl.bytes is not None or vl.error == "EINVAL"
    else:
        assert vl.bytes is None and vl.error == "EINVAL"


_REQUEST_AMX = """
import ctypes, sys
libc = ctypes.CDLL(None, use_errno=True)
rc = libc.syscall(ctypes.c_long(158), ctypes.c_long(0x1023), ctypes.c_ulong(18))
perm = ctypes.c_uint64(0)
libc.syscall(ctypes.c_long(158), ctypes.c_long(0x1022), ctypes.byref(perm))
print(rc, perm.value)
"""


@pytest.mark.skipif(platform.machine() != "x86_64", reason="arch_prctl AMX state is x86_64 only")
def test_real_amx_state_predicts_whether_a_process_may_use_amx() -> None:
    """Oracle: a child process asks for AMX tile data (ARCH_REQ_XCOMP_PERM); it is granted exactly when the
    agent's read-only answer says the kernel enables AMX."""
    amx = read_amx(SyscallCpuProbe())
    assert amx.supported_mask is not None and amx.error == ""
    assert not amx.agent_permitted  # the agent never requests AMX for itself
    out = subprocess.run([PYTHON, "-c", _REQUEST_AMX], capture_output=True, text=True, timeout=30, check=True)
    rc, perm = (int(x) for x in out.stdout.split())
    assert (rc == 0) == amx.os_enabled
    assert bool(perm >> 18 & 1) == amx.os_enabled
    # and the CLI on this host's /proc reports it (cpuinfo and boot_id are this kernel's)
    checks = _cli(Path("/proc"))
    has_flags = "amx_tile" in parse_cpuinfo(Path("/proc/cpuinfo").read_text(), platform.machine()).flags
    assert checks["cpu.amx"]["evidence"]["os_enabled"] is amx.os_enabled
    assert checks["cpu.amx"]["status"] == ("ok" if has_flags == amx.os_enabled else ("fail" if has_flags else "warn"))
