"""Property-based tests (hypothesis) for the procfs parsers in agent/node/host/, and the bounded procfs read.

Each parser, on any text, returns a value or raises the project's error (agent/errors.py), never another
exception, in bounded time; a procfs file that is huge or never ends (a link to /dev/zero) is read only up
to a named limit (:data:`inferwatch.agent.node.host.procfs.MAX_PROCFS_READ_BYTES`) and rejected with the project's
error.
"""

from __future__ import annotations

import contextlib
import os
import resource
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from inferwatch.agent.errors import InferwatchError, SourceFormatError
from inferwatch.agent.node.host import procfs as procfs_read
from inferwatch.agent.node.host.cgroup import parse_memory_stat
from inferwatch.agent.node.host.cpuinfo import parse_cpuinfo, read_cpuinfo
from inferwatch.agent.node.host.meminfo import parse_meminfo, read_meminfo
from inferwatch.agent.node.host.pressure import parse_pressure, read_pressure
from inferwatch.agent.node.host.vmstat import parse_vmstat, read_vmstat
from tests import cpu_corpus

MACHINES = ["x86_64", "aarch64", "armv7l", "armv6l", "s390x", "ppc64le", "riscv64", "loongarch64", "sparc64", ""]
# Lines shaped like procfs lines: keys the parsers look for, separators, values that are numbers or not.
KEYS = [
    "processor", "Processor", "flags", "Features", "features", "CPU implementer", "CPU part", "CPU variant",
    "vendor_id", "cpu family", "model", "model name", "stepping", "# processors", "MemTotal", "MemFree",
    "Inactive(file)", "some", "full", "avg10", "pgmajfault", "allocstall_normal", "workingset_refault", "total",
]  # fmt: skip
VALUES = st.one_of(
    st.integers(min_value=-(2**70), max_value=2**70).map(str),
    st.sampled_from(["0x41", "0xd40", "0x", "-0x5", "kB", "²", "٣", "1e999", "nan", "inf", "1_0", "", " ", "avg10="]),
    st.text(max_size=20),
    st.just("9" * 5000),
)
LINE = st.one_of(
    st.tuples(st.sampled_from(KEYS), st.sampled_from([":", "\t:", " : ", "=", " "]), VALUES).map("".join),
    st.builds(lambda v: f"some avg10={v} avg60={v} avg300={v} total={v}", VALUES),
    st.text(max_size=40),
)
TEXT = st.one_of(st.lists(LINE, max_size=40).map("\n".join), st.text(max_size=400))
PROPERTY = settings(max_examples=300, deadline=2000, suppress_health_check=[HealthCheck.too_slow])
MAX_PARSE_S = 2.0  # CPU seconds of the parsing thread (time.thread_time): the work, not the machine's load


def _returns_or_raises_ours(fn: Callable[..., Any], *args: Any) -> None:
    start = time.thread_time()
    with contextlib.suppress(InferwatchError):
        fn(*args)
    assert time.thread_time() - start < MAX_PARSE_S


@PROPERTY
@given(TEXT, st.sampled_from(MACHINES))
def test_cpuinfo_parser_returns_or_raises_ours(text: str, machine: str) -> None:
    _returns_or_raises_ours(parse_cpuinfo, text, machine)


@PROPERTY
@given(st.sampled_from([d.name for d in cpu_corpus.dumps()]), st.data())
def test_cpuinfo_parser_on_mangled_real_dumps(name: str, data: st.DataObject) -> None:
    """Real dumps cut at any point, with lines dropped or duplicated, for any kernel."""
    lines = (cpu_corpus.CORPUS / f"{name}.cpuinfo").read_text(encoding="ascii", errors="replace").splitlines()
    cut = data.draw(st.integers(0, len(lines)))
    extra = data.draw(st.lists(LINE, max_size=5))
    text = "\n".join(lines[:cut] + extra + lines[cut:][: data.draw(st.integers(0, 20))])
    _returns_or_raises_ours(parse_cpuinfo, text, data.draw(st.sampled_from(MACHINES)))


TEXT_PARSERS: dict[str, Callable[[str], object]] = {
    "meminfo": parse_meminfo,
    "pressure": parse_pressure,
    "vmstat": parse_vmstat,
    "cgroup memory.stat": parse_memory_stat,
}


@pytest.mark.parametrize("name", sorted(TEXT_PARSERS))
@PROPERTY
@given(text=TEXT)
def test_procfs_parsers_return_or_raise_ours(name: str, text: str) -> None:
    _returns_or_raises_ours(TEXT_PARSERS[name], text)


def test_the_examples_hypothesis_found() -> None:
    """Digits int() refuses ("²"), or more than its 4300-digit limit: skipped, never a ValueError."""
    assert parse_vmstat("pgmajfault ²\n") == {}
    assert parse_vmstat("pgmajfault " + "9" * 5000 + "\n") == {}
    assert parse_memory_stat("inactive_file ²\n") == {}
    with pytest.raises(SourceFormatError):
        parse_meminfo("MemTotal: " + "9" * 5000 + " kB\n")


# --- bounded reads ---------------------------------------------------------------------------------------


def _max_rss_bytes() -> int:
    return resource.getrusage(resource.RUSAGE_SELF).ru_maxrss * 1024  # Linux: KiB


READERS: dict[str, Callable[[Path], object]] = {
    "cpuinfo": lambda p: read_cpuinfo(p, "x86_64"),
    "meminfo": read_meminfo,
    "vmstat": read_vmstat,
    "pressure/memory": lambda p: read_pressure(p / "pressure" / "memory"),
}


@pytest.mark.parametrize("name", sorted(READERS))
def test_an_endless_procfs_file_is_read_only_up_to_the_limit(tmp_path: Path, name: str) -> None:
    """A link to /dev/zero (a file that never ends) is rejected with our error, memory bounded by the limit."""
    path = tmp_path / name
    path.parent.mkdir(parents=True, exist_ok=True)
    os.symlink("/dev/zero", path)
    before = _max_rss_bytes()
    start = time.thread_time()  # CPU seconds (reading /dev/zero is this thread's system time): the work done
    with pytest.raises(SourceFormatError, match="larger than"):
        READERS[name](tmp_path)
    assert time.thread_time() - start < 5.0
    limit = procfs_read.MAX_CPUINFO_READ_BYTES if name == "cpuinfo" else procfs_read.MAX_PROCFS_READ_BYTES
    assert _max_rss_bytes() - before <= 2 * limit + (8 << 20)


def test_a_huge_procfs_file_is_rejected_and_the_limit_is_named(tmp_path: Path) -> None:
    (tmp_path / "meminfo").write_bytes(b"MemTotal: 1 kB\n" * ((procfs_read.MAX_PROCFS_READ_BYTES // 15) + 2))
    with pytest.raises(SourceFormatError, match=f"larger than {procfs_read.MAX_PROCFS_READ_BYTES} bytes"):
        read_meminfo(tmp_path)
    (tmp_path / "meminfo").write_bytes(b"MemTotal: 1 kB\n")
    assert read_meminfo(tmp_path)["MemTotal"] == 1024


def test_read_bounded_reads_exactly_up_to_the_limit(tmp_path: Path) -> None:
    path = tmp_path / "f"
    path.write_bytes(b"x" * 100)
    assert procfs_read.read_bounded(path, 100) == b"x" * 100
    with pytest.raises(SourceFormatError):
        procfs_read.read_bounded(path, 99)
