"""How the suite shares the machine when pytest-xdist runs it in several processes.

scripts/test.sh runs ``pytest -n 4 --dist loadfile --no-loadscope-reorder``: each test file runs whole on one
worker (its module fixtures start their servers once), and files are handed out in collection order, which this
plugin sorts:

- ``@pytest.mark.slow`` files first (they take a minute or more of wall time, mostly real timings: a ``for:`` to
  wait out, windows to fill), then the rest, each group longest first by the wall time measured per file in
  tests/file-costs.json, so that the long ones overlap each other and the short files fill the gaps, instead of one
  long file starting last and running alone;
- ``@pytest.mark.cpu_heavy`` files (several agents, simulators under load and a TSDB: they need the CPUs to keep
  their compressed timings) hold one of ``INFERWATCH_TEST_HEAVY_SLOTS`` (1 unless set; scripts/test.sh sets 2)
  cross-process slots for as long as the file runs, so no more of them run at once. A slot is an ``flock`` on a
  file under ``build/test-slots/``; the kernel frees it when a worker dies, so a crash cannot leave it taken.
  Waiting is bounded (``HEAVY_SLOT_WAIT_S``): past it the file fails with the reason instead of hanging the run.

Without xdist (one process) the order is the same and a slot is always free.
"""

from __future__ import annotations

import fcntl
import json
import os
import time
from collections.abc import Generator, Iterator
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]
SLOT_DIR = ROOT / "build" / "test-slots"
COSTS = Path(__file__).resolve().parent / "file-costs.json"  # measured per file: wall and CPU seconds
HEAVY_SLOT_WAIT_S = 1800.0
POLL_S = 0.5


def pytest_configure(config: pytest.Config) -> None:
    config.addinivalue_line("markers", "cpu_heavy: starts a stack that needs the CPUs (one such file at a time)")


def pytest_collection_modifyitems(config: pytest.Config, items: list[pytest.Item]) -> None:
    """Files with a slow test first, then longest first by their measured wall time (tests/file-costs.json; a file
    not measured yet counts as the median), each file's tests kept together and in their own order (a stable sort
    by file: a file split in two would start its module fixtures twice)."""
    slow_files = {item.path for item in items if item.get_closest_marker("slow")}
    known = _known_costs()
    default_wall = sorted(known.values())[len(known) // 2] if known else 0.0

    def key(item: pytest.Item) -> tuple[int, float]:
        rel = item.path.relative_to(ROOT).as_posix()
        return (0 if item.path in slow_files else 1, -known.get(rel, default_wall))

    items.sort(key=key)


def _slots() -> int:
    raw = os.environ.get("INFERWATCH_TEST_HEAVY_SLOTS", "1")
    try:
        n = int(raw)
    except ValueError:
        raise pytest.UsageError(f"INFERWATCH_TEST_HEAVY_SLOTS must be a whole number, not {raw!r}") from None
    if n < 1:
        raise pytest.UsageError(f"INFERWATCH_TEST_HEAVY_SLOTS must be at least 1, not {n}")
    return n


@pytest.fixture(scope="module", autouse=True)
def _cpu_heavy_slot(request: pytest.FixtureRequest) -> Iterator[None]:
    """Hold a heavy slot for a ``cpu_heavy`` module's whole run (autouse: set up before its other fixtures)."""
    if request.node.get_closest_marker("cpu_heavy") is None:
        yield
        return
    SLOT_DIR.mkdir(parents=True, exist_ok=True)
    n = _slots()
    deadline = time.monotonic() + HEAVY_SLOT_WAIT_S
    handles = [open(SLOT_DIR / f"slot-{i}", "a+") for i in range(n)]  # noqa: SIM115 - held across the yield
    held = None
    try:
        while held is None:
            for h in handles:
                try:
                    fcntl.flock(h, fcntl.LOCK_EX | fcntl.LOCK_NB)
                except BlockingIOError:
                    continue
                held = h
                break
            if held is None:
                if time.monotonic() > deadline:
                    pytest.fail(f"no free cpu_heavy slot in {HEAVY_SLOT_WAIT_S:.0f} s ({SLOT_DIR})", pytrace=False)
                time.sleep(POLL_S)
        yield
    finally:
        if held is not None:
            fcntl.flock(held, fcntl.LOCK_UN)
        for h in handles:
            h.close()


def _known_costs() -> dict[str, float]:
    try:
        data = json.loads(COSTS.read_text())
    except (OSError, ValueError):
        return {}
    return {f: float(v["wall_s"]) for f, v in data.get("files", {}).items()}


_spent: dict[str, list[float]] = {}


@pytest.hookimpl(hookwrapper=True)
def pytest_runtest_protocol(item: pytest.Item, nextitem: pytest.Item | None) -> Generator[None, None, None]:
    """With ``INFERWATCH_TEST_COSTS=DIR``: each file's wall and CPU seconds (this process and the children it
    reaped: the servers a test starts), written per worker to DIR; ``python -m tests.scheduling DIR`` merges them
    into tests/file-costs.json."""
    if not os.environ.get("INFERWATCH_TEST_COSTS"):
        yield
        return
    t0, c0 = time.monotonic(), _cpu_s()
    yield
    spent = _spent.setdefault(item.path.relative_to(ROOT).as_posix(), [0.0, 0.0])
    spent[0] += time.monotonic() - t0
    spent[1] += _cpu_s() - c0


def _cpu_s() -> float:
    t = os.times()
    return t.user + t.system + t.children_user + t.children_system


def pytest_sessionfinish(session: pytest.Session) -> None:
    out = os.environ.get("INFERWATCH_TEST_COSTS")
    if not out or not _spent:
        return
    Path(out).mkdir(parents=True, exist_ok=True)
    worker = os.environ.get("PYTEST_XDIST_WORKER", "main")
    (Path(out) / f"{worker}.json").write_text(json.dumps(_spent))


def merge(directory: Path) -> dict[str, object]:
    files: dict[str, dict[str, float]] = {}
    for part in sorted(directory.glob("*.json")):
        for f, (wall, cpu) in json.loads(part.read_text()).items():
            files[f] = {"wall_s": round(wall, 1), "cpu_s": round(cpu, 1)}
    ordered = dict(sorted(files.items(), key=lambda kv: -kv[1]["wall_s"]))
    return {
        "note": "per test file, measured with INFERWATCH_TEST_COSTS under scripts/test.sh's workers; orders the run",
        "files": ordered,
    }


if __name__ == "__main__":
    import sys

    COSTS.write_text(json.dumps(merge(Path(sys.argv[1])), indent=1) + "\n")
