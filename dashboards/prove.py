"""Prove dashboards against a real Prometheus: every panel query runs and returns data.

Template variables are resolved as Grafana resolves them: each ``label_values(...)`` variable query is run
through Prometheus's HTTP API in dashboard order (so ``$job`` is known before ``$engine`` ...), "All" and
multi-value selections become ``(a|b|c)`` with regex metacharacters escaped, single values are escaped
the same way, and the macros ``$__rate_interval``, ``$__interval`` and ``$__range`` are replaced by the
durations given. Then every target of every panel is run as a range query (or an instant query where
the target is instant) and counted as failed when Prometheus errors or the result is empty.

``python -m inferwatch.dashboards.prove --prometheus URL`` does this against any Prometheus (e.g. production).
"""

from __future__ import annotations

import argparse
import re
import sys
import time
from collections.abc import Iterator, Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import httpx
import promql_parser

from inferwatch.dashboards import JSON_DIR, load_all

_LABEL_VALUES = re.compile(r"^\s*label_values\(\s*(?:(?P<expr>.+?)\s*,\s*)?(?P<label>[a-zA-Z_][a-zA-Z0-9_]*)\s*\)\s*$")
_VAR = re.compile(r"\$(?:\{([a-zA-Z_][a-zA-Z0-9_]*)\}|([a-zA-Z_][a-zA-Z0-9_]*))")
_REGEX_SPECIAL = re.compile(r"([\\^$*+?.()|{}\[\]])")
MACROS_FOR_LINT = {"__rate_interval": "1m", "__interval": "30s", "__range": "1h"}


@dataclass(frozen=True, slots=True)
class PanelQuery:
    dashboard: str  # uid
    panel: str  # title
    ref_id: str
    expr: str
    instant: bool


@dataclass(frozen=True, slots=True)
class Outcome:
    query: PanelQuery
    resolved: str
    series: int
    error: str = ""

    @property
    def ok(self) -> bool:
        return not self.error and self.series > 0


def panels(dashboard: Mapping[str, Any]) -> Iterator[dict[str, Any]]:
    """Every non-row panel, including those nested in collapsed rows."""
    for p in dashboard.get("panels", []):
        if p.get("type") == "row":
            yield from p.get("panels", [])
        else:
            yield p


def panel_queries(dashboard: Mapping[str, Any]) -> list[PanelQuery]:
    out = []
    for p in panels(dashboard):
        for t in p.get("targets", []):
            out.append(
                PanelQuery(str(dashboard["uid"]), str(p["title"]), str(t["refId"]), t["expr"], bool(t.get("instant")))
            )
    return out


def variable_queries(dashboard: Mapping[str, Any]) -> list[dict[str, Any]]:
    return [v for v in dashboard.get("templating", {}).get("list", []) if v.get("type") == "query"]


def parse_label_values(query: str) -> tuple[str | None, str]:
    """``label_values(expr, label)`` → (expr, label); ``label_values(label)`` → (None, label)."""
    m = _LABEL_VALUES.match(query)
    if not m:
        raise ValueError(f"unsupported variable query {query!r} (only label_values(...) is used)")
    return m.group("expr"), m.group("label")


def format_values(values: list[str]) -> str:
    """Grafana's Prometheus interpolation of a variable: regex-escaped, several values as (a|b)."""
    escaped = [_REGEX_SPECIAL.sub(r"\\\\\1", v) for v in values]
    if len(escaped) == 1:
        return escaped[0]
    return "(" + "|".join(escaped) + ")"


def interpolate(expr: str, values: Mapping[str, str]) -> str:
    def sub(m: re.Match[str]) -> str:
        name = m.group(1) or m.group(2)
        if name not in values:
            raise KeyError(f"variable ${name} is not defined")
        return values[name]

    return _VAR.sub(sub, expr)


def series_names(expr: str) -> set[str]:
    """Metric names an expression selects (macros replaced by fixed durations so it parses)."""
    ast = promql_parser.parse(interpolate(expr, _lint_values(expr)))
    names: set[str] = set()

    def visit(node: object) -> None:
        if isinstance(node, promql_parser.VectorSelector):
            name = node.name
            if not name:
                for m in node.matchers.matchers:
                    if m.name == "__name__":
                        name = m.value
            names.add(name or "")

    promql_parser.walk(ast, pre_visit=visit)
    return names


