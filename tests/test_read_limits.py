"""Read limits on procfs files as settings: a 50 MB cpuinfo and an endless meminfo (a link to /dev/zero).

A real agent runs on a fake procfs tree (``path.procfs``) built from recorded files, once clean and once
hostile; its peak RSS (``VmHWM``) is compared, the hits are counted in
``inferwatch_source_limit_hits_total{source,limit}`` and logged once, and the collectors fail (not the agent).
"""

from __future__ import annotations

import os
import re
import time
import tracemalloc
from collections.abc import Callable
from pathlib import Path

import pytest

from inferwatch.agent.config import load_settings
from inferwatch.agent.errors import ConfigError, ReadLimitError
from inferwatch.agent.node.collectors.pagecache import PageCacheCollector
from inferwatch.agent.node.host import runtime
from inferwatch.agent.node.host.procfs import CPUINFO_LIMIT, FILE_LIMIT, LimitHits, ReadLimits
from inferwatch.agent.node.wiring import collect_context
from tests.conftest import PYTHON, ROOT, free_port
from tests.procs import running, wait_http

FIXTURES = ROOT / "tests" / "fixtures"
CPUINFO = FIXTURES / "cpuinfo" / "x86_amd_epyc_7451_zen1_96cpu.txt"
MEMINFO = FIXTURES / "meminfo" / "kernel_doc_proc_rst_example.txt"
VMSTAT = FIXTURES / "meminfo" / "vmstat_node_exporter_pre_4_8_zoned.txt"
PRESSURE = FIXTURES / "meminfo" / "pressure_memory_all_zero_node_exporter.txt"
HOSTILE_CPUINFO_BYTES = 50_000_000
MAX_EXTRA_RSS_BYTES = 30 << 20  # issue 14: at most 30 MB above the clean baseline for every hostile shape


