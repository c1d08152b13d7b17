"""Engine adapters: which families each engine exposes and how they map to canonical quantities.

An :class:`Adapter` lists, per canonical quantity, candidate sources in order of preference (the
first one present for a model wins: vLLM's current ``inter_token_latency_seconds`` before the
deprecated ``time_per_output_token_seconds``). :func:`read` turns the samples of one exposition into
an :class:`EngineReading`: per model, the cumulative histograms of each timing quantity **per
series** (one per data-parallel rank, so resets are handled per rank, as ``increase`` does), the
gauges summed over ranks (KV-cache usage averaged), and the counters summed over ranks.

Anything an engine does not expose is simply missing from the reading (absent, never zero).
Families per engine, labels aggregated over and detection prefixes: docs/engine.md ("Canonical quantities
per engine", "Data-parallel ranks and models", "Detection").
"""

from __future__ import annotations

import contextlib
import math
from array import array
from collections.abc import Callable, Iterator
from dataclasses import dataclass, field, replace
from itertools import chain, compress, repeat
from operator import is_
from typing import TypeVar

from inferwatch.agent.catalog.engine import ENGINE_KINDS, QUANTITIES  # noqa: F401  (QUANTITIES re-exported)
from inferwatch.agent.catalog.engine_schemas import (
    COVERAGE,
    COVERAGE_KEYS,
    DERIVED,
    DERIVED_MEANS,
    MAPPED,
    NOT_EXPOSED,
    UNRECOGNISED,
    schemas_of,
)
from inferwatch.agent.common.precedence import step_aside
from inferwatch.agent.errors import SourceFormatError
from inferwatch.agent.node.engine import seriesmaps
from inferwatch.agent.node.engine.exposition import Exposition, ExpositionReader, Series
from inferwatch.agent.node.engine.histogram import Histogram
from inferwatch.agent.node.engine.limits import EngineLimits
from inferwatch.agent.node.engine.seriesmaps import Buckets, Key, Memo, SeriesKey, split_one
from inferwatch.agent.node.engine.textformat import Labels, parse_float

# The bulk steps of seriesmaps.py where they are compiled (seriesmaps.COMPILED); without them each family is read
# sample by sample, which in pure Python is as fast as their pure-Python definitions (the reference the compiled
# steps are held to, run by the tests).
memoise: Callable[..., int] | None = seriesmaps.memoise if seriesmaps.COMPILED else None
bucket_tuples: Callable[[list[Labels], array[float], Memo], dict[SeriesKey, Buckets] | None] | None = (
    seriesmaps.bucket_tuples if seriesmaps.COMPILED else None
)
totals: Callable[[list[Labels], array[float], Memo], dict[SeriesKey, float] | None] | None = (
    seriesmaps.totals if seriesmaps.COMPILED else None
)

DEFAULT_MODEL = "unknown"  # engines without a model label (TGI, llama.cpp) unless engine.model_name is set


@dataclass(frozen=True, slots=True)
class Source:
    """One family (histogram base name, or full sample name for counters and gauges) with a label filter.

    ``dimension``: a label kept apart (``finished_reason``); ``fixed``: a constant dimension value
    (``error`` for an error counter); ``scale``: factor to the canonical unit (seconds, ratio).
    """

    name: str
    match: tuple[tuple[str, str], ...] = ()
    dimension: str | None = None
    fixed: str | None = None
    scale: float = 1.0


def _s(*names: str, **kw: object) -> tuple[Source, ...]:
    return tuple(Source(n, **kw) for n in names)  # type: ignore[arg-type]


@dataclass(frozen=True)
class Adapter:
    kind: str
    prefixes: tuple[str, ...]
    model_labels: tuple[str, ...]  # first present label names the model
    histograms: dict[str, tuple[Source, ...]] = field(default_factory=dict)  # quantity → candidates
    gauges: dict[str, tuple[Source, ...]] = field(default_factory=dict)  # running, waiting, kv_usage
    counters: dict[str, tuple[Source, ...]] = field(default_factory=dict)  # prompt_tokens, ..., finished
    # vLLM's lora_requests_info: an info gauge whose labels carry the adapter lists (see read_lora)
    lora: tuple[Source, ...] = ()
    # quantities only some builds of this engine expose (llama.cpp's KV usage): their absence is not a fault
    build_dependent: frozenset[str] = frozenset()

    def wanted(self) -> frozenset[str]:
        names: set[str] = {src.name for src in self.lora}
        for cands in self.histograms.values():
            for src in cands:
                names.update((src.name + "_bucket", src.name + "_sum", src.name + "_count"))
        for group in (self.gauges, self.counters):
            for cands in group.values():
                names.update(src.name for src in cands)
        return frozenset(names)

    def reader(self, limits: EngineLimits | None = None) -> ExpositionReader:
        return ExpositionReader(self.prefixes, self.wanted(), limits=limits, model_labels=self.model_labels)


def _v(*names: str, **kw: object) -> tuple[Source, ...]:
    """vLLM's family names, then the same under Ray Serve's ``ray_`` prefix (with Ray's worker labels): ``ray_vllm:``
    as Ray 2.32 exported them, and ``ray_vllm_`` (the colon made an underscore) as Ray's own current dashboards
    query them (ray-project/ray ``dashboards/vllm_engine_panels.py``)."""
    return _s(*names, *("ray_" + n for n in names), *("ray_" + n.replace(":", "_", 1) for n in names), **kw)


