"""Engine timing and state, normalised across vLLM, SGLang, TGI, llama.cpp and TensorRT-LLM.

Per-model metrics carry the OpenTelemetry attribute ``gen_ai.request.model`` (Prometheus label
``gen_ai_request_model``) — one name for the model everywhere, so rules and panels can join them.
Quantities: ttft, itl, e2e, queue, prefill, decode, inference. Windows: 1m, 5m. ``source`` says where
a value comes from: ``histogram`` (interpolated from the engine's cumulative buckets, as
``histogram_quantile`` does) or ``spans`` (per-request samples from OTLP spans, in a DDSketch).
A quantity an engine does not expose is absent, never zero.
"""

from inferwatch.agent.catalog import engine_schemas
from inferwatch.agent.catalog.genai import SEMCONV_TPOT_BUCKETS_S, SEMCONV_TTFT_BUCKETS_S
from inferwatch.agent.catalog.spec import Kind, MetricSpec

MODEL = "gen_ai.request.model"
# Which engine a series or finding came from when the agent watches several (agent/node/discovery/): the target's name
# and, on Kubernetes, the ENGINE's namespace, pod and container (never the agent's). Attributes every series of a
# discovered target carries beside its catalog attributes, as a resource's do; each with the Prometheus label it is
# exported under (the ones kube-prometheus-stack users filter on). The single configured engine (engine.metrics_url)
# carries none of them, so its series are as they always were.
TARGET_ATTRIBUTES: dict[str, str] = {
    "inferwatch.engine.name": "engine_name",
    "k8s.namespace.name": "namespace",
    "k8s.pod.name": "pod",
    "k8s.container.name": "container",
}
# Span-derived latency split by prompt length, so the conformance band compares like with like. The bands are
# the tail explainer's (inferwatch.agent.node.analytics.tailrecords.PROMPT_BANDS, one definition;
# tests/test_prompt_band_histograms.py checks that these names are its names): four values, so 4 series sets per model
# and metric. A request whose span has no prompt token count is left out. PROMPT_BAND_ALL is the value the conformance
# rules give the unsplit (engine) histograms, never emitted by the agent.
PROMPT_BAND = "prompt_band"
PROMPT_BAND_NAMES = "<=1k, 1k-4k, 4k-16k, >16k prompt tokens"
PROMPT_BAND_ALL = "all"
# Values of the ``quantity`` attribute: the request phases whose latency the agent reports.
QUANTITIES = ("ttft", "itl", "e2e", "queue", "prefill", "decode", "inference")
# Engine histograms read for re-export only (not windowed into latency quantiles): the P/D KV-transfer time, as
# ``inferwatch.engine.kv_transfer.duration``.
REEXPORTED_ONLY = ("kv_transfer",)
# Goodput targets: a request is "good" when its TTFT and its time per output token (decode time /
# (output tokens - 1)) are both within target. Bucket edges of vLLM's TTFT and ITL histograms, so the recording
# rules of alerts/engine-signals.rules.yml bound the same figure from histograms (tests/test_engine_signals.py
# checks that the rules use these values).
GOODPUT_TTFT_TARGET_S = 0.5
GOODPUT_TPOT_TARGET_S = 0.1
# The engines the catalog describes, in detection order, are those of the release table (engine_schemas.SCHEMAS);
# agent/node/engine/adapters.py has exactly one adapter per kind (checked when it is imported), and config and the CLI
# take their choices from here.
ENGINE_KINDS = engine_schemas.ENGINE_KINDS
_M = (MODEL,)
_Q = (MODEL, "quantity", "window", "source")

# vLLM v1's default TTFT buckets (vllm/v1/metrics/loggers.py); every SLO threshold must be one of them.
TTFT_BUCKETS_S = (
    0.001,
    0.005,
    0.01,
    0.02,
    0.04,
    0.06,
    0.08,
    0.1,
    0.25,
    0.5,
    0.75,
    1.0,
    2.5,
    5.0,
    7.5,
    10.0,
    20.0,
    40.0,
    80.0,
    160.0,
    640.0,
    2560.0,
)
ITL_BUCKETS_S = (
    0.01,
    0.025,
    0.05,
    0.075,
    0.1,
    0.15,
    0.2,
    0.3,
    0.4,
    0.5,
    0.75,
    1.0,
    2.5,
    5.0,
    7.5,
    10.0,
    20.0,
    40.0,
    80.0,
)
E2E_BUCKETS_S = (
    0.3,
    0.5,
    0.8,
    1.0,
    1.5,
    2.0,
    2.5,
    5.0,
    10.0,
    15.0,
    20.0,
    30.0,
    40.0,
    50.0,
    60.0,
    120.0,
    240.0,
    480.0,
    960.0,
    1920.0,
    7680.0,
)

