"""Shared test helpers: fixture paths, a procfs builder, free ports, process cleanup."""

from __future__ import annotations

import os
import random
import socket
import sys
from collections.abc import Iterator
from pathlib import Path

import psutil
import pytest

ROOT = Path(__file__).resolve().parents[1]
FIXTURES = ROOT / "tests" / "fixtures"
PYTHON = sys.executable

pytest_plugins = [
    "tests.llamacpp_server",  # llama-server fixtures: llama_bin, llama_models, llama_tiny
    "tests.scheduling",  # xdist: slow files first, one cpu_heavy file at a time
]


@pytest.fixture(autouse=True)
def _psutil_procfs_restored() -> Iterator[None]:
    """psutil reads one global procfs root, which an agent on a recorded tree points elsewhere (RuntimeLocator).
    Put it back after every test: a later test in the same worker would otherwise find no process at all (seen
    as NoSuchProcess for a test's own child, and "no process 1", once files ran in a new order on four workers)."""
    saved = psutil.PROCFS_PATH
    yield
    psutil.PROCFS_PATH = saved


# Ports handed to servers the tests start come from below the kernel's ephemeral range (32768-60999 on Linux), each
# pytest-xdist worker from its own slice. A port the kernel hands out for bind(0) is in the ephemeral range, where any
# process's outgoing connection may take it as its source port between the test's check and the server's bind: CI
# runs lost whole modules to "address already in use" that way. Below that range only an explicit bind takes a port,
# and the workers never share one.
_PORT_BASE = 20000
_PORT_SLICE = 1500  # ports per worker: gw0..gw6 and the controller fit below 32768
_port_next: list[int] = []


def _port_slice() -> int:
    worker = os.environ.get("PYTEST_XDIST_WORKER", "")
    return int(worker[2:]) + 1 if worker.startswith("gw") and worker[2:].isdigit() else 0


def free_port() -> int:
    """A port on 127.0.0.1 that nothing listens on now, from this worker's own slice (never the ephemeral range)."""
    start = _PORT_BASE + (_port_slice() % 8) * _PORT_SLICE
    if not _port_next:  # a random start: two test runs on one machine rarely walk the same ports in step
        _port_next.append(random.randrange(_PORT_SLICE))
    for _ in range(_PORT_SLICE):
        port = start + _port_next[0] % _PORT_SLICE
        _port_next[0] += 1
        with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as s:
            try:  # no SO_REUSEADDR: a port with connections still in TIME_WAIT is passed over too
                s.bind(("127.0.0.1", port))
            except OSError:
                continue
            return port
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as s:  # the whole slice busy: the kernel's choice
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


@pytest.fixture
def fake_procfs(tmp_path: Path):
    """Build a procfs tree from recorded files: ``fake_procfs(meminfo=..., pressure_memory=..., ...)``."""

    def build(**files: str | Path) -> Path:
        root = tmp_path / "proc"
        mapping = {
            "meminfo": "meminfo",
            "pressure_memory": "pressure/memory",
            "vmstat": "vmstat",
            "cpuinfo": "cpuinfo",
            "osrelease": "sys/kernel/osrelease",
            "cmdline": "cmdline",
        }
        for key, src in files.items():
            dest = root / mapping[key]
            dest.parent.mkdir(parents=True, exist_ok=True)
            text = src.read_text() if isinstance(src, Path) else src
            dest.write_text(text)
        root.mkdir(exist_ok=True)
        return root

    return build


def pytest_terminal_summary(terminalreporter, exitstatus, config) -> None:  # type: ignore[no-untyped-def]
    """Count the skips by reason: each must be something the test command cannot provide (GPU, CPU, root)."""
    skipped = terminalreporter.stats.get("skipped", [])
    if not skipped:
        return
    reasons: dict[str, int] = {}
    for report in skipped:
        longrepr = report.longrepr
        reason = longrepr[2] if isinstance(longrepr, tuple) else str(longrepr)
        reason = reason.removeprefix("Skipped: ")
        reasons[reason] = reasons.get(reason, 0) + 1
    terminalreporter.write_sep("-", f"{len(skipped)} skipped: what the test command cannot provide on this machine")
    for reason, n in sorted(reasons.items(), key=lambda kv: -kv[1]):
        terminalreporter.write_line(f"{n:4d}  {reason}")
