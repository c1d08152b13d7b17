"""Binary compatibility on real binaries: a program built here against a library that is then removed."""

from __future__ import annotations

import json
import os
import subprocess
import sys
import time
from pathlib import Path

import pytest

from inferwatch.agent.errors import ToolError
from inferwatch.agent.node.actions.binary import check_binary, elf_interpreter, glibc_available
from tests.conftest import PYTHON, ROOT

LIB_C = "int diag_answer(void) { return 42; }\n"
MAIN_C = '#include <stdio.h>\nint diag_answer(void);\nint main(void) { printf("%d\\n", diag_answer()); return 0; }\n'


@pytest.fixture
def built(tmp_path: Path) -> tuple[Path, Path]:
    """(program, its shared library) built with gcc; the program finds the library through its rpath."""
    (tmp_path / "lib.c").write_text(LIB_C)
    (tmp_path / "main.c").write_text(MAIN_C)
    lib = tmp_path / "libdiagprobe.so"
    prog = tmp_path / "runtime-bin"
    subprocess.run(["gcc", "-shared", "-fPIC", "-o", str(lib), str(tmp_path / "lib.c")], check=True, timeout=120)
    subprocess.run(
        ["gcc", "-o", str(prog), str(tmp_path / "main.c"), f"-L{tmp_path}", "-ldiagprobe", f"-Wl,-rpath,{tmp_path}"],
        check=True,
        timeout=120,
    )
    assert subprocess.run([str(prog)], capture_output=True, text=True, timeout=30).stdout == "42\n"
    return prog, lib


def test_removed_library_is_reported_by_name(built) -> None:
    prog, lib = built
    ok = check_binary(prog)
    assert ok.compatible and ok.missing_libraries == []
    assert ok.glibc_required is not None and ok.glibc_available == glibc_available()
    lib.unlink()
    report = check_binary(prog)
    assert report.missing_libraries == ["libdiagprobe.so"]
    assert not report.compatible


