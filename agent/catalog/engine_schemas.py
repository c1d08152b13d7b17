"""Engine releases as data: which exposition layout (schema) each release range has, and what it covers.

A schema is recognised from the families an exposition declares (its ``# TYPE`` lines and sample
names) and the label names its engine samples carry; the first schema of the engine's list whose
conditions hold wins (lists run newest first). A rename between releases is a new row here and a new
candidate in the adapter's source list (agent/node/engine/adapters.py), never a code path.

Coverage is what an operator asks of a release: for each quantity the project claims, is it *mapped*
(read from a histogram, gauge or counter the engine exposes), *derived (mean only)* (the quotient of
two cumulative counters: a mean over a window, no quantile), or *not exposed*. The table in
docs/engine.md ("Engine releases and schemas") is generated from the capture corpus with these
definitions (``python -m inferwatch.agent.node.engine.coverage``).
"""

from __future__ import annotations

from dataclasses import dataclass

UNRECOGNISED = "unrecognised"


@dataclass(frozen=True, slots=True)
class Schema:
    """One recognisable exposition layout of an engine.

    ``any_of``: at least one of these families present (empty: no condition); ``and_any_of``: likewise, a
    second group; ``all_of``: every one present; ``none_of``: none present; ``label``: a label name some
    engine sample carries.
    Family names are as declared (``vllm:prompt_tokens_total``); Ray Serve's re-export is matched as vLLM's
    own name (``ray_vllm:x`` and ``ray_vllm_x`` as ``vllm:x``).
    """

    engine: str
    schema: str
    release_range: str
    any_of: tuple[str, ...] = ()
    all_of: tuple[str, ...] = ()
    none_of: tuple[str, ...] = ()
    label: str | None = None
    and_any_of: tuple[str, ...] = ()  # a second any-of group (both must hold)

    def matches(self, families: frozenset[str], labels: frozenset[str]) -> bool:
        if self.any_of and not any(f in families for f in self.any_of):
            return False
        if self.and_any_of and not any(f in families for f in self.and_any_of):
            return False
        if any(f not in families for f in self.all_of):
            return False
        if any(f in families for f in self.none_of):
            return False
        return self.label is None or self.label in labels


# vLLM V0-only families (deprecated in 0.8, hidden in 0.9, never in V1): reference engine-versions.md §1
VLLM_V0_ONLY = (
    "vllm:num_requests_swapped",
    "vllm:cpu_cache_usage_perc",
    "vllm:gpu_prefix_cache_hit_rate",
    "vllm:cpu_prefix_cache_hit_rate",
    "vllm:avg_prompt_throughput_toks_per_s",
    "vllm:avg_generation_throughput_toks_per_s",
    "vllm:spec_decode_draft_acceptance_rate",
    "vllm:time_in_queue_requests",
    "vllm:model_forward_time_milliseconds",
)
VLLM_V1_NEW = ("vllm:kv_cache_usage_perc", "vllm:inter_token_latency_seconds", "vllm:prefix_cache_queries_total")

