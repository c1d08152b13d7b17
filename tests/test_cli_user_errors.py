"""A user's mistake on the command line ends in one line and a non-zero exit, never a traceback (issue 31).

Each case is a file the user names (a token file, a log directory) that is missing, a directory or unreadable.
The commands run as a user runs them, in a subprocess, and the agent they would talk to is a closed port: the
file is read, and refused, before any request.
"""

from __future__ import annotations

import os
import subprocess
from pathlib import Path

import pytest

from inferwatch.agent.cli.common import MAX_TOKEN_FILE_BYTES
from tests.conftest import PYTHON, ROOT, free_port

TOKEN_COMMANDS = {
    "top": ["top", "--once", "--agent", "{agent}"],
    "explain": ["explain", "--agent", "{agent}"],
    "evidence list": ["evidence", "list", "--agent", "{agent}"],
    "evidence show": ["evidence", "show", "latest", "--agent", "{agent}"],
}


def _bad_file(kind: str, tmp: Path) -> Path:
    if kind == "missing":
        return tmp / "no-such-token"
    if kind == "directory":
        return tmp
    path = tmp / ("big" if kind == "too big" else "binary")
    path.write_bytes(b"x" * (MAX_TOKEN_FILE_BYTES + 1) if kind == "too big" else b"\xff\xfe token")
    return path


def _run(args: list[str], tmp: Path) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [PYTHON, "-m", "inferwatch.agent", *args], cwd=tmp, capture_output=True, text=True, timeout=120, check=False
    )


CASES = [(command, "missing") for command in sorted(TOKEN_COMMANDS)] + [
    ("top", kind)
    for kind in ("directory", "too big", "not utf-8")  # one helper reads it for every command
]


@pytest.mark.parametrize(("command", "kind"), CASES)
def test_a_bad_token_file_is_one_line_and_exit_2(command: str, kind: str, tmp_path: Path) -> None:
    agent = f"http://127.0.0.1:{free_port()}"
    token_file = _bad_file(kind, tmp_path)
    args = [a.format(agent=agent) for a in TOKEN_COMMANDS[command]] + ["--token-file", str(token_file)]
    r = _run(args, tmp_path)
    assert r.returncode == 2, (r.returncode, r.stdout, r.stderr)
    assert "Traceback" not in r.stderr and len(r.stderr.strip().splitlines()) == 1, r.stderr
    assert r.stderr.startswith(f"inferwatch {command.split()[0]}: ") and str(token_file) in r.stderr, r.stderr
    assert "cannot reach" not in r.stderr  # refused before any request


def test_a_good_token_file_is_read_and_sent(tmp_path: Path) -> None:
    """The helper's other half: a readable file's token (whitespace stripped) goes on; the agent is down here."""
    token = tmp_path / "token"
    token.write_text("  s3cret\n", encoding="utf-8")
    r = _run(["top", "--once", "--agent", f"http://127.0.0.1:{free_port()}", "--token-file", str(token)], tmp_path)
    assert r.returncode == 1 and "inferwatch top: " in r.stderr and "Traceback" not in r.stderr, r.stderr


@pytest.mark.parametrize("kind", ["a file", "unwritable"])
def test_demo_with_a_bad_log_dir_is_one_line_and_exit_2(kind: str, tmp_path: Path) -> None:
    if kind == "a file":
        log_dir = tmp_path / "file"
        log_dir.write_text("")
    else:
        log_dir = Path("/proc/inferwatch-demo-logs")  # cannot be created, even by root
    r = _run(["demo", "--log-dir", str(log_dir), "--duration", "1"], tmp_path)
    assert r.returncode == 2, (r.stdout, r.stderr)
    assert r.stderr.startswith(f"inferwatch demo: cannot use --log-dir {log_dir}: "), r.stderr
    assert "Traceback" not in r.stderr and len(r.stderr.strip().splitlines()) == 1


def test_an_error_raised_on_purpose_below_the_cli_is_one_line(tmp_path: Path) -> None:
    """The entry point's net: an inferwatch.agent.errors exception no command caught becomes one line, exit 1 or 2."""
    script = (
        "import sys, typer\n"
        "from inferwatch.agent.cli import main as m\n"
        "from inferwatch.agent.errors import ConfigError, ToolError\n"
        "m.app = typer.Typer()\n"
        "@m.app.command()\n"
        "def boom(config: bool = False) -> None:\n"
        "    raise (ConfigError if config else ToolError)('the thing the user got wrong')\n"
        "sys.argv = ['inferwatch', *sys.argv[1:]]\n"
        "m.main()\n"
    )
    for flag, code in (("--config", 2), ("--no-config", 1)):
        r = subprocess.run(
            [PYTHON, "-c", script, flag], cwd=ROOT, capture_output=True, text=True, timeout=120, check=False
        )
        assert r.returncode == code, (r.stdout, r.stderr)
        assert r.stderr == "inferwatch: the thing the user got wrong\n", r.stderr


@pytest.mark.parametrize("kind", ["no such directory", "a directory"])
def test_profile_with_a_bad_output_is_one_line_and_exit_2(kind: str, tmp_path: Path) -> None:
    """Refused before py-spy runs (it would record for --duration, then fail with its own backtrace)."""
    output = tmp_path / "missing" / "p.json" if kind == "no such directory" else tmp_path
    r = _run(["profile", "--pid", str(os.getpid()), "--duration", "1", "--output", str(output)], tmp_path)
    assert r.returncode == 2, (r.stdout, r.stderr)
    assert r.stderr.startswith(f"inferwatch profile: cannot write --output {output}: "), r.stderr
    assert "Traceback" not in r.stderr and "backtrace" not in r.stderr and len(r.stderr.strip().splitlines()) == 1


@pytest.mark.parametrize(
    ("args", "says"),
    [
        (["--rate", "-1"], "--rate must be > 0"),
        (["--hardware", "nope"], "unknown --hardware 'nope'"),
        (["--protocol", "nope"], "--protocol must be one of"),
        (["--scenario", "nope"], "unknown scenario 'nope'"),
    ],
)
def test_demo_refuses_bad_values_before_it_starts_anything(args: list[str], says: str, tmp_path: Path) -> None:
    """Else the child that refuses it writes to its own log (the load generator: once per restart)."""
    r = _run(["demo", *args, "--duration", "1", "--log-dir", str(tmp_path / "logs")], tmp_path)
    assert r.returncode == 2 and r.stderr.startswith(f"inferwatch demo: {says}"), (r.stdout, r.stderr)
    assert len(r.stderr.strip().splitlines()) == 1 and "stopped" not in r.stdout + r.stderr
    assert not (tmp_path / "logs").exists() or not list((tmp_path / "logs").iterdir())  # no child ran
