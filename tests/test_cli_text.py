"""What the command line prints, as a new user reads it (issue 15, "CLI and docs a new user trips over")."""

from __future__ import annotations

import os
import re
import subprocess

import click
import pytest
import typer.main
from typer.testing import CliRunner

from agent.cli.main import app
from tests.conftest import PYTHON, ROOT

# Characters rich's emoji codes produce (":M:" → Ⓜ, ":smile:" → 😄): enclosed alphanumerics, symbols, emoji.
_EMOJI = re.compile("[\u2460-\u24ff\u2600-\u27bf\U0001f000-\U0001faff]")


def _commands(group: click.Group, prefix: tuple[str, ...] = ()) -> list[tuple[tuple[str, ...], click.Command]]:
    out: list[tuple[tuple[str, ...], click.Command]] = []
    for name, cmd in sorted(group.commands.items()):
        out.append(((*prefix, name), cmd))
        if isinstance(cmd, click.Group):
            out += _commands(cmd, (*prefix, name))
    return out


def _squash(text: str) -> str:
    return " ".join(text.split())


def test_loadgen_help_shows_the_distribution_forms_literally() -> None:
    env = {**os.environ, "COLUMNS": "100", "TERM": "xterm-256color", "FORCE_COLOR": "1"}
    out = subprocess.run(
        [PYTHON, "-m", "agent", "loadgen", "--help"], cwd=ROOT, env=env, capture_output=True, text=True, timeout=60
    )
    assert out.returncode == 0, out.stderr
    text = _squash(out.stdout)
    assert "normal:MEAN:SD" in text and "lognormal:MEDIAN:SIGMA" in text and "uniform:LO:HI" in text
    assert not _EMOJI.search(out.stdout), out.stdout


COMMANDS = _commands(typer.main.get_command(app))  # type: ignore[arg-type]


@pytest.mark.parametrize(("path", "command"), COMMANDS, ids=[" ".join(p) for p, _ in COMMANDS])
def test_every_help_text_is_printed_as_written(path: tuple[str, ...], command: click.Command) -> None:
    """No markup or emoji processing anywhere: each option's help appears verbatim in its command's --help."""
    result = CliRunner().invoke(app, [*path, "--help"], env={"COLUMNS": "100"})
    assert result.exit_code == 0, result.output
    text = _squash(result.output)
    assert not _EMOJI.search(text), (path, text)
    assert "\u2502" not in result.output, "rich's boxed help (its markup and emoji codes) is on"
    for param in command.params:
        help_text = getattr(param, "help", None)
        if help_text and not getattr(param, "hidden", False):
            # compared without whitespace: the formatter wraps, and may break a long word at a hyphen
            assert "".join(help_text.split()) in "".join(text.split()), (path, param.name, help_text)
