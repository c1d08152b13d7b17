"""CPU capability: cpuinfo parsing, the model table, the collector, and ``doctor`` as the CI gate (real CLI)."""

from __future__ import annotations

import json
import subprocess
from pathlib import Path

import pytest

from inferwatch.agent.config import load_settings
from inferwatch.agent.errors import SourceFormatError
from inferwatch.agent.node.collectors.cpu import CPUCollector
from inferwatch.agent.node.host.cpucap import read_cpu_capability
from inferwatch.agent.node.host.cpuinfo import parse_cpuinfo
from inferwatch.agent.node.host.cpumodels import Dmi, identify
from inferwatch.agent.node.runner import validate
from inferwatch.agent.node.wiring import collect_context
from tests.conftest import FIXTURES, PYTHON, ROOT

CPU = FIXTURES / "cpuinfo"

# fixture -> (doctor cpu.features status, model name contains, features that must be missing)
EXPECTED: dict[str, tuple[str, str, set[str]]] = {
    # No DMI in these trees: the core's name, never a product name.
    "graviton2_neoverse_n1": ("ok", "Arm Neoverse-N1", set()),
    "graviton3_neoverse_v1": ("ok", "Arm Neoverse-V1", set()),
    "neoverse_v2_likely_graviton4": ("ok", "Arm Neoverse-V2", set()),
    "neoverse_v2_likely_grace": ("ok", "Arm Neoverse-V2", set()),
    "neoverse_v2_rhel9_no_pac": ("ok", "Arm Neoverse-V2", set()),
    "neoverse_n2_rhel9": ("ok", "Arm Neoverse-N2", set()),
    "ampereone_ampere1a_no_sve": ("ok", "Ampere-1a", set()),
    # Armv9 cores have SVE2 in silicon; this SoC's firmware hides it: the silent fallback we exist to catch.
    "armv9_mobile_a510_a710_a715_x3_sve_hidden": ("fail", "Cortex-A710", {"sve", "sve2"}),
    "x86_skylake_sp_xeon_gold_6132": ("ok", "(Skylake-SP)", set()),
    "x86_cascadelake_xeon_platinum_8260m": ("ok", "(Cascade Lake)", set()),
    "x86_sapphirerapids_xeon_platinum_8480plus": ("ok", "(Sapphire Rapids)", set()),
    "x86_amd_epyc_9654_zen4": ("ok", "(Zen 4)", set()),
    "x86_amd_epyc_7451_zen1_96cpu": ("ok", "(Zen)", set()),
}


def test_every_fixture_is_classified() -> None:
    assert {p.stem for p in CPU.glob("*.txt")} == set(EXPECTED)


def machine_of(text: str) -> str:
    """The architecture of the kernel that wrote a fixture (recorded trees carry it as sys/kernel/arch)."""
    return "x86_64" if "vendor_id" in text else "aarch64"


def _procfs(tmp_path: Path, text: str, machine: str | None = None, **extra: str) -> Path:
    root = tmp_path / "proc"
    (root / "sys" / "kernel").mkdir(parents=True, exist_ok=True)
    (root / "cpuinfo").write_text(text)
    (root / "sys" / "kernel" / "arch").write_text((machine or machine_of(text)) + "\n")
    for rel, content in extra.items():
        dest = root / rel
        dest.parent.mkdir(parents=True, exist_ok=True)
        dest.write_text(content)
    return root


def _drop(text: str, *tokens: str) -> str:
    """Remove exact flag tokens from every flags/Features line (never substrings: sve stays when sve2 goes)."""
    out = []
    for line in text.splitlines():
        key, sep, value = line.partition(":")
        if sep and key.strip() in ("flags", "Features"):
            line = f"{key}:{' '.join(t for t in value.split() if t not in tokens)}"
        out.append(line)
    return "\n".join(out) + "\n"


def _doctor(procfs: Path, *args: str, sysfs: Path | None = None) -> tuple[int, dict[str, dict[str, object]]]:
    cmd = [PYTHON, "-m", "inferwatch.agent", "doctor", "--json", "--path.procfs", str(procfs), *args]
    if sysfs is not None:
        cmd += ["--path.sysfs", str(sysfs)]
    r = subprocess.run(cmd, cwd=ROOT, capture_output=True, text=True, timeout=60)
    assert r.returncode in (0, 1), r.stderr
    checks = {c["id"]: c for c in json.loads(r.stdout)["checks"]}
    # Exit 1 exactly when a check failed (the GPU check reads this host's NVML, whatever procfs says).
    assert r.returncode == (1 if any(c["status"] == "fail" for c in checks.values()) else 0)
    return r.returncode, checks


