"""``inferwatch matrix``: the hardware × model matrix from a Prometheus holding fleet data (agent/matrix.py)."""

from __future__ import annotations

import typer

FORMATS = ("table", "csv", "markdown", "json")


def register(app: typer.Typer) -> None:
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
    ) -> None:
        """TTFT P95 and generation tokens/s per model (rows) on each hardware type (columns).

        A hardware type is machine type / CPU model / GPU model, from inferwatch_node_info and the GPU
        metrics, joined on the instance label.
        """
        from agent.matrix import (
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
