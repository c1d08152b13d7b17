"""``inferwatch demo``: simulator + load generator + agent on localhost until Ctrl-C."""

from __future__ import annotations

from pathlib import Path

import typer


def register(app: typer.Typer) -> None:
    @app.command()
    def demo(
        sim_port: int = typer.Option(8000, "--sim-port", help="Simulator port (a free one if taken)."),
        agent_port: int = typer.Option(9435, "--agent-port", help="Agent port (a free one if taken)."),
        otlp_port: int = typer.Option(4317, "--otlp-port", help="Agent's OTLP gRPC receiver port."),
        otlp_http_port: int = typer.Option(4318, "--otlp-http-port", help="Agent's OTLP HTTP receiver port."),
        hardware: str = typer.Option("h100", "--hardware", help="Simulated hardware profile."),
        model: str = typer.Option("meta-llama/Llama-3.1-8B-Instruct", "--model", help="Simulated model."),
        engines: int = typer.Option(2, "--engines", help="Data-parallel engines."),
        rate: float = typer.Option(5.0, "--rate", help="Load, requests/s (Poisson)."),
        protocol: str = typer.Option("chat", "--protocol", help="chat, completions or messages."),
        scenario: list[str] = typer.Option(None, "--scenario", help="Start with this fault scenario (repeatable)."),
        seed: int = typer.Option(0, "--seed", help="Seed of the simulator and the load."),
        duration: float | None = typer.Option(
            None, "--duration", help="Stop after this many seconds (default: Ctrl-C)."
        ),
        log_dir: Path | None = typer.Option(
            None, "--log-dir", help="Where the children's logs go (default: a temp dir)."
        ),
    ) -> None:
        """Start the simulator, the load generator and the agent; print where to look; stop all on Ctrl-C."""
        from inferwatch.simulator.demo import Demo, DemoConfig
        from inferwatch.simulator.profiles import PROFILES
        from inferwatch.simulator.scenarios import ScenarioError, parse

        # The children would each refuse a bad value in their own log (the load generator over and over, as the
        # demo restarts it): refuse it here, in one line, before anything starts.
        try:
            if hardware not in PROFILES:
                raise ValueError(f"unknown --hardware {hardware!r} (known: {', '.join(PROFILES)})")
            if not rate > 0 or engines < 1:
                raise ValueError("--rate must be > 0 and --engines >= 1")
            if protocol not in ("chat", "completions", "messages"):
                raise ValueError("--protocol must be one of chat, completions, messages")
            for spec in scenario or ():
                parse(spec)
        except (ScenarioError, ValueError) as exc:
            typer.echo(f"inferwatch demo: {exc}", err=True)
            raise typer.Exit(2) from None
        if log_dir is not None:
            try:
                log_dir.mkdir(parents=True, exist_ok=True)
            except OSError as exc:
                typer.echo(f"inferwatch demo: cannot use --log-dir {log_dir}: {exc.strerror or exc}", err=True)
                raise typer.Exit(2) from None
        config = DemoConfig(
            sim_port=sim_port, agent_port=agent_port, otlp_grpc_port=otlp_port, otlp_http_port=otlp_http_port,
            hardware=hardware, model=model, engines=engines, rate=rate, protocol=protocol,
            scenarios=tuple(scenario or ()), seed=seed, duration_s=duration, log_dir=log_dir,
        )  # fmt: skip
        code = Demo(config, Path(__file__).resolve().parents[2], echo=lambda m: typer.echo(m, err=False)).run()
        raise typer.Exit(code)