@pytest.mark.parametrize("name", sorted(EXPECTED))
def test_doctor_classifies_recorded_cpuinfo(tmp_path: Path, name: str) -> None:
    status, model, missing = EXPECTED[name]
    rc, checks = _doctor(_procfs(tmp_path, (CPU / f"{name}.txt").read_text()))
    cpu = checks["cpu.features"]
    assert cpu["status"] == status, cpu
    assert model in cpu["evidence"]["cpu_model"]
    assert set(cpu["evidence"].get("missing", [])) == missing
    if status == "fail":
        assert rc == 1


@pytest.mark.parametrize(
    ("fixture", "removed", "missing"),
    [
        ("graviton3_neoverse_v1", ("sve",), {"sve"}),
        ("neoverse_v2_likely_graviton4", ("sve2",), {"sve2"}),
        ("neoverse_v2_likely_grace", ("sve2",), {"sve2"}),
        ("x86_sapphirerapids_xeon_platinum_8480plus", ("amx_tile", "amx_bf16", "amx_int8"), None),
        ("x86_cascadelake_xeon_platinum_8260m", ("avx512f",), {"avx512f"}),
    ],
)
def test_doctor_fails_when_an_expected_feature_is_gone(
    tmp_path: Path, fixture: str, removed: tuple[str, ...], missing: set[str] | None
) -> None:
    text = _drop((CPU / f"{fixture}.txt").read_text(), *removed)
    rc, checks = _doctor(_procfs(tmp_path, text))
    cpu = checks["cpu.features"]
    assert rc == 1 and cpu["status"] == "fail"
    assert set(cpu["evidence"]["missing"]) == (missing or set(removed))
    assert cpu["evidence"]["hints"], "a failing check must say where to look"


def test_healthy_graviton3_is_never_flagged_for_sve2(tmp_path: Path) -> None:
    rc, checks = _doctor(_procfs(tmp_path, (CPU / "graviton3_neoverse_v1.txt").read_text()))
    assert checks["cpu.features"]["status"] == "ok"
    assert "sve2" not in checks["cpu.features"]["evidence"]["expected"]
    assert "sve" in checks["cpu.features"]["evidence"]["expected"]
    # ... but a user who asks for SVE2 on a Graviton3 gets the truth: it is absent.
    rc, checks = _doctor(_procfs(tmp_path, (CPU / "graviton3_neoverse_v1.txt").read_text()), "--require", "sve2")
    assert rc == 1 and checks["cpu.require"]["status"] == "fail"
    assert checks["cpu.require"]["evidence"]["absent"] == ["sve2"]
    assert checks["cpu.features"]["status"] == "ok"


def test_require_passes_when_present_and_is_case_insensitive(tmp_path: Path) -> None:
    procfs = _procfs(tmp_path, (CPU / "neoverse_v2_likely_graviton4.txt").read_text())
    _, checks = _doctor(procfs, "--require", "SVE2", "--require", "i8mm")
    assert checks["cpu.require"]["status"] == "ok" and checks["cpu.features"]["status"] == "ok"


def test_require_without_cpuinfo_fails_the_gate(tmp_path: Path) -> None:
    (tmp_path / "proc").mkdir()
    rc, checks = _doctor(tmp_path / "proc", "--require", "sve2")
    assert rc == 1 and checks["cpu.require"]["status"] == "fail"
    rc, checks = _doctor(tmp_path / "proc")
    assert checks["cpu"]["status"] == "skip" and checks["pagecache"]["status"] == "skip"


def test_doctor_usage_errors_exit_2(tmp_path: Path) -> None:
    r = subprocess.run(
        [PYTHON, "-m", "inferwatch.agent", "doctor", "--path.procfs", str(tmp_path / "nope")],
        cwd=ROOT,
        capture_output=True,
        text=True,
        timeout=60,
    )
    assert r.returncode == 2 and "not a directory" in r.stderr
    r = subprocess.run(
        [PYTHON, "-m", "inferwatch.agent", "doctor", "--bogus"], cwd=ROOT, capture_output=True, timeout=60
    )
    assert r.returncode == 2


