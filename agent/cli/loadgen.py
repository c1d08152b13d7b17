"""``inferwatch loadgen``: open-loop Poisson load against an OpenAI/Anthropic-compatible server."""

from __future__ import annotations

import asyncio
import json
import signal
import sys
from collections.abc import Callable
from typing import Any

import typer


def register(app: typer.Typer) -> None:
    @app.command()
    def loadgen(
        url: str = typer.Option("http://127.0.0.1:8000", "--url", help="Base URL of the server."),
        model: str | None = typer.Option(None, "--model", help="Model name (default: the server's first)."),
        protocol: str = typer.Option("chat", "--protocol", help="chat, completions or messages."),
        rate: float = typer.Option(10.0, "--rate", help="Target arrival rate, requests/s (Poisson)."),
        count: int | None = typer.Option(None, "--count", help="Stop after this many requests."),
        duration: float | None = typer.Option(None, "--duration", help="Stop launching after this many seconds."),
        prompt_tokens: str = typer.Option(
            "128", "--prompt-tokens", help="N, uniform:LO:HI, normal:MEAN:SD, lognormal:MEDIAN:SIGMA"
        ),
        output_tokens: str = typer.Option("32", "--output-tokens", help="Same forms as --prompt-tokens."),
        shared_prefix: int = typer.Option(0, "--shared-prefix-tokens", help="System prompt shared by all requests."),
        seed: int = typer.Option(0, "--seed", help="Seed of arrivals and lengths."),
        timeout: float = typer.Option(60.0, "--timeout", help="Per-request timeout, seconds."),
        max_in_flight: int = typer.Option(2000, "--max-in-flight", help="Arrivals beyond this are dropped, counted."),
        max_error_ratio: float | None = typer.Option(
            None,
            "--max-error-ratio",
            min=0.0,
            max=1.0,
            help="Exit 1 when more than this share of the requests failed (default: only when all of them did).",
        ),
        otlp_traces_endpoint: str | None = typer.Option(
            None,
            "--otlp-traces-endpoint",
            help="Report each request's client TTFT as an OTLP client span here (http://HOST:4318/v1/traces or "
            "HOST:4317), its context sent as traceparent so the engine span is its child.",
        ),
        as_json: bool = typer.Option(False, "--json", help="Print only the summary as JSON."),
        progress: bool | None = typer.Option(
            None, "--progress/--no-progress", help="Live progress (default: on a TTY)."
        ),
    ) -> None:
        """Send open-loop streaming load and print client-side TTFT/ITL/e2e percentiles.

        Bounded by --count or --duration (default --count 100). Exit 0 when the load ran, 1 when every request
        failed (nothing measured: wrong URL, model or protocol, a server down) or more than --max-error-ratio of
        them did, 2 on a usage error, 130 when interrupted. The summary is printed either way.
        """
        from rich.console import Console
        from rich.live import Live

        from inferwatch.simulator.loadgen import (
            Dist,
            LoadSpec,
            Progress,
            load_failed,
            run_load,
            summary_line,
            summary_table,
        )

        try:
            spec = LoadSpec(
                url=url.rstrip("/"),
                model=model,
                protocol=protocol,
                rate=rate,
                count=count if count is not None or duration is not None else 100,
                duration_s=duration,
                prompt_tokens=Dist.parse(prompt_tokens),
                output_tokens=Dist.parse(output_tokens),
                shared_prefix_tokens=shared_prefix,
                seed=seed,
                timeout_s=timeout,
                max_in_flight=max_in_flight,
                otlp_traces_endpoint=otlp_traces_endpoint,
            )
        except ValueError as exc:
            typer.echo(f"inferwatch loadgen: {exc}", err=True)
            raise typer.Exit(2) from None
        console = Console(stderr=as_json)
        show = progress if progress is not None else (console.is_terminal and not as_json)

        async def main(update: Callable[[Progress], None] | None) -> dict[str, Any]:
            stop = asyncio.Event()
            loop = asyncio.get_running_loop()
            for sig in (signal.SIGINT, signal.SIGTERM):
                loop.add_signal_handler(sig, stop.set)
            return await run_load(spec, update, stop)

        try:
            if show:
                with Live(console=console, refresh_per_second=4) as live:

                    def update(p: Progress) -> None:
                        live.update(
                            f"[bold]loadgen[/] {p.elapsed_s:6.1f}s  started {p.started}  finished {p.finished}  "
                            f"in flight {p.in_flight}  errors {p.errors}  dropped {p.dropped}"
                        )

                    summary = asyncio.run(main(update))
            else:
                summary = asyncio.run(main(None))
        except KeyboardInterrupt:
            raise typer.Exit(130) from None
        if as_json:
            sys.stdout.write(json.dumps(summary, indent=2) + "\n")
        else:
            console.print(summary_table(summary))
            console.print(summary_line(summary), soft_wrap=True)
        failed = load_failed(summary, max_error_ratio)
        if failed:
            typer.echo(f"inferwatch loadgen: {failed}", err=True)
            raise typer.Exit(1)
