"""The hardware × model matrix: TTFT P95 and generation tokens/s per model on each hardware type.

Read from a Prometheus holding fleet data (the agent's series, scraped directly or through an
OpenTelemetry Collector). A *hardware type* is the tuple (machine type, CPU model, GPU model):

- ``inferwatch_node_info{machine_type, cpu_model}`` — machine type from DMI ``product_name`` (the instance
  type on AWS), CPU model from ``/proc/cpuinfo``;
- the GPU model from the ``hw_model`` label of ``hw_gpu_memory_limit_bytes`` (NVML), ``none`` on CPU-only
  nodes;

joined on ``instance`` (the agent's scrape target, one per node). The Grafana "Hardware × model matrix"
dashboard (dashboards/matrix.py) reads the same three numbers from alerts/recording.rules.yml's
``model_hardware`` records (``*_recorded``); ``fetch_matrix(recorded=True)`` (``inferwatch matrix --recorded``)
reads those too, and tests/test_matrix.py checks the two forms agree on the same data.

- TTFT P95: ``histogram_quantile(0.95, …)`` over the engine's TTFT buckets of every node of that hardware
  type, summed (a fleet-wide quantile, not an average of per-node quantiles);
- tokens/s: generation tokens per second per node, averaged over the nodes of that hardware type.
"""

from __future__ import annotations

import csv
import io
import json
import math
import re
from collections.abc import Mapping
from dataclasses import asdict, dataclass, replace

import httpx

from inferwatch.agent.common.httpclient import http_client
from inferwatch.agent.common.redact import redact_url
from inferwatch.agent.errors import InferwatchError
from inferwatch.agent.fleet.prices import PRICE_RECORD, PriceTable

DEFAULT_WINDOW = "1h"
DEFAULT_TIMEOUT_S = 10.0
MAX_RESPONSE_BYTES = 32 << 20
NO_GPU = "none"
HW_LABELS = ("machine_type", "cpu_model", "hw_model")
_HW = ", ".join(HW_LABELS)
_WINDOW = re.compile(r"^[0-9]+(ms|s|m|h|d|w|y)$|^\$__range$")


class MatrixError(InferwatchError):
    """Prometheus could not be queried or answered something that is not a query result."""


def _sel(*parts: str) -> str:
    inner = ", ".join(p for p in parts if p)
    return f"{{{inner}}}" if inner else ""


def hardware_info(selector: str = "") -> str:
    """One series per node, value 1, labels ``instance`` + (machine_type, cpu_model, hw_model)."""
    sel = _sel(selector)
    gpu = f"topk by (instance) (1, count by (instance, hw_model) (hw_gpu_memory_limit_bytes{sel}))"
    return (
        f"(max by (instance, machine_type, cpu_model, hw_model) (inferwatch_node_info{sel} "
        f"* on (instance) group_left (hw_model) (0 * {gpu} + 1)) "
        f"or on (instance) label_replace(max by (instance, machine_type, cpu_model) (inferwatch_node_info{sel}), "
        f'"hw_model", "{NO_GPU}", "", ""))'
    )


def ttft_p95_query(window: str, selector: str = "", model_selector: str = "") -> str:
    """TTFT P95 per (model, hardware type). ``selector`` applies to every series (e.g. a job filter)."""
    return (
        f"histogram_quantile(0.95, sum by (le, gen_ai_request_model, {_HW}) "
        f"(rate(gen_ai_server_time_to_first_token_seconds_bucket{_sel(selector, model_selector)}[{window}]) "
        f"* on (instance) group_left ({_HW}) {hardware_info(selector)}))"
    )


def tokens_query(window: str, selector: str = "", model_selector: str = "") -> str:
    """Generation tokens per second per node, averaged over the nodes of each (model, hardware type)."""
    sel = _sel('type="generation"', selector, model_selector)
    return (
        f"avg by (gen_ai_request_model, {_HW}) "
        f"(sum by (instance, gen_ai_request_model) (rate(inferwatch_engine_tokens_total{sel}[{window}])) "
        f"* on (instance) group_left ({_HW}) {hardware_info(selector)})"
    )


