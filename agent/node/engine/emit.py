"""The instant samples of one engine reading: info, gauges, counters, engine signals, re-exported histograms.

Canonical names from the catalog: requests running and waiting, KV-cache usage, tokens, preemptions,
finished requests by reason, the engine signals (prefix cache, speculative decoding, KV transfer, LoRA),
the engine's TTFT, inter-token and end-to-end histograms re-exported as ``gen_ai.server.*`` (summed over
data-parallel ranks, with the engine's own bucket edges), and what the agent recognised of its schema.
"""

from __future__ import annotations

from inferwatch.agent import catalog
from inferwatch.agent.catalog import genai
from inferwatch.agent.catalog.engine import MODEL
from inferwatch.agent.common.precedence import step_aside
from inferwatch.agent.common.samples import AnySample, HistogramSample, Sample, attrs
from inferwatch.agent.node.engine.adapters import EngineReading, ModelReading
from inferwatch.agent.node.engine.histogram import sum_histograms

REEXPORTED = {
    "ttft": "gen_ai.server.time_to_first_token",
    "itl": "gen_ai.server.time_per_output_token",
    "e2e": "gen_ai.server.request.duration",
}
# Engine signals: histograms re-exported as they are, counters and gauges by name. Quantities outside
# QUANTITIES (kv_transfer) are re-exported only, not windowed into latency quantiles.
SIGNAL_HISTOGRAMS = {"kv_transfer": "inferwatch.engine.kv_transfer.duration"}
SIGNAL_COUNTERS = {  # adapter counter → (metric, attribute kept from the counter's dimension or fixed value)
    "prefix_queries": ("inferwatch.engine.prefix_cache.queries", ("cache", "local")),
    "prefix_hits": ("inferwatch.engine.prefix_cache.hits", ("cache", "local")),
    "external_prefix_queries": ("inferwatch.engine.prefix_cache.queries", ("cache", "external")),
    "external_prefix_hits": ("inferwatch.engine.prefix_cache.hits", ("cache", "external")),
    "cached_tokens": ("inferwatch.engine.tokens", ("type", "cached")),
    "prompt_by_source": ("inferwatch.engine.prompt_tokens.by_source", ("source", None)),
    "spec_drafts": ("inferwatch.engine.spec_decode.drafts", None),
    "spec_draft_tokens": ("inferwatch.engine.spec_decode.draft_tokens", None),
    "spec_accepted": ("inferwatch.engine.spec_decode.accepted_tokens", None),
    "spec_accepted_by_position": ("inferwatch.engine.spec_decode.accepted_by_position", ("position", None)),
    "kv_transfer_bytes": ("inferwatch.engine.kv_transfer.bytes", None),
    "kv_transfer_failures": ("inferwatch.engine.kv_transfer.failures", None),
}
SIGNAL_GAUGES = {
    "spec_acceptance": "inferwatch.engine.spec_decode.acceptance",
    "spec_acceptance_length": "inferwatch.engine.spec_decode.acceptance_length",
    "kv_transfer_latency": "inferwatch.engine.kv_transfer.latency",
}


def keep_sums(reading: EngineReading) -> None:
    """Replace each histogram's series by their sum (under no labels), once the windows and the hang detector have
    read them: the samples made from a reading need the sums only. At 200 models x 2 ranks the series' buckets are
    ~6 MB of (bound, count) tuples; let go here, the collection's samples are made in their place instead of beside
    them."""
    for m in reading.models.values():
        step_aside()  # per model: a request the API answers goes first (agent/common/precedence.py)
        for quantity, series in m.histograms.items():
            if len(series) > 1:
                total = sum_histograms(series.values())
                m.histograms[quantity] = {(): total} if total is not None else {}


def reading_samples(reading: EngineReading) -> list[AnySample]:
    """Instant samples of one reading: info, gauges, counters and re-exported cumulative histograms."""
    out: list[AnySample] = []
    for model, m in sorted(reading.models.items()):
        step_aside()
        out.extend(_model_samples(reading.kind, model, m))
    out.extend(schema_samples(reading))
    return out


