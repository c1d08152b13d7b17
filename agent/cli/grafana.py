"""``inferwatch grafana push``: upsert inferwatch's dashboards into a Grafana (exporters/grafana.py)."""

from __future__ import annotations

from pathlib import Path

import typer

EXIT_FAILED = 1
EXIT_USAGE = 2


def register(app: typer.Typer) -> None:
    grafana = typer.Typer(help="Grafana: push inferwatch's dashboards.", no_args_is_help=True, rich_markup_mode=None)
    app.add_typer(grafana, name="grafana")

    @grafana.command()
    def push(
        url: str = typer.Option(..., "--url", help="Grafana base URL, e.g. http://127.0.0.1:3000"),
        token: str | None = typer.Option(
            None, "--token", envvar="GRAFANA_TOKEN", help="Service-account token (Editor; Admin to create datasources)."
        ),
        basic_auth: str | None = typer.Option(None, "--basic-auth", help="USER:PASSWORD instead of a token."),
        folder: str = typer.Option("inferwatch", "--folder", help="Folder to put the dashboards in (created)."),
        datasource_uid: str | None = typer.Option(
            None, "--datasource-uid", help="Prometheus datasource the dashboards open on (checked or created)."
        ),
        prometheus_url: str | None = typer.Option(
            None, "--prometheus-url", help="Create the datasource (uid --datasource-uid) pointing at this URL."
        ),
        directory: Path | None = typer.Option(None, "--dir", help="Dashboard JSON directory (default: built in)."),
        timeout: float = typer.Option(10.0, "--timeout", help="HTTP timeout, seconds."),
    ) -> None:
        """Create or update every inferwatch dashboard in a Grafana folder (idempotent).

        Payloads target Grafana 11.6 (schemaVersion 41); Grafana older than 11.0 is refused.
        """
        from inferwatch.agent.common.assets import dashboards_dir
        from inferwatch.agent.common.redact import redact_url
        from inferwatch.dashboards import load_all
        from inferwatch.exporters.grafana import GrafanaError, GrafanaPusher
        from inferwatch.exporters.grafana import push as do_push

        if (token is None) == (basic_auth is None):
            typer.echo("inferwatch: pass exactly one of --token or --basic-auth USER:PASS", err=True)
            raise typer.Exit(EXIT_USAGE)
        basic: tuple[str, str] | None = None
        if basic_auth is not None:
            user, sep, password = basic_auth.partition(":")
            if not sep or not user:
                typer.echo("inferwatch: --basic-auth must be USER:PASSWORD", err=True)
                raise typer.Exit(EXIT_USAGE)
            basic = (user, password)
        if not url.startswith(("http://", "https://")):
            typer.echo(f"inferwatch: --url must start with http:// or https:// (got {redact_url(url)!r})", err=True)
            raise typer.Exit(EXIT_USAGE)
        source = directory or dashboards_dir()
        try:
            dashboards = load_all(source)
        except (OSError, ValueError, KeyError) as exc:
            typer.echo(f"inferwatch: cannot read dashboards from {source}: {exc}", err=True)
            raise typer.Exit(EXIT_USAGE) from None
        if not dashboards:
            typer.echo(f"inferwatch: no dashboard JSON in {source}", err=True)
            raise typer.Exit(EXIT_USAGE)
        try:
            pusher = GrafanaPusher(url, token=token, basic_auth=basic, timeout_s=timeout)
            version, results = do_push(
                pusher, dashboards, folder=folder, datasource_uid=datasource_uid, prometheus_url=prometheus_url
            )
        except GrafanaError as exc:
            typer.echo(f"inferwatch: {exc}", err=True)
            raise typer.Exit(EXIT_FAILED) from None
        shown = redact_url(url)  # printed: never the URL's credentials (http://admin:pw@grafana:3000)
        typer.echo(f"Grafana {version} at {shown}, folder {folder!r}:")
        for r in results:
            typer.echo(f"  {r.action:9} {r.uid:20} {r.title}  {shown.rstrip('/')}{r.url}")