def nodes_query(window: str, selector: str = "", model_selector: str = "") -> str:
    """Nodes that served each model on each hardware type in the window."""
    sel = _sel(selector, model_selector)
    return (
        f"count by (gen_ai_request_model, {_HW}) (max by (instance, gen_ai_request_model) "
        f"(rate(gen_ai_server_time_to_first_token_seconds_count{sel}[{window}])) "
        f"* on (instance) group_left ({_HW}) {hardware_info(selector)})"
    )


# The data must cover this share of the window; less, and rate() over the window reads low (measured: 25 tok/s
# over a 1 h window holding 3 minutes of data, 302 with --window 5m).
WINDOW_COVERAGE_RATIO = 0.9
SPAN_POINTS = 500  # subquery resolution of the data-span query: window / this, at least 1 s
_UNIT_S = {"ms": 0.001, "s": 1, "m": 60, "h": 3600, "d": 86400, "w": 604800, "y": 31536000}


def window_seconds(window: str) -> float:
    """A Prometheus duration (``30m``, ``1h``) in seconds; raise ValueError for anything else."""
    m = re.fullmatch(r"([0-9]+)(ms|s|m|h|d|w|y)", window)
    if not m:
        raise ValueError(f"window {window!r} is not a Prometheus duration such as 30m, 1h or 1d")
    return int(m.group(1)) * _UNIT_S[m.group(2)]


def data_span_query(window: str, selector: str = "") -> str:
    """Seconds from the earliest TTFT-count or token sample within ``window`` to now (a subquery of
    ``timestamp()``; each step sees the latest sample at or before it, so the earliest is the data's start;
    data younger than one step: the latest samples' age)."""
    step = _span_step_s(window)
    sel = _sel('__name__=~"gen_ai_server_time_to_first_token_seconds_count|inferwatch_engine_tokens_total"', selector)
    # The subquery only sees data at its aligned steps: data younger than one step has none there, so the
    # latest samples' own timestamps stand in (the data is then at most a step old: still "shorter").
    return f"(time() - min(min_over_time(timestamp({sel})[{window}:{step}s]))) or (time() - min(timestamp({sel})))"


def _span_step_s(window: str) -> int:
    """The data-span subquery's step: the span it reports can be short by up to one step."""
    return max(1, round(window_seconds(window) / SPAN_POINTS))


def data_span_s(prom: PrometheusClient, window: str, selector: str = "") -> float | None:
    """How far back the matrix's data goes within ``window`` (None: no data)."""
    result = prom.query(data_span_query(window, selector))
    return _value(result[0]) if result else None


def short_window(window: str, span_s: float | None) -> str | None:
    """A window the data does cover, when ``window`` is longer than the data (else None).

    The span is read at the subquery's steps, so it can be short by one step (at a 5 s window, one step is a fifth of
    it: data that covered the window read as 4 s, seen on a loaded machine); that step counts as covered.
    """
    if span_s is None or span_s + _span_step_s(window) >= WINDOW_COVERAGE_RATIO * window_seconds(window):
        return None
    return f"{int(span_s // 60)}m" if span_s >= 120 else f"{max(int(span_s), 1)}s"


@dataclass(frozen=True, slots=True)
class Hardware:
    machine_type: str
    cpu_model: str
    gpu_model: str

    @property
    def label(self) -> str:
        parts = [self.machine_type or "unknown machine", self.cpu_model or "unknown CPU"]
        if self.gpu_model and self.gpu_model != NO_GPU:
            parts.append(self.gpu_model)
        return " / ".join(parts)


@dataclass(frozen=True, slots=True)
class Cell:
    """One model on one hardware type. ``None``: no data in the window."""

    ttft_p95_seconds: float | None
    tokens_per_second: float | None
    nodes: int


