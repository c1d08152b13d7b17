"""``inferwatch top``: the status page's per-model view, live in a terminal (rich), for an SSH session.

Reads the agent's ``/api/v1/overview`` (the data the status page at ``/`` draws; token with the ``read`` scope from
``--token-file`` or ``INFERWATCH_TOKEN``) every ``--interval`` seconds and redraws: findings that need attention,
then one row per model (TTFT and ITL P50/P95/P99, tail ratio, goodput, the TTFT histogram as a bar of block
characters with its modes named, KV-cache, running/waiting, preemptions), then the collectors. ``q`` or Ctrl-C
quits; ``--once`` prints one frame and exits (exit 1 when the agent cannot be read).
"""

from __future__ import annotations

import contextlib
import select
import sys
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import typer

DEFAULT_AGENT_URL = "http://127.0.0.1:9435"
DEFAULT_INTERVAL_S = 2.0
BLOCKS = " ▁▂▃▄▅▆▇█"
STATUS_STYLE = {"fail": "bold white on red", "warn": "bold black on yellow", "ok": "green", "skip": "dim"}
STATUS_WORD = {"fail": "✖ FAIL", "warn": "▲ WARN", "ok": "✔ OK", "skip": "– SKIP"}


def fetch_overview(url: str, token: str) -> dict[str, Any]:
    """The agent's overview; raises ``RuntimeError`` with a one-line reason."""
    import httpx

    headers = {"Authorization": f"Bearer {token}"} if token else {}
    try:
        r = httpx.get(url.rstrip("/") + "/api/v1/overview", headers=headers, timeout=5.0)
    except httpx.HTTPError as exc:
        raise RuntimeError(f"cannot reach the agent at {url}: {exc}") from None
    if r.status_code in (401, 403):
        raise RuntimeError(f"the agent refused the request ({r.status_code}): give a read token (--token-file)")
    if r.status_code != 200:
        raise RuntimeError(f"the agent answered {r.status_code} for /api/v1/overview")
    data: dict[str, Any] = r.json()
    return data


def spark(counts: list[float]) -> str:
    """The histogram's non-empty span (first to last bucket with requests) as block characters."""
    nonzero = [i for i, c in enumerate(counts) if c > 0]
    if not nonzero:
        return ""
    top = max(counts) or 1.0
    out = []
    for i in range(nonzero[0], nonzero[-1] + 1):
        c = counts[i]
        level = 0 if c <= 0 else max(1, round(c / top * (len(BLOCKS) - 1)))
        out.append(BLOCKS[level])
    return "".join(out)