def _lint_values(expr: str) -> dict[str, str]:
    values = dict(MACROS_FOR_LINT)
    for m in _VAR.finditer(expr):
        values.setdefault(m.group(1) or m.group(2), "x")
    return values


class Prover:
    """Resolve variables and run panel queries against one Prometheus."""

    def __init__(self, url: str, rate_interval: str = "1m", range_: str = "15m", timeout_s: float = 15.0) -> None:
        self.url = url.rstrip("/")
        self.client = httpx.Client(timeout=timeout_s)
        self.rate_interval = rate_interval
        self.range = range_
        self.range_s = promql_parser.parse_duration(range_).total_seconds()

    def close(self) -> None:
        self.client.close()

    def _get(self, path: str, params: Mapping[str, Any]) -> Any:
        r = self.client.get(self.url + path, params=params)
        body = r.json()
        if body.get("status") != "success":
            raise RuntimeError(f"{body.get('errorType')}: {body.get('error')}")
        return body["data"]

    def resolve_variables(self, dashboard: Mapping[str, Any]) -> dict[str, str]:
        end = time.time()
        values = {
            "__rate_interval": self.rate_interval,
            "__interval": self.rate_interval,
            "__range": self.range,
            "datasource": "prometheus",
        }
        for var in variable_queries(dashboard):
            expr, label = parse_label_values(var["query"])
            if expr is None:
                found = self._get(f"/api/v1/label/{label}/values", {"start": end - self.range_s, "end": end})
            else:
                series = self._get(
                    "/api/v1/series", {"match[]": interpolate(expr, values), "start": end - self.range_s, "end": end}
                )
                found = sorted({s[label] for s in series if label in s})
            if not found:
                raise LookupError(f"variable ${var['name']} ({var['query']}) has no values")
            chosen = found if var.get("includeAll") or var.get("multi") else found[:1]
            values[var["name"]] = format_values(chosen)
        return values

    def run(self, q: PanelQuery, values: Mapping[str, str]) -> Outcome:
        resolved = interpolate(q.expr, values)
        end = time.time()
        try:
            if q.instant:
                data = self._get("/api/v1/query", {"query": resolved, "time": end})
            else:
                step = max(1.0, self.range_s / 60)
                data = self._get(
                    "/api/v1/query_range",
                    {"query": resolved, "start": end - self.range_s, "end": end, "step": step},
                )
        except (RuntimeError, httpx.HTTPError, ValueError) as exc:
            return Outcome(q, resolved, 0, str(exc))
        return Outcome(q, resolved, len(data.get("result", [])))

    def prove(self, dashboard: Mapping[str, Any]) -> list[Outcome]:
        try:
            values = self.resolve_variables(dashboard)
        except (LookupError, RuntimeError, httpx.HTTPError, ValueError) as exc:
            return [Outcome(q, q.expr, 0, f"variables: {exc}") for q in panel_queries(dashboard)]
        return [self.run(q, values) for q in panel_queries(dashboard)]


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description="Run every dashboard panel query against a Prometheus.")
    ap.add_argument("--prometheus", required=True, help="Prometheus base URL, e.g. http://127.0.0.1:9090")
    ap.add_argument("--dir", type=Path, default=JSON_DIR)
    ap.add_argument("--rate-interval", default="1m")
    ap.add_argument("--range", default="15m")
    args = ap.parse_args(argv)
    prover = Prover(args.prometheus, args.rate_interval, args.range)
    failed = 0
    try:
        for uid, dash in load_all(args.dir).items():
            for o in prover.prove(dash):
                status = "ok" if o.ok else "FAIL"
                detail = o.error or f"{o.series} series"
                print(f"{status:4} {uid} / {o.query.panel} [{o.query.ref_id}]: {detail}")
                failed += not o.ok
    finally:
        prover.close()
    print(f"{failed} failing queries", file=sys.stderr)
    return 1 if failed else 0


if __name__ == "__main__":
    raise SystemExit(main())