@dataclass(frozen=True, slots=True)
class Matrix:
    window: str
    models: tuple[str, ...]
    hardware: tuple[Hardware, ...]
    cells: Mapping[tuple[str, Hardware], Cell]

    def cell(self, model: str, hw: Hardware) -> Cell | None:
        return self.cells.get((model, hw))


def validate_window(window: str) -> str:
    if not _WINDOW.match(window):
        raise ValueError(f"window {window!r} is not a Prometheus duration such as 30m, 1h or 1d")
    return window


class PrometheusClient:
    """Instant queries against Prometheus's HTTP API (``GET /api/v1/query``)."""

    def __init__(self, url: str, timeout_s: float = DEFAULT_TIMEOUT_S, client: httpx.Client | None = None) -> None:
        self.url = url.rstrip("/")
        self.shown = redact_url(self.url)  # what messages say: never the URL's credentials
        self._client = client or http_client("prometheus", timeout=timeout_s, trust_env=True)

    def query(self, expr: str) -> list[dict[str, object]]:
        try:
            r = self._client.get(f"{self.shown}/api/v1/query", params={"query": expr})
        except httpx.HTTPError as exc:
            raise MatrixError(f"cannot reach Prometheus at {self.shown}: {exc}") from exc
        if len(r.content) > MAX_RESPONSE_BYTES:
            raise MatrixError(f"Prometheus answer is larger than {MAX_RESPONSE_BYTES} bytes")
        try:
            body = r.json()
        except ValueError:
            raise MatrixError(
                f"{self.shown} answered HTTP {r.status_code} with a body that is not JSON: is it a Prometheus?"
            ) from None
        if not isinstance(body, dict) or body.get("status") != "success":
            err = body.get("error") if isinstance(body, dict) else None
            raise MatrixError(f"Prometheus rejected the query (HTTP {r.status_code}): {err or body!r}")
        data = body.get("data")
        if not isinstance(data, dict) or data.get("resultType") != "vector" or not isinstance(data.get("result"), list):
            raise MatrixError(f"unexpected answer from {self.shown}: not an instant vector")
        return [x for x in data["result"] if isinstance(x, dict)]

    def close(self) -> None:
        self._client.close()


def _value(item: dict[str, object]) -> float | None:
    v = item.get("value")
    if not isinstance(v, list) or len(v) != 2:
        return None
    try:
        f = float(v[1])
    except (TypeError, ValueError):
        return None
    return None if math.isnan(f) or math.isinf(f) else f


def _key(item: dict[str, object]) -> tuple[str, Hardware] | None:
    m = item.get("metric")
    if not isinstance(m, dict) or "gen_ai_request_model" not in m:
        return None
    hw = Hardware(str(m.get("machine_type", "")), str(m.get("cpu_model", "")), str(m.get("hw_model", NO_GPU)))
    return str(m["gen_ai_request_model"]), hw


# The same three numbers from alerts/recording.rules.yml's model_hardware records (5 m rates pre-aggregated per
# model and hardware type by Prometheus or vmalert): what the matrix dashboard reads, so a refresh at 1,000 nodes
# reads one series per cell and bucket instead of every node's (docs/scaling.md). Over a window the recorded 5 m
# rates are averaged (quantile of the averaged bucket rates, as over raw buckets); no job filter (the records
# are fleet-wide: they keep no job label).
RECORDED_TTFT_BUCKETS = "model_hardware_le:gen_ai_server_time_to_first_token_seconds_bucket:rate5m"
RECORDED_TOKENS = "model_hardware:inferwatch_engine_generation_tokens_per_node:rate5m"
RECORDED_NODES = "model_hardware:inferwatch_nodes_serving:count5m"


def ttft_p95_recorded(window: str, model_selector: str = "") -> str:
    return (
        f"histogram_quantile(0.95, sum by (le, gen_ai_request_model, {_HW}) "
        f"(avg_over_time({RECORDED_TTFT_BUCKETS}{_sel(model_selector)}[{window}])))"
    )