# Labels that name a data-parallel rank (vLLM v1 ``engine``, SGLang ``dp_rank``); a series without one is rank "0".
RANK_LABELS = ("engine", "dp_rank")
# What the hang detector needs per rank (agent/node/engine/hang.py): the load gauges, the progress counters and the step
# signal (below).
RANK_QUANTITIES = ("running", "waiting", "prompt_tokens", "generation_tokens", "kv_usage")
# Per engine kind, the rank quantity that moves at every engine step, a chunked prefill's steps included, and the
# families where it does. vLLM V1 (``kv_cache_usage_perc``, the V1 name) publishes its scheduler's stats after every
# step, and allocates a prefill's KV blocks chunk by chunk, so a long prefill raises the usage at each step while a hung
# engine leaves it still; its token counters and ``iteration_tokens_total`` move only on a step with output (none for
# a partial prefill). vLLM V0 (``gpu_cache_usage_perc`` alone) allocated a prompt's blocks at admission; SGLang, TGI,
# llama.cpp and TensorRT-LLM publish no per-step figure, and Ray Serve's ``ray_vllm:`` copies arrive on Ray's own
# export interval: none there, the detector keeps the prefill allowance.
STEP_SIGNALS: dict[str, tuple[str, frozenset[str]]] = {"vllm": ("kv_usage", frozenset({"vllm:kv_cache_usage_perc"}))}
# averaged over ranks (ratios and per-transfer figures); every other gauge is summed
GAUGE_MEAN = frozenset({"kv_usage", "spec_acceptance", "spec_acceptance_length", "kv_transfer_latency"})
# The domain of each gauge, by the catalog quantity it feeds (agent/catalog/engine.py): KV-cache usage is a
# ratio (unit "1", 0..1), requests running and waiting are counts. A raw sample outside it rejects the
# reading (``out_of_range``), as a negative counter, bucket, count or duration sum does (``negative_value``).
GAUGE_DOMAINS: dict[str, tuple[float, float]] = {
    "kv_usage": (0.0, 1.0),
    "running": (0.0, math.inf),
    "waiting": (0.0, math.inf),
    "spec_acceptance": (0.0, 1.0),
    "spec_acceptance_length": (0.0, math.inf),
    "kv_transfer_latency": (0.0, math.inf),
}
# Counters whose candidates are all used (summed by dimension) instead of first-present-wins.
COUNTER_ALL = frozenset({"finished"})
COUNTER_DOMAIN = (0.0, math.inf)  # counters (and TGI's token sums) never go below zero

VLLM = Adapter(
    "vllm",
    ("vllm:", "ray_vllm:", "ray_vllm_"),  # Ray Serve re-exports vLLM's families as ray_vllm:* / ray_vllm_*
    ("model_name",),
    histograms={
        "ttft": _v("vllm:time_to_first_token_seconds"),
        "itl": _v("vllm:inter_token_latency_seconds", "vllm:time_per_output_token_seconds"),
        "e2e": _v("vllm:e2e_request_latency_seconds"),
        "queue": _v("vllm:request_queue_time_seconds"),
        "prefill": _v("vllm:request_prefill_time_seconds"),
        "decode": _v("vllm:request_decode_time_seconds"),
        "inference": _v("vllm:request_inference_time_seconds"),
        # P/D disaggregation: the NIXL connector's per-transfer duration (vLLM's KVConnectorPromMetrics)
        "kv_transfer": _v("vllm:nixl_xfer_time_seconds"),
    },
    gauges={
        "running": _v("vllm:num_requests_running"),
        "waiting": _v("vllm:num_requests_waiting"),
        "kv_usage": _v("vllm:kv_cache_usage_perc", "vllm:gpu_cache_usage_perc"),
    },
    counters={
        "prompt_tokens": _v("vllm:prompt_tokens_total"),
        "generation_tokens": _v("vllm:generation_tokens_total"),
        "preemptions": _v("vllm:num_preemptions_total"),
        "finished": _v("vllm:request_success_total", dimension="finished_reason"),
        # engine signals: all in tokens unless named otherwise, summed over DP ranks
        "cached_tokens": _v("vllm:prompt_tokens_cached_total"),
        "prompt_by_source": _v("vllm:prompt_tokens_by_source_total", dimension="source"),
        # renamed with PR #18354 (gpu_prefix_cache_* deprecated in 0.10; both side by side in 0.10.0)
        "prefix_queries": _v("vllm:prefix_cache_queries_total", "vllm:gpu_prefix_cache_queries_total"),
        "prefix_hits": _v("vllm:prefix_cache_hits_total", "vllm:gpu_prefix_cache_hits_total"),
        "external_prefix_queries": _v("vllm:external_prefix_cache_queries_total"),
        "external_prefix_hits": _v("vllm:external_prefix_cache_hits_total"),
        "spec_drafts": _v("vllm:spec_decode_num_drafts_total"),
        "spec_draft_tokens": _v("vllm:spec_decode_num_draft_tokens_total"),
        "spec_accepted": _v("vllm:spec_decode_num_accepted_tokens_total"),
        "spec_accepted_by_position": _v("vllm:spec_decode_num_accepted_tokens_per_pos_total", dimension="position"),
        "kv_transfer_bytes": _v("vllm:nixl_bytes_transferred_sum"),
        "kv_transfer_failures": _v("vllm:nixl_num_failed_transfers_total"),
    },
    lora=_v("vllm:lora_requests_info"),
)

SGLANG = Adapter(
    "sglang",
    ("sglang:",),
    ("model_name", "name"),  # early SGLang named the model in a `name` label
    histograms={
        "ttft": _s("sglang:time_to_first_token_seconds"),
        "itl": _s("sglang:inter_token_latency_seconds", "sglang:time_per_output_token_seconds"),
        "e2e": _s("sglang:e2e_request_latency_seconds"),
        "queue": _s("sglang:queue_time_seconds"),
        "prefill": _s("sglang:per_stage_req_latency_seconds", match=(("stage", "prefill_forward"),)),
        "kv_transfer": _s("sglang:per_stage_req_latency_seconds", match=(("stage", "prefill_transfer_kv_cache"),)),
    },
    gauges={
        "running": _s("sglang:num_running_reqs"),
        "waiting": _s("sglang:num_queue_reqs"),
        "kv_usage": _s("sglang:token_usage"),
        # the scheduler's own rolling figures (no counters behind them in SGLang)
        "spec_acceptance": _s("sglang:spec_accept_rate"),
        "spec_acceptance_length": _s("sglang:spec_accept_length"),
        "kv_transfer_latency": _s("sglang:kv_transfer_latency_ms", scale=1e-3),
    },
    counters={
        "prompt_tokens": _s("sglang:prompt_tokens_total"),
        "generation_tokens": _s("sglang:generation_tokens_total"),
        "preemptions": _s("sglang:num_retracted_requests_total"),
        "finished": _s("sglang:num_aborted_requests_total", fixed="abort"),
        "cached_tokens": _s("sglang:cached_tokens_total"),
        "kv_transfer_failures": _s("sglang:num_transfer_failed_reqs_total"),
    },
)