def procfs_tree(root: Path, hostile: bool) -> Path:
    """A procfs tree of recorded files; ``hostile``: cpuinfo is 50 MB of real blocks, meminfo is /dev/zero."""
    (root / "pressure").mkdir(parents=True)
    (root / "sys" / "kernel").mkdir(parents=True)
    (root / "sys" / "kernel" / "osrelease").write_text("6.8.0\n")
    (root / "vmstat").write_text(VMSTAT.read_text())
    (root / "pressure" / "memory").write_text(PRESSURE.read_text())
    cpuinfo = CPUINFO.read_bytes()
    if hostile:
        with (root / "cpuinfo").open("wb") as f:
            for _ in range(HOSTILE_CPUINFO_BYTES // len(cpuinfo) + 1):
                f.write(cpuinfo)
        os.symlink("/dev/zero", root / "meminfo")
    else:
        (root / "cpuinfo").write_bytes(cpuinfo)
        (root / "meminfo").write_text(MEMINFO.read_text())
    return root


def metric(text: str, name: str, **labels: str) -> float | None:
    want = ",".join(f'{k}="{v}"' for k, v in sorted(labels.items()))
    for line in text.splitlines():
        if line.startswith(f"{name}{{{want}}} ") or (not labels and line.startswith(f"{name} ")):
            return float(line.split()[-1])
    return None


def peak_rss_bytes(pid: int) -> int:
    status = Path(f"/proc/{pid}/status").read_text()
    match = re.search(r"^VmHWM:\s+(\d+) kB", status, re.M)
    assert match, status
    return int(match.group(1)) * 1024


def run_agent(
    tmp_path: Path, procfs: Path, ready: str, settled: Callable[[str], bool] = lambda _text: True
) -> tuple[int, str, str]:
    """Run the agent on ``procfs`` until /metrics shows ``ready``, a few more cycles, and until ``settled`` accepts
    /metrics (how many cycles ran in the 2 s depends on the machine's load); (peak RSS bytes, /metrics, log)."""
    port = free_port()
    base = f"http://127.0.0.1:{port}"
    log = tmp_path / f"{procfs.parent.name}.log"
    env = {"INFERWATCH_PATH__PROCFS": str(procfs), "INFERWATCH_SNAPSHOTS__DIR": str(tmp_path / "snap")}
    cmd = [PYTHON, "-m", "inferwatch.agent", "run", "--port", str(port), "--interval", "0.5"]
    with running(cmd, log, cwd=ROOT, env=env) as proc:
        wait_http(f"{base}/metrics", ok=lambda r: ready in r.text, proc=proc, timeout_s=60)
        time.sleep(2.0)  # a few more cycles of the pagecache collector
        text = wait_http(f"{base}/metrics", ok=lambda r: settled(r.text), proc=proc).text
        rss = peak_rss_bytes(proc.pid)
    return rss, text, log.read_text()


def test_a_hostile_procfs_is_bounded_counted_and_logged_once(tmp_path: Path) -> None:
    clean_rss, clean, _ = run_agent(
        tmp_path, procfs_tree(tmp_path / "clean" / "proc", False), 'inferwatch_collector_success{collector="cpu"}'
    )
    assert metric(clean, "inferwatch_collector_success", collector="pagecache") == 1
    assert "inferwatch_source_limit_hits_total{" not in clean
    hostile_rss, text, log = run_agent(
        tmp_path,
        procfs_tree(tmp_path / "hostile" / "proc", True),
        f'inferwatch_source_limit_hits_total{{limit="{CPUINFO_LIMIT}",source="cpuinfo"}}',
        lambda text: (metric(text, "inferwatch_source_limit_hits_total", limit=FILE_LIMIT, source="meminfo") or 0) >= 3,
    )
    print(f"peak RSS: clean {clean_rss / 2**20:.1f} MiB, hostile {hostile_rss / 2**20:.1f} MiB")
    assert hostile_rss - clean_rss <= MAX_EXTRA_RSS_BYTES, (clean_rss, hostile_rss)
    meminfo_hits = metric(text, "inferwatch_source_limit_hits_total", limit=FILE_LIMIT, source="meminfo")
    assert meminfo_hits is not None and meminfo_hits >= 3  # one per pagecache run, every 0.5 s
    assert metric(text, "inferwatch_source_limit_hits_total", limit=CPUINFO_LIMIT, source="cpuinfo") >= 1  # type: ignore[operator]
    assert metric(text, "inferwatch_collector_success", collector="pagecache") == 0
    assert metric(text, "inferwatch_collector_success", collector="cpu") == 0
    assert log.count("meminfo is larger than 1048576 bytes") == 2, log  # the limit's line, the collector's line
    assert log.count(f"raise {FILE_LIMIT}") == 2 and "Traceback" not in log


def test_the_limits_are_settings_and_each_hit_is_counted(tmp_path: Path) -> None:
    root = procfs_tree(tmp_path / "proc", False)
    settings = load_settings(
        overrides={"path": {"procfs": str(root)}, "read_limits": {"max_file_bytes": 4096, "max_cpuinfo_bytes": 8192}}
    )
    assert (settings.read_limits.max_file_bytes, settings.read_limits.max_cpuinfo_bytes) == (4096, 8192)
    hits = LimitHits()
    limits = ReadLimits.of(settings.read_limits, hits)
    with pytest.raises(ReadLimitError, match=r"larger than 8192 bytes.*read_limits\.max_cpuinfo_bytes") as exc:
        limits.text(root / "cpuinfo", "cpuinfo", cpuinfo=True)  # 133 kB of real blocks, 96 CPUs
    assert exc.value.limit == CPUINFO_LIMIT
    (root / "meminfo").write_text(MEMINFO.read_text() + "Padding: 0 kB\n" * 400)  # over 4096 bytes
    for _ in range(2):
        with pytest.raises(ReadLimitError):
            limits.text(root / "meminfo", "meminfo")
    got = {(s.attributes, s.value) for s in hits.samples()}
    assert got == {
        ((("limit", CPUINFO_LIMIT), ("source", "cpuinfo")), 1),
        ((("limit", FILE_LIMIT), ("source", "meminfo")), 2),
    }
    ctx = collect_context(settings)
    with pytest.raises(ReadLimitError):
        PageCacheCollector(ctx, settings.pagecache).collect()
    assert ctx.read_limits.hits is not None
    assert [s.value for s in ctx.read_limits.hits.samples()] == [1]
    with pytest.raises(ConfigError, match=r"read_limits\.max_file_bytes"):
        load_settings(overrides={"read_limits": {"max_file_bytes": 10}})


def test_a_large_regular_file_is_refused_unread(tmp_path: Path) -> None:
    """A recorded file that says it is over the limit is not read at all: no 16 MiB buffer for a 50 MB file."""
    path = tmp_path / "cpuinfo"
    with path.open("wb") as f:
        f.truncate(HOSTILE_CPUINFO_BYTES)  # sparse: 50 MB of st_size, no data
    limits = ReadLimits()
    started = time.thread_time()  # CPU seconds of this thread: at CI's load a wall clock can stall 0.1 s on its own
    with pytest.raises(ReadLimitError):
        limits.text(path, "cpuinfo", cpuinfo=True)
    assert time.thread_time() - started < 0.1


def test_net_tcp_is_scanned_line_by_line_and_an_endless_one_is_bounded(tmp_path: Path) -> None:
    """/proc/net/tcp is never read whole: an endless one (a link to /dev/zero) costs one line of memory."""
    (tmp_path / "net").mkdir()
    os.symlink("/dev/zero", tmp_path / "net" / "tcp")
    (tmp_path / "net" / "tcp6").write_text(
        "  sl  local_address rem_address   st tx_queue rx_queue tr tm->when retrnsmt   uid  timeout inode\n"
        "   0: 0100007F:ZZZZ 00000000:0000 0A 00000000:00000000 00:00000000 00000000  0 0 111 1\n"
        "   1: 0100007F:1F90 00000000:0000 0A 00000000:00000000 00:00000000 00000000  0 0 4242 1\n"
    )
    tracemalloc.start()
    try:
        started = time.thread_time()  # CPU seconds (reading /dev/zero is this thread's system time)
        assert runtime._listening_inodes(tmp_path, 8080) == {"4242"}
        elapsed = time.thread_time() - started
        peak = tracemalloc.get_traced_memory()[1]
    finally:
        tracemalloc.stop()
    print(f"endless /proc/net/tcp: {elapsed:.1f} s, peak {peak / 2**10:.0f} KiB")
    assert peak < 1 << 20 and elapsed < 60
