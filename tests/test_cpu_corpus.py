"""The CPU analysis over the real cpuinfo dumps (tests/fixtures/cpuinfo/corpus/) against a golden table.

Update switch, after a deliberate change: ``python -m tests.cpu_corpus --update`` (or
``INFERWATCH_UPDATE_GOLDEN=1 pytest tests/test_cpu_corpus.py``) rewrites verdicts.tsv and the table in
docs/doctor.md from the same code.
"""

from __future__ import annotations

import contextlib
import csv
import json
import os
import shutil
import subprocess
from collections import Counter
from pathlib import Path

import pytest

from inferwatch.agent.common.samples import Finding
from inferwatch.agent.errors import InferwatchError, SourceFormatError
from inferwatch.agent.node.host.cpucap import cpu_feature_verdict, read_cpu_capability
from inferwatch.agent.node.host.cpuinfo import parse_cpuinfo
from inferwatch.agent.node.host.cpumodels import Dmi, identify
from tests import cpu_corpus
from tests.conftest import PYTHON, ROOT
from tests.test_cpu import _drop, _procfs

UNKNOWN_ARCHES = {"s390x", "sparc64", "ppc", "ppc64", "ppc64le", "riscv64", "loongarch64", "armv6l", "armv7l"}


def test_the_corpus_is_real_and_sourced() -> None:
    dumps = cpu_corpus.dumps()
    assert len(dumps) >= 60
    assert {d.cpuinfo.name for d in dumps} == {p.name for p in cpu_corpus.CORPUS.glob("*.cpuinfo")}
    # every DMI tree belongs to a dump, and holds only the fields the agent reads
    assert {p.name for p in cpu_corpus.CORPUS.glob("*.dmi")} <= {d.dmi.name for d in dumps}
    for tree in cpu_corpus.CORPUS.glob("*.dmi"):
        assert {f.name for f in tree.iterdir()} <= {"sys_vendor", "product_name", "board_vendor"}, tree.name
    for d in dumps:
        assert d.repo and d.path and len(d.commit) == 40 and d.machine, d.name
    machines = Counter(d.machine for d in dumps)
    assert {"x86_64", "aarch64", "s390x", "ppc64le", "riscv64", "loongarch64", "sparc64", "armv6l"} <= set(machines)


def test_verdicts_match_the_golden_table() -> None:
    rows = cpu_corpus.verdicts()
    if os.environ.get("INFERWATCH_UPDATE_GOLDEN") == "1":
        cpu_corpus.write_golden(rows)
    assert rows == cpu_corpus.read_golden(), "verdicts changed: review, then `python -m tests.cpu_corpus --update`"


def test_docs_table_is_generated_from_the_same_rows() -> None:
    rows = cpu_corpus.read_golden()
    text = cpu_corpus.DOC.read_text(encoding="utf-8")
    if os.environ.get("INFERWATCH_UPDATE_GOLDEN") == "1":
        cpu_corpus.DOC.write_text(cpu_corpus.render_doc(text, rows), encoding="utf-8")
        text = cpu_corpus.DOC.read_text(encoding="utf-8")
    assert cpu_corpus.render_doc(text, rows) == text, "docs/doctor.md is stale: `python -m tests.cpu_corpus --update`"


def test_unknown_architectures_are_a_note_never_a_failure() -> None:
    for name, machine, status, _model, _missing in cpu_corpus.read_golden():
        if machine in UNKNOWN_ARCHES:
            assert status == "skip", (name, status)
        assert status != "fail" or machine in ("aarch64", "x86_64"), name


def _dump(name: str) -> cpu_corpus.Dump:
    return next(d for d in cpu_corpus.dumps() if d.name == name)