def test_doctor_reports_the_missing_library(built, tmp_path) -> None:
    prog, lib = built
    lib.unlink()
    env = {**os.environ, "INFERWATCH_BINARY__PATH": str(prog)}
    out = subprocess.run(
        [PYTHON, "-m", "inferwatch.agent", "doctor", "--json"],
        cwd=ROOT,
        env=env,
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert out.returncode == 1, out.stdout + out.stderr
    checks = {c["id"]: c for c in json.loads(out.stdout)["checks"]}
    finding = checks["runtime.hardware_mismatch"]
    assert finding["status"] == "fail" and "libdiagprobe.so" in finding["summary"]


def test_running_process_exe_resolves() -> None:
    report = check_binary(Path(os.path.realpath(sys.executable)), os.getpid())
    assert report.compatible, report.as_dict()
    assert report.interpreter is not None and elf_interpreter(Path(sys.executable).resolve()) == report.interpreter


def test_bad_paths_are_refused(tmp_path) -> None:
    with pytest.raises(ToolError, match="absolute"):
        check_binary(Path("relative/bin"))
    with pytest.raises(ToolError, match="cannot resolve"):
        check_binary(tmp_path / "missing")
    script = tmp_path / "script.sh"
    script.write_text("#!/bin/sh\necho hi\n")
    with pytest.raises(ToolError, match="not an ELF"):
        check_binary(script)


SLEEPER_C = (
    "#include <unistd.h>\nint diag_answer(void);\n"
    "int main(void) { for (int i = 0; i < 600; i++) { if (diag_answer() != 42) return 1; sleep(1); } return 0; }\n"
)


def test_running_runtime_via_proc_exe_and_the_api(built, tmp_path) -> None:
    """The agent resolves /proc/PID/exe at start; a library deleted under a running process is reported."""
    import httpx

    from tests.conftest import free_port
    from tests.procs import running, stop, wait_http

    _prog, lib = built
    (tmp_path / "sleeper.c").write_text(SLEEPER_C)
    sleeper = tmp_path / "sleeper"
    subprocess.run(
        [
            "gcc",
            "-o",
            str(sleeper),
            str(tmp_path / "sleeper.c"),
            f"-L{tmp_path}",
            "-ldiagprobe",
            f"-Wl,-rpath,{tmp_path}",
        ],
        check=True,
        timeout=120,
    )
    runtime = subprocess.Popen([str(sleeper)], start_new_session=True)
    try:
        time.sleep(0.3)
        lib.unlink()  # the runtime keeps running on the mapped copy; a restart would fail
        port = free_port()
        env = {"INFERWATCH_RUNTIME__PID": str(runtime.pid), "INFERWATCH_SNAPSHOTS__DIR": str(tmp_path / "snap")}
        cmd = [PYTHON, "-m", "inferwatch.agent", "run", "--port", str(port), "--interval", "0.5"]
        with running(cmd, tmp_path / "agent.log", cwd=ROOT, env=env) as proc:
            base = f"http://127.0.0.1:{port}"
            wait_http(f"{base}/readyz", ok=lambda r: r.status_code == 200, proc=proc)
            body = httpx.get(f"{base}/api/v1/binary").json()
            assert body["report"]["path"] == str(sleeper) and body["report"]["pid"] == runtime.pid
            assert body["report"]["missing_libraries"] == ["libdiagprobe.so"]
            assert body["report"]["deleted_mapped"] == [str(lib)]
            assert body["findings"][0]["id"] == "runtime.hardware_mismatch"
            metrics = httpx.get(f"{base}/metrics").text
            assert 'inferwatch_runtime_binary_missing_libraries{runtime="runtime"} 1.0' in metrics
            assert 'inferwatch_runtime_binary_compatible{runtime="runtime"} 0.0' in metrics
            # on demand needs the profile scope, which is never anonymous
            assert httpx.post(f"{base}/api/v1/binary").status_code == 401
    finally:
        stop(runtime)


def test_restored_library_clears_on_schedule_and_on_request(built, tmp_path) -> None:
    """Issue 15: RuntimeHardwareMismatch for a missing library never cleared after the library was restored
    until the agent restarted. The check is re-run every ``binary.interval_s`` and on ``POST /api/v1/binary``
    (scope ``profile``: the runbook sends the token header)."""
    import shutil

    import httpx

    from tests.conftest import free_port
    from tests.procs import running, wait_http

    prog, lib = built
    kept = tmp_path / "kept.so"
    shutil.copy2(lib, kept)
    lib.unlink()  # the program's rpath directory no longer holds its library
    port = free_port()
    token = "op-token-binary-1"
    env = {
        "INFERWATCH_BINARY__PATH": str(prog),
        "INFERWATCH_BINARY__INTERVAL_S": "1",
        "INFERWATCH_API__TOKENS": json.dumps([{"token": token, "scopes": ["read", "profile"], "name": "op"}]),
        "INFERWATCH_SNAPSHOTS__DIR": str(tmp_path / "snap"),
    }
    cmd = [PYTHON, "-m", "inferwatch.agent", "run", "--port", str(port), "--interval", "0.5"]
    base = f"http://127.0.0.1:{port}"
    auth = {"Authorization": f"Bearer {token}"}
    missing = 'inferwatch_runtime_binary_missing_libraries{runtime="runtime"}'

    def metric() -> str:
        line = next(x for x in httpx.get(f"{base}/metrics", timeout=10).text.splitlines() if x.startswith(missing))
        return line.split()[-1]

    def until(value: str, limit_s: float) -> float:
        start = time.monotonic()
        while metric() != value:
            assert time.monotonic() - start < limit_s, f"{missing} still not {value} after {limit_s}s"
            time.sleep(0.2)
        return time.monotonic() - start

    with running(cmd, tmp_path / "agent.log", cwd=ROOT, env=env) as proc:
        wait_http(f"{base}/readyz", ok=lambda r: r.status_code == 200, proc=proc)
        assert metric() == "1.0"
        shutil.copy2(kept, lib)  # the library is back: the scheduled re-check clears it, no restart
        # 60 s bounds a hang (the default re-check is every 300 s, so a pass still shows interval_s=1 is used)
        until("0.0", 60)
        checks = httpx.get(f"{base}/api/v1/binary", headers=auth, timeout=10).json()["report"]
        assert checks["compatible"] is True and checks["missing_libraries"] == []
        lib.unlink()
        until("1.0", 60)
        # on request: without the token 401, with it the new report at once
        shutil.copy2(kept, lib)
        assert httpx.post(f"{base}/api/v1/binary", timeout=30).status_code == 401
        r = httpx.post(f"{base}/api/v1/binary", headers=auth, timeout=30)
        assert r.status_code == 200 and r.json()["report"]["missing_libraries"] == []
        assert metric() == "0.0"


LISTENER_C = (
    "#include <arpa/inet.h>\n#include <stdlib.h>\n#include <sys/socket.h>\n#include <unistd.h>\n"
    "int diag_answer(void);\n"
    "int main(int argc, char **argv) {\n"
    "  int s = socket(AF_INET, SOCK_STREAM, 0), one = 1;\n"
    "  setsockopt(s, SOL_SOCKET, SO_REUSEADDR, &one, sizeof one);\n"
    "  struct sockaddr_in a = {0}; a.sin_family = AF_INET; a.sin_port = htons(atoi(argv[1]));\n"
    "  a.sin_addr.s_addr = htonl(INADDR_LOOPBACK);\n"
    "  if (bind(s, (struct sockaddr *)&a, sizeof a) || listen(s, 8)) return 2;\n"
    "  for (int i = 0; i < 600 && diag_answer() == 42; i++) sleep(1);\n"
    "  return 0;\n}\n"
)


@pytest.mark.slow
def test_doctor_engine_url_finds_the_runtime_by_port_for_the_binary_check(built, tmp_path) -> None:
    """Issue 15: ``doctor --engine-url`` found the runtime by its port for the SIMD check but said "no runtime
    process configured" for the binary check. A runtime built here listens on a port; its library is removed."""
    from tests.conftest import free_port
    from tests.procs import stop

    _prog, lib = built
    (tmp_path / "listener.c").write_text(LISTENER_C)
    listener = tmp_path / "runtime-listener"
    subprocess.run(
        ["gcc", "-o", str(listener), str(tmp_path / "listener.c"), f"-L{tmp_path}", "-ldiagprobe",
         f"-Wl,-rpath,{tmp_path}"],
        check=True, timeout=120,
    )  # fmt: skip
    port = free_port()
    runtime = subprocess.Popen([str(listener), str(port)], start_new_session=True)
    try:
        deadline = time.monotonic() + 60  # bounds a hang; past it the doctor would look for a runtime not listening
        while True:
            import socket

            with socket.socket() as s:
                if s.connect_ex(("127.0.0.1", port)) == 0:
                    break
            assert runtime.poll() is None and time.monotonic() < deadline, f"not listening (exit {runtime.poll()})"
            time.sleep(0.1)
        lib.unlink()
        env = {k: v for k, v in os.environ.items() if not k.startswith("INFERWATCH_")}
        out = subprocess.run(
            [PYTHON, "-m", "inferwatch.agent", "doctor", "--json", "--engine-url", f"http://127.0.0.1:{port}"],
            cwd=ROOT, env=env, capture_output=True, text=True, timeout=180,
        )  # fmt: skip
        checks = {c["id"]: c for c in json.loads(out.stdout)["checks"]}
        finding = checks.get("runtime.hardware_mismatch")
        assert finding is not None, {k: (c["status"], c["summary"]) for k, c in checks.items()}
        assert finding["status"] == "fail" and "libdiagprobe.so" in finding["summary"]
        assert finding["evidence"]["pid"] == runtime.pid and finding["evidence"]["path"] == str(listener)
    finally:
        stop(runtime)


def test_a_stopped_check_posts_nothing_even_when_its_check_outlasts_the_stop() -> None:
    """A target's binary check stopped while a check is in progress (its join timed out under load): once stop()
    returns, the check posts nothing, so the record the target's removal forgot stays forgotten."""
    import threading

    from inferwatch.agent.config import BinarySettings
    from inferwatch.agent.errors import NoDataError
    from inferwatch.agent.node.actions.binary import BinaryCheck
    from inferwatch.agent.node.state import AgentState

    entered, release = threading.Event(), threading.Event()

    class SlowLocator:
        procfs = Path("/proc")

        def find_serving(self, port: int | None) -> object:
            entered.set()
            release.wait(5)
            raise NoDataError("no runtime")

    state = AgentState()
    check = BinaryCheck(BinarySettings(), SlowLocator(), absent_interval_s=60.0, state=state, record="binary:t")  # type: ignore[arg-type]
    check.start()
    assert entered.wait(5)
    stopper = threading.Thread(target=check.stop, kwargs={"timeout_s": 0.05})
    stopper.start()
    time.sleep(0.2)  # the join has timed out; stop() now waits for the check in progress
    assert stopper.is_alive()
    release.set()
    stopper.join(5)
    assert not stopper.is_alive()
    state.forget("binary:t")  # what the target's removal does after stop()
    time.sleep(0.1)
    assert "binary:t" not in state.health()