TGI = Adapter(
    "tgi",
    ("tgi_",),
    (),
    histograms={
        "itl": _s("tgi_request_mean_time_per_token_duration"),
        "e2e": _s("tgi_request_duration"),
        "queue": _s("tgi_request_queue_duration"),
        "prefill": _s("tgi_batch_forward_duration", match=(("method", "prefill"),)),
        "inference": _s("tgi_request_inference_duration"),
    },
    gauges={"running": _s("tgi_batch_current_size"), "waiting": _s("tgi_queue_size")},
    counters={
        "prompt_tokens": _s("tgi_request_input_length_sum"),
        "generation_tokens": _s("tgi_request_generated_tokens_sum"),
        "finished": _s("tgi_request_failure", "tgi_request_failure_total", fixed="error"),
    },
)

LLAMACPP = Adapter(
    "llamacpp",
    ("llamacpp:",),
    (),
    # kv_cache_usage_ratio (0..1): builds before PR #13660 and the ik_llama.cpp fork (tests/fixtures/engines/
    # llamacpp-ik-pr695.prom); upstream removed it there (#23632 asks it back), so current builds expose none.
    gauges={
        "running": _s("llamacpp:requests_processing"),
        "waiting": _s("llamacpp:requests_deferred"),
        "kv_usage": _s("llamacpp:kv_cache_usage_ratio"),
    },
    build_dependent=frozenset({"kv_usage"}),
    counters={
        "prompt_tokens": _s("llamacpp:prompt_tokens_total"),
        "generation_tokens": _s("llamacpp:tokens_predicted_total"),
        "prompt_seconds": _s("llamacpp:prompt_seconds_total"),
        "generation_seconds": _s("llamacpp:tokens_predicted_seconds_total"),
        # prompt tokens reused from a slot's KV cache (cache_prompt), and speculative decoding with --model-draft
        # (--spec-type draft-simple): the same counters as vLLM's, per draft position too (llama-server b11434;
        # tests/test_llamacpp_specdec.py).
        "cached_tokens": _s("llamacpp:prompt_tokens_cached_total"),
        "spec_drafts": _s("llamacpp:spec_decode_num_drafts_total"),
        "spec_draft_tokens": _s("llamacpp:spec_decode_num_draft_tokens_total"),
        "spec_accepted": _s("llamacpp:spec_decode_num_accepted_tokens_total"),
        "spec_accepted_by_position": _s("llamacpp:spec_decode_num_accepted_tokens_per_pos_total", dimension="position"),
    },
)

TRTLLM = Adapter(
    "trtllm",
    # trtllm-serve (trtllm_, trtllm: under Dynamo, unprefixed in PR #5785 and NIM), its PyTorch backend (pytrtllm:),
    # Triton's TensorRT-LLM backend (nv_trt_llm_, nv_llm_) and Triton core (nv_inference_*, any backend)
    ("trtllm_", "trtllm:", "pytrtllm:", "time_to_first_token_seconds", "nv_trt_llm_", "nv_llm_", "nv_inference_"),
    ("model_name", "model"),
    histograms={
        "ttft": _s(
            "trtllm_time_to_first_token_seconds", "trtllm:time_to_first_token_seconds", "time_to_first_token_seconds"
        ),
        "itl": _s(
            "trtllm_time_per_output_token_seconds",
            "trtllm:time_per_output_token_seconds",
            "time_per_output_token_seconds",
        ),
        "e2e": _s(
            "trtllm_e2e_request_latency_seconds", "trtllm:e2e_request_latency_seconds", "e2e_request_latency_seconds"
        ),
        "queue": _s("trtllm_request_queue_time_seconds", "trtllm:request_queue_time_seconds"),
        "prefill": _s("trtllm_request_prefill_time_seconds", "trtllm:request_prefill_time_seconds"),
        "decode": _s("trtllm_request_decode_time_seconds", "trtllm:request_decode_time_seconds"),
        "inference": _s("trtllm_request_inference_time_seconds", "trtllm:request_inference_time_seconds"),
    },
    gauges={
        "running": (
            *_s("trtllm_num_requests_running", "trtllm:num_requests_running", "pytrtllm:num_requests_running"),
            Source("nv_trt_llm_request_metrics", match=(("request_type", "scheduled"),)),
            Source("num_requests_running"),  # NIM (unprefixed, as PR #5785)
        ),
        "waiting": (
            *_s("trtllm_num_requests_waiting", "trtllm:num_requests_waiting", "pytrtllm:num_requests_waiting"),
            Source("nv_trt_llm_request_metrics", match=(("request_type", "waiting"),)),
            Source("nv_inference_pending_request_count"),  # Triton core: requests queued in the server
            Source("num_requests_waiting"),
        ),
        "kv_usage": (
            *_s("trtllm_kv_cache_utilization", "trtllm:kv_cache_utilization"),
            Source("nv_trt_llm_kv_cache_block_metrics", match=(("kv_cache_block_type", "fraction"),)),
            Source("gpu_cache_usage_perc"),
        ),
    },
    counters={
        "prompt_tokens": _s(
            "trtllm_prompt_tokens_total",
            "trtllm:prompt_tokens_total",
            "pytrtllm:prompt_tokens_total",
            "nv_llm_input_token_len_sum",
            "prompt_tokens_total",
        ),
        "generation_tokens": _s(
            "trtllm_generation_tokens_total",
            "trtllm:generation_tokens_total",
            "pytrtllm:generation_tokens_total",
            "nv_llm_output_token_len_sum",
            "generation_tokens_total",
        ),
        "cached_tokens": _s("trtllm_prompt_cached_tokens_total", "trtllm:prompt_cached_tokens_total"),
        "finished": (
            *_s("trtllm_request_success_total", "trtllm:request_success_total", dimension="finished_reason"),
            *_s("trtllm_request_error_total", "trtllm:request_error_total", fixed="error"),
            Source("pytrtllm:request_completed_total", fixed="success"),
            Source("pytrtllm:request_failed_total", fixed="error"),
            Source("nv_inference_request_success", fixed="success"),  # Triton core, any backend
            Source("nv_inference_request_failure", fixed="error"),
        ),
        # Triton core's cumulative microsecond counters: means per request over a window (DERIVED_MEANS)
        # (or, with --metrics-config counter_latencies=false summary_latencies=true, the summaries' _sum and _count;
        # their quantiles cover Triton's own sliding window and are not read)
        "requests": _s("nv_inference_request_success", "nv_inference_request_summary_us_count"),
        "e2e_seconds": _s("nv_inference_request_duration_us", "nv_inference_request_summary_us_sum", scale=1e-6),
        "queue_seconds": _s("nv_inference_queue_duration_us", "nv_inference_queue_summary_us_sum", scale=1e-6),
        "inference_seconds": _s(
            "nv_inference_compute_infer_duration_us", "nv_inference_compute_infer_summary_us_sum", scale=1e-6
        ),
    },
)

