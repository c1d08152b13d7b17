"""The runtime process collector on real child processes; the runtime's cgroup v2 files on a synthetic sysfs."""

from __future__ import annotations

import time
import uuid
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import Any

import psutil
import pytest

from inferwatch.agent.config import load_settings
from inferwatch.agent.errors import NoDataError
from inferwatch.agent.node.collectors import schedules
from inferwatch.agent.node.collectors.process import ProcessCollector, _faults
from inferwatch.agent.node.host.cgroup import cgroup_v2_path, parse_memory_stat
from inferwatch.agent.node.host.runtime import RuntimeLocator
from inferwatch.agent.node.runner import Runner, validate
from inferwatch.agent.node.state import AgentState
from inferwatch.agent.node.wiring import collect_context
from tests.conftest import PYTHON
from tests.procs import running


@contextmanager
def fake_runtime(tmp_path: Path, marker: str) -> Iterator[Any]:
    # A real process whose command line carries a unique marker, like "vllm serve MODEL".
    cmd = [PYTHON, "-c", "import time, sys; time.sleep(120)", f"fake-runtime-{marker}"]
    with running(cmd, tmp_path / f"rt-{uuid.uuid4().hex[:6]}.log") as proc:
        deadline = time.monotonic() + 10  # until exec: before it, the child's cmdline is still pytest's
        while time.monotonic() < deadline:
            # Seen once in a parallel run: the child gone (reaped, no output) before its exec was observed. Say
            # how it ended rather than psutil's bare NoSuchProcess, so a recurrence can be traced.
            assert proc.poll() is None, f"the fake runtime exited with {proc.returncode} before it ran (pid {proc.pid})"
            try:
                if cmd[-1] in psutil.Process(proc.pid).cmdline():
                    break
            except psutil.NoSuchProcess as exc:
                raise AssertionError(f"the fake runtime (pid {proc.pid}) vanished: {exc}; poll={proc.poll()}") from exc
            time.sleep(0.01)
        yield proc


def _collector(**runtime: object) -> ProcessCollector:
    settings = load_settings(overrides={"runtime": {"name": "vllm", **runtime}})
    return ProcessCollector(collect_context(settings), settings.pagecache)


def _values(collector: ProcessCollector) -> dict[tuple[str, tuple[tuple[str, str], ...]], float]:
    result = validate(collector.collect())
    return {(s.name, s.attributes): s.value for s in result.samples}


def test_found_by_pattern_and_rediscovered_after_restart(tmp_path: Path) -> None:
    marker = uuid.uuid4().hex
    c = _collector(cmdline_pattern=f"fake-runtime-{marker}")
    r = (("runtime", "vllm"),)
    with fake_runtime(tmp_path, marker) as first:
        v = _values(c)
        assert v[("inferwatch.runtime.up", r)] == 1
        assert v[("process.memory.usage", r)] > 1_000_000  # a Python interpreter is several MB resident
        assert v[("process.thread.count", r)] >= 1
        assert v[("inferwatch.runtime.restarts", r)] == 0
        assert v[("process.paging.faults", (("process.paging.fault_type", "minor"), ("runtime", "vllm")))] > 0
        assert ("process.context_switches", (("process.context_switch_type", "voluntary"), ("runtime", "vllm"))) in v
        assert c.locator.find().pid == first.pid
    with pytest.raises(NoDataError) as exc:
        c.collect()
    assert "not running" in str(exc.value) and "cmdline_pattern" in exc.value.hint
    assert [(s.name, s.value) for s in exc.value.samples] == [
        ("inferwatch.runtime.up", 0),
        ("inferwatch.runtime.restarts", 0),
    ]
    with fake_runtime(tmp_path, marker) as second:
        v = _values(c)
        assert c.locator.find().pid == second.pid
        assert v[("inferwatch.runtime.up", r)] == 1
        assert v[("inferwatch.runtime.restarts", r)] == 1
        assert v[("process.uptime", r)] < 120


def test_found_by_pidfile_and_pid(tmp_path: Path) -> None:
    pidfile = tmp_path / "runtime.pid"
    c = _collector(pidfile=str(pidfile))
    with pytest.raises(NoDataError, match="cannot be read"):
        c.collect()
    pidfile.write_text("garbage\n")
    with pytest.raises(NoDataError, match="not a pid"):
        c.collect()
    with fake_runtime(tmp_path, "a") as a, fake_runtime(tmp_path, "b") as b:
        pidfile.write_text(f"{a.pid}\n")
        assert c.locator.find().pid == a.pid
        pidfile.write_text(f"{b.pid}\n")  # the supervisor restarted the runtime and rewrote the pidfile
        _values(c)
        assert c.locator.find().pid == b.pid and c.locator.restarts == 1
        by_pid = _collector(pid=b.pid)
        assert _values(by_pid)[("inferwatch.runtime.up", (("runtime", "vllm"),))] == 1


def test_unconfigured_runtime_is_absent_with_a_hint() -> None:
    with pytest.raises(NoDataError) as exc:
        _collector().collect()
    assert "INFERWATCH_RUNTIME__CMDLINE_PATTERN" in exc.value.hint and not exc.value.samples


