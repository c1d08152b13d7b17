"""``inferwatch run`` serves in a fresh interpreter of its own process, handed its settings (agent/cli/serve.py)."""

from __future__ import annotations

import os
import signal
import subprocess
from pathlib import Path

import msgspec
import pytest

from inferwatch.agent.cli.serve import SETTINGS_FD, _path, main
from inferwatch.agent.config import Settings
from tests.conftest import PYTHON, ROOT, free_port
from tests.procs import wait_http

# Every section set away from its default, with paths, maps, lists and a token: what the command hands over.
RICH = {
    "listen_address": "127.0.0.1",
    "listen_port": 19435,
    "interval_s": 3,
    "log_level": "debug",
    "path": {"procfs": "/host/proc", "sysfs": "/host/sys"},
    "collectors": {"cpu": {"enabled": False}, "engine": {"interval_s": 4}},
    "runtime": {"name": "vllm", "cmdline_pattern": "vllm serve"},
    "node": {"environment": "production"},
    "engine": {"metrics_url": "http://127.0.0.1:8000/metrics?x=1", "kind": "vllm", "progress_filter": False},
    "receiver": {"enabled": True, "http_endpoint": "127.0.0.1:14318", "grpc_endpoint": ""},
    "runbooks": {"base_url": "https://runbooks.example/"},
    "probe": {"url": "http://127.0.0.1:8000", "protocols": ["openai", "anthropic"]},
    "api": {"tokens": [{"token": "s3cret-s3cret-s3cret", "scopes": ["read"], "name": "ops"}]},
    "snapshots": {"dir": "relative/snapshots", "max_count": 5},
    "evidence": {"enabled": False},
}


@pytest.mark.parametrize("values", [{}, RICH], ids=["defaults", "rich"])
def test_the_settings_read_back_as_the_command_made_them(values: dict[str, object]) -> None:
    settings = Settings.from_values(values)
    handed = msgspec.json.decode(msgspec.json.encode(settings, enc_hook=_path))
    assert Settings.from_values(handed) == settings


def _cmdline(pid: int) -> list[str]:
    return Path(f"/proc/{pid}/cmdline").read_bytes().decode().split("\0")[:-1]


def _run(tmp_path: Path, env: dict[str, str]) -> tuple[subprocess.Popen[str], str]:
    port = free_port()
    clean = {k: v for k, v in os.environ.items() if not k.startswith("INFERWATCH_")} | {"HOME": str(tmp_path), **env}
    proc = subprocess.Popen(
        [PYTHON, "-m", "inferwatch.agent", "run", "--port", str(port), "--no-collector.gpu"],
        cwd=tmp_path,
        env=clean,
        stdout=subprocess.DEVNULL,
        stderr=subprocess.PIPE,
        text=True,
    )
    base = f"http://127.0.0.1:{port}"
    try:
        wait_http(base + "/readyz", proc=proc)
    except BaseException:
        proc.kill()
        proc.wait(10)
        raise
    return proc, base


@pytest.mark.integration
def test_the_agent_serves_in_the_commands_process_without_its_command_line(tmp_path: Path) -> None:
    proc, base = _run(tmp_path, {})
    try:
        cmdline = _cmdline(proc.pid)  # the same PID: what a supervisor or a pidfile knows stays true
        assert cmdline[1:6] == ["-m", "inferwatch.agent.cli.serve", SETTINGS_FD, cmdline[4], "--"] or (
            "inferwatch.agent.cli.serve" in cmdline and SETTINGS_FD in cmdline
        ), cmdline
        assert cmdline[-4:] == ["run", "--port", base.rsplit(":", 1)[1], "--no-collector.gpu"]  # what ps shows
        fds = Path(f"/proc/{proc.pid}/fd")
        links = [os.readlink(f) for f in fds.iterdir() if f.is_symlink()]
        assert not [x for x in links if "inferwatch-settings" in x], links  # the memory file was read and closed
    finally:
        proc.send_signal(signal.SIGTERM)
        _, err = proc.communicate(timeout=60)
    assert proc.returncode == 0, err[-2000:]
    assert "received SIGTERM: stopping" in err and "agent stopped" in err


@pytest.mark.integration
def test_with_the_exec_turned_off_the_command_serves_in_its_own_interpreter(tmp_path: Path) -> None:
    proc, _ = _run(tmp_path, {"INFERWATCH_REEXEC": "0"})
    try:
        assert _cmdline(proc.pid)[1:4] == ["-m", "inferwatch.agent", "run"]
    finally:
        proc.send_signal(signal.SIGTERM)
        _, err = proc.communicate(timeout=60)
    assert proc.returncode == 0, err[-2000:]


def test_a_bad_setting_is_refused_by_the_command_before_any_exec(tmp_path: Path) -> None:
    env = {k: v for k, v in os.environ.items() if not k.startswith("INFERWATCH_")} | {"HOME": str(tmp_path)}
    out = subprocess.run(
        [PYTHON, "-m", "inferwatch.agent", "run", "--port", "99999"],
        cwd=ROOT,
        env=env,
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert out.returncode == 2 and out.stderr.startswith("inferwatch: invalid configuration: listen_port"), out.stderr


@pytest.mark.parametrize("args", [[], ["--settings-fd"], ["--settings-fd", "x"], ["run"]])
def test_the_serving_entry_refuses_anything_but_its_memory_file(
    args: list[str], capsys: pytest.CaptureFixture[str]
) -> None:
    with pytest.raises(SystemExit) as exc:
        main(args)
    assert exc.value.code == 2 and "usage:" in capsys.readouterr().err


def test_a_broken_hand_over_is_one_line_and_exit_2(capsys: pytest.CaptureFixture[str]) -> None:
    r, w = os.pipe()
    os.write(w, b'{"listen_port": "not a port"}')
    os.close(w)
    with pytest.raises(SystemExit) as exc:
        main([SETTINGS_FD, str(r)])
    assert exc.value.code == 2 and capsys.readouterr().err.startswith("inferwatch: invalid configuration: listen_port")
