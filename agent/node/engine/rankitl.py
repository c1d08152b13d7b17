"""Per data-parallel rank, the engine's cumulative inter-token latency (sum and count of its ITL histogram).

vLLM v1 labels every series of a data-parallel engine with its rank (``engine="0"``, ``engine="1"``; SGLang
``dp_rank``). The engine collector sums its histograms over ranks for everything it exports; this keeps, before
that sum, each rank's ITL sum (seconds) and observation count, so the tail explainer can tell a slow rank from
stock vLLM spans (which carry no rank): a rank's mean ITL over a window is its sum's increase over its count's
(``EngineCounters`` in :mod:`inferwatch.agent.node.analytics.tailcauses`). Handed over in the engine collection's
``details["rank_itl"]``, not exported as a metric.
"""

from __future__ import annotations

from inferwatch.agent.node.engine.adapters import RANK_LABELS, EngineReading

ITL = "itl"  # the canonical quantity of vLLM's inter_token_latency_seconds (time_per_output_token_seconds before)


def rank_itl(reading: EngineReading) -> dict[str, dict[str, list[float]]]:
    """``model -> rank -> [ITL sum in seconds, ITL count]``, cumulative, for the models with at least two ranks.

    Read from the per-series histograms, so before :func:`~inferwatch.agent.node.engine.emit.keep_sums`. A series
    without a rank label is rank ``"0"`` (as the hang detector reads ranks)."""
    out: dict[str, dict[str, list[float]]] = {}
    for model, m in reading.models.items():
        series = m.histograms.get(ITL)
        if not series or len(series) < 2:
            continue
        ranks: dict[str, list[float]] = {}
        for labels, hist in series.items():
            rank = next((v for k, v in labels if k in RANK_LABELS), "0")
            cell = ranks.setdefault(rank, [0.0, 0.0])
            cell[0] += hist.sum
            cell[1] += hist.count
        if len(ranks) >= 2:
            out[model] = ranks
    return out
