"""``inferwatch doctor``: every registered collector once; exit 0 ok, 1 a check failed, 2 usage or tool error."""

from __future__ import annotations

import json
from pathlib import Path

import typer

from inferwatch.agent.cli.common import ConfigOpt, MachineOpt, ProcfsOpt, SysfsOpt, build_settings
from inferwatch.agent.common.samples import Finding


def register(app: typer.Typer) -> None:
    @app.command()
    def doctor(
        config: Path | None = ConfigOpt,
        procfs: Path | None = ProcfsOpt,
        sysfs: Path | None = SysfsOpt,
        machine: str | None = MachineOpt,
        require: list[str] = typer.Option([], "--require", help="CPU feature that must be present (repeatable)."),
        as_json: bool = typer.Option(False, "--json", help='Print {"checks": [...]} as JSON.'),
        engine_url: str | None = typer.Option(
            None,
            "--engine-url",
            help="Runtime base URL (or its /metrics): the engine collector scrapes it, the probe its streams, once.",
        ),
        profile_url: str | None = typer.Option(
            None, "--profile-url", help="The runtime's debug runtime_profile URL: check its state."
        ),
    ) -> None:
        """Run every registered collector once, as the agent does, and print their findings; a CI/CD hardware gate."""
        from inferwatch.agent.doctor import checks as doc
        from inferwatch.agent.errors import ConfigError
        from inferwatch.agent.node.wiring import build_deps

        settings = build_settings(config, procfs, sysfs, [], doc.doctor_overrides(engine_url, profile_url, machine))
        if not settings.path.procfs.is_dir():
            typer.echo(f"inferwatch: procfs root {settings.path.procfs} is not a directory", err=True)
            raise typer.Exit(2)
        try:
            deps = build_deps(settings, persist_key=False)
        except ConfigError as exc:
            typer.echo(f"inferwatch: {exc}", err=True)
            raise typer.Exit(2) from None
        findings = doc.run_checks(deps, doc.DoctorRequest([r.lower() for r in require], engine_url))
        if as_json:
            typer.echo(json.dumps(doc.as_json(findings), indent=2, sort_keys=False, default=str))
        else:
            _print_table(findings)
            typer.echo(doc.machine_line(findings))
        raise typer.Exit(doc.exit_code(findings))


def _print_table(findings: list[Finding]) -> None:
    from rich.console import Console
    from rich.table import Table

    colors = {"ok": "green", "warn": "yellow", "fail": "red", "skip": "dim"}
    table = Table(title="inferwatch doctor")
    table.add_column("check")
    table.add_column("status")
    table.add_column("summary")
    table.add_column("runbook")
    for f in findings:
        table.add_row(f.id, f"[{colors.get(f.status, '')}]{f.status}[/]", f.summary, f.runbook)
    Console(width=160).print(table)
