"""``inferwatch explain --model M --window 5m [--json]``: why a model's latency tail is slow, from an agent's API.

Reads ``/api/v1/explain`` of the agent (``--agent``, default http://127.0.0.1:9435; a token with the ``read`` scope
from ``--token-file`` or ``INFERWATCH_TOKEN`` when the API needs one) and prints the verdict for TTFT and e2e, the
decomposition of the tail by phase, the attribute that separates the tail and the slowest requests with their trace
ids (docs/explain.md). Exit 0 shown, 1 the agent refused or has nothing for the model, 2 usage error.
"""

from __future__ import annotations

import json
from pathlib import Path
from urllib.parse import urlencode

import typer

from inferwatch.agent.cli.common import read_token
from inferwatch.agent.node.analytics.explain import DEFAULT_TOP, MAX_TOP, QUANTITIES, parse_window
from inferwatch.agent.node.analytics.explaintext import render_text

DEFAULT_AGENT = "http://127.0.0.1:9435"
API_TIMEOUT_S = 15.0


def register(app: typer.Typer) -> None:
    @app.command()
    def explain(
        model: str = typer.Option(None, "--model", help="The model (gen_ai.request.model); optional with one model."),
        target: str = typer.Option(None, "--target", help="A discovered engine target's name: explain that engine."),
        window: str = typer.Option("5m", "--window", help="How far back: 30s .. 5m."),
        top: int = typer.Option(DEFAULT_TOP, "--top", help=f"How many of the slowest requests to list (0..{MAX_TOP})."),
        by: str = typer.Option("ttft", "--by", help="Rank the slowest requests by ttft or e2e."),
        as_json: bool = typer.Option(False, "--json", help="Print the agent's JSON answer."),
        agent: str = typer.Option(DEFAULT_AGENT, "--agent", help="The agent's API (http://host:9435)."),
        token_file: Path | None = typer.Option(None, "--token-file", help="File holding a token (read scope)."),
    ) -> None:
        """Why the latency tail is slow: the phase that drives P99 - P50, who is in the tail, the slowest requests."""
        try:
            parse_window(window)
            if not 0 <= top <= MAX_TOP:
                raise ValueError(f"--top must be 0..{MAX_TOP}")
            if by not in QUANTITIES:
                raise ValueError(f"--by must be one of {', '.join(QUANTITIES)}")
        except ValueError as exc:
            typer.echo(f"inferwatch explain: {exc}", err=True)
            raise typer.Exit(2) from None
        token = read_token(token_file, "explain")
        headers = {"Authorization": f"Bearer {token}"} if token else {}
        params = {"window": window, "top": str(top), "by": by} | ({"model": model} if model else {})
        params |= {"target": target} if target else {}
        url = f"{agent.rstrip('/')}/api/v1/explain?{urlencode(params)}"
        import httpx  # here, not at the top: `inferwatch run` imports every command's module and needs no client

        try:
            r = httpx.get(url, headers=headers, timeout=API_TIMEOUT_S)
        except httpx.HTTPError as exc:
            typer.echo(f"inferwatch explain: cannot reach {agent}: {exc}", err=True)
            raise typer.Exit(1) from None
        if r.status_code != 200:
            try:
                message = r.json().get("message", r.text)
            except ValueError:
                message = r.text
            typer.echo(f"inferwatch explain: HTTP {r.status_code}: {str(message)[:300]}", err=True)
            raise typer.Exit(1)
        report = r.json()
        typer.echo(json.dumps(report, indent=2) if as_json else render_text(report), nl=as_json)
