from __future__ import annotations

import pytest

from inferwatch.agent.config import load_settings
from inferwatch.agent.errors import NoDataError, SourceFormatError
from inferwatch.agent.node.collectors.pagecache import PageCacheCollector
from inferwatch.agent.node.host.meminfo import mem_available, parse_meminfo
from inferwatch.agent.node.host.pagecache import pagecache_verdict
from inferwatch.agent.node.host.pressure import parse_pressure
from inferwatch.agent.node.host.vmstat import parse_vmstat
from inferwatch.agent.node.runner import validate
from inferwatch.agent.node.wiring import collect_context
from tests.conftest import FIXTURES

MEM = FIXTURES / "meminfo"


def _meminfo(name: str) -> dict[str, int]:
    return parse_meminfo((MEM / f"{name}.txt").read_text())


def test_meminfo_units_and_fields() -> None:
    info = _meminfo("kernel_doc_proc_rst_example")
    assert info["Inactive(file)"] == 3015640 * 1024
    assert "MemAvailable" in info


def test_legacy_header_is_skipped() -> None:
    info = _meminfo("gopsutil_issue1002_legacy_header")
    assert info["MemTotal"] == 254472 * 1024
    assert "total" not in info and "Mem" not in info


def test_no_memavailable_falls_back() -> None:
    info = _meminfo("procfs_large_pagecache_no_memavailable")
    assert "MemAvailable" not in info
    assert mem_available(info) == info["MemFree"] + info.get("Buffers", 0) + info["Cached"]


def test_garbage_meminfo_is_a_format_error() -> None:
    with pytest.raises(SourceFormatError):
        parse_meminfo("MemTotal: lots kB\n")
    with pytest.raises(SourceFormatError):
        parse_meminfo("hello\n")


def test_pressure_parsing_without_trailing_newline() -> None:
    p = parse_pressure((MEM / "pressure_memory_nonzero_gopsutil.txt").read_text())
    assert p["some"].avg10 == pytest.approx(0.0232)
    assert p["full"].total_seconds == pytest.approx(1367e-6)
    zero = parse_pressure((MEM / "pressure_memory_all_zero_node_exporter.txt").read_text())
    assert zero["some"].avg10 == 0


def test_zoned_vmstat_is_summed() -> None:
    vm = parse_vmstat((MEM / "vmstat_node_exporter_pre_4_8_zoned.txt").read_text())
    text = (MEM / "vmstat_node_exporter_pre_4_8_zoned.txt").read_text()
    expected = sum(
        int(v)
        for k, v in (line.split() for line in text.splitlines())
        if k.startswith("pgscan_direct_") and not k.endswith("_throttle")
    )
    assert vm["pgscan_direct"] == expected
    assert vm["pgmajfault"] > 0


@pytest.mark.parametrize(
    ("meminfo", "pressure", "expected"),
    [
        ("procfs_large_pagecache_no_memavailable", "pressure_memory_nonzero_gopsutil", "ok"),
        ("kernel_doc_proc_rst_example", "pressure_memory_nonzero_gopsutil", "ok"),
        ("gopsutil_intelcorei5_16gb", "pressure_memory_all_zero_node_exporter", "ok"),
        ("node_exporter_low_inactive_file_no_memavailable", "pressure_memory_all_zero_node_exporter", "warn"),
        ("node_exporter_low_inactive_file_no_memavailable", "pressure_memory_nonzero_gopsutil", "fail"),
        ("gopsutil_issue1002_legacy_header", None, "warn"),
    ],
)
def test_pagecache_verdicts(meminfo: str, pressure: str | None, expected: str) -> None:
    info = _meminfo(meminfo)
    psi = parse_pressure((MEM / f"{pressure}.txt").read_text()) if pressure else None
    assert pagecache_verdict(info, 1 << 30, psi).status == expected


def test_refaults_count_only_where_neither_psi_nor_memavailable_is_known() -> None:
    info = _meminfo("node_exporter_low_inactive_file_no_memavailable")  # 1.12 of 3.57 GiB available, no PSI
    assert pagecache_verdict(info, 1 << 30, None, refaults_per_s=12.0).status == "warn"
    cgroup = {"Inactive(file)": info["Inactive(file)"]}  # a cgroup's memory.stat: no MemTotal/MemAvailable
    assert pagecache_verdict(cgroup, 1 << 30, None, refaults_per_s=5000.0).status == "fail"
    assert pagecache_verdict(cgroup, 1 << 30, None, refaults_per_s=12.0).status == "warn"
    assert pagecache_verdict(cgroup, 1 << 30, None, refaults_per_s=None).status == "warn"
    starved = {**info, "MemFree": 40 << 20, "Cached": 150 << 20, "Buffers": 10 << 20}  # 0.2 of 3.57 GiB
    assert pagecache_verdict(starved, 1 << 30, None).status == "fail"