DYNAMO = Adapter(
    "dynamo",
    ("dynamo_frontend_",),
    ("model",),
    histograms={
        "ttft": _s("dynamo_frontend_time_to_first_token_seconds"),
        "itl": _s("dynamo_frontend_inter_token_latency_seconds"),
        "e2e": _s("dynamo_frontend_request_duration_seconds"),
    },
    # queued_requests counts from HTTP entry to the first token (prefill included): not a queue, not mapped
    gauges={"running": _s("dynamo_frontend_inflight_requests")},
    counters={
        # the per-request input length histogram's _sum: every prompt token the frontend has passed on
        "prompt_tokens": _s("dynamo_frontend_input_sequence_tokens_sum"),
        "generation_tokens": _s("dynamo_frontend_output_tokens_total"),
        # the requests the frontend answered with an error; its successes have no stop/length split, so (as TGI's)
        # only failures are counted
        "finished": (Source("dynamo_frontend_requests_total", match=(("status", "error"),), fixed="error"),),
    },
)

LITELLM = Adapter(
    "litellm",
    ("litellm_",),
    ("requested_model", "model"),  # the name the client asked for, else the upstream deployment's
    histograms={
        "ttft": _s("litellm_llm_api_time_to_first_token_metric"),  # streaming requests only
        "e2e": _s("litellm_request_total_latency_metric"),
    },
    counters={
        "prompt_tokens": _s("litellm_input_tokens_metric_total", "litellm_input_tokens_total"),
        "generation_tokens": _s("litellm_output_tokens_metric_total", "litellm_output_tokens_total"),
    },
)

# OpenVINO Model Server: per servable (label ``name``; a DAG's request time is under the DAG's name), microseconds
OVMS = Adapter(
    "ovms",
    ("ovms_",),
    ("name",),
    histograms={
        "e2e": _s("ovms_request_time_us", scale=1e-6),  # the whole request, summed over its interface (REST, gRPC)
        "queue": _s("ovms_wait_for_infer_req_time_us", scale=1e-6),  # waiting for a free inference request
        "inference": _s("ovms_inference_time_us", scale=1e-6),  # execution in the OpenVINO backend
    },
    gauges={"running": _s("ovms_current_requests")},  # received and not yet answered
)

ADAPTERS: dict[str, Adapter] = {a.kind: a for a in (VLLM, SGLANG, TGI, LLAMACPP, TRTLLM, DYNAMO, LITELLM, OVMS)}

# Quantities an engine exposes only with a feature switched on (or from a given version): their absence is the
# normal state of an engine without that feature, not a gap in what the agent reads (the doctor lists them apart).
FEATURE_QUANTITIES: dict[str, str] = {
    "cached_tokens": "prefix caching (newer versions count cached prompt tokens)",
    "prefix_hits": "prefix caching",
    "prefix_queries": "prefix caching",
    "prompt_by_source": "prefix caching / KV connector (newer vLLM)",
    "external_prefix_hits": "a KV connector with an external cache",
    "external_prefix_queries": "a KV connector with an external cache",
    "spec_accepted": "speculative decoding",
    "spec_accepted_by_position": "speculative decoding",
    "spec_draft_tokens": "speculative decoding",
    "spec_drafts": "speculative decoding",
    "spec_acceptance": "speculative decoding",
    "spec_acceptance_length": "speculative decoding",
    "kv_transfer": "disaggregated prefill/decode (KV transfer)",
    "kv_transfer_bytes": "disaggregated prefill/decode (KV transfer)",
    "kv_transfer_failures": "disaggregated prefill/decode (KV transfer)",
    "kv_transfer_latency": "disaggregated prefill/decode (KV transfer)",
}
if tuple(ADAPTERS) != ENGINE_KINDS:  # one adapter per catalogued engine kind, in detection order
    raise ImportError(
        f"adapters {tuple(ADAPTERS)} do not match inferwatch.agent.catalog.engine.ENGINE_KINDS {ENGINE_KINDS}"
    )


def prefixes_seen(text: str, limit: int = 8) -> list[str]:
    """Distinct family prefixes (up to the first ``:`` or ``_``) of the sample lines, for "unknown engine"."""
    seen: dict[str, None] = {}
    for line in text.split("\n"):
        line = line.lstrip(" \t")
        if not line or line[0] in "#{":
            continue
        cut = min((i for i in (line.find(":"), line.find("_")) if i > 0), default=-1)
        seen.setdefault(line[: cut + 1] if cut > 0 else line.split("{")[0].split(" ")[0])
        if len(seen) >= limit:
            break
    return list(seen)


