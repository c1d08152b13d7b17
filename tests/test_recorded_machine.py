"""Recorded machines are read as themselves (issue 31): the doctor's gate on corpus dumps with nothing in the tree
that names the architecture, ``--machine``, the live /proc, and cpuinfo reads bounded in memory as in bytes.

The dumps are real (tests/fixtures/cpuinfo/corpus/, SOURCES.tsv); the failing ones are edited copies, as the
issue's reporter made them: a Graviton3 dump with its ``sve`` token removed and a Graviton4 (Neoverse-V2) dump
with its ``sve2`` token removed, from every processor block. None of the trees holds ``sys/kernel/arch``.
"""

from __future__ import annotations

import json
import os
import platform
import subprocess
import tracemalloc
from pathlib import Path

import pytest

from inferwatch.agent.errors import ReadLimitError, SourceFormatError
from inferwatch.agent.node.host.cpucap import read_cpu_capability
from inferwatch.agent.node.host.cpuinfo import parse_cpuinfo, read_cpuinfo
from inferwatch.agent.node.host.procfs import MAX_LINE_BYTES
from tests import cpu_corpus
from tests.conftest import PYTHON, ROOT
from tests.test_cpu import _drop

GRAVITON3 = "eessi_AWS-awslinux-graviton3"  # Neoverse-V1, one processor block
GRAVITON4 = "ecaz_graviton4-m8g.2xlarge"  # Neoverse-V2, the whole /proc/cpuinfo of an m8g.2xlarge (8 blocks)
EPYC = ROOT / "tests" / "fixtures" / "cpuinfo" / "x86_amd_epyc_7451_zen1_96cpu.txt"  # 96 real x86 blocks
TEN_MB = 10_000_000
# tracemalloc peak of one read of a 10 MB cpuinfo: 147.6 MB when the file was read whole, split and kept as dicts;
# ~0.2 MB line by line (measured, this machine). 4 MiB leaves room for interpreter noise, nowhere near a copy.
MAX_PARSE_PEAK_BYTES = 4 << 20


def _dump(name: str) -> cpu_corpus.Dump:
    return next(d for d in cpu_corpus.dumps() if d.name == name)


def _tree(tmp_path: Path, text: str) -> Path:
    """A recorded procfs tree: the cpuinfo alone, nothing naming the architecture."""
    procfs = tmp_path / "proc"
    procfs.mkdir(parents=True)
    (procfs / "cpuinfo").write_text(text)
    return procfs


def _doctor(procfs: Path, sysfs: Path, *args: str) -> tuple[int, dict[str, object], str]:
    cmd = [PYTHON, "-m", "inferwatch.agent", "doctor", "--path.procfs", str(procfs), "--path.sysfs", str(sysfs), *args]
    r = subprocess.run(cmd, cwd=ROOT, capture_output=True, text=True, timeout=120)
    assert "Traceback" not in r.stderr, r.stderr
    return r.returncode, json.loads(r.stdout) if "--json" in args else {}, r.stdout


def _checks(doc: dict[str, object]) -> dict[str, dict[str, object]]:
    checks = doc["checks"]
    assert isinstance(checks, list)
    return {c["id"]: c for c in checks}


@pytest.mark.parametrize(
    ("name", "removed"),
    [(GRAVITON3, "sve"), (GRAVITON4, "sve2")],
)
def test_the_gate_fails_a_recorded_arm64_machine_that_lacks_the_feature(
    tmp_path: Path, name: str, removed: str
) -> None:
    """Read as x86 (the running kernel's arch) these passed with exit 0; read as the dump says they fail."""
    text = _dump(name).cpuinfo.read_text()
    assert f" {removed} " in f" {text.split('Features')[1].splitlines()[0]} "  # the real dump has it
    rc, doc, _ = _doctor(_tree(tmp_path / "edited", _drop(text, removed)), tmp_path, "--json")
    cpu = _checks(doc)["cpu.features"]
    assert rc == 1 and cpu["status"] == "fail", cpu
    assert cpu["evidence"]["missing"] == [removed]  # type: ignore[index]
    assert doc["machine"] == {
        "machine": "aarch64",
        "arch": "aarch64",
        "arch_source": "inferred from cpuinfo",
        "arch_evidence": "Features: asimd fp (arm64 hwcaps)",
    }
    # the dump as recorded passes: the failure is the removed feature, nothing else
    rc, doc, _ = _doctor(_tree(tmp_path / "real", text), tmp_path, "--json")
    assert _checks(doc)["cpu.features"]["status"] == "ok" and rc == 0, _checks(doc)["cpu.features"]


def test_the_text_output_says_which_architecture_and_why(tmp_path: Path) -> None:
    procfs = _tree(tmp_path, _drop(_dump(GRAVITON3).cpuinfo.read_text(), "sve"))
    rc, _, out = _doctor(procfs, tmp_path)
    assert rc == 1
    assert "architecture: aarch64 (inferred from cpuinfo: Features: asimd fp (arm64 hwcaps))" in out, out