def _issue15_procfs(fake_procfs, psi: str, refaults: int):
    """16 GB host (recorded gopsutil meminfo, 10.7 GiB available) with Inactive(file) cut to 0.37 GiB."""
    text = (MEM / "gopsutil_intelcorei5_16gb.txt").read_text()
    text = text.replace("Inactive(file):  1683344 kB", "Inactive(file):   388000 kB")
    assert "388000" in text
    vmstat = f"nr_free_pages 2144407\nworkingset_refault_file {refaults}\npgmajfault 100\n"
    return fake_procfs(meminfo=text, pressure_memory=psi, vmstat=vmstat)


ZERO_PSI = (MEM / "pressure_memory_all_zero_node_exporter.txt").read_text()


@pytest.mark.parametrize(
    ("psi", "expected"),
    [(ZERO_PSI, "warn"), ((MEM / "pressure_memory_nonzero_gopsutil.txt").read_text(), "fail")],
)
def test_agent_and_doctor_agree_on_the_same_host(fake_procfs, psi: str, expected: str) -> None:
    """Issue 15: with plenty available and PSI 0 the agent said ``fail … memory is under pressure`` (it
    counted refaults since its last run) while ``doctor`` said ``warn``. Both run the one verdict; the
    agent's second run, with refaults in between, still agrees with the doctor's single run."""
    import json
    import subprocess

    from tests.conftest import PYTHON, ROOT

    root = _issue15_procfs(fake_procfs, psi, 1000)
    settings = load_settings(overrides={"path": {"procfs": str(root)}})
    collector = PageCacheCollector(collect_context(settings), settings.pagecache)
    first = validate(collector.collect()).findings[0]
    _issue15_procfs(fake_procfs, psi, 250000)  # refaults since the last run
    agent = validate(collector.collect()).findings[0]
    assert agent.evidence["workingset_refault_file_per_s"] > 0
    out = subprocess.run(
        [PYTHON, "-m", "inferwatch.agent", "doctor", "--json", "--path.procfs", str(root)],
        cwd=ROOT, capture_output=True, text=True, timeout=120,
    )  # fmt: skip
    doctor = {c["id"]: c for c in json.loads(out.stdout)["checks"]}["pagecache"]
    assert first.status == agent.status == doctor["status"] == expected, (agent.summary, doctor["summary"])
    assert agent.summary == doctor["summary"]
    if expected == "warn":
        assert "no memory pressure" in agent.summary and "10.71 GiB available" in agent.summary


def test_collector_on_recorded_procfs(fake_procfs) -> None:
    root = fake_procfs(
        meminfo=MEM / "node_exporter_low_inactive_file_no_memavailable.txt",
        pressure_memory=MEM / "pressure_memory_nonzero_gopsutil.txt",
        vmstat=MEM / "vmstat_node_exporter_pre_4_8_zoned.txt",
    )
    settings = load_settings(overrides={"path": {"procfs": str(root)}})
    result = validate(PageCacheCollector(collect_context(settings), settings.pagecache).collect())
    by = {(s.name, s.attributes): s.value for s in result.samples}
    assert by[("inferwatch.memory.file_lru", (("list", "inactive"),))] == 145676 * 1024
    assert by[("inferwatch.pressure.memory.avg", (("kind", "some"), ("window", "10s")))] == pytest.approx(0.0232)
    assert result.findings[0].status == "fail"


def test_collector_without_psi_still_reports(fake_procfs) -> None:
    root = fake_procfs(meminfo=MEM / "kernel_doc_proc_rst_example.txt")
    settings = load_settings(overrides={"path": {"procfs": str(root)}})
    result = PageCacheCollector(collect_context(settings), settings.pagecache).collect()
    assert "no PSI" in result.details["psi"]
    assert not [s for s in result.samples if s.name.startswith("inferwatch.pressure")]


def test_missing_meminfo_is_expected_absence(tmp_path) -> None:
    settings = load_settings(overrides={"path": {"procfs": str(tmp_path)}})
    with pytest.raises(NoDataError) as exc:
        PageCacheCollector(collect_context(settings), settings.pagecache).collect()
    assert "--path.procfs" in exc.value.hint