def tokens_recorded(window: str, model_selector: str = "") -> str:
    return f"avg_over_time({RECORDED_TOKENS}{_sel(model_selector)}[{window}])"


def nodes_recorded(window: str, model_selector: str = "") -> str:
    return f"max_over_time({RECORDED_NODES}{_sel(model_selector)}[{window}])"


# The effective cost and hardware match in PromQL, for the dashboard: the recorded tokens/s per node over the
# window joined on machine_type with the price rules ``inferwatch prices FILE --rules`` writes (agent/fleet/prices.py).
def price_per_hour_query() -> str:
    return f"max by (machine_type) ({PRICE_RECORD})"


def cost_per_mtok_recorded(window: str, model_selector: str = "") -> str:
    """Price per hour / (generated tokens/s per node × 3600) × 1e6 per (model, hardware type); cells without a
    price or without generated tokens have no value."""
    return (
        f"{TOKENS_PER_MTOK} / {SECONDS_PER_HOUR} * ({price_per_hour_query()} * on (machine_type) group_right () "
        f"(1 / ({tokens_recorded(window, model_selector)} > 0)))"
    )


def hardware_match_recorded(window: str, model_selector: str = "") -> str:
    """Tokens/s per node of a cell / the best cell's for the same model (1 = the model's best hardware type)."""
    tokens = tokens_recorded(window, model_selector)
    return f"{tokens} / on (gen_ai_request_model) group_left () max by (gen_ai_request_model) ({tokens})"


def fetch_matrix(
    prom: PrometheusClient,
    window: str = DEFAULT_WINDOW,
    selector: str = "",
    model_selector: str = "",
    recorded: bool = False,
) -> Matrix:
    """Run the three matrix queries and assemble the cells (``recorded``: from the recording rules' series,
    which ignore ``selector``)."""
    window = validate_window(window)
    if recorded:
        queries = (
            ttft_p95_recorded(window, model_selector),
            tokens_recorded(window, model_selector),
            nodes_recorded(window, model_selector),
        )
    else:
        queries = (
            ttft_p95_query(window, selector, model_selector),
            tokens_query(window, selector, model_selector),
            nodes_query(window, selector, model_selector),
        )
    ttft: dict[tuple[str, Hardware], float | None] = {}
    tps: dict[tuple[str, Hardware], float | None] = {}
    nodes: dict[tuple[str, Hardware], int] = {}
    for item in prom.query(queries[0]):
        k = _key(item)
        if k:
            ttft[k] = _value(item)
    for item in prom.query(queries[1]):
        k = _key(item)
        if k:
            tps[k] = _value(item)
    for item in prom.query(queries[2]):
        k = _key(item)
        v = _value(item)
        if k and v is not None:
            nodes[k] = int(v)
    keys = set(ttft) | set(tps)
    cells = {k: Cell(ttft.get(k), tps.get(k), nodes.get(k, 0)) for k in keys}
    models = tuple(sorted({m for m, _ in keys}))
    hardware = tuple(sorted({h for _, h in keys}, key=lambda h: (h.machine_type, h.cpu_model, h.gpu_model)))
    return Matrix(window, models, hardware, cells)


def _fmt_s(v: float | None) -> str:
    if v is None:
        return "–"
    return f"{v * 1000:.0f} ms" if v < 1 else f"{v:.2f} s"


def _fmt_tps(v: float | None) -> str:
    return "–" if v is None else f"{v:.1f}"


def header(m: Matrix) -> list[str]:
    cols = ["model"]
    for hw in m.hardware:
        cols += [f"{hw.label} TTFT P95", f"{hw.label} tok/s"]
    return cols


def rows(m: Matrix) -> list[list[str]]:
    out = []
    for model in m.models:
        row = [model]
        for hw in m.hardware:
            c = m.cell(model, hw)
            row += [_fmt_s(c.ttft_p95_seconds if c else None), _fmt_tps(c.tokens_per_second if c else None)]
        out.append(row)
    return out