def test_machine_flag_states_it_and_a_contradiction_fails_the_gate(tmp_path: Path) -> None:
    procfs = _tree(tmp_path, _dump(GRAVITON3).cpuinfo.read_text())
    rc, doc, _ = _doctor(procfs, tmp_path, "--json", "--machine", "aarch64")
    assert rc == 0 and doc["machine"]["arch_source"] == "given"  # type: ignore[index]
    rc, doc, out = _doctor(procfs, tmp_path, "--json", "--machine", "x86_64")
    cpu = _checks(doc)["cpu"]  # the collector's failure: the check named after it, as for any crash
    assert rc == 1 and cpu["status"] == "fail" and "cpu.features" not in _checks(doc), out
    assert "machine" not in doc
    assert "contradictory: x86_64 (given" in str(cpu["summary"]) and "aarch64 (inferred from cpuinfo" in str(
        cpu["summary"]
    )
    r = subprocess.run(
        [PYTHON, "-m", "inferwatch.agent", "doctor", "--path.procfs", str(procfs), "--machine", "not an arch"],
        cwd=ROOT,
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert r.returncode == 2 and "path.machine" in r.stderr and "Traceback" not in r.stderr, r.stderr


def test_the_agent_setting_states_it(tmp_path: Path) -> None:
    from inferwatch.agent.config import load_settings
    from inferwatch.agent.node.collectors.cpu import CPUCollector
    from inferwatch.agent.node.wiring import collect_context

    procfs = _tree(tmp_path, _dump(GRAVITON3).cpuinfo.read_text())
    settings = load_settings(None, {"path": {"procfs": str(procfs), "sysfs": str(tmp_path), "machine": "AArch64"}})
    assert settings.path.machine == "aarch64"
    finding = CPUCollector(collect_context(settings), settings.cpu, settings.path.machine).collect().findings[0]
    assert finding.evidence["arch_source"] == "given" and finding.evidence["machine"] == "aarch64"


def test_the_live_proc_is_the_running_kernel(tmp_path: Path) -> None:
    """/proc itself, or a link to it (the host's /proc mounted elsewhere), is read as the running kernel."""
    cap = read_cpu_capability(Path("/proc"), Path("/sys"))
    assert cap.arch_source == "running kernel" and cap.info.machine == platform.machine(), cap.arch_evidence
    (tmp_path / "hostproc").symlink_to("/proc")
    assert read_cpu_capability(tmp_path / "hostproc", Path("/sys")).arch_source == "running kernel"


def test_the_running_kernels_boot_id_makes_a_copied_tree_its_own(tmp_path: Path) -> None:
    """A copy of this kernel's files with its boot_id is this kernel (a tree with another boot id is not)."""
    procfs = _tree(tmp_path, Path("/proc/cpuinfo").read_text(errors="replace"))
    boot = Path("/proc/sys/kernel/random/boot_id").read_text()
    (procfs / "sys" / "kernel" / "random").mkdir(parents=True)
    (procfs / "sys" / "kernel" / "random" / "boot_id").write_text(boot)
    assert read_cpu_capability(procfs, Path("/sys")).arch_source == "running kernel"
    (procfs / "sys" / "kernel" / "random" / "boot_id").write_text("00000000-0000-4000-8000-000000000000\n")
    assert read_cpu_capability(procfs, Path("/sys")).arch_source == "inferred from cpuinfo"


# --- memory: a cpuinfo under the byte cap is read in bounded memory ------------------------------------------


def _ten_mb(path: Path, unit: bytes) -> Path:
    path.mkdir(parents=True)
    with (path / "cpuinfo").open("wb") as fh:
        for _ in range(TEN_MB // len(unit) + 1):
            fh.write(unit)
    return path


def _peak(fn: object) -> tuple[object, int]:
    assert callable(fn)
    tracemalloc.start()
    try:
        out = fn()
        return out, tracemalloc.get_traced_memory()[1]
    finally:
        tracemalloc.stop()


def test_a_10mb_cpuinfo_is_parsed_in_bounded_memory(tmp_path: Path) -> None:
    """75 copies of a real 96-CPU file: 7,200 blocks, read with the flags every block reports, in < 4 MiB."""
    unit = EPYC.read_bytes()
    procfs = _ten_mb(tmp_path / "proc", unit)
    (procfs / "sys" / "kernel").mkdir(parents=True)
    (procfs / "sys" / "kernel" / "arch").write_text("x86_64\n")
    cap, peak = _peak(lambda: read_cpu_capability(procfs, tmp_path))
    one = parse_cpuinfo(unit.decode(), "x86_64")
    copies = TEN_MB // len(unit) + 1
    assert cap.info.logical_cpus == one.logical_cpus * copies and cap.info.flags == one.flags  # type: ignore[attr-defined]
    assert peak < MAX_PARSE_PEAK_BYTES, f"peak {peak / 1e6:.1f} MB"


@pytest.mark.parametrize(
    "shape",
    ["distinct_keys", "distinct_cores", "distinct_flags"],
)
def test_hostile_cpuinfo_shapes_stay_bounded(tmp_path: Path, shape: str) -> None:
    """10 MB built to grow a parser that keeps what it reads: every line a new key, every block a new core
    type, every block new flag tokens. Kept: the keys read, at most 64 core types, the running intersection."""
    if shape == "distinct_keys":
        body = "processor\t: 0\n" + "".join(f"key{i:07d}\t: v\n" for i in range(TEN_MB // 16))
        machine = "x86_64"
    elif shape == "distinct_cores":
        block = "processor\t: {i}\nFeatures\t: fp asimd\nCPU implementer\t: 0x41\nCPU part\t: {i:#x}\n\n"
        body = "".join(block.format(i=i) for i in range(TEN_MB // len(block)))
        machine = "aarch64"
    else:
        block = "processor\t: {i}\nFeatures\t: fp asimd " + " ".join(f"f{{i}}x{j}" for j in range(20)) + "\n\n"
        body = "".join(block.format(i=i) for i in range(TEN_MB // len(block)))
        machine = "aarch64"
    procfs = tmp_path / "proc"
    procfs.mkdir()
    (procfs / "cpuinfo").write_text(body)
    info, peak = _peak(lambda: read_cpuinfo(procfs, machine))
    assert peak < MAX_PARSE_PEAK_BYTES, f"{shape}: peak {peak / 1e6:.1f} MB"
    if shape == "distinct_cores":
        assert len(info.core_types) == 64  # type: ignore[attr-defined]
    if shape == "distinct_flags":
        assert info.flags == {"fp", "asimd"}  # type: ignore[attr-defined]


def test_an_endless_or_one_line_cpuinfo_is_refused_in_bounded_memory(tmp_path: Path) -> None:
    procfs = tmp_path / "proc"
    procfs.mkdir()
    os.symlink("/dev/zero", procfs / "cpuinfo")
    with pytest.raises(ReadLimitError, match=r"read_limits\.max_cpuinfo_bytes"):
        _peak(lambda: read_cpuinfo(procfs, "x86_64"))
    (procfs / "cpuinfo").unlink()
    (procfs / "cpuinfo").write_text("processor\t: 0\nflags\t: " + "x" * TEN_MB + "\n")
    tracemalloc.start()
    try:
        with pytest.raises(SourceFormatError, match=f"line 2 is longer than {MAX_LINE_BYTES} bytes"):
            read_cpuinfo(procfs, "x86_64")
        peak = tracemalloc.get_traced_memory()[1]
    finally:
        tracemalloc.stop()
    assert peak < MAX_PARSE_PEAK_BYTES, f"peak {peak / 1e6:.1f} MB"


def test_the_small_procfs_files_are_read_in_bounded_memory_too(tmp_path: Path) -> None:
    """1 MiB (the file limit) of distinct fields: meminfo and memory.stat are refused past 4,096 fields, vmstat
    keeps only the counters it reports, PSI only ``some``/``full``; each read a line at a time. Whole-text
    parses that kept every field peaked at 12.5 (meminfo) and 13.6 MB (vmstat, memory.stat)."""
    from inferwatch.agent.node.host.cgroup import parse_memory_stat
    from inferwatch.agent.node.host.meminfo import read_meminfo
    from inferwatch.agent.node.host.pressure import read_pressure
    from inferwatch.agent.node.host.procfs import DEFAULT_READ_LIMITS
    from inferwatch.agent.node.host.vmstat import read_vmstat

    def fill(name: str, line: str) -> Path:
        unit = len(line.format(i=0))
        (tmp_path / name).write_text("".join(line.format(i=i) for i in range((1 << 20) // unit - 1)))
        return tmp_path / name

    fill("meminfo", "K{i:07d}: {i:07d} kB\n")
    with pytest.raises(SourceFormatError, match="more than 4096 fields"):
        _, peak = _peak(lambda: read_meminfo(tmp_path))
    fill("vmstat", "pgmajfault_x{i:07d} 1\n")
    counters, peak = _peak(lambda: read_vmstat(tmp_path))
    assert counters == {"pgmajfault": (1 << 20) // 22 - 1} and peak < MAX_PARSE_PEAK_BYTES, peak
    stat = fill("memory.stat", "f{i:07d} 1\n")
    with pytest.raises(SourceFormatError, match="more than 4096 fields"):
        parse_memory_stat(DEFAULT_READ_LIMITS.lines(stat, "memory.stat"))
    psi = fill("memory.pressure", "k{i:07d} avg10=0.00 avg60=0.00 avg300=0.00 total=0\n")
    psi.write_text(psi.read_text() + "some avg10=1.00 avg60=0.00 avg300=0.00 total=5\n")
    lines, peak = _peak(lambda: read_pressure(psi))
    assert set(lines) == {"some"} and peak < MAX_PARSE_PEAK_BYTES, peak  # type: ignore[arg-type]
