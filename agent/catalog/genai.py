"""GenAI model-server metrics, as the OpenTelemetry GenAI semantic conventions define them.

Matched against semantic-conventions v1.41.1 (commit ead83b9b0fa36540c1642fce46e874f002ac23f1, the last release
of open-telemetry/semantic-conventions that holds the GenAI conventions before they moved to
open-telemetry/semantic-conventions-genai): ``model/gen-ai/metrics.yaml`` (name, instrument, unit, attributes)
and ``docs/gen-ai/gen-ai-metrics.md`` (the ExplicitBucketBoundaries advice); excerpts in
``tests/fixtures/semconv-genai/``. All three are histograms in seconds with the required ``gen_ai.operation.name``
and ``gen_ai.provider.name`` and the conditionally required ``gen_ai.request.model``; only
``gen_ai.server.request.duration`` carries ``error.type`` (empty, i.e. no Prometheus label, for a request that
succeeded); time to first token and time per output token are recorded for successful responses only.

From spans (``receiver.emit_histograms``) they have exactly the conventions' buckets (TTFT optionally extended past
10 s by ``receiver.ttft_extra_buckets_s``) and are exported over OTLP too. The engine collector re-exports the
engine's own histograms under the same names with the engine's own bucket edges, ``gen_ai.provider.name`` set
to the engine kind and no operation (the engine's histograms mix every operation): Prometheus only.
"""

from inferwatch.agent.catalog.spec import Kind, MetricSpec

SEMCONV_VERSION = "1.41.1"
SEMCONV_SCHEMA_URL = f"https://opentelemetry.io/schemas/{SEMCONV_VERSION}"
OPERATION = "gen_ai.operation.name"
PROVIDER = "gen_ai.provider.name"
MODEL = "gen_ai.request.model"
ERROR_TYPE = "error.type"
ERROR_OTHER = "_OTHER"  # the conventions' fallback error.type value

TTFT = "gen_ai.server.time_to_first_token"
TPOT = "gen_ai.server.time_per_output_token"
DURATION = "gen_ai.server.request.duration"

# docs/gen-ai/gen-ai-metrics.md: "This metric SHOULD be specified with [ExplicitBucketBoundaries] of ..."
SEMCONV_TTFT_BUCKETS_S = (0.001, 0.005, 0.01, 0.02, 0.04, 0.06, 0.08, 0.1, 0.25, 0.5, 0.75, 1.0, 2.5, 5.0, 7.5, 10.0)
SEMCONV_TPOT_BUCKETS_S = (0.01, 0.025, 0.05, 0.075, 0.1, 0.15, 0.2, 0.3, 0.4, 0.5, 0.75, 1.0, 2.5)
SEMCONV_DURATION_BUCKETS_S = (
    0.01,
    0.02,
    0.04,
    0.08,
    0.16,
    0.32,
    0.64,
    1.28,
    2.56,
    5.12,
    10.24,
    20.48,
    40.96,
    81.92,
)

_ATTRS = (OPERATION, PROVIDER, MODEL)

METRICS = (
    MetricSpec(
        TTFT,
        Kind.HISTOGRAM,
        "s",
        "Time to generate the first token for successful responses, from request arrival (GenAI semconv). From the "
        "engine collector: the engine's buckets summed over data-parallel ranks.",
        _ATTRS,
        SEMCONV_TTFT_BUCKETS_S,
    ),
    MetricSpec(
        TPOT,
        Kind.HISTOGRAM,
        "s",
        "Time per output token after the first, for successful responses (GenAI semconv: per request, "
        "(duration - TTFT) / (output tokens - 1)). From the engine collector: the engine's per-token ITL histogram.",
        _ATTRS,
        SEMCONV_TPOT_BUCKETS_S,
    ),
    MetricSpec(
        DURATION,
        Kind.HISTOGRAM,
        "s",
        "Request duration to the last output token (GenAI semconv); error.type names the failure, empty on success.",
        (*_ATTRS, ERROR_TYPE),
        SEMCONV_DURATION_BUCKETS_S,
    ),
)


def ttft_buckets(extra_s: tuple[float, ...] = ()) -> tuple[float, ...]:
    """The TTFT bucket edges: the conventions' advice, then ``extra_s`` (each above 10 s, increasing)."""
    return SEMCONV_TTFT_BUCKETS_S + tuple(extra_s)


def buckets(name: str, ttft_extra_s: tuple[float, ...] = ()) -> tuple[float, ...]:
    """The bucket edges the agent uses for one of the three metrics."""
    if name == TTFT:
        return ttft_buckets(ttft_extra_s)
    return {TPOT: SEMCONV_TPOT_BUCKETS_S, DURATION: SEMCONV_DURATION_BUCKETS_S}[name]