METRICS = (
    MetricSpec(
        "inferwatch.engine.up",
        Kind.GAUGE,
        "",
        "1 when the engine's /metrics answered and parsed on the last scrape, else 0.",
        ("engine",),
    ),
    MetricSpec(
        "inferwatch.engine.info",
        Kind.GAUGE,
        "",
        "Always 1 per model the engine serves; labels say which engine was detected.",
        ("engine", MODEL),
    ),
    MetricSpec(
        "inferwatch.engine.latency",
        Kind.GAUGE,
        "s",
        f"Latency quantile of a request phase over a sliding window (quantity: {', '.join(QUANTITIES)}; "
        "quantile: 0.5, 0.9, 0.95, 0.99).",
        (*_Q, "quantile"),
    ),
    MetricSpec(
        "inferwatch.engine.latency.samples",
        Kind.GAUGE,
        "{request}",
        "Observations behind the window's quantiles (requests finished in the window).",
        _Q,
    ),
    MetricSpec(
        "inferwatch.engine.latency.tail_ratio",
        Kind.GAUGE,
        "1",
        "P99 / P50 of the quantity over the window; above 3 means jitter that more resources will not fix.",
        _Q,
    ),
    MetricSpec(
        "inferwatch.engine.latency.bimodal",
        Kind.GAUGE,
        "",
        "1 when the window's latency distribution is bimodal (slow node or slow path), else 0.",
        _Q,
    ),
    MetricSpec(
        "inferwatch.engine.latency.bimodality",
        Kind.GAUGE,
        "",
        "The bimodality statistic behind the verdict: Ashman's D of a two-component fit on log latency "
        "(>= 2, with the other criteria, means bimodal; see docs/analytics.md).",
        _Q,
    ),
    MetricSpec(
        "inferwatch.engine.frontend_gap",
        Kind.GAUGE,
        "s",
        "Mean TTFT − (queue + prefill) over the window: API server, tokenisation, templating and IPC time.",
        (MODEL, "window"),
    ),
    MetricSpec(
        "inferwatch.engine.tail.driver",
        Kind.GAUGE,
        "1",
        "The tail explainer's verdict (docs/explain.md): the largest phase's share of the gap between the slowest "
        "2 % and the median band of the quantity (ttft or e2e) over the window; phase is the driver (frontend, queue, "
        "prefill, decode) or none when no driver is confident, attribute the value that separates the tail "
        "(dp_rank=1, prompt_tokens=>16k; a rank served slower per token, dp_rank=1 with the largest phase; a tail "
        "under KV-cache preemptions, preempted=yes) or none. From spans only.",
        (MODEL, "quantity", "window", "phase", "attribute", "source"),
    ),
    MetricSpec(
        "inferwatch.engine.time_to_first_token",
        Kind.HISTOGRAM,
        "s",
        "Time to first token of successful requests by prompt length, from spans (receiver.prompt_band_histograms; "
        f"{PROMPT_BAND}: {PROMPT_BAND_NAMES}): the conformance band's per-prompt-band TTFT (alerts/matrix.rules.yml). "
        "Buckets as gen_ai.server.time_to_first_token's.",
        (MODEL, PROMPT_BAND),
        SEMCONV_TTFT_BUCKETS_S,
    ),
    MetricSpec(
        "inferwatch.engine.time_per_output_token",
        Kind.HISTOGRAM,
        "s",
        "Time per output token after the first of successful requests by prompt length, from spans "
        f"(receiver.prompt_band_histograms; {PROMPT_BAND}: {PROMPT_BAND_NAMES}): per request, as "
        "gen_ai.server.time_per_output_token, with its buckets.",
        (MODEL, PROMPT_BAND),
        SEMCONV_TPOT_BUCKETS_S,
    ),
    MetricSpec("inferwatch.engine.requests.running", Kind.UPDOWNCOUNTER, "{request}", "Requests in the batch.", _M),
    MetricSpec("inferwatch.engine.requests.waiting", Kind.UPDOWNCOUNTER, "{request}", "Requests queued.", _M),
    MetricSpec("inferwatch.engine.kv_cache.usage", Kind.GAUGE, "1", "KV-cache blocks in use (0..1).", _M),
    MetricSpec(
        "inferwatch.engine.tokens",
        Kind.COUNTER,
        "{token}",
        "Tokens processed, by type (prompt, generation, cached: prompt tokens served from the prefix cache), "
        "summed over data-parallel ranks.",
        (MODEL, "type"),
    ),
    MetricSpec("inferwatch.engine.preemptions", Kind.COUNTER, "{preemption}", "Requests preempted.", _M),
    # Engine signals (docs/engine-signals.md): cumulative counters summed over data-parallel ranks, so
    # rates and ratios are recording rules (alerts/engine-signals.rules.yml). Absent where the engine has no data.
    MetricSpec(
        "inferwatch.engine.prefix_cache.queries",
        Kind.COUNTER,
        "{token}",
        "Prompt tokens looked up in the prefix cache (cache: local, external = KV-connector cross-instance cache).",
        (MODEL, "cache"),
    ),
    MetricSpec(
        "inferwatch.engine.prefix_cache.hits",
        Kind.COUNTER,
        "{token}",
        "Prompt tokens found in the prefix cache (cache: local, external).",
        (MODEL, "cache"),
    ),
    MetricSpec(
        "inferwatch.engine.prompt_tokens.by_source",
        Kind.COUNTER,
        "{token}",
        "Prompt tokens by where their KV came from (source: local_compute, local_cache_hit, external_kv_transfer).",
        (MODEL, "source"),
    ),
    MetricSpec(
        "inferwatch.engine.spec_decode.drafts",
        Kind.COUNTER,
        "{draft}",
        "Speculative-decoding drafts proposed (one per sequence per step that speculated).",
        _M,
    ),
    MetricSpec(
        "inferwatch.engine.spec_decode.draft_tokens",
        Kind.COUNTER,
        "{token}",
        "Draft tokens proposed by the draft model (or n-gram/EAGLE/MTP head).",
        _M,
    ),
    MetricSpec(
        "inferwatch.engine.spec_decode.accepted_tokens",
        Kind.COUNTER,
        "{token}",
        "Draft tokens the target model accepted; acceptance = accepted / draft tokens, mean acceptance length = "
        "1 + accepted / drafts.",
        _M,
    ),
    MetricSpec(
        "inferwatch.engine.spec_decode.accepted_by_position",
        Kind.COUNTER,
        "{token}",
        "Draft tokens accepted at each draft position (0 = first); / drafts = acceptance by position.",
        (MODEL, "position"),
    ),
    MetricSpec(
        "inferwatch.engine.spec_decode.acceptance",
        Kind.GAUGE,
        "1",
        "The engine's own rolling acceptance rate (SGLang spec_accept_rate; vLLM has counters instead).",
        _M,
    ),
    MetricSpec(
        "inferwatch.engine.spec_decode.acceptance_length",
        Kind.GAUGE,
        "{token}",
        "The engine's own rolling mean acceptance length (SGLang spec_accept_length).",
        _M,
    ),
    MetricSpec(
        "inferwatch.engine.goodput",
        Kind.GAUGE,
        "1",
        f"Share of the window's finished requests with TTFT <= {GOODPUT_TTFT_TARGET_S:g} s and time per output token "
        f"<= {GOODPUT_TPOT_TARGET_S:g} s together, exact, from spans (source: spans); the recording rules bound it "
        "from histograms where there are no spans.",
        (MODEL, "window", "source"),
    ),
    MetricSpec(
        "inferwatch.engine.lora.adapters",
        Kind.GAUGE,
        "{adapter}",
        "LoRA adapters with requests in the batch (state: running) or in the queue (state: waiting).",
        (MODEL, "state"),
    ),
    MetricSpec(
        "inferwatch.engine.lora.max_adapters",
        Kind.GAUGE,
        "{adapter}",
        "LoRA adapter slots per batch (vLLM --max-loras).",
        _M,
    ),
    MetricSpec(
        "inferwatch.engine.lora.blocked",
        Kind.GAUGE,
        "{adapter}",
        "Adapters whose requests waited for an adapter slot (waiting, not resident, while every slot is taken) at "
        "any engine step of the last 15 s (vLLM's lora_requests_info label sets, each at the time it was last set).",
        _M,
    ),
    MetricSpec(
        "inferwatch.engine.kv_transfer.duration",
        Kind.HISTOGRAM,
        "s",
        "P/D disaggregation: duration of each KV-cache transfer (vLLM NIXL connector's xfer time, SGLang's "
        "transfer_kv_cache stage), the engine's buckets summed over data-parallel ranks.",
        _M,
    ),
    MetricSpec(
        "inferwatch.engine.kv_transfer.bytes",
        Kind.COUNTER,
        "By",
        "P/D disaggregation: bytes moved by KV-cache transfers (vLLM NIXL connector).",
        _M,
    ),
    MetricSpec(
        "inferwatch.engine.kv_transfer.failures",
        Kind.COUNTER,
        "{transfer}",
        "P/D disaggregation: failed KV-cache transfers.",
        _M,
    ),
    MetricSpec(
        "inferwatch.engine.kv_transfer.latency",
        Kind.GAUGE,
        "s",
        "P/D disaggregation: the engine's own recent KV-transfer latency (SGLang kv_transfer_latency_ms).",
        _M,
    ),
    # Hang detection per data-parallel rank (agent/node/engine/hang.py, docs/diagnostics.md).
    MetricSpec(
        "inferwatch.engine.stall",
        Kind.GAUGE,
        "s",
        "Time the rank has had requests (running or waiting) without its token counters moving; 0 when idle or "
        "progressing.",
        (MODEL, "rank"),
    ),
    MetricSpec(
        "inferwatch.engine.stall.allowance",
        Kind.GAUGE,
        "s",
        "The longest stall a working rank can show: 2 × max_model_len × prefill seconds per token, at least "
        "engine.hang_fast_stall_s, capped at engine.hang_max_stall_s; engine.hang_min_stall_s while the length or "
        "the speed is unknown; max_model_len is engine.max_model_len, or what the engine reports (/v1/models, "
        "llama.cpp /props) when that is 0. A stall no prefill explains is a hang after engine.hang_fast_stall_s.",
        (MODEL, "rank"),
    ),
    MetricSpec(
        "inferwatch.engine.hung",
        Kind.GAUGE,
        "",
        "1 when the rank's stall passed its allowance while the engine's /metrics answers and its /health does not "
        'fail (200, or no /health endpoint, or engine.health_url set to ""), else 0.',
        (MODEL, "rank"),
    ),
    MetricSpec(
        "inferwatch.engine.requests.finished",
        Kind.COUNTER,
        "{request}",
        "Requests finished, by reason (stop, length, abort, error).",
        (MODEL, "reason"),
    ),
    # gen_ai.server.* (re-exported engine histograms, and from spans): agent/catalog/genai.py.
    # Added with the engine collector (agent/node/collectors/engine.py).
    MetricSpec(
        "inferwatch.engine.scrape.errors",
        Kind.COUNTER,
        "{error}",
        "Failed reads of the engine's /metrics by reason (connect, timeout, http_status, too_large, truncated, "
        "not_utf8, not_prometheus, unknown_engine, parse, duplicate_series, type_conflict, negative_value, "
        "out_of_range, openmetrics, sample_limit, label_value_length_limit, label_bytes_limit).",
        ("reason",),
    ),
    MetricSpec(
        "inferwatch.engine.limit_hits",
        Kind.COUNTER,
        "{scrape}",
        "Scrapes of the engine that hit a limit (limit: sample_limit, label_value_length_limit, label_bytes_limit "
        "reject the scrape; max_models drops the models past engine.max_models). See docs/engine.md.",
        ("limit",),
    ),
    MetricSpec(
        "inferwatch.engine.series.dropped",
        Kind.COUNTER,
        "{line}",
        "Lines of the engine's /metrics dropped with a problem of their own, the rest of the scrape kept (reason: "
        "parse, duplicate_series, type_conflict, negative_value, openmetrics; agent/node/engine/exposition.py). Past "
        "1,000 in one scrape, or when nothing else is left, the scrape fails with that reason instead.",
        ("reason",),
    ),
    MetricSpec(
        "inferwatch.engine.latency.mean",
        Kind.GAUGE,
        "s",
        "Mean of a quantity the engine exposes only as cumulative counters (docs/engine.md, derived, mean only): "
        "seconds per request for Triton's e2e, queue and inference (its _duration_us counters over its successes), "
        "per token for llama.cpp's prefill and itl, over the window. No quantile can be made of it.",
        (MODEL, "quantity", "window"),
    ),
    MetricSpec(
        "inferwatch.engine.schema.info",
        Kind.GAUGE,
        "",
        "Always 1: the release range and exposition schema the agent recognised in the engine's /metrics "
        "(agent/catalog/engine_schemas.py; release_range and schema are 'unrecognised' when no schema matched).",
        ("engine", "release_range", "schema"),
    ),
    MetricSpec(
        "inferwatch.engine.quantities.recognised",
        Kind.GAUGE,
        "{quantity}",
        "How many of the quantities the project claims (TTFT, ITL, e2e, queue, prefill, decode, inference, tokens, "
        "running, waiting, KV and prefix cache, preemptions, speculative decoding, LoRA) the last good scrape mapped "
        "or derived; a drop after a restart or upgrade is the EngineSchemaShrank alert.",
        ("engine",),
    ),
    MetricSpec(
        "inferwatch.engine.unmapped_families",
        Kind.GAUGE,
        "{family}",
        "Families of the engine's own prefix that the last good scrape declared and no adapter source reads.",
        ("engine",),
    ),
    MetricSpec(
        "inferwatch.engine.models.dropped",
        Kind.GAUGE,
        "{model}",
        "Distinct models the last good scrape left out, past engine.max_models (0 when within it).",
        (),
    ),
    MetricSpec(
        "inferwatch.engine.token_time",
        Kind.GAUGE,
        "s",
        "Mean seconds per token over the window by phase (prefill: per prompt token; decode: per generated "
        "token), from the engine's cumulative seconds and token counters (llama.cpp).",
        (MODEL, "phase", "window"),
    ),
)