def render(ov: dict[str, Any], url: str) -> Any:
    """One frame (a rich renderable) for an overview."""
    from rich.console import Group
    from rich.table import Table
    from rich.text import Text

    from inferwatch.agent.node.api.display import fmt_seconds

    n = ov["node"]
    urgent = [f for f in ov["findings"] if f["status"] in ("fail", "warn")]
    failing = sum(f["status"] == "fail" for f in urgent)
    head = Text.assemble(
        (f"{n['host_name'] or 'node'}", "bold"),
        f" · {n['machine_type'] or 'unknown machine'} · {n['cpu_model'] or 'unknown CPU'} · kernel {n['kernel']} · ",
        (
            f"{failing} failing, {len(urgent) - failing} warning",
            "bold",
        ),
        f" · {url} · {time.strftime('%H:%M:%S', time.localtime(ov['generated_at']))} · q quits",
    )
    findings = Table(title="Findings", title_justify="left", expand=True, show_edge=False)
    findings.add_column("state", no_wrap=True)
    findings.add_column("finding")
    findings.add_column("runbook", no_wrap=True)
    for f in urgent:
        findings.add_row(
            Text(STATUS_WORD.get(f["status"], f["status"]), style=STATUS_STYLE.get(f["status"], "")),
            f["summary"],
            f["runbook"] or "—",
        )
    if not urgent:
        findings.add_row(Text("✔ OK", style="green"), "nothing needs attention", "")
    blocks: list[Any] = []
    engines = ov.get("engines", [])
    if engines:  # one row per engine the agent watches: the configured one and each discovered target
        table = Table(title="Engines", title_justify="left", expand=True, show_edge=False)
        for column in ("engine", "namespace/pod/container", "kind", "up", "models", "note"):
            table.add_column(column, no_wrap=column != "note")
        for e in engines:
            where = "/".join(x for x in (e["namespace"], e["pod"], e["container"]) if x) or "—"
            up = (
                Text("—")
                if e["up"] is None
                else Text("up", style="green")
                if e["up"] == 1
                else Text("down", style="bold red")
            )
            note = e["last_error"] or e["hint"] or ""
            table.add_row(e["name"], where, e["kind"] or "—", up, ", ".join(e["models"]) or "—", note)
        blocks.append(table)
    blocks.append(Text("Models", style="bold italic"))
    for m in ov["models"]:
        lat = []
        for q in ("ttft", "itl"):
            cur = m["latency"].get(q)
            src = f" ({cur['source']}, 1m)" if cur else ""
            lat.append(" / ".join(fmt_seconds(cur[k]) for k in ("p50", "p95", "p99")) + src if cur else "—")
        h = m["ttft_histogram"]
        good = h["goodput"]["ratio"] if h else None
        if h:
            modes = h["modes"]
            words = f"{len(modes)} modes" if len(modes) > 1 else "1 mode" if modes else "no mode"
            hist = Text(spark(h["counts"]) + "  ", style="bold red" if len(modes) > 1 else "")
            hist.append(words + ": " + " & ".join(x["range"] for x in modes) if modes else words)
        else:
            hist = Text("—")
        ratio = m["tail_ratio"].get("ttft")
        kv = m["kv_cache_usage_ratio"]
        grid = Table.grid(padding=(0, 2))
        for _ in range(4):
            grid.add_column()
        grid.add_row("TTFT p50/p95/p99", lat[0], "p99/p50 (5m)", "—" if ratio is None else f"{ratio:.2f}")
        grid.add_row("ITL p50/p95/p99", lat[1], "goodput", "—" if good is None else f"{good:.1%}")
        grid.add_row(
            "TTFT histogram",
            hist,
            "KV · run/wait",
            f"{'—' if kv is None else f'{kv:.0%}'} · {m['requests_running'] or 0:g}/{m['requests_waiting'] or 0:g}",
        )
        engine = f" ({m['engine']})" if m["engine"] else ""
        blocks += [Text(m["model"] + engine, style="bold"), grid]
    if not ov["models"]:
        blocks.append(Text("no engine model seen yet"))
    bad = [c for c in ov["collectors"] if c["state"] == "failed"]
    a = ov["agent"]
    tail = Text(
        f"collectors: {len(ov['collectors'])}, failing: {', '.join(c['name'] for c in bad) or 'none'} · "
        f"agent CPU {a['cpu_seconds']:.1f} s ({a['cpu_core_share']:.2%} of a core), peak RSS "
        f"{a['peak_rss_bytes'] / (1 << 20):.0f} MiB"
    )
    return Group(head, findings, *blocks, tail)


@contextlib.contextmanager
def _keys() -> Iterator[Any]:
    """A function that returns the key pressed since the last call ('' if none); cbreak mode on a terminal."""
    if not sys.stdin.isatty():
        yield lambda: ""
        return
    import termios
    import tty

    fd = sys.stdin.fileno()
    old = termios.tcgetattr(fd)
    tty.setcbreak(fd)
    try:
        yield lambda: sys.stdin.read(1) if select.select([sys.stdin], [], [], 0)[0] else ""
    finally:
        termios.tcsetattr(fd, termios.TCSADRAIN, old)


def register(app: typer.Typer) -> None:
    @app.command()
    def top(
        agent: str = typer.Option(DEFAULT_AGENT_URL, "--agent", help="The agent's base URL."),
        token_file: Path | None = typer.Option(None, "--token-file", help="File holding a token with the read scope."),
        interval: float = typer.Option(DEFAULT_INTERVAL_S, "--interval", min=0.2, help="Seconds between redraws."),
        once: bool = typer.Option(False, "--once", help="Print one frame and exit."),
    ) -> None:
        """Live per-model view of an agent (the status page in the terminal); q or Ctrl-C quits."""
        from rich.console import Console
        from rich.live import Live

        from inferwatch.agent.cli.common import read_token

        token = read_token(token_file, "top")
        console = Console()
        if once:
            try:
                console.print(render(fetch_overview(agent, token), agent))
            except RuntimeError as exc:
                typer.echo(f"inferwatch top: {exc}", err=True)
                raise typer.Exit(1) from None
            return
        with contextlib.suppress(KeyboardInterrupt), _keys() as key, Live(console=console, screen=True) as live:
            while True:
                try:
                    live.update(render(fetch_overview(agent, token), agent))
                except RuntimeError as exc:
                    live.update(f"inferwatch top: {exc} (retrying every {interval:g} s; q quits)")
                deadline = time.monotonic() + interval
                while time.monotonic() < deadline:
                    if key() in ("q", "Q"):
                        return
                    time.sleep(0.05)
