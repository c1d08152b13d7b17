"""Entry point of the ``inferwatch`` command. Only this layer exits; library code raises."""

from __future__ import annotations

import typer

from inferwatch.agent import __version__
from inferwatch.agent.cli import assets, demo, doctor, loadgen, run, simulate, top
from inferwatch.agent.cli import engine as engine_cli
from inferwatch.agent.cli import evidence as evidence_cli
from inferwatch.agent.cli import explain as explain_cli
from inferwatch.agent.cli import probe as probe_cmd
from inferwatch.agent.cli import profile as profile_cmd
from inferwatch.agent.cli import simd as simd_cli

app = typer.Typer(
    name="inferwatch",
    help="Observability and SLO diagnostics for LLM inference runtimes.",
    no_args_is_help=True,
    add_completion=False,
    pretty_exceptions_enable=False,
    # Help is plain text: rich markup would turn "normal:M:SD" into "normalⓂSD" (emoji codes) and eat "[...]".
    rich_markup_mode=None,
)

for module in (
    run,
    doctor,
    engine_cli,
    simulate,
    loadgen,
    demo,
    probe_cmd,
    profile_cmd,
    evidence_cli,
    explain_cli,
    simd_cli,
    assets,
    top,
):
    module.register(app)

from inferwatch.agent.cli import drift, grafana, matrix  # noqa: E402  (dash: grafana push, matrix; drift)

for module in (grafana, matrix, drift):
    module.register(app)


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
    from inferwatch.agent.errors import ConfigError, InferwatchError

    try:
        app()
    except InferwatchError as exc:
        typer.echo(f"inferwatch: {exc}", err=True)
        raise SystemExit(2 if isinstance(exc, ConfigError) else 1) from None
