"""``inferwatch run``: start the agent and its API server until interrupted."""

from __future__ import annotations

import sys
from pathlib import Path

import typer

from inferwatch.agent.cli.common import (
    EXTRA_ARGS,
    ConfigOpt,
    MachineOpt,
    ProcfsOpt,
    SysfsOpt,
    build_settings,
    setup_logging,
)
from inferwatch.agent.cli.serve import reexec, serve


def register(app: typer.Typer) -> None:
    @app.command(context_settings=EXTRA_ARGS)
    def run(
        ctx: typer.Context,
        config: Path | None = ConfigOpt,
        procfs: Path | None = ProcfsOpt,
        sysfs: Path | None = SysfsOpt,
        machine: str | None = MachineOpt,
        listen_address: str | None = typer.Option(
            None, "--listen-address", help="Address to bind (default 127.0.0.1)."
        ),
        port: int | None = typer.Option(None, "--port", help="Port of the API and /metrics (default 9435)."),
        interval: float | None = typer.Option(None, "--interval", help="Default collection interval, seconds."),
        environment: str | None = typer.Option(None, "--environment", help="Node environment, e.g. production."),
    ) -> None:
        """Run the node agent: collectors, /metrics, the status API and (with OTEL_* set) OTLP export.

        Switch collectors with --collector.NAME / --no-collector.NAME.
        """
        overrides: dict[str, object] = {}
        if listen_address is not None:
            overrides["listen_address"] = listen_address
        if port is not None:
            overrides["listen_port"] = port
        if interval is not None:
            overrides["interval_s"] = interval
        if environment is not None:
            overrides["node"] = {"environment": environment}
        if machine is not None:
            overrides["path"] = {"machine": machine}
        settings = build_settings(config, procfs, sysfs, ctx.args, overrides)
        reexec(settings, sys.argv[1:])  # serves in a fresh interpreter without typer and click, where it can
        setup_logging(settings.log_level)
        serve(settings)