SCHEMAS: tuple[Schema, ...] = (
    # vLLM, newest first
    Schema(
        "vllm", "vllm-mixed", "mixed: V0 and V1 families in one exposition", any_of=VLLM_V0_ONLY, and_any_of=VLLM_V1_NEW
    ),
    Schema(
        "vllm",
        "vllm-v1-current",
        "v1 >= 0.12 (inter_token_latency; deprecated names gone or hidden)",
        any_of=("vllm:inter_token_latency_seconds",),
        none_of=("vllm:time_per_output_token_seconds", "vllm:gpu_cache_usage_perc"),
    ),
    Schema(
        "vllm",
        "vllm-v1-itl",
        "v1 0.10.1 - 0.11 (inter_token_latency beside deprecated names)",
        any_of=("vllm:inter_token_latency_seconds",),
    ),
    Schema("vllm", "vllm-v1-kv", "v1 0.9 - 0.10 (kv_cache_usage_perc)", any_of=VLLM_V1_NEW),
    Schema(
        "vllm",
        "vllm-v1-spec",
        "v1 >= 0.8.5 (spec_decode counters, PR #16665)",
        any_of=("vllm:spec_decode_num_accepted_tokens_per_pos_total", "vllm:spec_decode_num_drafts_total"),
    ),
    Schema(
        "vllm",
        "vllm-v1-early",
        "v1 0.7 - 0.8 (gpu_prefix_cache counters)",
        any_of=("vllm:gpu_prefix_cache_queries_total", "vllm:gpu_prefix_cache_hits_total"),
    ),
    Schema("vllm", "vllm-v0", "v0 engine (<= 0.8)", any_of=VLLM_V0_ONLY),
    Schema("vllm", "vllm-v1-engine-label", "v1 (engine label; no family tells the release)", label="engine"),
    Schema(
        "vllm",
        "vllm-legacy-names",
        "<= 0.10, v0 or v1 (only names both share)",
        any_of=("vllm:gpu_cache_usage_perc", "vllm:time_per_output_token_seconds", "vllm:num_requests_running"),
    ),
    # SGLang
    Schema("sglang", "sglang-itl", ">= 0.5 (inter_token_latency)", any_of=("sglang:inter_token_latency_seconds",)),
    Schema(
        "sglang", "sglang-tpot", "0.4 - 0.5 (time_per_output_token)", any_of=("sglang:time_per_output_token_seconds",)
    ),
    Schema("sglang", "sglang-model-name", "0.4 - 0.5 (model_name label)", label="model_name"),
    Schema("sglang", "sglang-name-label", "<= 0.3 (name label, PR #1853)", label="name"),
    # TGI and IBM's TGIS fork
    Schema("tgi", "tgis", "IBM TGIS fork (tgi_tokenize_*)", any_of=("tgi_tokenize_request_tokens",)),
    Schema(
        "tgi",
        "tgi-router",
        "1.x - 3.x (router histograms, no TTFT)",
        any_of=("tgi_request_duration", "tgi_queue_size", "tgi_request_count"),
    ),
    # llama.cpp server
    Schema(
        "llamacpp",
        "llamacpp-spec",
        ">= b7xxx (speculative decoding counters, PR #26389)",
        any_of=("llamacpp:spec_decode_num_drafts_total",),
    ),
    Schema("llamacpp", "llamacpp-kv", "<= PR #13660 (kv_cache_usage_ratio)", any_of=("llamacpp:kv_cache_usage_ratio",)),
    Schema(
        "llamacpp",
        "llamacpp-counters",
        "after PR #13660 (seconds counters, no KV gauge)",
        any_of=("llamacpp:prompt_seconds_total", "llamacpp:tokens_predicted_seconds_total"),
    ),
    # TensorRT-LLM: trtllm-serve, its PyTorch backend, NIM, and Triton (with or without the TensorRT-LLM backend)
    Schema(
        "trtllm",
        "trtllm-dynamo-worker",
        "Dynamo TRT-LLM worker (trtllm_ beside dynamo_component_*)",
        any_of=("trtllm_time_to_first_token_seconds", "trtllm_request_success_total"),
        and_any_of=("dynamo_component_requests_total", "dynamo_component_uptime_seconds"),
    ),
    Schema(
        "trtllm", "trtllm-serve", "trtllm-serve >= 1.0 (trtllm_ prefix)", any_of=("trtllm_time_to_first_token_seconds",)
    ),
    Schema(
        "trtllm",
        "trtllm-dynamo",
        "trtllm-serve under Dynamo (trtllm: prefix)",
        any_of=("trtllm:time_to_first_token_seconds",),
    ),
    Schema(
        "trtllm",
        "trtllm-unprefixed",
        "trtllm-serve PR #5785 / NIM (unprefixed names)",
        any_of=("time_to_first_token_seconds",),
    ),
    Schema(
        "trtllm",
        "trtllm-pytorch",
        "TensorRT-LLM PyTorch backend (pytrtllm:, PR #5560)",
        any_of=("pytrtllm:prompt_tokens_total",),
    ),
    Schema(
        "trtllm",
        "triton-trtllm",
        "Triton + TensorRT-LLM backend (nv_trt_llm_*)",
        any_of=("nv_trt_llm_request_metrics", "nv_trt_llm_kv_cache_block_metrics"),
    ),
    Schema(
        "trtllm",
        "triton-core",
        "Triton core, any backend (nv_inference_* counters)",
        any_of=("nv_inference_request_success", "nv_inference_request_duration_us"),
    ),
    # NVIDIA Dynamo's HTTP frontend and the LiteLLM proxy
    Schema("dynamo", "dynamo-frontend", "frontend (dynamo_frontend_*)", any_of=("dynamo_frontend_requests_total",)),
    Schema(
        "litellm",
        "litellm-proxy",
        "proxy (litellm_*_metric histograms)",
        any_of=("litellm_request_total_latency_metric", "litellm_llm_api_latency_metric"),
    ),
    # OpenVINO Model Server (its metrics endpoint since 2022.2)
    Schema(
        "ovms",
        "ovms-time-us",
        ">= 2022.2 (ovms_*_time_us histograms)",
        any_of=("ovms_request_time_us", "ovms_inference_time_us"),
    ),
)

# The engine kinds, in detection order: the order of each engine's first row above. A new engine is its rows here
# (and its adapter, agent/node/engine/adapters.py); the config's choices, discovery and the docs read this.
ENGINE_KINDS: tuple[str, ...] = tuple(dict.fromkeys(s.engine for s in SCHEMAS))

# The quantities an operator asks of every release, in the table's order.
COVERAGE = (
    "ttft",
    "itl",
    "e2e",
    "queue",
    "prefill",
    "decode",
    "inference",
    "prompt_tokens",
    "generation_tokens",
    "running",
    "waiting",
    "kv_usage",
    "prefix_cache",
    "preemptions",
    "spec_decode",
    "lora",
)
# Reading keys (histograms, gauges, counters of agent/node/engine/adapters.py) that make a coverage quantity "mapped"
# when they are not named as the quantity itself.
COVERAGE_KEYS: dict[str, tuple[str, ...]] = {
    "prefix_cache": ("prefix_queries", "prefix_hits", "cached_tokens", "external_prefix_queries"),
    "spec_decode": (
        "spec_drafts",
        "spec_draft_tokens",
        "spec_accepted",
        "spec_accepted_by_position",
        "spec_acceptance",
        "spec_acceptance_length",
    ),
}
# A quantity with no histogram but two cumulative counters: seconds spent and how many (requests or tokens). The
# increase of the first over the increase of the second is the mean over a window; no quantile can come of it.
DERIVED_MEANS: dict[str, tuple[str, str]] = {
    "prefill": ("prompt_seconds", "prompt_tokens"),  # llama.cpp: seconds per prompt token
    "itl": ("generation_seconds", "generation_tokens"),  # llama.cpp: seconds per generated token
    "e2e": ("e2e_seconds", "requests"),  # Triton: nv_inference_request_duration_us / request_success
    "queue": ("queue_seconds", "requests"),  # Triton: nv_inference_queue_duration_us / request_success
    "inference": ("inference_seconds", "requests"),  # Triton: nv_inference_compute_infer_duration_us / success
}
MAPPED = "mapped"
DERIVED = "derived (mean only)"
NOT_EXPOSED = "not exposed"


def schemas_of(engine: str) -> tuple[Schema, ...]:
    return tuple(s for s in SCHEMAS if s.engine == engine)