def schema_samples(reading: EngineReading) -> list[AnySample]:
    """What the agent recognised of the engine's schema: the release range and schema (an info gauge), how many
    claimed quantities it maps or derives, and how many of the engine's own families it does not read."""
    r = reading.recognition
    e = attrs(engine=reading.kind)
    return [
        Sample(
            "inferwatch.engine.schema.info",
            1,
            attrs(engine=reading.kind, release_range=r.release_range, schema=r.schema),
        ),
        Sample("inferwatch.engine.quantities.recognised", reading.recognised(), e),
        Sample("inferwatch.engine.unmapped_families", r.unmapped_families, e),
    ]


def _model_samples(kind: str, model: str, m: ModelReading) -> list[AnySample]:
    a = attrs({MODEL: model})
    out: list[AnySample] = [Sample("inferwatch.engine.info", 1, attrs({MODEL: model}, engine=kind))]
    for gauge, name in (
        ("running", "inferwatch.engine.requests.running"),
        ("waiting", "inferwatch.engine.requests.waiting"),
        ("kv_usage", "inferwatch.engine.kv_cache.usage"),
    ):
        if gauge in m.gauges:
            out.append(Sample(name, m.gauges[gauge], a))
    for counter, typ in (("prompt_tokens", "prompt"), ("generation_tokens", "generation")):
        if counter in m.counters:
            total = sum(m.counters[counter].values())
            out.append(Sample("inferwatch.engine.tokens", total, attrs({MODEL: model}, type=typ)))
    if "preemptions" in m.counters:
        out.append(Sample("inferwatch.engine.preemptions", sum(m.counters["preemptions"].values()), a))
    for reason, v in sorted(m.counters.get("finished", {}).items()):
        out.append(Sample("inferwatch.engine.requests.finished", v, attrs({MODEL: model}, reason=reason or "unknown")))
    for quantity, name in (*REEXPORTED.items(), *SIGNAL_HISTOGRAMS.items()):
        series = m.histograms.get(quantity)
        h = sum_histograms(series.values()) if series else None
        if h is not None and h.sum == h.sum:  # skip when the engine gave no _sum (NaN)
            out.append(HistogramSample(name, h.buckets, h.sum, h.count, _histogram_attrs(kind, model, name)))
    out.extend(signal_samples(model, m))
    return out


def _histogram_attrs(kind: str, model: str, name: str) -> tuple[tuple[str, str], ...]:
    """A re-exported histogram's attributes: the GenAI semconv ones (agent/catalog/genai.py) for gen_ai.server.*,
    with the engine kind as provider and no operation or error type (the engine's histograms mix them all)."""
    keys = catalog.get(name).attributes
    values = {MODEL: model, genai.PROVIDER: kind}
    return attrs({k: values.get(k, "") for k in keys})


def signal_samples(model: str, m: ModelReading) -> list[AnySample]:
    """The engine signals of one model: counters, the engine's own gauges and the LoRA state."""
    out: list[AnySample] = []
    for counter, (name, attr) in SIGNAL_COUNTERS.items():
        dims = m.counters.get(counter)
        if not dims:
            continue
        if attr is None:
            out.append(Sample(name, sum(dims.values()), attrs({MODEL: model})))
        elif attr[1] is not None:
            out.append(Sample(name, sum(dims.values()), attrs({MODEL: model, attr[0]: attr[1]})))
        else:
            for dim, v in sorted(dims.items()):
                out.append(Sample(name, v, attrs({MODEL: model, attr[0]: dim or "unknown"})))
    for gauge, name in SIGNAL_GAUGES.items():
        if gauge in m.gauges:
            out.append(Sample(name, m.gauges[gauge], attrs({MODEL: model})))
    if m.lora is not None:
        lora = m.lora
        for state, names in (("running", lora.running), ("waiting", lora.waiting)):
            out.append(Sample("inferwatch.engine.lora.adapters", len(names), attrs({MODEL: model}, state=state)))
        out.append(Sample("inferwatch.engine.lora.max_adapters", lora.max_lora, attrs({MODEL: model})))
        out.append(Sample("inferwatch.engine.lora.blocked", lora.blocked_recent, attrs({MODEL: model})))
    return out