@pytest.mark.parametrize(
    "name",
    ["util-linux_s390-lpar", "util-linux_sparc64", "pytorch-cpuinfo_raspberrypi", "util-linux_armv7"],
)
def test_doctor_gate_passes_unknown_layouts(tmp_path: Path, name: str) -> None:
    """The real CLI on the recorded dump alone (no sys/kernel/arch: read as the machine its cpuinfo says, never
    as this one): s390x, sparc64 and old ARM layouts are an 'unknown CPU' skip, exit 0, no SourceFormatError,
    and never an x86 "family None model None"."""
    d = _dump(name)
    procfs = tmp_path / "proc"
    procfs.mkdir()
    (procfs / "cpuinfo").write_bytes(d.cpuinfo.read_bytes())
    cmd = [
        PYTHON,
        "-m",
        "inferwatch.agent",
        "doctor",
        "--json",
        "--path.procfs",
        str(procfs),
        "--path.sysfs",
        str(tmp_path),
    ]
    r = subprocess.run(cmd, cwd=ROOT, capture_output=True, text=True, timeout=120)
    doc = json.loads(r.stdout)
    checks = {c["id"]: c for c in doc["checks"]}
    cpu = checks["cpu.features"]
    assert cpu["status"] == "skip" and cpu["summary"].startswith("unknown CPU"), cpu
    assert "None" not in cpu["summary"] and f"({d.machine} kernel)" in cpu["summary"], cpu["summary"]
    assert doc["machine"]["machine"] == d.machine and doc["machine"]["arch_source"] == "inferred from cpuinfo"
    assert "SourceFormatError" not in r.stdout + r.stderr


def test_old_arm_layout_without_processor_lines() -> None:
    info = parse_cpuinfo(_dump("pytorch-cpuinfo_raspberrypi").cpuinfo.read_text(), "armv6l")
    assert info.arch == "arm" and info.layout == "no 'processor' lines" and info.logical_cpus == 1
    assert "vfp" in info.flags and info.core_types[0].part == 0xB76
    # util-linux armv7: Features and CPU part printed once, after the processor blocks
    info = parse_cpuinfo(_dump("util-linux_armv7").cpuinfo.read_text(), "armv7l")
    assert info.logical_cpus == 2 and "neon" in info.flags and info.core_types[0].part == 0xC0F


def test_loongarch_has_features_and_is_not_aarch64() -> None:
    text = _dump("util-linux_loongarch-loongson_3a5000_hv").cpuinfo.read_text()
    info = parse_cpuinfo(text, "loongarch64")
    assert info.arch == "loongarch64" and "lasx" in info.flags and info.logical_cpus == 4
    assert identify(info).name == "Loongson-3A5000-HV" and not identify(info).known


def test_product_names_need_dmi_evidence() -> None:
    a72 = parse_cpuinfo(_dump("archspec_linux-amazon-cortex_a72").cpuinfo.read_text(), "aarch64")
    # A Raspberry Pi 4 is a Cortex-A72 too: without DMI it is never "AWS Graviton".
    assert identify(a72).name == "Arm Cortex-A72"
    assert identify(a72, Dmi("Raspberry Pi Foundation", "Raspberry Pi 4 Model B")).name == "Arm Cortex-A72"
    graviton = identify(a72, Dmi("Amazon EC2", "a1.large"))
    assert graviton.name == "AWS Graviton (Arm Cortex-A72)" and graviton.product_evidence == "sys_vendor=Amazon EC2"
    n2 = parse_cpuinfo(_dump("archspec_linux-rhel9-neoverse_n2").cpuinfo.read_text(), "aarch64")
    assert identify(n2).name == "Arm Neoverse-N2"
    assert identify(n2, Dmi("Alibaba Cloud", "Alibaba Cloud ECS")).name == "Alibaba Yitian 710 (Arm Neoverse-N2)"
    assert identify(n2, Dmi("Microsoft Corporation", "Virtual Machine")).name == "Azure Cobalt 100 (Arm Neoverse-N2)"
    # The real Graviton4 and Cobalt 100 dumps get their product name only with the DMI their clouds show.
    g4 = parse_cpuinfo(_dump("ecaz_graviton4-m8g.2xlarge").cpuinfo.read_text(), "aarch64")
    assert identify(g4).name == "Arm Neoverse-V2"
    assert identify(g4, Dmi("Amazon EC2", "m8g.2xlarge")).name == "AWS Graviton4 (Arm Neoverse-V2)"
    cobalt = parse_cpuinfo(_dump("arm-learning-paths_azure-cobalt100-d4ps_v6").cpuinfo.read_text(), "aarch64")
    assert (
        identify(cobalt, Dmi("Microsoft Corporation", "Virtual Machine")).name == "Azure Cobalt 100 (Arm Neoverse-N2)"
    )
    # The real Yitian 710 (a g8y VM): its core alone, Alibaba's product name only with Alibaba's DMI.
    yitian = parse_cpuinfo(_dump("arm-socs-table_yitian-710-g8y").cpuinfo.read_text(), "aarch64")
    assert identify(yitian).name == "Arm Neoverse-N2" and yitian.logical_cpus == 4
    assert identify(yitian, Dmi("Alibaba Cloud", "Alibaba Cloud ECS")).name == "Alibaba Yitian 710 (Arm Neoverse-N2)"
    azure = Dmi("Microsoft Corporation", "Virtual Machine")
    assert identify(yitian, azure).name == "Azure Cobalt 100 (Arm Neoverse-N2)"
    v1 = parse_cpuinfo(_dump("archspec_linux-amazon-neoverse_v1").cpuinfo.read_text(), "aarch64")
    assert identify(v1, Dmi("Amazon EC2", "c7g.8xlarge")).name == "AWS Graviton3 (Arm Neoverse-V1)"
    assert identify(v1, Dmi("Amazon EC2", "hpc7g.16xlarge")).name == "AWS Graviton3E (Arm Neoverse-V1)"