def test_runner_keeps_runtime_up_zero_when_absent() -> None:
    settings = load_settings(overrides={"runtime": {"pid": 2**22 - 1}})  # above pid_max's default: never a process
    state = AgentState()
    collectors = [ProcessCollector(collect_context(settings), settings.pagecache)]
    runner = Runner(state, collectors, schedules(collectors, settings))
    runner.start()
    try:
        deadline = time.monotonic() + 10
        while state.health()["process"].runs == 0 and time.monotonic() < deadline:
            time.sleep(0.05)
    finally:
        runner.stop()
    health = state.health()["process"]
    assert health.state == "absent" and "runtime.pid" in (health.hint or "")
    up = [s for s in state.samples() if s.name == "inferwatch.runtime.up"]
    assert [(s.value, s.attributes) for s in up] == [(0, (("runtime", "runtime"),))]


def test_procfs_root_is_respected(tmp_path: Path) -> None:
    saved = psutil.PROCFS_PATH
    try:
        (tmp_path / "proc").mkdir()
        loc = RuntimeLocator(
            load_settings(overrides={"runtime": {"cmdline_pattern": "python"}}).runtime, tmp_path / "proc"
        )
        with pytest.raises(NoDataError):  # an empty procfs has no processes, although python runs here
            loc.find()
        assert str(tmp_path / "proc") == psutil.PROCFS_PATH  # set on first use, not when the wiring builds it
    finally:
        psutil.PROCFS_PATH = saved


MEMORY_STAT = """anon 1073741824
file 8589934592
kernel 104857600
shmem 268435456
file_mapped 4294967296
file_dirty 4096
file_writeback 0
inactive_anon 0
active_anon 1073741824
inactive_file 536870912
active_file 7784628224
unevictable 0
workingset_refault_anon 0
workingset_refault_file 12345
pgfault 999999
pgmajfault 4242
pgscan 100000
pgsteal 90000
"""
MEMORY_PRESSURE = (
    "some avg10=12.50 avg60=3.00 avg300=0.50 total=9876543\nfull avg10=1.00 avg60=0.20 avg300=0.00 total=12345\n"
)


def test_cgroup_v2_memory_on_synthetic_sysfs(tmp_path: Path) -> None:
    marker = uuid.uuid4().hex
    with fake_runtime(tmp_path, marker) as proc:
        cg = cgroup_v2_path(Path("/proc"), proc.pid)  # the child's real cgroup path
        sysfs = tmp_path / "sys"
        directory = sysfs / "fs" / "cgroup" / cg.lstrip("/")
        directory.mkdir(parents=True)
        (directory / "memory.stat").write_text(MEMORY_STAT)
        (directory / "memory.pressure").write_text(MEMORY_PRESSURE)
        settings = load_settings(
            overrides={"runtime": {"cmdline_pattern": f"fake-runtime-{marker}"}, "path": {"sysfs": str(sysfs)}}
        )
        c = ProcessCollector(collect_context(settings), settings.pagecache)
        result = validate(c.collect())
        v = {(s.name, s.attributes): s.value for s in result.samples}
        assert v[("inferwatch.runtime.cgroup.memory.stat", (("field", "inactive_file"),))] == 536870912
        assert v[("inferwatch.runtime.cgroup.memory.stat", (("field", "file_mapped"),))] == 4294967296
        assert v[("inferwatch.runtime.cgroup.memory.events", (("event", "workingset_refault_file"),))] == 12345
        assert v[("inferwatch.runtime.cgroup.memory.events", (("event", "pgmajfault"),))] == 4242
        assert v[("inferwatch.runtime.cgroup.pressure.memory.avg", (("kind", "some"), ("window", "10s")))] == 0.125
        assert result.details["cgroup"] == cg
        # inactive_file 512 MiB < the 1 GiB default, and the cgroup's PSI shows stalls: the runtime's own
        # page cache is being reclaimed, whatever the node's meminfo says.
        (finding,) = result.findings
        assert finding.id == "pagecache.runtime_cgroup" and finding.status == "fail"
        (directory / "memory.pressure").write_text(MEMORY_PRESSURE.replace("avg10=12.50", "avg10=0.00"))
        assert c.collect().findings[0].status == "warn"  # low, no stall now, refaults unchanged since last run
        # without the files the process metrics still come, and the details say why cgroup ones do not
        (directory / "memory.stat").unlink()
        result = validate(c.collect())
        assert "no cgroup v2 memory.stat" in result.details["cgroup"]
        assert not [s for s in result.samples if s.name.startswith("inferwatch.runtime.cgroup")]


def test_cgroup_v1_only_process_is_absent(tmp_path: Path) -> None:
    (tmp_path / "42").mkdir()
    (tmp_path / "42" / "cgroup").write_text("4:memory:/docker/abc\n1:cpu:/\n")
    with pytest.raises(NoDataError, match="no cgroup v2"):
        cgroup_v2_path(tmp_path, 42)


def test_stat_parsing_survives_odd_comm_and_garbage() -> None:
    line = "1234 (python (worker) x) S 1 1234 1234 0 -1 4194560 5000 0 7 0 10 2 0 0 20 0 3 0 100 0 0"
    assert _faults(line) == (5000, 7)
    assert _faults("garbage") is None
    assert parse_memory_stat("anon x\nfile 10\n\x00\xff\n") == {"file": 10}