def detect(text: str | bytes | bytearray) -> str | None:
    """The engine whose prefix starts a sample line of ``text`` (first in ENGINE_KINDS order), else None.

    ``text`` may be the undecoded body (the prefixes are ASCII).
    """
    raw = not isinstance(text, str)
    for kind in ENGINE_KINDS:
        for prefix in ADAPTERS[kind].prefixes:
            if raw:
                p = prefix.encode()
                if text.startswith(p) or (b"\n" + p) in text:  # type: ignore[arg-type]
                    return kind
            elif text.startswith(prefix) or ("\n" + prefix) in text:  # type: ignore[arg-type]
                return kind
    return None


# How far back from the newest ``lora_requests_info`` label set a blocked one counts (engine clock): the agent's default
# collection interval and Prometheus's scrape, so each scrape says whether requests were blocked at any step since the
# one before, not only at the instant it was taken.
LORA_RECENT_S = 15.0


@dataclass(frozen=True, slots=True)
class LoraState:
    """vLLM's LoRA scheduler state from ``vllm:lora_requests_info`` (the label set with the newest timestamp).

    ``running`` / ``waiting``: adapters with requests running / waiting; ``max_lora``: adapter slots per batch
    (``--max-loras``). ``blocked``: adapters with waiting requests that are not resident while every slot is
    taken, i.e. requests waiting for an adapter slot (vLLM's scheduler skips them until a slot frees).
    ``blocked_recent``: the most ``blocked`` of any label set set within :data:`LORA_RECENT_S` of the newest one.
    """

    running: frozenset[str]
    waiting: frozenset[str]
    max_lora: int
    blocked_recent: int = 0

    @property
    def blocked(self) -> int:
        if len(self.running) < self.max_lora:
            return 0
        return len(self.waiting - self.running)


def _lora_state(labels: Labels) -> LoraState:
    have = dict(labels)

    def names(key: str) -> frozenset[str]:
        return frozenset(n for n in have.get(key, "").split(",") if n)

    raw = have.get("max_lora", "0")
    try:
        max_lora = int(float(raw))
    except ValueError:
        raise SourceFormatError(f"lora_requests_info max_lora={raw[:40]!r} is not a number") from None
    if max_lora < 0:
        raise ReadingError(f"lora_requests_info max_lora={max_lora}: below zero", "negative_value")
    return LoraState(names("running_lora_adapters"), names("waiting_lora_adapters"), max_lora)


def read_lora(adapter: Adapter, expo: Exposition) -> LoraState | None:
    """The newest ``lora_requests_info`` label set, and how many adapters were blocked at most in the label sets of
    the :data:`LORA_RECENT_S` before it.

    vLLM sets the gauge to the current time under the label set of every step's adapters (its value is that
    wall-clock time) and keeps every set it ever set, so the sets with recent timestamps are the steps since then:
    slot contention between two reads shows even when a slot is free at the instant of the read.
    """
    sets = [(value, labels) for src in adapter.lora for labels, value in expo.get(src.name) if not math.isnan(value)]
    if not sets:
        return None
    newest_t, newest = max(sets, key=lambda s: s[0])
    state = _lora_state(newest)
    recent = max(_lora_state(labels).blocked for t, labels in sets if t >= newest_t - LORA_RECENT_S)
    return replace(state, blocked_recent=recent)


@dataclass
class ModelReading:
    """What one model's series say, summed over data-parallel ranks (histograms kept per series)."""

    histograms: dict[str, dict[Labels, Histogram]] = field(default_factory=dict)  # quantity → series → hist
    gauges: dict[str, float] = field(default_factory=dict)
    counters: dict[str, dict[str, float]] = field(default_factory=dict)  # name → dimension value → total
    sources: dict[str, str] = field(default_factory=dict)  # quantity/gauge/counter → family it came from
    ranks: dict[str, dict[str, float]] = field(default_factory=dict)  # DP rank → RANK_QUANTITIES present
    lora: LoraState | None = None


@dataclass(frozen=True, slots=True)
class Recognition:
    """Which release range and schema of the engine an exposition matches (agent/catalog/engine_schemas.py),
    and how many of the engine's own families it declares that no adapter source reads."""

    release_range: str = UNRECOGNISED
    schema: str = UNRECOGNISED
    unmapped_families: int = 0


@dataclass
class EngineReading:
    kind: str
    models: dict[str, ModelReading]
    series: int  # samples read
    models_dropped: int = 0  # distinct models past max_models, left out of ``models``
    recognition: Recognition = field(default_factory=Recognition)

    def coverage(self) -> dict[str, str]:
        """Per COVERAGE quantity: ``mapped``, ``derived (mean only)`` or ``not exposed``, over every model."""
        return {
            q: max((quantity_status(m, q) for m in self.models.values()), key=_RANK.__getitem__, default=NOT_EXPOSED)
            for q in COVERAGE
        }

    def recognised(self) -> int:
        """How many COVERAGE quantities are mapped or derived (the figure the schema-shrink alert compares)."""
        return sum(1 for status in self.coverage().values() if status != NOT_EXPOSED)


_RANK = {NOT_EXPOSED: 0, DERIVED: 1, MAPPED: 2}


def quantity_status(m: ModelReading, quantity: str) -> str:
    """``mapped`` when a source of the quantity was read for the model, ``derived (mean only)`` when both of
    its DERIVED_MEANS counters were, else ``not exposed``."""
    if quantity == "lora":
        return MAPPED if m.lora is not None else NOT_EXPOSED
    keys = COVERAGE_KEYS.get(quantity, (quantity,))
    if any(k in m.histograms or k in m.gauges or k in m.counters for k in keys):
        return MAPPED
    pair = DERIVED_MEANS.get(quantity)
    if pair is not None and all(k in m.counters for k in pair):
        return DERIVED
    return NOT_EXPOSED


