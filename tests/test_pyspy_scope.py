"""py-spy only for the runtime's own processes (issue 14: the agent itself and another user's process were
profiled; ``{"pid": true}`` became pid 1). Real processes: a Python "runtime" with a Python worker child
(and, as root, a child dropped to user nobody), an unrelated Python process, the agent itself, pid 1 —
through :class:`PidScope` and through a real agent's ``POST /api/v1/profiles``.
"""

from __future__ import annotations

import os
import subprocess
import time
from collections.abc import Iterator
from pathlib import Path

import httpx
import psutil
import pytest

from inferwatch.agent.config import RuntimeSettings
from inferwatch.agent.node.actions.pyspy import PID_MAX, PidScope, PySpyError, validate_pid
from inferwatch.agent.node.host.runtime import RuntimeLocator
from tests.conftest import PYTHON, ROOT, free_port
from tests.procs import running, stop, wait_http

LOOP = "import time\nwhile True:\n    time.sleep(0.05)\n"
NOBODY = 65534
SETPRIV = "/usr/bin/setpriv"
# The runtime starts a Python worker, and as root also a worker running as user nobody.
RUNTIME = f"""
import os, subprocess, sys, time
subprocess.Popen([sys.executable, "-c", {LOOP!r}])
if os.geteuid() == 0 and os.path.exists({SETPRIV!r}):
    subprocess.Popen([{SETPRIV!r}, "--reuid={NOBODY}", "--regid={NOBODY}", "--clear-groups", sys.executable,
                      "-c", {LOOP!r}])
while True:
    time.sleep(0.05)
"""
BAD_PIDS = [True, False, "1; rm -rf /", "42", 1.0, 12.5, -1, 0, PID_MAX + 1, None, [1], {"pid": 1}]
TOKEN = "scope-token-0123456789abcdef"


@pytest.fixture
def processes() -> Iterator[tuple[subprocess.Popen[bytes], subprocess.Popen[bytes]]]:
    """(the runtime, an unrelated Python process); both in their own process groups, always stopped."""
    runtime = subprocess.Popen([PYTHON, "-c", RUNTIME], start_new_session=True)
    other = subprocess.Popen([PYTHON, "-c", LOOP], start_new_session=True)
    try:
        yield runtime, other
    finally:
        stop(runtime)
        stop(other)


def workers(runtime: subprocess.Popen[bytes], timeout_s: float = 20.0) -> tuple[psutil.Process, psutil.Process | None]:
    """(the runtime user's Python worker, the nobody worker or None when not root), once they run."""
    as_root = os.geteuid() == 0 and os.path.exists(SETPRIV)
    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline:
        running_loop = []
        for k in psutil.Process(runtime.pid).children(recursive=True):
            try:
                if "time.sleep(0.05)" in " ".join(k.cmdline()) and k.name() != "setpriv":
                    running_loop.append((k.uids().real, k))
            except psutil.NoSuchProcess:
                continue
        mine = [k for uid, k in running_loop if uid == os.getuid()]
        nobody = [k for uid, k in running_loop if uid == NOBODY]
        if mine and (nobody or not as_root):
            return mine[0], (nobody[0] if as_root else None)
        time.sleep(0.1)
    raise TimeoutError(f"runtime {runtime.pid} did not start its workers")


def refused(scope: PidScope, pid: object) -> PySpyError:
    with pytest.raises(PySpyError) as info:
        scope.check(pid)
    return info.value


def test_scope_is_the_runtime_and_its_children(processes) -> None:
    runtime, other = processes
    scope = PidScope(RuntimeLocator(RuntimeSettings(pid=runtime.pid, name="fake-vllm")))
    worker, nobody = workers(runtime)
    assert scope.check(runtime.pid) == runtime.pid
    assert scope.check(worker.pid) == worker.pid
    err = refused(scope, other.pid)
    assert err.kind == "not_runtime" and f"pid {other.pid} is not the runtime fake-vllm (pid {runtime.pid})" in str(err)
    err = refused(scope, os.getpid())
    assert err.kind == "not_runtime" and "the agent itself" in str(err)
    assert refused(scope, 1).kind == "not_runtime"  # pid 1 is not the runtime here
    if nobody is not None:
        err = refused(scope, nobody.pid)
        assert err.kind == "not_runtime" and "another user" in str(err) and f"uid {NOBODY}" in str(err)


def test_the_runtime_may_be_pid_1_of_its_namespace() -> None:
    """pid 1 is refused only because it is not the runtime: a scope whose runtime is pid 1 accepts it."""
    assert PidScope(RuntimeLocator(RuntimeSettings(pid=1))).check(1) == 1


@pytest.mark.parametrize("value", BAD_PIDS, ids=repr)
def test_pids_are_positive_integers(value: object) -> None:
    with pytest.raises(PySpyError) as info:
        validate_pid(value)
    assert info.value.kind == "invalid_pid"


def test_no_runtime_configured_refuses_every_pid(processes) -> None:
    _, other = processes
    err = refused(PidScope(RuntimeLocator(RuntimeSettings())), other.pid)
    assert err.kind == "no_runtime" and "runtime.pid" in str(err)


def test_api_profiles_only_the_runtime(processes, tmp_path: Path) -> None:
    runtime, other = processes
    worker, nobody = workers(runtime)
    port = free_port()
    env = {
        "INFERWATCH_API__TOKENS": f'[{{"token": "{TOKEN}", "scopes": ["read", "profile"]}}]',
        "INFERWATCH_PROFILING__ENABLED": "true",
        "INFERWATCH_RUNTIME__PID": str(runtime.pid),
        "INFERWATCH_SNAPSHOTS__DIR": str(tmp_path / "snap"),
    }
    cmd = [PYTHON, "-m", "inferwatch.agent", "run", "--port", str(port), "--interval", "1"]
    auth = {"Authorization": f"Bearer {TOKEN}"}
    with running(cmd, tmp_path / "agent.log", cwd=ROOT, env=env) as agent:
        base = f"http://127.0.0.1:{port}"
        wait_http(f"{base}/healthz", proc=agent)

        def post(pid: object) -> httpx.Response:
            return httpx.post(f"{base}/api/v1/profiles", json={"pid": pid, "duration_s": 1}, headers=auth, timeout=30)

        forbidden = [other.pid, agent.pid, 1] + ([nobody.pid] if nobody is not None else [])
        for pid in forbidden:
            r = post(pid)
            assert r.status_code == 403 and r.json()["error"] == "not_runtime", (pid, r.text)
        for bad in BAD_PIDS:
            if bad is None:
                continue  # no pid: the runtime (below)
            r = post(bad)
            assert r.status_code == 400 and r.json()["error"] == "invalid_pid", (bad, r.text)
        assert httpx.get(f"{base}/api/v1/profiles", headers=auth).json()["profiles"] == []  # nothing ran
        r = post(worker.pid)  # a child of the runtime: recorded
        assert r.status_code == 202, r.text
        job = r.json()
        deadline = time.monotonic() + 60
        while (state := httpx.get(base + job["status_url"], headers=auth).json())["state"] == "running":
            assert time.monotonic() < deadline
            time.sleep(0.2)
        assert state["state"] == "done", state
        r = httpx.post(f"{base}/api/v1/profiles", json={"duration_s": 1}, headers=auth, timeout=30)
        assert r.status_code == 202 and r.json()["pid"] == runtime.pid  # runtime: true (the default)
