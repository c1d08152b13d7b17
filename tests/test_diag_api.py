"""The authenticated API and py-spy profiles over real HTTP, and the profile CLI on a real Python process."""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import tempfile
import time
from pathlib import Path

import httpx
import psutil
import pytest

from inferwatch.agent.node.actions.pyspy import classify
from tests.conftest import PYTHON, ROOT, free_port
from tests.procs import running, stop, wait_http

READ = "read-token-0123456789abcdef"
SNAP = "snap-token-0123456789abcdef"
PROF = "prof-token-0123456789abcdef"
# The runtime: busy Python, with a non-Python child process (a runtime's helper, in its process tree). Busy a
# fifth of the time (20 ms of work, 80 ms asleep): py-spy samples it as a running interpreter all the same, and
# the test command's 2 shared cores are not spent on a spinning target for the module's ~50 s.
BUSY_LOOP = (
    "import subprocess, time\nsubprocess.Popen(['sleep', '120'])\nwhile True:\n"
    "    t = time.monotonic()\n    while time.monotonic() - t < 0.02:\n        sum(i * i for i in range(2000))\n"
    "    time.sleep(0.08)\n"
)


def hdr(token: str | None) -> dict[str, str]:
    return {"Authorization": f"Bearer {token}"} if token else {}


def assert_speedscope(data: bytes) -> None:
    doc = json.loads(data)
    assert doc["$schema"] == "https://www.speedscope.app/file-format-schema.json"
    profile = doc["profiles"][0]
    assert profile["type"] == "sampled" and len(profile["samples"]) > 0
    assert len(profile["samples"]) == len(profile["weights"])
    assert doc["shared"]["frames"], "no frames recorded"


@pytest.fixture
def target(tmp_path):
    """A real busy Python process to profile."""
    proc = subprocess.Popen([PYTHON, "-c", BUSY_LOOP], start_new_session=True)
    try:
        time.sleep(0.5)
        yield proc
    finally:
        stop(proc)


@pytest.fixture
def agent(tmp_path, target):
    tokens = tmp_path / "tokens"
    tokens.write_text(f"# token scopes name\n{READ} read reader\n{SNAP} read,snapshots\n{PROF} profile,read ops\n")
    port = free_port()
    env = {
        "INFERWATCH_API__TOKENS_FILE": str(tokens),
        "INFERWATCH_PROFILING__ENABLED": "true",
        "INFERWATCH_RUNTIME__PID": str(target.pid),
        "INFERWATCH_SNAPSHOTS__DIR": str(tmp_path / "snap"),
    }
    cmd = [PYTHON, "-m", "inferwatch.agent", "run", "--port", str(port), "--interval", "1"]
    with running(cmd, tmp_path / "agent.log", cwd=ROOT, env=env) as proc:
        base = f"http://127.0.0.1:{port}"
        wait_http(f"{base}/healthz", proc=proc)
        yield base


def test_scopes_401_403_and_open_paths(agent) -> None:
    for path in ("/metrics", "/healthz"):
        assert httpx.get(agent + path).status_code == 200
    assert httpx.get(agent + "/readyz").status_code in (200, 503)
    r = httpx.get(agent + "/api/v1/status")
    assert r.status_code == 401 and r.headers["www-authenticate"].startswith("Bearer")
    assert httpx.get(agent + "/api/v1/status", headers=hdr("wrong-token-0123456789abcdef")).status_code == 401
    assert httpx.get(agent + "/api/v1/status", headers={"Authorization": f"Basic {READ}"}).status_code == 401
    assert httpx.get(agent + "/api/v1/status", headers=hdr(READ)).status_code == 200
    assert httpx.get(agent + "/api/v1/findings", headers=hdr(READ)).status_code == 200
    assert httpx.get(agent + "/api/v1/snapshots", headers=hdr(READ)).status_code == 403
    assert httpx.get(agent + "/api/v1/snapshots", headers=hdr(SNAP)).status_code == 200
    r = httpx.post(agent + "/api/v1/profiles", json={"duration_s": 1}, headers=hdr(READ))
    assert r.status_code == 403 and "profile" in r.json()["message"]
    assert httpx.post(agent + "/api/v1/profiles", json={"duration_s": 1}).status_code == 401
    assert httpx.post(agent + "/api/v1/binary", headers=hdr(SNAP)).status_code == 403
    metrics = httpx.get(agent + "/metrics").text
    assert 'inferwatch_api_refused_total{status="401"} 4.0' in metrics
    assert 'inferwatch_api_refused_total{status="403"} 3.0' in metrics


def test_api_records_a_speedscope_profile_of_the_runtime(agent, target) -> None:
    r = httpx.post(
        agent + "/api/v1/profiles", json={"duration_s": 2, "rate_hz": 50, "nonblocking": True}, headers=hdr(PROF)
    )
    assert r.status_code == 202, r.text
    job = r.json()
    assert job["pid"] == target.pid and job["state"] == "running"
    busy = httpx.post(agent + "/api/v1/profiles", json={"duration_s": 1}, headers=hdr(PROF))
    assert busy.status_code == 409 and "one at a time" in busy.json()["message"]
    deadline = time.monotonic() + 60
    while time.monotonic() < deadline:
        res = httpx.get(agent + job["result_url"], headers=hdr(PROF))
        if res.status_code != 202:
            break
        time.sleep(0.3)
    assert res.status_code == 200, res.text
    assert_speedscope(res.content)
    assert httpx.get(agent + job["result_url"], headers=hdr(READ)).status_code == 403
    listed = httpx.get(agent + "/api/v1/profiles", headers=hdr(PROF)).json()["profiles"]
    assert [p["state"] for p in listed] == ["done"]