def _corpus_finding(tmp_path: Path, name: str) -> Finding:
    """The verdict for one corpus dump, read with its own DMI tree where the source has one."""
    d = _dump(name)
    procfs, sysfs = tmp_path / "proc", tmp_path / "sys"
    procfs.mkdir(parents=True)
    (procfs / "cpuinfo").write_bytes(d.cpuinfo.read_bytes())  # no sys/kernel/arch: read as the dump says
    if d.dmi.is_dir():
        shutil.copytree(d.dmi, sysfs / "class" / "dmi" / "id")
    return cpu_feature_verdict(read_cpu_capability(procfs, sysfs))


@pytest.mark.parametrize(
    ("name", "core"),
    [
        ("eessi_debian-rpi4", "Arm Cortex-A72"),  # a Raspberry Pi 4 on a 64-bit kernel: never "AWS Graviton"
        ("eessi_Jureca-Rocky95", "Arm Neoverse-V2"),  # NVIDIA Grace, no DMI in the source
        ("eessi_GCP-axion", "Arm Neoverse-V2"),  # Google Axion: the same core, not Graviton4 nor Grace
        ("eessi_AWS-awslinux-graviton2", "Arm Neoverse-N1"),
        ("eessi_AWS-awslinux-graviton3", "Arm Neoverse-V1"),
        # Azure Cobalt 100 as its source states, no DMI there: the core, never "Cobalt 100" nor "Yitian 710"
        ("arm-learning-paths_azure-cobalt100-d4ps_v6", "Arm Neoverse-N2"),
        # Alibaba Yitian 710 (a g8y VM) as its source states, spaces for tabs as pasted, no DMI: the core
        ("arm-socs-table_yitian-710-g8y", "Arm Neoverse-N2"),
        # AWS Graviton4 (m8g.2xlarge) as its source states, all 8 blocks, no DMI there: the core
        ("ecaz_graviton4-m8g.2xlarge", "Arm Neoverse-V2"),
    ],
)
def test_real_cloud_and_board_dumps_without_dmi_are_named_by_their_core(tmp_path: Path, name: str, core: str) -> None:
    finding = _corpus_finding(tmp_path, name)
    assert finding.status == "ok" and finding.summary.startswith(core), finding.summary
    assert "product_evidence" not in finding.evidence and "dmi" not in finding.evidence


def test_real_dmi_names_no_product_for_another_core(tmp_path: Path) -> None:
    """Real DMI trees (hwloc): NVIDIA DMI on the GB10's Cortex-X925/A725 is no Grace; Huawei DMI on a Kunpeng 920
    names the TaiShan core and is reported as evidence, but claims no product the table does not know."""
    gb10 = _corpus_finding(tmp_path / "gb10", "hwloc_nvidia-dgx-gb10")
    assert gb10.evidence["dmi"] == {
        "sys_vendor": "NVIDIA",
        "product_name": "NVIDIA_DGX_Spark",
        "board_vendor": "NVIDIA",
    }
    assert "Grace" not in gb10.summary and "product_evidence" not in gb10.evidence
    assert gb10.status == "warn"  # cores without a table entry: a note, never a failed gate
    kunpeng = _corpus_finding(tmp_path / "kunpeng", "hwloc_128arm-2pa2n8cluster4co")
    assert kunpeng.summary.startswith("HiSilicon TaiShan-v110") and kunpeng.status == "warn"
    assert kunpeng.evidence["dmi"] == {"sys_vendor": "Huawei", "product_name": "XA320 V2", "board_vendor": "Huawei"}
    assert "product_evidence" not in kunpeng.evidence


