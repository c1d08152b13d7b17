"""One-shot view of an exposition: detected engine, models, quantities present and absent, quantiles.

Quantiles come from the cumulative buckets summed over data-parallel ranks, or — with a baseline
exposition taken earlier from the same engine — from the per-series increase since the baseline
(reset-aware, as Prometheus's ``increase``). Seconds throughout; ``source`` is ``histogram``.
"""

from __future__ import annotations

import math
from typing import Any

from agent.catalog.engine import QUANTITIES
from agent.engine.adapters import ADAPTERS, EngineReading
from agent.engine.histogram import Histogram
from agent.engine.scrape import stats_from_histogram
from agent.engine.windows import HistogramWindow

INSPECT_QUANTITIES = tuple(q for q in QUANTITIES if q != "inference")  # inference = prefill + decode
_KEYS = {0.5: "p50", 0.9: "p90", 0.95: "p95", 0.99: "p99"}


def inspect(current: EngineReading, baseline: EngineReading | None = None) -> dict[str, Any]:
    """``{"engine", "models": {MODEL: {QUANTITY: {p50, p90, p95, p99, count, source}, "ttft_p99_p50_ratio"}},
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
            if stats is None:
                entry[quantity] = {**dict.fromkeys(_KEYS.values()), "count": 0.0, "source": "histogram"}
                continue
            entry[quantity] = {
                **{_KEYS[q]: v for q, v in stats.quantiles.items()},
                "count": stats.count,
                "source": stats.source,
            }
        ttft = entry.get("ttft")
        ratio = None
        if ttft and ttft["p50"] and ttft["p99"] is not None and ttft["p50"] > 0:
            ratio = ttft["p99"] / ttft["p50"]
        entry["ttft_p99_p50_ratio"] = ratio
        models[model] = entry
        absent[model] = missing
    return {"engine": current.kind, "models": models, "absent": absent}


def _zero(h: Histogram) -> Histogram:
    return Histogram(tuple((b, 0.0) for b, _ in h.buckets), 0.0, 0.0)


def expected_quantities(kind: str) -> tuple[str, ...]:
    """Timing quantities the engine's adapter can read at all."""
    return tuple(q for q in INSPECT_QUANTITIES if q in ADAPTERS[kind].histograms)
