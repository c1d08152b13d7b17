"""``inferwatch assets``: list, print or write out the alert rules, Alertmanager config, dashboards and runbooks.

For loading them into your own Prometheus, Alertmanager and Grafana (agent/common/assets.py says where they come
from). Exit 0 done, 1 an asset is missing or in the way, 2 usage error.
"""

from __future__ import annotations

import sys
from pathlib import Path

import typer

EXIT_FAILED = 1


def register(app: typer.Typer) -> None:
    assets = typer.Typer(
        help="The alert rules, Alertmanager config, SLO spec, dashboards and runbooks inferwatch ships.",
        no_args_is_help=True,
        rich_markup_mode=None,
    )
    app.add_typer(assets, name="assets")

    @assets.command("list")
    def list_() -> None:
        """Print the path of every shipped asset, as 'assets export' lays them out."""
        from inferwatch.agent.common.assets import catalog
        from inferwatch.agent.errors import AssetError

        try:
            for asset in catalog():
                typer.echo(asset.path)
        except AssetError as exc:
            typer.echo(f"inferwatch: {exc}", err=True)
            raise typer.Exit(EXIT_FAILED) from None

    @assets.command()
    def show(
        name: str = typer.Argument(
            ..., help="A path from 'assets list' (rules/slo.rules.yml), or a unique file name or stem (AgentDown)."
        ),
    ) -> None:
        """Print one asset's exact content to standard output."""
        from inferwatch.agent.common.assets import find
        from inferwatch.agent.errors import AssetError

        try:
            data = find(name).read_bytes()
        except AssetError as exc:
            typer.echo(f"inferwatch: {exc}", err=True)
            raise typer.Exit(EXIT_FAILED) from None
        sys.stdout.buffer.write(data)
        sys.stdout.flush()

    @assets.command()
    def export(
        directory: Path = typer.Argument(..., help="Directory to write into (created if missing)."),
        force: bool = typer.Option(False, "--force", help="Replace files of the same name already there."),
    ) -> None:
        """Write rules/, alertmanager.yml, slo.yml, dashboards/ and runbooks/ into DIRECTORY.

        Nothing already in DIRECTORY is replaced without --force, and nothing is deleted.
        """
        from inferwatch.agent.common.assets import export as do_export
        from inferwatch.agent.errors import AssetError

        try:
            written = do_export(directory, overwrite=force)
        except AssetError as exc:
            typer.echo(f"inferwatch: {exc}", err=True)
            raise typer.Exit(EXIT_FAILED) from None
        counts: dict[str, int] = {}  # rules/ → 3, alertmanager.yml → 1, ...
        for path in written:
            rel = path.relative_to(directory).parts
            top = f"{rel[0]}/" if len(rel) > 1 else rel[0]
            counts[top] = counts.get(top, 0) + 1
        parts = ", ".join(f"{top} ({n})" if top.endswith("/") else top for top, n in counts.items())
        typer.echo(f"wrote {len(written)} files to {directory}: {parts}")
        typer.echo(f"check them with: promtool check rules {directory}/rules/*.yml")
        typer.echo(f"                 amtool check-config {directory}/alertmanager.yml")