def to_csv(m: Matrix) -> str:
    """Long form, one line per (model, hardware): raw numbers for spreadsheets."""
    buf = io.StringIO()
    w = csv.writer(buf, lineterminator="\n")
    w.writerow(["model", "machine_type", "cpu_model", "gpu_model", "nodes", "ttft_p95_seconds", "tokens_per_second"])
    for model in m.models:
        for hw in m.hardware:
            c = m.cell(model, hw)
            if c is None:
                continue
            w.writerow(
                [
                    model,
                    hw.machine_type,
                    hw.cpu_model,
                    hw.gpu_model,
                    c.nodes,
                    "" if c.ttft_p95_seconds is None else f"{c.ttft_p95_seconds:.6g}",
                    "" if c.tokens_per_second is None else f"{c.tokens_per_second:.6g}",
                ]
            )
    return buf.getvalue()


def _md_cell(s: str) -> str:
    return s.replace("|", "\\|")


def to_markdown(m: Matrix) -> str:
    head = header(m)
    lines = [
        "| " + " | ".join(_md_cell(h) for h in head) + " |",
        "|" + "|".join(["---"] + ["---:"] * (len(head) - 1)) + "|",
    ]
    lines += ["| " + " | ".join(_md_cell(c) for c in r) + " |" for r in rows(m)]
    return "\n".join(lines) + "\n"


def to_json(m: Matrix) -> str:
    return json.dumps(
        {
            "window": m.window,
            "models": list(m.models),
            "hardware": [asdict(h) | {"label": h.label} for h in m.hardware],
            "cells": [
                {"model": model, "hardware": asdict(hw), **asdict(c)}
                for model in m.models
                for hw in m.hardware
                if (c := m.cell(model, hw)) is not None
            ],
        },
        indent=2,
    )


# --- effective cost -------------------------------------------------------------------------------------------
# A cheaper machine can cost more per token when the model runs badly on it. Per cell, from the measured
# generation throughput per node (tokens_per_second) and the price per hour of one machine of the type:
#   cost per MTok = price per hour / (tokens per second × 3600) × 1e6
#   hardware match = tokens per second / the best hardware type's tokens per second for that model (1 = best)
# and a rank per model by cost (1 = cheapest per generated token). Throughput depends on load as much as on
# hardware: compare cells under similar load (the dashboard and docs/matrix.md say so too).
SECONDS_PER_HOUR = 3600
TOKENS_PER_MTOK = 1_000_000


@dataclass(frozen=True, slots=True)
class CostRow:
    """One (model, hardware) cell with its effective cost. ``None``: no price for the machine type, or no
    throughput measured."""

    model: str
    hardware: Hardware
    nodes: int
    tokens_per_second: float | None
    ttft_p95_seconds: float | None
    price_per_hour: float | None
    cost_per_mtok: float | None
    hardware_match: float | None
    rank: int | None


def cost_per_mtok(price_per_hour: float, tokens_per_second: float) -> float | None:
    """Price of a million generated tokens at this throughput (None when nothing was generated)."""
    if tokens_per_second <= 0:
        return None
    return price_per_hour / (tokens_per_second * SECONDS_PER_HOUR) * TOKENS_PER_MTOK