def derived_mean(m: ModelReading, quantity: str) -> float | None:
    """The cumulative mean behind a ``derived (mean only)`` quantity: total seconds / total count since the
    engine started (seconds per request or per token), None when the count is 0 or a counter is missing."""
    pair = DERIVED_MEANS.get(quantity)
    if pair is None or not all(k in m.counters for k in pair):
        return None
    seconds, count = (sum(m.counters[k].values()) for k in pair)
    return seconds / count if count > 0 else None


_SUFFIXES = ("_bucket", "_sum", "_count", "_created")


def recognise(adapter: Adapter, expo: Exposition) -> Recognition:
    """The first schema of the engine whose conditions the exposition's families and labels meet; and the
    engine's own families (by the adapter's prefixes) that no source of the adapter reads."""
    declared = set(expo.types)
    for name in expo.samples:
        declared.add(name)
        for suffix in _SUFFIXES:
            if name.endswith(suffix):
                declared.add(name[: -len(suffix)])
                break
    families = frozenset(
        f[4:] if f.startswith("ray_vllm:") else "vllm:" + f[9:] if f.startswith("ray_vllm_") else f for f in declared
    )
    labels = frozenset(k for series in expo.samples.values() for k, _ in (series.labels[0] if len(series) else ()))
    found = next((s for s in schemas_of(adapter.kind) if s.matches(families, labels)), None)
    wanted = adapter.wanted()
    unmapped = sum(
        1
        for f in expo.types
        if f.startswith(adapter.prefixes)
        and not f.endswith("_created")  # a counter's creation time, declared as a gauge of its own by old clients
        and not any(f + sfx in wanted for sfx in ("", "_total", *_SUFFIXES))
    )
    if found is None:
        return Recognition(unmapped_families=unmapped)
    return Recognition(found.release_range, found.schema, unmapped)


class ReadingError(SourceFormatError):
    """A value the engine's quantity cannot take (a negative counter, a ratio above 1); ``reason`` as fetch's."""

    def __init__(self, message: str, reason: str) -> None:
        super().__init__(message)
        self.reason = reason


def _reject(src: Source, labels: Labels, value: float, why: str, reason: str) -> ReadingError:
    shown = ",".join(f'{k}="{v[:40]}"' for k, v in labels[:4])
    return ReadingError(f"{src.name}{{{shown}}} = {value:g}: {why}", reason)


_Key = Key  # (model, other labels sorted, le bound or None)
_NO_SKIP: frozenset[str] = frozenset()
# what a memo lookup returns for labels not memoised yet (None is a memoised "no match"); compared by identity
MISS: _Key = ("", (), None)
MAX_KEY_CACHE_ENTRIES = 200_000
_T = TypeVar("_T")


class KeyCache:
    """Memoised split of a label tuple into (model, remaining labels, ``le``), per label filter.

    The reader hands out the same label tuple objects scrape after scrape, so the memo is keyed by
    object identity: ``id(labels) → key`` (None: the filter does not match), and every memoised tuple is
    held (``_alive``) until the memo is cleared, so an id cannot be reused while it is a key. After the
    first scrape, one int-keyed dict lookup per sample. Keep one per target (``EngineParser`` does).
    """

    def __init__(self, model_labels: tuple[str, ...], default_model: str) -> None:
        self.model_labels = frozenset(model_labels)
        self.model_order = model_labels
        self.default_model = default_model
        self._memo: dict[tuple[tuple[str, str], ...], dict[int, _Key | None]] = {}
        self._alive: list[Labels] = []  # the tuples whose ids are memo keys
        self.generation = 0  # of the reader's caches the memoised tuples come from (Exposition.generation)
        self._le: dict[str, float] = {}
        # one object per model name and per remaining label tuple, so that the buckets of one series
        # (consecutive in an exposition) are told apart from the next series by identity
        self._same: dict[object, object] = {}

    @property
    def size(self) -> int:
        return len(self._alive)

    def clear(self) -> None:
        for memo in self._memo.values():  # emptied in place: a caller holding one sees it empty
            memo.clear()
        self._alive.clear()
        self._le.clear()
        self._same.clear()

    def memo(self, match: tuple[tuple[str, str], ...]) -> dict[int, _Key | None]:
        """The memo for one label filter: ``id(labels) → key``; a miss (``memo.get(id(labels), MISS) is MISS``)
        goes to :meth:`key`."""
        memo = self._memo.get(match)
        if memo is None:
            memo = self._memo[match] = {}
        return memo

    def key(self, labels: Labels, match: tuple[tuple[str, str], ...]) -> _Key | None:
        memo = self._memo.get(match)
        if memo is None:
            memo = self._memo[match] = {}
        out = memo.get(id(labels), MISS)
        if out is not MISS:
            return out
        out = self._split(labels, match)
        if len(self._alive) >= MAX_KEY_CACHE_ENTRIES:
            self.clear()
        memo[id(labels)] = out
        self._alive.append(labels)
        return out

    def fill(self, labels: list[Labels], match: tuple[tuple[str, str], ...]) -> bool:
        """Memoise the keys of those of ``labels`` not memoised yet, in bulk (``seriesmaps.memoise``; one by one
        through :meth:`key` under a label filter or near the bound on entries); True when any was new. A label tuple
        whose ``le`` is no number is left out: the per-sample read meets it (and rejects the reading) in order."""
        if memoise is None:
            return False  # one by one, as the samples come (KeyCache.key)
        memo = self.memo(match)
        before = len(memo)
        if match or len(self._alive) + len(labels) > MAX_KEY_CACHE_ENTRIES:
            for one in labels:
                if id(one) not in memo:
                    with contextlib.suppress(SourceFormatError):  # an le that is no number: left out, as below
                        self.key(one, match)
            return len(memo) > before
        order, same, default = self.model_order, self._same, self.default_model
        return memoise(labels, memo, self._alive, order, _NO_SKIP, same, default, self._le, self._number) > 0

    def _number(self, le_text: str) -> float | None:
        """The bound of an ``le`` text, None where it is no number."""
        try:
            return self._bound(le_text)
        except SourceFormatError:
            return None

    def _split(self, labels: Labels, match: tuple[tuple[str, str], ...]) -> _Key | None:
        if match:
            have = dict(labels)
            if any(have.get(k) != v for k, v in match):
                return None
            skip: frozenset[str] = frozenset(k for k, _ in match)
        else:
            skip = _NO_SKIP
        model, rest, le_text = split_one(labels, self.model_order, skip, self._same, self.default_model)
        return model, rest, self._bound(le_text)

    def _bound(self, le_text: str | None) -> float | None:
        """The bound of an ``le`` text (None for none), parsed once per text."""
        if le_text is None:
            return None
        le = self._le.get(le_text)
        if le is None:
            try:
                le = self._le[le_text] = parse_float(le_text)  # "+Inf" → inf
            except ValueError:
                raise SourceFormatError(f"bucket bound le={le_text[:40]!r} is not a number") from None
        return le


