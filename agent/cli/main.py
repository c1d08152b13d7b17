"""Entry point of the ``inferwatch`` command. Only this layer exits; library code raises.

A command's module is imported when that command runs (or when a help text or a completion lists every command):
``inferwatch run`` loads ``cli/run.py`` and what it needs, not the other commands' modules and their imports
(~2 MB of every agent's memory: docs/benchmarks.md, "Where the megabytes go").
"""

from __future__ import annotations

import importlib
from collections.abc import Iterator, MutableMapping
from typing import Any

import typer
import typer.main
from typer.core import TyperGroup

from inferwatch.agent import __version__

# Every command, in the order ``inferwatch --help`` lists them → the module of inferwatch.agent.cli whose
# ``register(app)`` defines it (a module may define several: matrix.py defines ``prices`` and ``matrix``).
COMMANDS: dict[str, str] = {
    "run": "run",
    "doctor": "doctor",
    "simulate": "simulate",
    "loadgen": "loadgen",
    "demo": "demo",
    "probe": "probe",
    "profile": "profile",
    "explain": "explain",
    "simd": "simd",
    "top": "top",
    "prices": "matrix",
    "matrix": "matrix",
    "drift": "drift",
    "version": "",  # defined below, in this module
    "engine": "engine",
    "evidence": "evidence",
    "assets": "assets",
    "grafana": "grafana",
}

# One set of settings for the root and for every command's own small app, so a command reads the same either way.
_APP_SETTINGS: dict[str, Any] = {
    "add_completion": False,
    "pretty_exceptions_enable": False,
    # Help is plain text: rich markup would turn "normal:M:SD" into "normalⓂSD" (emoji codes) and eat "[...]".
    "rich_markup_mode": None,
}


def _module_commands(module: str) -> dict[str, Any]:
    """The click commands that ``inferwatch.agent.cli.<module>``'s ``register`` defines, by name."""
    sub = typer.Typer(**_APP_SETTINGS)
    importlib.import_module(f"inferwatch.agent.cli.{module}").register(sub)
    return dict(typer.main.get_group(sub).commands)


class _Commands(MutableMapping[str, Any]):
    """The root group's commands: every name in :data:`COMMANDS` from the start, each command built (its module
    imported) the first time it is looked up. Iterating yields the names without building anything; reading every
    value (``items()``, a help listing) builds them all."""

    def __init__(self, built: MutableMapping[str, Any]) -> None:
        self._built = dict(built)

    def __getitem__(self, name: str) -> Any:
        module = COMMANDS.get(name)
        if name not in self._built and module:
            for cmd_name, cmd in _module_commands(module).items():
                self._built.setdefault(cmd_name, cmd)
        return self._built[name]

    def __setitem__(self, name: str, cmd: Any) -> None:
        self._built[name] = cmd

    def __delitem__(self, name: str) -> None:
        del self._built[name]

    def __iter__(self) -> Iterator[str]:
        yield from COMMANDS
        yield from (name for name in self._built if name not in COMMANDS)

    def __len__(self) -> int:
        return len(COMMANDS.keys() | self._built.keys())

    def __contains__(self, name: object) -> bool:
        return name in COMMANDS or name in self._built


class _LazyGroup(TyperGroup):
    """The root group, whose commands are a :class:`_Commands` (typer builds it with the commands of this module)."""

    def __init__(self, **kwargs: Any) -> None:
        super().__init__(**kwargs)
        self.commands = _Commands(self.commands)


app = typer.Typer(
    name="inferwatch",
    help="Observability and SLO diagnostics for LLM inference runtimes.",
    no_args_is_help=True,
    cls=_LazyGroup,
    **_APP_SETTINGS,
)


@app.callback()
def _root() -> None:
    # A group, not a one-command app: the other commands are added by _LazyGroup, where typer does not see them.
    pass


@app.command()
def version() -> None:
    """Print the inferwatch version."""
    typer.echo(__version__)


def main() -> None:
    """Run the command; an error the agent raises on purpose (inferwatch.agent.errors) ends in one line, never a
    traceback.

    Commands catch what they expect themselves; this is the net under them, so a user's mistake that reaches
    library code (a bad value, an unreadable file) still reads as one message: exit 2 for configuration, else 1.
    """
    from inferwatch.agent.cli.serve import PROGRAM
    from inferwatch.agent.errors import ConfigError, InferwatchError

    PROGRAM[0] = True  # this process is the command's: ``inferwatch run`` may replace its interpreter
    try:
        app()
    except InferwatchError as exc:
        typer.echo(f"inferwatch: {exc}", err=True)
        raise SystemExit(2 if isinstance(exc, ConfigError) else 1) from None