def test_dmi_from_sysfs_reaches_the_verdict(tmp_path: Path) -> None:
    d = _dump("archspec_linux-amazon-neoverse_v1")
    procfs, sysfs = tmp_path / "proc", tmp_path / "sys"
    (procfs / "sys" / "kernel").mkdir(parents=True)
    (procfs / "cpuinfo").write_bytes(d.cpuinfo.read_bytes())
    dmi = sysfs / "class" / "dmi" / "id"
    dmi.mkdir(parents=True)
    (dmi / "sys_vendor").write_text("Amazon EC2\n")
    (dmi / "product_name").write_text("c7g.8xlarge\n")
    finding = cpu_feature_verdict(read_cpu_capability(procfs, sysfs, machine="aarch64"))
    assert finding.status == "ok" and finding.summary.startswith("AWS Graviton3 (Arm Neoverse-V1)")
    assert finding.evidence["product_evidence"] == "sys_vendor=Amazon EC2"
    assert finding.evidence["dmi"] == {"sys_vendor": "Amazon EC2", "product_name": "c7g.8xlarge"}
    assert finding.evidence["arch_source"] == "given"


def test_graviton3_listing_sve_is_never_told_it_has_no_sve(tmp_path: Path) -> None:
    text = _drop(_dump("archspec_linux-amazon-neoverse_v1").cpuinfo.read_text(), "svebf16", "svei8mm")
    cap = read_cpu_capability(_procfs(tmp_path, text, "aarch64"), tmp_path / "nosys")
    finding = cpu_feature_verdict(cap)
    assert finding.status == "fail" and finding.evidence["missing"] == ["svebf16", "svei8mm"]
    hints = finding.evidence["hints"]
    assert isinstance(hints, list) and hints
    assert not any("without SVE support" in h or "CONFIG_ARM64_SVE" in h for h in hints), hints
    assert any("lists sve" in h for h in hints)


def test_x86_cpuid_read_flags_are_told_apart_from_kernel_gated(tmp_path: Path) -> None:
    text = _dump("archspec_linux-unknown-sapphirerapids").cpuinfo.read_text()
    only_cpuid = cpu_feature_verdict(
        read_cpu_capability(_procfs(tmp_path / "a", _drop(text, "avx512_fp16", "avx_vnni"), "x86_64"), tmp_path)
    )
    assert only_cpuid.status == "warn" and "read these from CPUID" in only_cpuid.summary
    assert only_cpuid.evidence["missing_cpuid_read"] == ["avx512_fp16", "avx_vnni"]
    assert only_cpuid.evidence["missing_kernel_gated"] == []
    gated = cpu_feature_verdict(
        read_cpu_capability(_procfs(tmp_path / "b", _drop(text, "amx_tile", "avx512_vnni"), "x86_64"), tmp_path)
    )
    assert gated.status == "fail" and gated.evidence["missing_kernel_gated"] == ["amx_tile"]
    assert gated.evidence["missing_cpuid_read"] == ["avx512_vnni"]


@pytest.mark.parametrize("name", ["archspec_linux-rhel9-graniterapids", "eessi_AWS-Rocky9-6975PC"])
def test_real_granite_rapids_passes_with_amx_and_fails_without(tmp_path: Path, name: str) -> None:
    """Bare metal (Xeon 6972P) and an AWS VM (Xeon 6975P-C): named Granite Rapids, AMX expected and present."""
    text = _dump(name).cpuinfo.read_text()
    real = cpu_feature_verdict(read_cpu_capability(_procfs(tmp_path / "a", text, "x86_64"), tmp_path))
    assert real.status == "ok" and "(Granite Rapids)" in real.summary, real.summary
    no_amx = cpu_feature_verdict(
        read_cpu_capability(_procfs(tmp_path / "b", _drop(text, "amx_int8"), "x86_64"), tmp_path)
    )
    assert no_amx.status == "fail" and no_amx.evidence["missing_kernel_gated"] == ["amx_int8"]


def _add_flags(text: str, *tokens: str) -> str:
    """Append flag tokens to every x86 flags line (the inverse of tests.test_cpu._drop)."""
    lines = text.splitlines()
    out = [f"{line} {' '.join(tokens)}" if line.partition(":")[0].strip() == "flags" else line for line in lines]
    return "\n".join(out) + "\n"


