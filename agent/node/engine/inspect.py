"""One-shot view of an exposition: detected engine, release range and schema, models, quantities present and
absent, quantiles, and the means a release without histograms allows.

Quantiles come from the cumulative buckets summed over data-parallel ranks, or — with a baseline
exposition taken earlier from the same engine — from the per-series increase since the baseline
(reset-aware, as Prometheus's ``increase``). Seconds throughout; ``source`` is ``histogram``.
A quantity *derived (mean only)* (llama.cpp's and Triton's cumulative seconds counters) has a mean:
total seconds over total tokens or requests since the engine started, or over the increase since the
baseline. Gauges and counters (summed over data-parallel ranks and dimensions) are given as read.
"""

from __future__ import annotations

import math
from typing import Any

from inferwatch.agent.catalog.engine import QUANTITIES
from inferwatch.agent.catalog.engine_schemas import DERIVED, DERIVED_MEANS
from inferwatch.agent.node.engine.adapters import ADAPTERS, EngineReading, ModelReading, quantity_status
from inferwatch.agent.node.engine.histogram import Histogram
from inferwatch.agent.node.engine.scrape import stats_from_histogram
from inferwatch.agent.node.engine.windows import HistogramWindow

INSPECT_QUANTITIES = tuple(q for q in QUANTITIES if q != "inference")  # inference = prefill + decode
_KEYS = {0.5: "p50", 0.9: "p90", 0.95: "p95", 0.99: "p99"}


def inspect(current: EngineReading, baseline: EngineReading | None = None) -> dict[str, Any]:
    """``{"engine", "release_range", "schema", "unmapped_families", "coverage": {QUANTITY: status},
    "models": {MODEL: {QUANTITY: {p50, p90, p95, p99, count, sum, source}, "ttft_p99_p50_ratio", "values": {NAME: v},
    "derived": {QUANTITY: mean}, "lora": {running, waiting, max_lora, blocked} (vLLM with LoRA only)}},
    "absent": {MODEL: [QUANTITY, ...]}}``."""
    if baseline is not None and baseline.kind != current.kind:
        raise ValueError(f"baseline is a {baseline.kind} exposition, the current one a {current.kind} exposition")
    models: dict[str, Any] = {}
    absent: dict[str, list[str]] = {}
    for model, m in sorted(current.models.items()):
        entry: dict[str, Any] = {}
        missing = []
        for quantity in INSPECT_QUANTITIES:
            series = m.histograms.get(quantity)
            if series is None:
                missing.append(quantity)
                continue
            window = HistogramWindow(horizon_s=math.inf)
            if baseline is not None:
                before = baseline.models.get(model)
                known = before.histograms.get(quantity, {}) if before else {}
                # A rank (or model) the baseline did not have started after it: all of it is increase.
                zero = {k: _zero(h) for k, h in series.items() if k not in known}
                window.update(0.0, {**known, **zero})
                window.update(1.0, series)
                hist = window.window(math.inf)
            else:
                window.update(0.0, series)
                hist = window.current()
            stats = stats_from_histogram(hist)
            if stats is None or hist is None:
                entry[quantity] = {**dict.fromkeys(_KEYS.values()), "count": 0.0, "sum": None, "source": "histogram"}
                continue
            entry[quantity] = {
                **{_KEYS[q]: v for q, v in stats.quantiles.items()},
                "count": stats.count,
                "sum": hist.sum if hist.sum == hist.sum else None,  # NaN: the engine gave no _sum
                "source": stats.source,
            }
        ttft = entry.get("ttft")
        ratio = None
        if ttft and ttft["p50"] and ttft["p99"] is not None and ttft["p50"] > 0:
            ratio = ttft["p99"] / ttft["p50"]
        entry["ttft_p99_p50_ratio"] = ratio
        entry["values"] = _values(m)
        before = baseline.models.get(model) if baseline is not None else None
        entry["derived"] = {q: _mean(m, before, q) for q in DERIVED_MEANS if quantity_status(m, q) == DERIVED}
        if m.lora is not None:  # vLLM's lora_requests_info, its newest label set: adapter counts, not names
            lora = m.lora
            entry["lora"] = {
                "running": len(lora.running),
                "waiting": len(lora.waiting),
                "max_lora": lora.max_lora,
                "blocked": lora.blocked,
            }
        models[model] = entry
        absent[model] = missing
    r = current.recognition
    return {
        "engine": current.kind,
        "release_range": r.release_range,
        "schema": r.schema,
        "unmapped_families": r.unmapped_families,
        "coverage": current.coverage(),
        "models": models,
        "absent": absent,
    }


def _values(m: ModelReading) -> dict[str, float]:
    """The model's gauges and counters as read (counters summed over ranks and dimensions)."""
    out = dict(m.gauges)
    out.update((name, sum(dims.values())) for name, dims in m.counters.items())
    return dict(sorted(out.items()))


def _mean(m: ModelReading, before: ModelReading | None, quantity: str) -> float | None:
    """Seconds per token or request: the DERIVED_MEANS quotient of the counters, over their increase since the
    baseline when there is one (a counter lower than its baseline restarted: all of it is increase)."""
    seconds, count = DERIVED_MEANS[quantity]
    totals = []
    for name in (seconds, count):
        now = sum(m.counters[name].values())
        then = sum(before.counters.get(name, {}).values()) if before is not None else 0.0
        totals.append(now - then if now >= then else now)
    return totals[0] / totals[1] if totals[1] > 0 else None


def _zero(h: Histogram) -> Histogram:
    return Histogram(tuple((b, 0.0) for b, _ in h.buckets), 0.0, 0.0)


def expected_quantities(kind: str) -> tuple[str, ...]:
    """Timing quantities the engine's adapter can read at all."""
    return tuple(q for q in INSPECT_QUANTITIES if q in ADAPTERS[kind].histograms)