def test_cause_hints_name_the_kernel_command_line(tmp_path: Path) -> None:
    text = _drop((CPU / "graviton3_neoverse_v1.txt").read_text(), "sve", "svei8mm", "svebf16")
    procfs = _procfs(
        tmp_path,
        text,
        cmdline="BOOT_IMAGE=/vmlinuz root=/dev/nvme0n1p1 arm64.nosve\n",
        **{"sys/kernel/osrelease": "6.1.0"},
    )
    sysfs = tmp_path / "sys"
    (sysfs / "class" / "dmi" / "id").mkdir(parents=True)
    (sysfs / "class" / "dmi" / "id" / "product_name").write_text("c7g.8xlarge\n")
    (sysfs / "class" / "dmi" / "id" / "sys_vendor").write_text("Amazon EC2\n")
    rc, checks = _doctor(procfs, sysfs=sysfs)
    cpu = checks["cpu.features"]
    assert rc == 1 and cpu["evidence"]["machine_type"] == "c7g.8xlarge"
    assert any("arm64.nosve" in h for h in cpu["evidence"]["hints"])


def test_old_kernel_hint_for_bf16_on_graviton(tmp_path: Path) -> None:
    text = _drop((CPU / "graviton3_neoverse_v1.txt").read_text(), "bf16", "i8mm", "svebf16", "svei8mm", "sve")
    procfs = _procfs(tmp_path, text, **{"sys/kernel/osrelease": "4.14.311-233.529.amzn2.aarch64"})
    cap = read_cpu_capability(procfs, tmp_path / "nosys")
    from inferwatch.agent.node.host.cpucap import cause_hints

    hints = cause_hints(cap, cap.missing)
    assert any("older than 5.10" in h for h in hints)
    assert any("older than 4.15" in h for h in hints)
    assert any("sve_default_vector_length" in h for h in hints)


def test_flags_are_exact_tokens_and_intersected() -> None:
    info = parse_cpuinfo((CPU / "armv9_mobile_a510_a710_a715_x3_sve_hidden.txt").read_text(), "aarch64")
    assert info.logical_cpus == 8 and len(info.core_types) == 4
    # sve2-only Features must not make "sve" present
    text = "processor\t: 0\nFeatures\t: fp asimd sve2 svebf16\nCPU implementer\t: 0x41\nCPU part\t: 0xd4f\n"
    info = parse_cpuinfo(text, "aarch64")
    assert "sve" not in info.flags and "sve2" in info.flags
    two = text + "\nprocessor\t: 1\nFeatures\t: fp asimd\nCPU implementer\t: 0x41\nCPU part\t: 0xd4f\n"
    assert parse_cpuinfo(two, "aarch64").flags == {"fp", "asimd"}


def test_x86_identity_and_zen1_96_cpus() -> None:
    info = parse_cpuinfo((CPU / "x86_amd_epyc_7451_zen1_96cpu.txt").read_text(), "x86_64")
    assert (info.vendor, info.family, info.model, info.logical_cpus) == ("AuthenticAMD", 23, 1, 96)
    spr = parse_cpuinfo((CPU / "x86_sapphirerapids_xeon_platinum_8480plus.txt").read_text(), "x86_64")
    assert {"amx_tile", "amx_bf16", "amx_int8", "avx512_bf16"} <= identify(spr).expected


def test_dmi_picks_the_product_of_a_shared_part() -> None:
    info = parse_cpuinfo((CPU / "neoverse_v2_likely_grace.txt").read_text(), "aarch64")
    assert identify(info, Dmi("Amazon EC2", "c8g.4xlarge")).name == "AWS Graviton4 (Arm Neoverse-V2)"
    assert identify(info, Dmi("NVIDIA", "GH200")).name == "NVIDIA Grace (Arm Neoverse-V2)"
    assert identify(info).name == "Arm Neoverse-V2"


def test_garbage_cpuinfo_is_a_format_error() -> None:
    with pytest.raises(SourceFormatError):
        parse_cpuinfo("\x00\xff garbage\nno colon here\n", "x86_64")
    with pytest.raises(SourceFormatError):
        parse_cpuinfo("\x00\xff garbage\nno colon here\n", "aarch64")