def read(
    adapter: Adapter,
    expo: Exposition,
    default_model: str = DEFAULT_MODEL,
    keys: KeyCache | None = None,
    max_models: int | None = None,
) -> EngineReading:
    """Map an exposition's samples to per-model canonical quantities (see the module docstring).

    ``max_models``: keep the first that many distinct models (in the order the adapter meets them:
    its families in order, each in exposition order); the others are counted in ``models_dropped``.
    """
    split = keys if keys is not None else KeyCache(adapter.model_labels, default_model)
    if split.generation != expo.generation:  # the reader dropped its caches: its label tuples are new objects
        split.clear()
        split.generation = expo.generation
    models: dict[str, ModelReading] = {}
    dropped: set[str] = set()
    cap = max_models if max_models is not None else math.inf
    spare = ModelReading()  # what a dropped model's samples are written into, then thrown away

    def model(name: str) -> ModelReading:
        m = models.get(name)
        if m is None:
            if len(models) >= cap:
                dropped.add(name)
                spare.histograms.clear()
                spare.gauges.clear()
                spare.counters.clear()
                return spare
            m = models[name] = ModelReading()
        return m

    for quantity, cands in adapter.histograms.items():
        taken: set[str] = set()
        for src in cands:
            step_aside()  # per family: a request the API answers goes first (agent/common/precedence.py)
            for mname, series in _histograms(src, expo, split).items():
                if mname in taken:
                    continue
                reading = model(mname)
                reading.histograms[quantity] = series
                reading.sources[quantity] = src.name
            taken.update(m for m, r in models.items() if quantity in r.histograms)

    for gname, cands in adapter.gauges.items():
        for src in cands:
            step_aside()
            domain = GAUGE_DOMAINS.get(gname)
            for mname, (total, n) in _scalars(src, expo, split, per_dimension=False, domain=domain).items():
                reading = model(mname)
                if gname in reading.gauges:
                    continue
                value = total[""] / n if gname in GAUGE_MEAN else total[""]
                reading.gauges[gname] = value * src.scale
                reading.sources[gname] = src.name

    for cname, cands in adapter.counters.items():
        for src in cands:
            step_aside()
            for mname, (total, _n) in _scalars(src, expo, split, per_dimension=True, domain=COUNTER_DOMAIN).items():
                reading = model(mname)
                if cname in reading.counters and cname not in COUNTER_ALL:
                    continue
                acc = reading.counters.setdefault(cname, {})
                for dim, v in total.items():
                    acc[dim] = acc.get(dim, 0.0) + v * src.scale
                reading.sources.setdefault(cname, src.name)
    for m in models.values():  # SGLang exposes its spec gauges at 0 without speculative decoding: absent, not 0
        if m.gauges.get("spec_acceptance_length") == 0.0:
            for g in ("spec_acceptance", "spec_acceptance_length"):
                m.gauges.pop(g, None)
                m.sources.pop(g, None)
    _read_ranks(adapter, expo, split, models)
    lora = read_lora(adapter, expo) if adapter.lora else None
    if lora is not None:  # vLLM serves one base model per process; the info gauge names none
        only = next(iter(models)) if len(models) == 1 else default_model
        if only in models or len(models) < cap:
            model(only).lora = lora
    return EngineReading(
        adapter.kind, models, expo.matched, len(dropped) + expo.models_dropped, recognise(adapter, expo)
    )


def _read_ranks(adapter: Adapter, expo: Exposition, keys: KeyCache, models: dict[str, ModelReading]) -> None:
    """Per data-parallel rank, the RANK_QUANTITIES from the family each one was read from (a second, small pass)."""
    for name in RANK_QUANTITIES:
        cands = adapter.gauges.get(name) or adapter.counters.get(name) or ()
        by_name = {src.name: src for src in cands}
        # family → the models that read this quantity from it: one pass over each family's samples
        # (not one per model), each sample added to its own model's ranks in exposition order
        readers: dict[str, dict[str, ModelReading]] = {}
        for mname, m in models.items():
            sname = m.sources.get(name, "")
            if sname in by_name:
                readers.setdefault(sname, {})[mname] = m
        for sname, of_model in readers.items():
            src = by_name[sname]
            for labels, value in expo.get(sname):
                k = keys.key(labels, src.match)
                if k is None or math.isnan(value):
                    continue
                reading = of_model.get(k[0])
                if reading is None:
                    continue
                rank = next((v for label, v in k[1] if label in RANK_LABELS), "0")
                acc = reading.ranks.setdefault(rank, {})
                acc[name] = acc.get(name, 0.0) + value * src.scale


def _histograms(src: Source, expo: Exposition, keys: KeyCache) -> dict[str, dict[Labels, Histogram]]:
    """Per model, per series, the source's histograms: the ``_bucket`` family taken in bulk where
    :func:`~inferwatch.agent.node.engine.seriesmaps.bucket_tuples` takes it (and the source has no scale), else
    sample by sample; both give the same histograms."""
    samples = expo.get(src.name + "_bucket")
    buckets = _in_bulk(bucket_tuples, src, samples, keys) if src.scale == 1.0 else None
    if buckets is None:
        buckets = {  # each series' dict let go as its tuple is made (~3 MB at 200 models x 2 ranks)
            series: tuple(sorted(b.items()))
            for series, b in _bucket_maps_by_sample(src, samples, keys).items()
            if math.inf in b  # else not a usable histogram (no +Inf bucket); Prometheus would return NaN
        }
    sums, counts = (_totals(src, expo, suffix, keys) for suffix in ("_sum", "_count"))
    out: dict[str, dict[Labels, Histogram]] = {}
    for (model, series), ordered in buckets.items():  # in order
        count = counts.get((model, series), ordered[-1][1])
        out.setdefault(model, {})[series] = Histogram(ordered, sums.get((model, series), math.nan), count)
    return out