def cost_rows(m: Matrix, prices: PriceTable) -> list[CostRow]:
    """Every cell of ``m`` with price, effective cost per MTok, hardware match and rank; per model, ranked
    cells first (cheapest first), then cells without a cost."""
    out: list[CostRow] = []
    for model in m.models:
        cells = [(hw, c) for hw in m.hardware if (c := m.cell(model, hw)) is not None]
        best = max((c.tokens_per_second or 0.0 for _, c in cells), default=0.0)
        rows_: list[CostRow] = []
        for hw, c in cells:
            tps = c.tokens_per_second
            price = prices.price(hw.machine_type)
            cost = cost_per_mtok(price, tps) if price is not None and tps is not None else None
            match = tps / best if tps is not None and best > 0 else None
            rows_.append(CostRow(model, hw, c.nodes, tps, c.ttft_p95_seconds, price, cost, match, None))
        ranked = sorted((r for r in rows_ if r.cost_per_mtok is not None), key=lambda r: r.cost_per_mtok or 0.0)
        out += [replace(r, rank=i) for i, r in enumerate(ranked, 1)]
        out += sorted(
            (r for r in rows_ if r.cost_per_mtok is None), key=lambda r: (r.hardware.machine_type, r.hardware.label)
        )
    return out


def unpriced(m: Matrix, prices: PriceTable) -> list[str]:
    """Machine types in the matrix that the price table does not price."""
    return sorted({hw.machine_type for hw in m.hardware if prices.price(hw.machine_type) is None})


def _num(v: float | None, fmt: str) -> str:
    return "" if v is None else format(v, fmt)


COST_HEADER = [
    "rank",
    "model",
    "machine_type",
    "cpu_model",
    "gpu_model",
    "nodes",
    "tokens_per_second",
    "hardware_match",
    "price_per_hour",
    "cost_per_mtok",
    "ttft_p95_seconds",
]


def cost_to_csv(rows_: list[CostRow]) -> str:
    buf = io.StringIO()
    w = csv.writer(buf, lineterminator="\n")
    w.writerow(COST_HEADER)
    for r in rows_:
        w.writerow(
            [
                "" if r.rank is None else r.rank,
                r.model,
                r.hardware.machine_type,
                r.hardware.cpu_model,
                r.hardware.gpu_model,
                r.nodes,
                _num(r.tokens_per_second, ".6g"),
                _num(r.hardware_match, ".4f"),
                _num(r.price_per_hour, ".6g"),
                _num(r.cost_per_mtok, ".6g"),
                _num(r.ttft_p95_seconds, ".6g"),
            ]
        )
    return buf.getvalue()


def cost_to_json(m: Matrix, rows_: list[CostRow], prices: PriceTable) -> str:
    return json.dumps(
        {
            "window": m.window,
            "currency": prices.currency,
            "example_prices": prices.example,
            "unpriced_machine_types": unpriced(m, prices),
            "cells": [asdict(r) | {"hardware": asdict(r.hardware) | {"label": r.hardware.label}} for r in rows_],
        },
        indent=2,
    )


def cost_table_rows(rows_: list[CostRow], currency: str) -> list[list[str]]:
    """Human-readable cells, in COST_HEADER's order less cpu/gpu (the hardware label carries them)."""
    return [
        [
            "–" if r.rank is None else str(r.rank),
            r.model,
            r.hardware.label,
            str(r.nodes),
            _fmt_tps(r.tokens_per_second),
            "–" if r.hardware_match is None else f"{r.hardware_match:.0%}",
            "–" if r.price_per_hour is None else f"{r.price_per_hour:.4g} {currency}/h",
            "–" if r.cost_per_mtok is None else f"{r.cost_per_mtok:.4g} {currency}",
            _fmt_s(r.ttft_p95_seconds),
        ]
        for r in rows_
    ]


COST_TABLE_HEADER = [
    "rank",
    "model",
    "hardware",
    "nodes",
    "tok/s per node",
    "hw match",
    "price",
    "per MTok",
    "TTFT P95",
]


def cost_to_markdown(rows_: list[CostRow], currency: str) -> str:
    lines = [
        "| " + " | ".join(COST_TABLE_HEADER) + " |",
        "|" + "|".join(["---:", "---", "---"] + ["---:"] * (len(COST_TABLE_HEADER) - 3)) + "|",
    ]
    lines += ["| " + " | ".join(_md_cell(c) for c in r) + " |" for r in cost_table_rows(rows_, currency)]
    return "\n".join(lines) + "\n"