def test_api_validates_requests(agent) -> None:
    for body in ({"duration_s": 61}, {"duration_s": 1, "format": "pdf"}, {"duration_s": 1, "rate_hz": 0}, {"pid": "x"}):
        r = httpx.post(agent + "/api/v1/profiles", json=body, headers=hdr(PROF))
        assert r.status_code == 400, (body, r.text)
    assert httpx.get(agent + "/api/v1/profiles/..%2Fetc", headers=hdr(PROF)).status_code == 404


def test_api_reports_a_non_python_target(agent, target) -> None:
    (sleeper,) = psutil.Process(target.pid).children()  # the runtime's non-Python child: in scope
    r = httpx.post(agent + "/api/v1/profiles", json={"pid": sleeper.pid, "duration_s": 1}, headers=hdr(PROF))
    assert r.status_code == 202, r.text
    url = r.json()["status_url"]
    deadline = time.monotonic() + 120  # bounds a hang (CI's load 10-17 on 2 cores)
    while (job := httpx.get(agent + url, headers=hdr(PROF)).json())["state"] == "running":
        assert time.monotonic() < deadline
        time.sleep(0.2)
    assert job["state"] == "failed" and job["error_kind"] == "not_python"
    assert "Python" in job["error"]


def test_cli_records_a_speedscope_file(target, tmp_path) -> None:
    out = tmp_path / "p.speedscope.json"
    cmd = [PYTHON, "-m", "inferwatch.agent", "profile", "--pid", str(target.pid), "--duration", "2", "--rate", "50"]
    res = subprocess.run([*cmd, "--nonblocking", "-o", str(out)], cwd=ROOT, capture_output=True, text=True, timeout=90)
    assert res.returncode == 0, res.stderr
    assert res.stdout.strip() == str(out)
    assert_speedscope(out.read_bytes())
    bad = subprocess.run([*cmd[:6], "--duration", "61"], cwd=ROOT, capture_output=True, text=True, timeout=60)
    assert bad.returncode == 2 and "duration" in bad.stderr
    both = subprocess.run([*cmd[:6], "--runtime"], cwd=ROOT, capture_output=True, text=True, timeout=60)
    assert both.returncode == 2 and "exactly one" in both.stderr


def test_permission_errors_name_the_fix() -> None:
    # py-spy 0.4.3's stderr when ptrace is refused (docs/diagnostics.md, "Profiling with py-spy")
    err = classify(
        "Error: Permission Denied: Try running again with elevated permissions by going 'sudo env \"PATH=$PATH\" !!'", 7
    )
    assert err.kind == "permission"
    for fix in ("SYS_PTRACE", "pid: host", "shareProcessNamespace"):
        assert fix in str(err)
    no_exe = "Error: Failed to get process executable name. Check that the process is running.\n\nCaused by:\n"
    assert classify(no_exe + "    0: Permission denied (os error 13)", 1).kind == "permission"  # seen on pid 1 here
    assert classify(no_exe + "    No such file or directory (os error 2)", 9).kind == "no_process"


def test_non_loopback_without_tokens_refuses_to_start(tmp_path) -> None:
    cmd = [PYTHON, "-m", "inferwatch.agent", "run", "--listen-address", "0.0.0.0", "--port", str(free_port())]
    env = {k: v for k, v in os.environ.items() if not k.startswith("INFERWATCH_")}
    res = subprocess.run(cmd, cwd=ROOT, capture_output=True, text=True, timeout=60, env=env)
    assert res.returncode == 2
    assert "not a loopback address" in res.stderr and "api.tokens" in res.stderr


def test_bad_tokens_file_refuses_to_start(tmp_path) -> None:
    tokens = tmp_path / "tokens"
    tokens.write_text("short read\n")
    cmd = [PYTHON, "-m", "inferwatch.agent", "run", "--port", str(free_port())]
    res = subprocess.run(
        cmd,
        cwd=ROOT,
        capture_output=True,
        text=True,
        timeout=60,
        env={**os.environ, "INFERWATCH_API__TOKENS_FILE": str(tokens)},
    )
    assert res.returncode == 2 and "shorter than 16" in res.stderr


@pytest.mark.skipif(os.geteuid() != 0 or not os.path.exists("/usr/bin/setpriv"), reason="needs root to drop to nobody")
def test_cli_without_ptrace_permission_names_the_fix(target, tmp_path) -> None:
    """A real refusal: py-spy as user nobody against a root-owned Python process."""
    cmd = [
        "/usr/bin/setpriv",
        "--reuid=65534",
        "--regid=65534",
        "--clear-groups",
        PYTHON,
        "-m",
        "inferwatch.agent",
        "profile",
    ]
    cmd += ["--pid", str(target.pid), "--duration", "1", "-o"]
    # An --output nobody may not even look into (pytest's root-only tmp): one line, exit 2, before py-spy runs.
    res = subprocess.run([*cmd, str(tmp_path / "never.json")], cwd=ROOT, capture_output=True, text=True, timeout=60)
    assert res.returncode == 2 and "cannot write --output" in res.stderr, res.stdout + res.stderr
    assert "Traceback" not in res.stderr
    # A writable --output: py-spy itself is refused by the kernel, and the message names the fix.
    out_dir = Path(tempfile.mkdtemp(prefix="inferwatch-nobody-"))
    try:
        out_dir.chmod(0o777)
        res = subprocess.run([*cmd, str(out_dir / "never.json")], cwd=ROOT, capture_output=True, text=True, timeout=60)
    finally:
        shutil.rmtree(out_dir, ignore_errors=True)
    assert res.returncode == 1, res.stdout + res.stderr
    assert "permission denied" in res.stderr and "SYS_PTRACE" in res.stderr and "pid: host" in res.stderr
