"""``inferwatch matrix``: the hardware × model matrix from a Prometheus holding fleet data (agent/fleet/matrix.py);
with ``--prices FILE`` its effective cost per generated token. ``inferwatch prices``: a price file checked, and
written as recording rules for the fleet's Prometheus (agent/fleet/prices.py)."""

from __future__ import annotations

from pathlib import Path
from typing import TYPE_CHECKING

import typer

if TYPE_CHECKING:
    from inferwatch.agent.fleet.matrix import Matrix
    from inferwatch.agent.fleet.prices import PriceTable

FORMATS = ("table", "csv", "markdown", "json")


def register(app: typer.Typer) -> None:
    register_prices(app)

    @app.command()
    def matrix(
        prometheus: str = typer.Option(..., "--prometheus", help="Prometheus base URL, e.g. http://127.0.0.1:9090"),
        window: str = typer.Option("1h", "--window", help="Look-back window (Prometheus duration: 30m, 1h, 1d)."),
        fmt: str = typer.Option("table", "--format", help="table | csv | markdown | json"),
        job: str | None = typer.Option(
            None, "--job", help="Only series of this Prometheus job (when the agent's data arrives twice)."
        ),
        timeout: float = typer.Option(10.0, "--timeout", help="HTTP timeout, seconds."),
        recorded: bool = typer.Option(
            False,
            "--recorded",
            help="Read the recording rules' model_hardware series (alerts/recording.rules.yml evaluated by the fleet "
            "storage's ruler), as the matrix dashboard does; --job does not apply.",
        ),
        prices: Path | None = typer.Option(
            None,
            "--prices",
            help="Price file (YAML, deploy/prices.example.yml): adds per cell the price per hour, the effective "
            "cost per million generated tokens, the hardware match (throughput / the model's best hardware type's) "
            "and a rank per model, cheapest first.",
        ),
    ) -> None:
        """TTFT P95 and generation tokens/s per model (rows) on each hardware type (columns).

        A hardware type is machine type / CPU model / GPU model, from inferwatch_node_info and the GPU
        metrics, joined on the instance label.
        """
        from inferwatch.agent.errors import ConfigError
        from inferwatch.agent.fleet.matrix import (
            MatrixError,
            PrometheusClient,
            data_span_s,
            fetch_matrix,
            rows,
            short_window,
            to_csv,
            to_json,
            to_markdown,
            validate_window,
        )
        from inferwatch.agent.fleet.prices import load_prices

        if fmt not in FORMATS:
            typer.echo(f"inferwatch: --format must be one of {', '.join(FORMATS)} (got {fmt!r})", err=True)
            raise typer.Exit(2)
        try:
            validate_window(window)
        except ValueError as exc:
            typer.echo(f"inferwatch: --window: {exc}", err=True)
            raise typer.Exit(2) from None
        if job is not None and ('"' in job or "\\" in job):
            typer.echo("inferwatch: --job must not contain quotes or backslashes", err=True)
            raise typer.Exit(2)
        price_table: PriceTable | None = None
        if prices is not None:
            try:
                price_table = load_prices(prices)
            except ConfigError as exc:
                typer.echo(f"inferwatch: --prices: {exc}", err=True)
                raise typer.Exit(2) from None
        client = PrometheusClient(prometheus, timeout_s=timeout)
        try:
            selector = f'job="{job}"' if job else ""
            m = fetch_matrix(client, window, selector=selector, recorded=recorded)
            try:  # only for the warning below: its failure does not fail the matrix
                span = data_span_s(client, window, selector) if window != "$__range" else None
            except MatrixError:
                span = None
        except MatrixError as exc:
            typer.echo(f"inferwatch: {exc}", err=True)
            raise typer.Exit(1) from None
        finally:
            client.close()
        shorter = short_window(window, span) if window != "$__range" else None
        if shorter is not None:
            typer.echo(
                f"inferwatch: warning: the data in {prometheus} goes back {span:.0f}s, less than --window {window}: "
                f"rates over the window read low; try --window {shorter}",
                err=True,
            )
        if not m.models:
            typer.echo(
                f"inferwatch: no model has TTFT or token data over the last {window} in {prometheus} "
                "(are the agent's engine collector and inferwatch_node_info scraped?)",
                err=True,
            )
            raise typer.Exit(1)
        if price_table is not None:
            _print_costs(m, price_table, fmt, window)
            return
        if fmt == "csv":
            typer.echo(to_csv(m), nl=False)
        elif fmt == "markdown":
            typer.echo(to_markdown(m), nl=False)
        elif fmt == "json":
            typer.echo(to_json(m))
        else:
            from rich.console import Console
            from rich.table import Table

            table = Table(title=f"TTFT P95 · generation tokens/s per node, last {window}", show_lines=True)
            table.add_column("model", no_wrap=True)
            for hw in m.hardware:
                parts = [hw.machine_type or "unknown machine", hw.cpu_model or "unknown CPU"]
                parts.append(hw.gpu_model if hw.gpu_model and hw.gpu_model != "none" else "no GPU")
                table.add_column("\n".join(parts), justify="right")
            for model, *cells in rows(m):
                pairs = zip(cells[::2], cells[1::2], strict=True)
                table.add_row(
                    model, *(f"{ttft}\n{tps} tok/s" if ttft != "–" or tps != "–" else "–" for ttft, tps in pairs)
                )
            Console(width=max(120, 40 + 34 * len(m.hardware))).print(table)


