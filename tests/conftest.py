"""Shared test helpers: fixture paths, a procfs builder, free ports, process cleanup."""

from __future__ import annotations

import socket
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]
FIXTURES = ROOT / "tests" / "fixtures"
PYTHON = sys.executable

pytest_plugins = ["tests.llamacpp_server"]  # llama-server fixtures: llama_bin, llama_models, llama_tiny


def free_port() -> int:
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as s:
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


# Modules whose tests are independent and each minutes long: under pytest-xdist their tests may run on different
# workers at once. Every other module's tests stay on one worker together (its module-scoped servers start once).
SPLIT_MODULES = {"tests/test_dashboards_data.py"}

# Wall seconds of the longest modules (pytest --durations, 2 cores), for the order in which workers take them:
# the longest first, so none of them starts last and stretches the run. Only the order depends on these figures.
LONG_MODULES_S = {
    "tests/test_healthy_noise.py": 180,
    "tests/test_vm_storage.py": 170,
    "tests/test_dashboards_data.py": 150,
    "tests/e2e/test_hang_production.py": 130,
    "tests/test_fleet_drill.py": 120,
    "tests/e2e/test_alert_pipeline.py": 100,
    "tests/test_packaging.py": 55,
    "tests/test_binary.py": 50,
    "tests/test_compose_processes.py": 45,
    "tests/test_runbooks_exec.py": 45,
    "tests/test_alertmanager_inhibition.py": 37,
}


def pytest_collection_modifyitems(config: pytest.Config, items: list[pytest.Item]) -> None:
    """Order and group the suite for pytest-xdist (``scripts/test.sh`` runs it on several workers, since most tests
    wait on real servers rather than compute): the longest modules first, and each module's tests in one xdist
    group (``--dist loadgroup``) unless it is in ``SPLIT_MODULES``. Without xdist only the order changes."""
    for item in items:
        module = item.nodeid.split("::", 1)[0]
        if module not in SPLIT_MODULES and item.get_closest_marker("xdist_group") is None:
            item.add_marker(pytest.mark.xdist_group(module))
    items.sort(key=lambda item: -LONG_MODULES_S.get(item.nodeid.split("::", 1)[0], 0))  # stable: same order within


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
