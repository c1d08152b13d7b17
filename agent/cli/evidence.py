"""``inferwatch evidence list|show ID``: the evidence bundles the agent captured, in a terminal.

Read from this node's ring (``evidence.dir``), or with ``--agent URL`` from an agent's API (token with the
``evidence`` scope from ``--token-file`` or ``INFERWATCH_TOKEN``). Exit 0 shown, 1 no such bundle or the agent
refused, 2 usage error.
"""

from __future__ import annotations

import json
import time
from pathlib import Path
from typing import Any

import typer

from inferwatch.agent.cli.common import ConfigOpt, build_settings, read_token

AgentOpt = typer.Option(None, "--agent", help="Read from this agent's API (http://host:9435) instead of this node.")
TokenFileOpt = typer.Option(None, "--token-file", help="File holding a token with the evidence scope.")
API_TIMEOUT_S = 15.0


def _api(agent: str, path: str, token_file: Path | None) -> Any:
    import httpx  # here, not at the top: `inferwatch run` imports every command's module and needs no client

    token = read_token(token_file, "evidence")
    headers = {"Authorization": f"Bearer {token}"} if token else {}
    try:
        r = httpx.get(agent.rstrip("/") + path, headers=headers, timeout=API_TIMEOUT_S)
    except httpx.HTTPError as exc:
        typer.echo(f"inferwatch: cannot reach {agent}: {exc}", err=True)
        raise typer.Exit(1) from None
    if r.status_code != 200:
        typer.echo(f"inferwatch: {agent}{path}: HTTP {r.status_code}: {r.text[:200]}", err=True)
        raise typer.Exit(1)
    return r.json()


def register(app: typer.Typer) -> None:
    evidence_app = typer.Typer(help="Evidence bundles captured on a hang or a page.", no_args_is_help=True)

    @evidence_app.command("list")
    def list_cmd(
        agent: str | None = AgentOpt, token_file: Path | None = TokenFileOpt, config: Path | None = ConfigOpt
    ) -> None:
        """One line per bundle, newest first: id, time, trigger, summary."""
        if agent:
            rows = _api(agent, "/api/v1/evidence", token_file)["evidence"]
        else:
            from inferwatch.agent.node.wiring import build_deps

            store = build_deps(build_settings(config, None, None, []), persist_key=False).evidence
            rows = [m.as_dict() for m in store.list()]
        for m in rows:
            when = time.strftime("%Y-%m-%d %H:%M:%S", time.gmtime(m["captured_at"]))
            typer.echo(f"{m['id']}  {when}Z  {m['trigger']:5}  {m['summary']}")
        if not rows:
            typer.echo("no evidence bundles", err=True)

    @evidence_app.command("show")
    def show_cmd(
        bundle_id: str = typer.Argument(..., help="The bundle id (from `inferwatch evidence list`), or latest."),
        as_json: bool = typer.Option(False, "--json", help="Print the bundle's JSON."),
        agent: str | None = AgentOpt,
        token_file: Path | None = TokenFileOpt,
        config: Path | None = ConfigOpt,
    ) -> None:
        """The bundle: summary, processes and threads (state, wchan, kernel and Python stacks), scrapes, GPUs."""
        from inferwatch.agent.node.actions.evidencebundle import render_text

        if agent:
            bundle = _api(agent, f"/api/v1/evidence/{bundle_id}", token_file)
        else:
            from inferwatch.agent.node.wiring import build_deps

            store = build_deps(build_settings(config, None, None, []), persist_key=False).evidence
            bundle = store.latest() if bundle_id == "latest" else store.get(bundle_id)
        if bundle is None:
            typer.echo(f"inferwatch: no evidence bundle {bundle_id!r}", err=True)
            raise typer.Exit(1)
        typer.echo(json.dumps(bundle, indent=2, sort_keys=True) if as_json else render_text(bundle), nl=as_json)

    app.add_typer(evidence_app, name="evidence")
