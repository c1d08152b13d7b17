"""``inferwatch probe``: one synthetic streamed request; print timings and every violation's schema path.

Exit 0 clean, 1 the stream or request had problems, 2 usage error.
"""

from __future__ import annotations

import json

import typer


def register(app: typer.Typer) -> None:
    @app.command()
    def probe(
        url: str = typer.Option(
            ..., "--url", help="Runtime base URL (or the full /v1/chat/completions or /v1/messages URL)."
        ),
        protocol: str = typer.Option("openai", "--protocol", help="openai (chat/completions) or anthropic (messages)."),
        model: str | None = typer.Option(None, "--model", help="Model to request (default: first of GET /v1/models)."),
        prompt: str = typer.Option("Say OK.", "--prompt", help="Prompt of the synthetic request."),
        max_tokens: int = typer.Option(8, "--max-tokens", min=1, max=256, help="max_tokens of the request."),
        timeout: float = typer.Option(10.0, "--timeout", min=0.1, max=300, help="Overall timeout, seconds."),
        as_json: bool = typer.Option(False, "--json", help="Print the result as JSON."),
    ) -> None:
        """Run the streaming probe once against URL and print what it saw."""
        from inferwatch.agent.node.probe.client import PROTOCOLS, run_probe

        if protocol not in PROTOCOLS:
            typer.echo(f"inferwatch: --protocol must be one of {', '.join(PROTOCOLS)}", err=True)
            raise typer.Exit(2)
        if not url.startswith(("http://", "https://")):
            typer.echo("inferwatch: --url must be an http:// or https:// URL", err=True)
            raise typer.Exit(2)
        result = run_probe(url, protocol, model=model, prompt=prompt, max_tokens=max_tokens, timeout_s=timeout)
        if as_json:
            typer.echo(json.dumps(result.as_dict(), indent=2))
        else:
            _print(result)
        raise typer.Exit(0 if result.ok else 1)


def _fmt(v: float | None) -> str:
    return "-" if v is None else f"{v * 1000:.1f} ms"


def _print(result: object) -> None:
    from inferwatch.agent.node.probe.client import ProbeResult

    assert isinstance(result, ProbeResult)
    r = result
    typer.echo(f"probe {r.protocol} {r.url}")
    typer.echo(f"  status      {r.status_code if r.status_code is not None else '-'}")
    typer.echo(f"  ttft        {_fmt(r.ttft_s)}")
    typer.echo(f"  itl (mean)  {_fmt(r.itl_s)}")
    typer.echo(f"  total       {_fmt(r.duration_s)}")
    typer.echo(f"  events      {r.events} ({r.text_events} with text)")
    if r.error_type:
        typer.echo(f"  error       {r.error_type}: {r.error_message}")
    elif r.error_message:
        typer.echo(f"  note        {r.error_message}")
    counts = r.violation_counts()
    typer.echo("  violations  " + (", ".join(f"{k}={n}" for k, n in sorted(counts.items())) or "none"))
    for v in r.violations:
        where = f" event {v.event_index}" if v.event_index is not None else ""
        typer.echo(f"    - {v.kind}{where}: {v.message}")
        if v.schema_path:
            typer.echo(f"      schema path: {v.schema_path}  instance: {v.instance_path}")
    typer.echo("  result      " + ("OK" if r.ok else "FAILED"))
