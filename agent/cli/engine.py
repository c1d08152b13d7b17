"""``inferwatch engine inspect``: what the agent derives from one engine exposition.

Exit 0 on success, 1 when the exposition cannot be read or used (the message says why), 2 on usage.
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import typer

from inferwatch.agent.common.redact import redact_text
from inferwatch.agent.config import DEFAULT_ENGINE_MAX_BYTES, ENGINE_KIND_CHOICES
from inferwatch.agent.errors import CollectorError
from inferwatch.agent.node.engine.adapters import DEFAULT_MODEL, EngineReading
from inferwatch.agent.node.engine.fetch import fetch, read_file
from inferwatch.agent.node.engine.inspect import INSPECT_QUANTITIES, inspect
from inferwatch.agent.node.engine.scrape import EngineParser

DEFAULT_INSPECT_TIMEOUT_S = 5.0
KINDS = ENGINE_KIND_CHOICES  # "auto" and every adapter's kind


def register(app: typer.Typer) -> None:
    engine_app = typer.Typer(
        help="Inspect an inference engine's own /metrics.", no_args_is_help=True, rich_markup_mode=None
    )

    @engine_app.command("inspect")
    def inspect_cmd(
        metrics_url: str | None = typer.Option(None, "--metrics-url", help="Engine /metrics URL to fetch once."),
        metrics_file: Path | None = typer.Option(None, "--metrics-file", help="A saved exposition to read."),
        baseline: Path | None = typer.Option(
            None, "--baseline", help="An earlier exposition of the same engine: quantiles over the increase since it."
        ),
        kind: str = typer.Option("auto", "--kind", help=f"Engine kind ({', '.join(KINDS)}); default: detect."),
        model_name: str = typer.Option(DEFAULT_MODEL, "--model-name", help="Model name for unlabeled engines."),
        timeout_s: float = typer.Option(DEFAULT_INSPECT_TIMEOUT_S, "--timeout", help="Fetch timeout, seconds."),
        as_json: bool = typer.Option(False, "--json", help="Print the result as JSON (seconds)."),
    ) -> None:
        """Detected engine, models, quantities present and absent, P50/P90/P95/P99 per quantity (seconds)."""
        if (metrics_url is None) == (metrics_file is None):
            typer.echo("inferwatch: give exactly one of --metrics-url and --metrics-file", err=True)
            raise typer.Exit(2)
        if kind not in KINDS:
            typer.echo(f"inferwatch: --kind must be one of {', '.join(KINDS)}", err=True)
            raise typer.Exit(2)
        if timeout_s <= 0:
            typer.echo("inferwatch: --timeout must be > 0", err=True)
            raise typer.Exit(2)
        parser = EngineParser(kind, model_name)
        try:
            current = _load(parser, metrics_url, metrics_file, timeout_s)
            base = (
                EngineParser(kind, model_name).parse(read_file(baseline, DEFAULT_ENGINE_MAX_BYTES))
                if baseline
                else None
            )
            result = inspect(current, base)
        except (CollectorError, ValueError) as exc:
            typer.echo(redact_text(f"inferwatch: {exc}"), err=True)
            raise typer.Exit(1) from None
        if as_json:
            typer.echo(json.dumps(result, indent=2))
        else:
            _print(result, current, baseline is not None)

    app.add_typer(engine_app, name="engine")


def _load(parser: EngineParser, url: str | None, path: Path | None, timeout_s: float) -> EngineReading:
    if url is not None:
        from inferwatch.agent.common.httpclient import http_client  # httpx: only for a URL (not in `inferwatch run`)

        with http_client("engine") as client:
            return parser.parse(fetch(client, url, timeout_s, DEFAULT_ENGINE_MAX_BYTES))
    assert path is not None
    return parser.parse(read_file(path, DEFAULT_ENGINE_MAX_BYTES))


def _fmt(v: Any) -> str:
    if v is None:
        return "-"
    if isinstance(v, float):
        return f"{v:.4g}"
    return str(v)


def _count(v: Any) -> str:
    """A request count as the integer it is (68010, never 6.801e+04)."""
    return f"{round(v)}" if isinstance(v, (int, float)) and float(v).is_integer() else _fmt(v)


def _first_bound(reading_histograms: dict[Any, Any]) -> float | None:
    """The lowest finite upper bound of a quantity's histograms (its first bucket), seconds."""
    bounds = [b for h in reading_histograms.values() for b in h.bounds[:1] if b != float("inf")]
    return min(bounds) if bounds else None


def first_bucket_notes(result_model: dict[str, Any], histograms: dict[str, dict[Any, Any]]) -> list[str]:
    """One line per quantity whose P50 lies in its first bucket: the histogram cannot resolve below that bound,
    so the P50 is interpolated between 0 and it (vLLM's queue and prefill buckets start at 0.3 s)."""
    out = []
    for quantity in INSPECT_QUANTITIES:
        e = result_model.get(quantity)
        first = _first_bound(histograms.get(quantity, {}))
        if e is None or e.get("p50") is None or first is None or e["p50"] > first:
            continue
        out.append(
            f"  {quantity} P50 {_fmt(e['p50'])} s lies in the first bucket (le={first:g} s): the engine's histogram "
            f"does not resolve below {first:g} s, so it is interpolated, not measured"
        )
    return out


def _print(result: dict[str, Any], reading: EngineReading, delta: bool) -> None:
    from rich.console import Console
    from rich.table import Table

    console = Console(width=140)
    basis = "increase since the baseline" if delta else "cumulative buckets"
    console.print(f"engine: [bold]{result['engine']}[/]   quantiles from {basis} (seconds)")
    console.print(
        f"release: {result['release_range']}   schema: {result['schema']}   "
        f"unmapped families: {result['unmapped_families']}",
        soft_wrap=True,
        markup=False,
    )
    by_status: dict[str, list[str]] = {}
    for quantity, status in result["coverage"].items():
        by_status.setdefault(status, []).append(quantity)
    for status in ("mapped", "derived (mean only)", "not exposed"):
        console.print(f"  {status}: {', '.join(by_status.get(status, [])) or '-'}", soft_wrap=True, markup=False)
    for model, m in sorted(reading.models.items()):
        table = Table(title=f"model {model}")
        for col in ("quantity", "p50", "p90", "p95", "p99", "count", "source"):
            table.add_column(col)
        entry = result["models"].get(model, {})
        for quantity in INSPECT_QUANTITIES:
            e = entry.get(quantity)
            if e is None and quantity in entry.get("derived", {}):
                table.add_row(quantity, "mean only", "", "", "", "", "counters")
            elif e is None:
                table.add_row(quantity, "absent", "", "", "", "", "")
            else:
                quantiles = (_fmt(e[k]) for k in ("p50", "p90", "p95", "p99"))
                table.add_row(quantity, *quantiles, _count(e["count"]), _fmt(e["source"]))
        console.print(table)
        for note in first_bucket_notes(entry, m.histograms):
            console.print(note, soft_wrap=True)
        ratio = entry.get("ttft_p99_p50_ratio")
        others = ", ".join(f"{k}={_fmt(v)}" for k, v in sorted(m.gauges.items())) or "none"
        console.print(f"  TTFT P99/P50: {_fmt(ratio)}   gauges: {others}")
        for quantity, mean in entry.get("derived", {}).items():
            unit = "token" if quantity in ("prefill", "itl") and result["engine"] == "llamacpp" else "request"
            console.print(f"  {quantity} mean (from counters, no quantile): {_fmt(mean)} s per {unit}", markup=False)
