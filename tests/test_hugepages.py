"""The huge pages collector on recorded /proc/meminfo files and the transparent huge page files' documented format."""

from __future__ import annotations

from pathlib import Path

import pytest

from inferwatch.agent.config import load_settings
from inferwatch.agent.errors import NoDataError, SourceFormatError
from inferwatch.agent.node.collectors import REGISTRY, is_enabled
from inferwatch.agent.node.collectors.hugepages import HugePagesCollector, thp_mode
from inferwatch.agent.node.runner import validate
from inferwatch.agent.node.wiring import collect_context
from tests.conftest import FIXTURES

# Documentation/admin-guide/mm/transhuge.rst (torvalds/linux): "cat /sys/kernel/mm/transparent_hugepage/enabled"
# prints the modes with the one in force in brackets; defrag has five modes.
THP_ENABLED = "always [madvise] never\n"
THP_DEFRAG = "always defer defer+madvise [madvise] never\n"


def _node(tmp_path: Path, meminfo: str, thp: bool = True) -> HugePagesCollector:
    proc, sys = tmp_path / "proc", tmp_path / "sys"
    proc.mkdir()
    (proc / "meminfo").write_text((FIXTURES / "meminfo" / f"{meminfo}.txt").read_text())
    if thp:
        d = sys / "kernel" / "mm" / "transparent_hugepage"
        d.mkdir(parents=True)
        (d / "enabled").write_text(THP_ENABLED)
        (d / "defrag").write_text(THP_DEFRAG)
    settings = load_settings(overrides={"path": {"procfs": str(proc), "sysfs": str(sys)}})
    return HugePagesCollector(collect_context(settings))


def _values(collector: HugePagesCollector) -> dict[tuple[str, tuple[tuple[str, str], ...]], float]:
    collection = validate(collector.collect())
    return {(s.name, tuple(sorted(s.attributes))): s.value for s in collection.samples}


def test_pool_and_thp_from_the_kernel_docs_example(tmp_path: Path) -> None:
    values = _values(_node(tmp_path, "kernel_doc_proc_rst_example"))
    for state in ("total", "free", "reserved", "surplus"):
        assert values[("inferwatch.memory.hugepages", (("state", state),))] == 0
    assert values[("inferwatch.memory.hugepages.size", ())] == 2048 * 1024
    assert values[("inferwatch.memory.anon_hugepages", ())] == 4149248 * 1024  # AnonHugePages: 4149248 kB
    thp = {k[1]: v for k, v in values.items() if k[0] == "inferwatch.memory.transparent_hugepage"}
    assert thp == {
        (("mode", "madvise"), ("setting", "enabled")): 1.0,
        (("mode", "madvise"), ("setting", "defrag")): 1.0,
    }


def test_a_kernel_without_thp_reports_the_pool_only(tmp_path: Path) -> None:
    values = _values(_node(tmp_path, "gopsutil_intelcorei5_16gb", thp=False))
    assert values[("inferwatch.memory.hugepages", (("state", "total"),))] == 0
    assert not [k for k in values if k[0] == "inferwatch.memory.transparent_hugepage"]


def test_meminfo_without_hugepage_lines_is_absent_with_a_hint(tmp_path: Path) -> None:
    collector = _node(tmp_path, "gopsutil_issue1002_legacy_header")  # a 2.4-era file: no HugePages lines
    with pytest.raises(NoDataError) as err:
        collector.collect()
    assert "CONFIG_HUGETLBFS" in (err.value.hint or "")


@pytest.mark.parametrize("text", ["always madvise never", "[always] [never]", "", "[]"])
def test_a_thp_file_without_one_mode_in_force_is_a_format_error(text: str) -> None:
    with pytest.raises(SourceFormatError):
        thp_mode(text)


def test_off_by_default_and_on_when_asked() -> None:
    assert not is_enabled("hugepages", load_settings())
    assert is_enabled("hugepages", load_settings(overrides={"collectors": {"hugepages": {"enabled": True}}}))
    assert list(REGISTRY).index("hugepages") == list(REGISTRY).index("pagecache") + 1  # its order: 15