def test_real_emerald_rapids_guest_without_amx_fails_and_names_the_hypervisor(tmp_path: Path) -> None:
    """A KVM guest on a Xeon Platinum 8575C (Emerald Rapids, model 207): its hypervisor passes AVX-512 and
    avx512_bf16 through but no AMX, avx512_fp16 or avx_vnni. AMX is expected and kernel-gated, so the gate fails;
    the only cause the file shows is the virtual machine (the hypervisor flag), and no kernel age is claimed
    (the recorded file has no kernel release). The same file with the hidden flags put back passes."""
    name = "f25-devops-intro_xeon-8575c-kvm"
    real = _corpus_finding(tmp_path / "real", name)
    assert real.status == "fail", real.summary
    assert real.summary.startswith("Intel(R) Xeon(R) Platinum 8575C (Emerald Rapids)"), real.summary
    assert real.evidence["x86_family_model_stepping"] == "6/207/2" and real.evidence["logical_cpus"] == 4
    assert real.evidence["missing_kernel_gated"] == ["amx_bf16", "amx_int8", "amx_tile"]
    assert real.evidence["missing_cpuid_read"] == ["avx512_fp16", "avx_vnni"]
    hints = real.evidence["hints"]
    assert isinstance(hints, list) and len(hints) == 1 and hints[0].startswith("this is a virtual machine"), hints
    assert "product_evidence" not in real.evidence and "dmi" not in real.evidence
    text = _dump(name).cpuinfo.read_text()
    amx = _add_flags(text, "amx_bf16", "amx_tile", "amx_int8")
    with_amx = cpu_feature_verdict(read_cpu_capability(_procfs(tmp_path / "amx", amx, "x86_64"), tmp_path))
    assert with_amx.status == "warn" and with_amx.evidence["missing_kernel_gated"] == [], with_amx.summary
    full = _add_flags(amx, "avx512_fp16", "avx_vnni")
    whole = cpu_feature_verdict(read_cpu_capability(_procfs(tmp_path / "full", full, "x86_64"), tmp_path))
    assert whole.status == "ok" and "(Emerald Rapids)" in whole.summary, whole.summary


@pytest.mark.parametrize("dump", cpu_corpus.dumps(), ids=lambda d: d.name)
def test_a_recorded_dump_is_read_as_its_own_machine(dump: cpu_corpus.Dump) -> None:
    """Every dump, alone in a tree with nothing that names the architecture, is read as the machine its source
    documents (SOURCES.tsv's ``machine``: the source's naming, not this code), inferred from the dump's layout."""
    cap = cpu_corpus.capability(dump)
    assert cap.arch_source == "inferred from cpuinfo" and cap.arch_evidence, cap.arch_source
    assert cap.info.machine == dump.machine, (cap.info.machine, cap.arch_evidence)
    assert "None" not in cap.cpu_model


def test_every_architecture_of_the_corpus_is_inferred() -> None:
    """The parametrized test above covers each architecture the corpus has (one dump at least per machine)."""
    assert {d.machine for d in cpu_corpus.dumps()} == {
        "x86_64", "aarch64", "armv6l", "armv7l", "s390x", "ppc", "ppc64", "ppc64le", "riscv64", "loongarch64",
        "sparc64",
    }  # fmt: skip


class _Probe:
    """The live-kernel boundary of a machine whose kernel is ``arch`` and whose boot id is ``boot``."""

    def __init__(self, arch: str, boot: str) -> None:
        self.arch, self.boot = arch, boot

    def machine(self) -> str:
        return self.arch

    def boot_id(self) -> str:
        return self.boot

    def arch_prctl_get(self, code: int) -> int:
        raise OSError(22, "no")

    def sve_get_vl(self) -> int:
        raise OSError(22, "no")


