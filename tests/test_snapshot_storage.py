"""Snapshot writes under real storage failures: persisted and 201, or a JSON 507/500, counted; nothing left behind.

The failures are real, made without root: a file-size limit (``RLIMIT_FSIZE``, so ``write`` fails with
EFBIG, which the ring treats like a full disk: ``no_space``, 507) set on a subprocess agent, and a snapshot
directory whose parent is a regular file (ENOTDIR: ``unwritable``, 500; unlike ``chmod 0500`` it holds
for root too). After each, the listing names only ids that GET answers, and no ``.tmp`` file remains.
"""

from __future__ import annotations

import json
import subprocess
import sys
import time
from collections.abc import Iterator
from pathlib import Path

import httpx
import pytest

from inferwatch.agent.errors import StorageError
from inferwatch.agent.node.actions.ring import FileRing, sweep_temp_files
from tests.conftest import PYTHON, ROOT, free_port
from tests.fake_runtime import FakeRuntime, fake_runtime
from tests.procs import running, wait_http

SNAP = "snap-token-0123456789abcdef"
AUTH = {"Authorization": f"Bearer {SNAP}"}
FSIZE_LIMIT_BYTES = 64 << 10  # above every log line and key file the agent writes, below the big profile
BIG_PROFILE = {"engine": "fake", "notes": [f"scheduler note {i:06d}" for i in range(12_000)]}  # ~270 KB as JSON
SMALL_PROFILE = {"engine": "fake", "num_running_requests": 3}


def with_fsize_limit(limit_bytes: int, *argv: str) -> list[str]:
    """``argv`` run by a Python that first lowers RLIMIT_FSIZE (soft and hard) to ``limit_bytes``."""
    code = (
        "import os, resource, sys; "
        f"resource.setrlimit(resource.RLIMIT_FSIZE, ({limit_bytes}, {limit_bytes})); "
        "os.execv(sys.executable, [sys.executable, *sys.argv[1:]])"
    )
    return [PYTHON, "-c", code, *argv]


def temp_files(directory: Path) -> list[str]:
    return sorted(p.name for p in directory.iterdir() if p.name.endswith(".tmp")) if directory.is_dir() else []


def assert_listing_is_true(base: str) -> list[str]:
    """Every listed id is served (no dangling id); the ids, newest first."""
    r = httpx.get(f"{base}/api/v1/snapshots", headers=AUTH)
    assert r.status_code == 200, r.text
    ids = [s["id"] for s in r.json()["snapshots"]]
    for snap_id in ids:
        assert httpx.get(f"{base}/api/v1/snapshots/{snap_id}", headers=AUTH).status_code == 200, snap_id
    return ids


def write_errors(base: str, reason: str) -> float:
    for line in httpx.get(f"{base}/metrics").text.splitlines():
        if line.startswith(f'inferwatch_snapshot_write_errors_total{{reason="{reason}"}} '):
            return float(line.split()[-1])
    raise AssertionError(f"no write_errors sample for {reason}")


@pytest.fixture(scope="module")
def rt() -> Iterator[FakeRuntime]:
    with fake_runtime() as runtime:
        yield runtime


def agent_cmd(port: int) -> list[str]:
    return ["-m", "inferwatch.agent", "run", "--port", str(port), "--interval", "1"]


def agent_env(rt: FakeRuntime, tmp_path: Path, snap_dir: Path) -> dict[str, str]:
    tokens = tmp_path / "tokens"
    tokens.write_text(f"{SNAP} read,snapshots\n")
    return {
        "INFERWATCH_API__TOKENS_FILE": str(tokens),
        "INFERWATCH_RUNTIME_PROFILE__URL": f"{rt.url}/debug/runtime_profile",
        "INFERWATCH_RUNTIME_PROFILE__INTERVAL_S": "3600",  # one capture at start, then only the API's
        "INFERWATCH_SNAPSHOTS__DIR": str(snap_dir),
    }