def _in_bulk(
    step: Callable[[list[Labels], array[float], Memo], _T | None] | None, src: Source, samples: Series, keys: KeyCache
) -> _T | None:
    """A family's answer from one of :mod:`~inferwatch.agent.node.engine.seriesmaps`' bulk steps: the label tuples
    not memoised yet memoised first (a cold read), when the step says None for them; None where it does anyway, or
    where the step is not compiled."""
    if step is None:
        return None
    memo = keys.memo(src.match)
    got = step(samples.labels, samples.values, memo)
    if got is None and keys.fill(samples.labels, src.match):
        got = step(samples.labels, samples.values, memo)
    return got


def _keyed(
    samples: Series, keys: KeyCache, match: tuple[tuple[str, str], ...]
) -> Iterator[tuple[Labels, float, _Key | None]]:
    """The samples in order, each with its key (None: the label filter leaves it out): the memo looked up in bulk,
    the label tuples not memoised yet split in order; an ``le`` that is no number raises where its sample comes."""
    labels, values = samples.labels, samples.values
    found = list(map(keys.memo(match).get, map(id, labels), repeat(MISS)))
    for i in compress(range(len(found)), map(is_, found, repeat(MISS))):
        try:
            found[i] = keys.key(labels[i], match)
        except SourceFormatError:
            return chain(zip(labels[:i], values[:i], found[:i], strict=True), _raising(keys, labels[i], match))
    return zip(labels, values, found, strict=True)


def _raising(
    keys: KeyCache, labels: Labels, match: tuple[tuple[str, str], ...]
) -> Iterator[tuple[Labels, float, _Key]]:
    keys.key(labels, match)  # raises again, once the samples before it are read
    yield from ()


def _bucket_maps_by_sample(src: Source, samples: Series, keys: KeyCache) -> dict[SeriesKey, dict[float, float]]:
    """Each series' ``bound → count`` map, sample by sample, for every case (a bucket below zero rejects the reading; a
    scale applies to the finite bounds): what :func:`~inferwatch.agent.node.engine.seriesmaps.bucket_tuples` answers
    in bulk for the common case."""
    buckets: dict[SeriesKey, dict[float, float]] = {}
    scaled = src.scale != 1.0
    last_model: str | None = None
    last_series: Labels | None = None
    b: dict[float, float] = {}
    for labels, value, k in _keyed(samples, keys, src.match):
        if k is None:
            continue
        model, series, bound = k
        if bound is None:
            continue
        if series is not last_series or model is not last_model:  # the next series (KeyCache interns both)
            got = buckets.get((model, series))
            if got is None:
                got = buckets[(model, series)] = {}
            b, last_model, last_series = got, model, series
        if value < 0:
            raise _reject(src, labels, value, "a bucket below zero", "negative_value")
        if scaled and math.isfinite(bound):
            bound *= src.scale
        b[bound] = b.get(bound, 0.0) + value
    return buckets


def _totals(src: Source, expo: Exposition, suffix: str, keys: KeyCache) -> dict[SeriesKey, float]:
    """A histogram's ``_sum`` (scaled) or ``_count`` family per series, in bulk where
    :func:`~inferwatch.agent.node.engine.seriesmaps.totals` takes it, else sample by sample."""
    samples = expo.get(src.name + suffix)
    scale = src.scale if suffix == "_sum" else 1.0
    got = _in_bulk(totals, src, samples, keys) if scale == 1.0 else None
    return got if got is not None else _totals_by_sample(src, samples, suffix, scale, keys)


def _totals_by_sample(
    src: Source, samples: Series, suffix: str, scale: float, keys: KeyCache
) -> dict[SeriesKey, float]:
    """:func:`~inferwatch.agent.node.engine.seriesmaps.totals` sample by sample, for every case (a value below zero
    rejects the reading: a count, or a sum of durations, as every histogram an adapter reads is)."""
    into: dict[SeriesKey, float] = {}
    for labels, value, k in _keyed(samples, keys, src.match):
        if k is None:
            continue
        if value < 0:
            raise _reject(src, labels, value, f"{suffix[1:]} below zero", "negative_value")
        key = (k[0], k[1])
        into[key] = into.get(key, 0.0) + value * scale
    return into


def _scalars(
    src: Source,
    expo: Exposition,
    keys: KeyCache,
    per_dimension: bool,
    domain: tuple[float, float] | None = None,
) -> dict[str, tuple[dict[str, float], int]]:
    out: dict[str, tuple[dict[str, float], int]] = {}
    lo, hi = domain if domain is not None else (-math.inf, math.inf)
    samples = expo.get(src.name)
    keys.fill(samples.labels, src.match)  # a cold read's new label tuples split in bulk, not one by one below
    for labels, value in samples:
        if math.isnan(value):
            continue
        k = keys.key(labels, src.match)
        if k is None:
            continue
        if not lo <= value <= hi:  # only the samples this source reads (its label filter matched)
            if value < 0 and lo == 0:
                raise _reject(src, labels, value, "below zero", "negative_value")
            raise _reject(src, labels, value, f"outside {lo:g}..{hi:g}", "out_of_range")
        model, rest, _le = k
        if src.fixed is not None:
            dim = src.fixed
        elif per_dimension and src.dimension:
            dim = next((v for name, v in rest if name == src.dimension), "")
        else:
            dim = ""
        total, n = out.get(model, ({}, 0))
        total[dim] = total.get(dim, 0.0) + value
        out[model] = (total, n + 1)
    return out