def test_collector_samples_match_the_catalog(tmp_path: Path) -> None:
    text = _drop((CPU / "graviton3_neoverse_v1.txt").read_text(), "sve")
    procfs = _procfs(tmp_path, text, **{"sys/kernel/osrelease": "6.1.0", "sys/abi/sve_default_vector_length": "32\n"})
    settings = load_settings(
        overrides={"path": {"procfs": str(procfs), "sysfs": str(tmp_path)}, "cpu": {"expect_features": ["SHA3"]}}
    )
    result = validate(CPUCollector(collect_context(settings), settings.cpu, settings.path.machine).collect())
    by = {(s.name, s.attributes): s.value for s in result.samples}
    model = "Arm Neoverse-V1"
    kernel = ("detected_by", "kernel")  # every Arm feature reaches user space through the kernel's hwcaps
    assert by[("inferwatch.cpu.feature.missing", (("cpu_model", model), kernel, ("feature", "sve")))] == 1
    assert by[("inferwatch.cpu.feature.missing", (("cpu_model", model), kernel, ("feature", "bf16")))] == 0
    assert by[("inferwatch.cpu.feature.expected", (("cpu_model", model), ("feature", "sha3")))] == 1
    assert by[("inferwatch.cpu.feature.present", (("feature", "sve2"),))] == 0
    assert by[("inferwatch.cpu.sve.vector_length", ())] == 32
    assert by[("system.cpu.logical.count", ())] == 1
    info = next(s for s in result.samples if s.name == "inferwatch.node.info")
    assert dict(info.attributes)["arch"] == "aarch64" and dict(info.attributes)["kernel_release"] == "6.1.0"
    assert result.findings[0].status == "fail"


def test_node_identity_names_arm_cpus_without_a_model_name(tmp_path: Path) -> None:
    from inferwatch.agent.node.identity import node_identity

    procfs = _procfs(tmp_path, (CPU / "graviton3_neoverse_v1.txt").read_text(), **{"sys/kernel/osrelease": "6.1.0"})
    ident = node_identity(procfs, tmp_path / "nosys")
    assert ident["host.cpu.model.name"] == "Arm Neoverse-V1"
    assert ident["host.arch"] == "arm64" and ident["host.cpu.model.id"] == "0x41/0xd40"
    assert ident["os.version"] == "6.1.0"


def test_cpuid_read_and_kernel_gated_features_are_told_apart(tmp_path: Path) -> None:
    """A Sapphire Rapids whose file lacks avx512_fp16 (read from CPUID by runtimes) and amx_tile (kernel-gated)."""
    text = _drop((CPU / "x86_sapphirerapids_xeon_platinum_8480plus.txt").read_text(), "avx512_fp16", "amx_tile")
    procfs = _procfs(tmp_path, text, **{"sys/kernel/osrelease": "5.10.0"})
    settings = load_settings(overrides={"path": {"procfs": str(procfs), "sysfs": str(tmp_path)}})
    result = validate(CPUCollector(collect_context(settings), settings.cpu, settings.path.machine).collect())
    missing = {
        dict(s.attributes)["feature"]: dict(s.attributes)["detected_by"]
        for s in result.samples
        if s.name == "inferwatch.cpu.feature.missing" and s.value == 1
    }
    assert missing == {"avx512_fp16": "cpuid", "amx_tile": "kernel"}
    verdict = result.findings[0]
    assert verdict.status == "fail" and "amx_tile" in verdict.summary
    assert "not listed, read from CPUID by runtimes: avx512_fp16" in verdict.summary
    assert verdict.evidence["missing_kernel_gated"] == ["amx_tile"]
    assert verdict.evidence["missing_cpuid_read"] == ["avx512_fp16"]
    only_cpuid = _drop((CPU / "x86_sapphirerapids_xeon_platinum_8480plus.txt").read_text(), "avx512_fp16")
    procfs = _procfs(tmp_path / "b", only_cpuid, **{"sys/kernel/osrelease": "5.10.0"})
    settings = load_settings(overrides={"path": {"procfs": str(procfs), "sysfs": str(tmp_path)}})
    result = validate(CPUCollector(collect_context(settings), settings.cpu, settings.path.machine).collect())
    assert result.findings[0].status == "warn" and "from CPUID themselves" in result.findings[0].summary