def _print_costs(m: Matrix, table: PriceTable, fmt: str, window: str) -> None:
    from inferwatch.agent.fleet.matrix import (
        cost_rows,
        cost_table_rows,
        cost_to_csv,
        cost_to_json,
        cost_to_markdown,
        unpriced,
    )

    if table.example:
        typer.echo("inferwatch: warning: the price file says example: true (placeholder prices, not yours)", err=True)
    missing = unpriced(m, table)
    if missing:
        typer.echo(f"inferwatch: warning: no price for machine type(s) {', '.join(missing)}", err=True)
    rows_ = cost_rows(m, table)
    if fmt == "csv":
        typer.echo(cost_to_csv(rows_), nl=False)
    elif fmt == "markdown":
        typer.echo(cost_to_markdown(rows_, table.currency), nl=False)
    elif fmt == "json":
        typer.echo(cost_to_json(m, rows_, table))
    else:
        from rich.console import Console
        from rich.table import Table

        from inferwatch.agent.fleet.matrix import COST_TABLE_HEADER

        out = Table(
            title=f"Effective cost per million generated tokens ({table.currency}), last {window}, cheapest first",
            caption="per MTok = price per hour / (generated tokens/s per node × 3600) × 1e6; "
            "hw match = tokens/s / the model's best hardware type's",
        )
        for i, name in enumerate(COST_TABLE_HEADER):
            out.add_column(name, justify="left" if i in (1, 2) else "right", no_wrap=i == 1)
        for r in cost_table_rows(rows_, table.currency):
            out.add_row(*r)
        Console(width=160).print(out)


def register_prices(app: typer.Typer) -> None:
    @app.command()
    def prices(
        file: Path = typer.Argument(..., help="Price file (YAML, deploy/prices.example.yml)."),
        rules: bool = typer.Option(
            False,
            "--rules",
            help="Print a Prometheus rule file with one constant series per machine type "
            "(machine_type:inferwatch_price_per_hour:config), to load beside alerts/*.rules.yml: the matrix "
            "dashboard's cost panels read it.",
        ),
    ) -> None:
        """Check a price file (price per hour per machine type); --rules writes it as recording rules."""
        from inferwatch.agent.errors import ConfigError
        from inferwatch.agent.fleet.prices import load_prices, price_rules

        try:
            table = load_prices(file)
        except ConfigError as exc:
            typer.echo(f"inferwatch: {exc}", err=True)
            raise typer.Exit(2) from None
        if table.example:
            typer.echo(f"inferwatch: warning: {file} says example: true (placeholder prices, not yours)", err=True)
        if rules:
            typer.echo(price_rules(table, str(file)), nl=False)
            return
        for name, price in sorted(table.per_hour.items()):
            typer.echo(f"{name}\t{price:g} {table.currency}/h")