def test_a_file_size_limit_answers_507_leaves_nothing_and_recovers(rt: FakeRuntime, tmp_path: Path) -> None:
    snap_dir = tmp_path / "snap"
    snap_dir.mkdir()
    stale = snap_dir / ".000000000009-00112233445566778899aabbccddeeff.json.tmp"  # a write a crash cut
    stale.write_bytes(b'{"meta": ')
    port = free_port()
    base = f"http://127.0.0.1:{port}"
    cmd = with_fsize_limit(FSIZE_LIMIT_BYTES, *agent_cmd(port))
    log = tmp_path / "agent.log"
    rt.profile = SMALL_PROFILE  # the collector's first capture at start fits
    with running(cmd, log, cwd=ROOT, env=agent_env(rt, tmp_path, snap_dir)) as proc:
        wait_http(f"{base}/readyz", ok=lambda r: r.status_code == 200, proc=proc)  # the collector's first read
        # swept at start; the collector's own first capture may be mid-write now (its temp file is not stale)
        assert not stale.exists(), temp_files(snap_dir)
        # Its store runs after /readyz (a state listener): let it land first, or it could take the ring's next
        # number after the POST below and be listed as the newest in place of the snapshot the API stored.
        deadline = time.monotonic() + 120  # bounds a hang only
        while len(assert_listing_is_true(base)) < 1:
            assert time.monotonic() < deadline, "the collector's first capture was never stored"
            time.sleep(0.1)
        # a capture fetches the profile and fsyncs in the request: 30 s, not httpx's 5 s, at CI's load
        first = httpx.post(f"{base}/api/v1/snapshots", headers=AUTH, timeout=30)
        assert first.status_code == 201, first.text
        stored = assert_listing_is_true(base)
        assert stored[0] == first.json()["id"]
        rt.profile = BIG_PROFILE
        for _ in range(3):
            r = httpx.post(f"{base}/api/v1/snapshots", headers=AUTH, timeout=30)
            assert r.status_code == 507, r.text
            body = r.json()
            assert body["error"] == "snapshot_not_stored" and body["reason"] == "no_space", body
            assert "File too large" in body["message"] and "Traceback" not in r.text
            assert temp_files(snap_dir) == []
        assert assert_listing_is_true(base) == stored
        assert write_errors(base, "no_space") == 3
        rt.profile = SMALL_PROFILE
        again = httpx.post(f"{base}/api/v1/snapshots", headers=AUTH, timeout=30)
        assert again.status_code == 201, again.text
        assert assert_listing_is_true(base) == [again.json()["id"], *stored]
        assert write_errors(base, "no_space") == 3 and temp_files(snap_dir) == []
    text = log.read_text()
    assert text.count("cannot store runtime_profile snapshots (no_space)") == 1, text
    assert text.count("runtime_profile snapshots are stored again") == 1, text
    assert "Traceback" not in text


def test_an_unwritable_directory_answers_500_json_without_traceback(rt: FakeRuntime, tmp_path: Path) -> None:
    blocker = tmp_path / "not-a-dir"
    blocker.write_text("a regular file where the snapshot directory's parent should be\n")
    port = free_port()
    base = f"http://127.0.0.1:{port}"
    log = tmp_path / "agent.log"
    rt.profile = SMALL_PROFILE
    with running([PYTHON, *agent_cmd(port)], log, cwd=ROOT, env=agent_env(rt, tmp_path, blocker / "snap")) as proc:
        wait_http(f"{base}/healthz", proc=proc)
        for _ in range(2):
            r = httpx.post(f"{base}/api/v1/snapshots", headers=AUTH, timeout=30)
            assert r.status_code == 500, r.text
            body = r.json()
            assert body["reason"] == "unwritable" and "Not a directory" in body["message"], body
            assert "Traceback" not in r.text
        assert httpx.get(f"{base}/api/v1/snapshots", headers=AUTH).json() == {"snapshots": []}
        assert write_errors(base, "unwritable") == 2
    text = log.read_text()
    assert "Traceback" not in text and text.count("cannot store runtime_profile snapshots (unwritable)") == 1


RING_UNDER_LIMIT = """
import json, sys
from pathlib import Path
import resource
from inferwatch.agent.node.actions.ring import FileRing
from inferwatch.agent.errors import StorageError
ring = FileRing(Path(sys.argv[1]), 8, 1 << 20)
ring.put(b"small", ".json")
resource.setrlimit(resource.RLIMIT_FSIZE, (4096, resource.RLIM_INFINITY))
try:
    ring.put(b"x" * 8192, ".json")
except StorageError as exc:
    print(json.dumps({"reason": exc.reason, "message": str(exc)}))
"""


def test_the_ring_under_a_real_size_limit_raises_no_space_and_keeps_only_whole_entries(tmp_path: Path) -> None:
    directory = tmp_path / "ring"
    got = subprocess.run(
        [sys.executable, "-c", RING_UNDER_LIMIT, str(directory)], cwd=ROOT, capture_output=True, text=True, timeout=60
    )
    assert got.returncode == 0, got.stderr
    assert json.loads(got.stdout)["reason"] == "no_space"
    assert temp_files(directory) == []
    (entry,) = FileRing(directory, 8, 1 << 20).entries()
    assert entry.path.read_bytes() == b"small"


def test_stale_temp_files_are_swept_and_nothing_else(tmp_path: Path) -> None:
    directory = tmp_path / "ring"
    directory.mkdir()
    stale = directory / ".000000000007-0123456789abcdef.json.tmp"
    stale.write_bytes(b"half a snap")
    kept = [directory / "notes.tmp", directory / "000000000001-0123456789abcdef.json"]
    for p in kept:
        p.write_bytes(b"{}")
    assert sweep_temp_files(directory) == 1
    assert not stale.exists() and all(p.exists() for p in kept)
    stale.write_bytes(b"again")
    FileRing(directory, 8, 1 << 20)  # opening the ring sweeps too
    assert not stale.exists()
    assert sweep_temp_files(tmp_path / "absent") == 0


def test_a_snapshot_over_the_budget_is_too_large_and_a_path_under_a_file_unwritable(tmp_path: Path) -> None:
    ring = FileRing(tmp_path / "ring", 8, 100)
    with pytest.raises(StorageError) as over:
        ring.put(b"x" * 101, ".json")
    assert over.value.reason == "too_large" and ring.entries() == []
    (tmp_path / "file").write_text("x")
    with pytest.raises(StorageError) as under:
        FileRing(tmp_path / "file" / "ring", 8, 100)
    assert under.value.reason == "unwritable"