def test_the_architecture_sources_and_their_order(tmp_path: Path) -> None:
    """given > the running kernel (the tree is its own) > recorded (sys/kernel/arch, uname) > the cpuinfo's layout."""
    text = _dump("util-linux_loongarch-loongson_3a5000_hv").cpuinfo.read_text()
    procfs = _procfs(tmp_path, text, "loongarch64")
    cap = read_cpu_capability(procfs, tmp_path)
    assert (cap.info.arch, cap.arch_source, cap.arch_evidence) == (
        "loongarch64",
        "recorded uname",
        "<procfs>/sys/kernel/arch",
    )
    (procfs / "sys" / "kernel" / "arch").unlink()
    cap = read_cpu_capability(procfs, tmp_path)
    assert cap.info.arch == "loongarch64" and cap.arch_source == "inferred from cpuinfo", cap.arch_source
    # The tree of the running kernel (its boot_id is the probe's): uname -m of that kernel.
    boot = "5b1d3c1e-0000-4000-8000-000000000031"
    (procfs / "sys" / "kernel" / "random").mkdir(parents=True)
    (procfs / "sys" / "kernel" / "random" / "boot_id").write_text(boot + "\n")
    cap = read_cpu_capability(procfs, tmp_path, probe=_Probe("loongarch64", boot))
    assert cap.info.arch == "loongarch64" and cap.arch_source == "running kernel", cap.arch_source
    # Another kernel's boot: the running kernel says nothing about this tree.
    cap = read_cpu_capability(procfs, tmp_path, probe=_Probe("x86_64", "another-boot"))
    assert cap.info.machine == "loongarch64" and cap.arch_source == "inferred from cpuinfo"
    # A recorded `uname -a` (the convention agent/node/host/machine.py documents).
    uname_a = "Linux node7 6.6.0 #1 SMP PREEMPT Mon Jan 1 00:00:00 UTC 2024 loongarch64 GNU/Linux\n"
    (procfs / "uname").write_text(uname_a)
    cap = read_cpu_capability(procfs, tmp_path, probe=_Probe("x86_64", "another-boot"))
    assert cap.info.machine == "loongarch64" and (cap.arch_source, cap.arch_evidence) == (
        "recorded uname",
        "<procfs>/uname",
    )
    # Given: it wins, and agrees with the file.
    cap = read_cpu_capability(procfs, tmp_path, machine="loongarch64")
    assert cap.arch_source == "given"


def test_sources_that_disagree_are_an_error_naming_both(tmp_path: Path) -> None:
    """A LoongArch cpuinfo said to be x86_64 (given, or a recorded sys/kernel/arch) is never read as either."""
    text = _dump("util-linux_loongarch-loongson_3a5000_hv").cpuinfo.read_text()
    procfs = _procfs(tmp_path, text, "x86_64")
    with pytest.raises(SourceFormatError, match=r"contradictory: x86_64 \(recorded uname.*loongarch64 \(inferred"):
        read_cpu_capability(procfs, tmp_path)
    (procfs / "sys" / "kernel" / "arch").unlink()
    with pytest.raises(SourceFormatError, match=r"contradictory: x86_64 \(given.*loongarch64 \(inferred"):
        read_cpu_capability(procfs, tmp_path, machine="x86_64")
    # and for an arm64 kernel a file without ARM lines is an error
    with pytest.raises(SourceFormatError):
        parse_cpuinfo("no colon here\nbogus line\n", "aarch64")
    # a cpuinfo of no known layout, in a tree that records nothing: say how to state it
    (procfs / "cpuinfo").write_text("processor\t: 0\nsomething\t: else\n")
    with pytest.raises(SourceFormatError, match="state it with --machine"):
        read_cpu_capability(procfs, tmp_path)
    assert read_cpu_capability(procfs, tmp_path, machine="alpha").info.arch == "alpha"


def test_every_dump_parses_for_every_kernel() -> None:
    """No dump raises anything but the project's error, whichever kernel it is attributed to."""
    for d in cpu_corpus.dumps():
        text = d.cpuinfo.read_text(encoding="ascii", errors="replace")
        for machine in ("x86_64", "aarch64", "armv7l", "s390x", "riscv64", ""):
            with contextlib.suppress(InferwatchError):
                parse_cpuinfo(text, machine)


def test_sources_tsv_is_well_formed() -> None:
    with cpu_corpus.SOURCES.open(newline="") as fh:
        rows = list(csv.reader(fh, delimiter="\t"))
    assert rows[0] == ["name", "machine", "repo", "path", "commit", "licence", "note"]
    assert all(len(r) == 7 for r in rows)


def test_node_identity_takes_the_kernels_architecture(tmp_path: Path) -> None:
    from inferwatch.agent.node.identity import node_identity

    d = _dump("util-linux_s390-lpar")
    ident = node_identity(_procfs(tmp_path, d.cpuinfo.read_text(), d.machine), tmp_path / "nosys")
    assert ident["host.arch"] == "s390x" and ident["host.cpu.vendor.id"] == "IBM/S390"
    d = _dump("pytorch-cpuinfo_raspberrypi")
    ident = node_identity(_procfs(tmp_path / "pi", d.cpuinfo.read_text(), d.machine), tmp_path / "nosys")
    assert ident["host.arch"] == "arm32" and ident["host.cpu.model.name"] == "Arm ARM1176"
