"""Engine adapters: which families each engine exposes and how they map to canonical quantities.

An :class:`Adapter` lists, per canonical quantity, candidate sources in order of preference (the
first one present for a model wins: vLLM's current ``inter_token_latency_seconds`` before the
deprecated ``time_per_output_token_seconds``). :func:`read` turns the samples of one exposition into
an :class:`EngineReading`: per model, the cumulative histograms of each timing quantity **per
series** (one per data-parallel rank, so resets are handled per rank, as ``increase`` does), the
gauges summed over ranks (KV-cache usage averaged), and the counters summed over ranks.

Anything an engine does not expose is simply missing from the reading (absent, never zero).
Names, labels and buckets: ``/work/shared/reference/engines.md`` §1 and §4.
"""

from __future__ import annotations

import math
from dataclasses import dataclass, field

from agent.engine.exposition import Exposition, ExpositionReader, Labels
from agent.engine.histogram import Histogram

QUANTITIES = ("ttft", "itl", "e2e", "queue", "prefill", "decode", "inference")
ENGINE_KINDS = ("vllm", "sglang", "tgi", "llamacpp", "trtllm")
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

    def wanted(self) -> frozenset[str]:
        names: set[str] = set()
        for cands in self.histograms.values():
            for src in cands:
                names.update((src.name + "_bucket", src.name + "_sum", src.name + "_count"))
        for group in (self.gauges, self.counters):
            for cands in group.values():
                names.update(src.name for src in cands)
        return frozenset(names)

    def reader(self) -> ExpositionReader:
        return ExpositionReader(self.prefixes, self.wanted())


GAUGE_MEAN = frozenset({"kv_usage"})  # averaged over ranks; every other gauge is summed
# Counters whose candidates are all used (summed by dimension) instead of first-present-wins.
COUNTER_ALL = frozenset({"finished"})

VLLM = Adapter(
    "vllm",
    ("vllm:",),
    ("model_name",),
    histograms={
        "ttft": _s("vllm:time_to_first_token_seconds"),
        "itl": _s("vllm:inter_token_latency_seconds", "vllm:time_per_output_token_seconds"),
        "e2e": _s("vllm:e2e_request_latency_seconds"),
        "queue": _s("vllm:request_queue_time_seconds"),
        "prefill": _s("vllm:request_prefill_time_seconds"),
        "decode": _s("vllm:request_decode_time_seconds"),
        "inference": _s("vllm:request_inference_time_seconds"),
    },
    gauges={
        "running": _s("vllm:num_requests_running"),
        "waiting": _s("vllm:num_requests_waiting"),
        "kv_usage": _s("vllm:kv_cache_usage_perc", "vllm:gpu_cache_usage_perc"),
    },
    counters={
        "prompt_tokens": _s("vllm:prompt_tokens_total"),
        "generation_tokens": _s("vllm:generation_tokens_total"),
        "preemptions": _s("vllm:num_preemptions_total"),
        "finished": _s("vllm:request_success_total", dimension="finished_reason"),
    },
)

SGLANG = Adapter(
    "sglang",
    ("sglang:",),
    ("model_name",),
    histograms={
        "ttft": _s("sglang:time_to_first_token_seconds"),
        "itl": _s("sglang:inter_token_latency_seconds", "sglang:time_per_output_token_seconds"),
        "e2e": _s("sglang:e2e_request_latency_seconds"),
        "queue": _s("sglang:queue_time_seconds"),
        "prefill": _s("sglang:per_stage_req_latency_seconds", match=(("stage", "prefill_forward"),)),
    },
    gauges={
        "running": _s("sglang:num_running_reqs"),
        "waiting": _s("sglang:num_queue_reqs"),
        "kv_usage": _s("sglang:token_usage"),
    },
    counters={
        "prompt_tokens": _s("sglang:prompt_tokens_total"),
        "generation_tokens": _s("sglang:generation_tokens_total"),
        "preemptions": _s("sglang:num_retracted_requests_total"),
        "finished": _s("sglang:num_aborted_requests_total", fixed="abort"),
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
    gauges={"running": _s("llamacpp:requests_processing"), "waiting": _s("llamacpp:requests_deferred")},
    counters={
        "prompt_tokens": _s("llamacpp:prompt_tokens_total"),
        "generation_tokens": _s("llamacpp:tokens_predicted_total"),
        "prompt_seconds": _s("llamacpp:prompt_seconds_total"),
        "generation_seconds": _s("llamacpp:tokens_predicted_seconds_total"),
    },
)

TRTLLM = Adapter(
    "trtllm",
    ("trtllm_", "trtllm:", "nv_trt_llm_", "nv_llm_"),
    ("model_name", "model"),
    histograms={
        "ttft": _s("trtllm_time_to_first_token_seconds", "trtllm:time_to_first_token_seconds"),
        "itl": _s("trtllm_time_per_output_token_seconds", "trtllm:time_per_output_token_seconds"),
        "e2e": _s("trtllm_e2e_request_latency_seconds", "trtllm:e2e_request_latency_seconds"),
        "queue": _s("trtllm_request_queue_time_seconds", "trtllm:request_queue_time_seconds"),
        "prefill": _s("trtllm_request_prefill_time_seconds", "trtllm:request_prefill_time_seconds"),
        "decode": _s("trtllm_request_decode_time_seconds", "trtllm:request_decode_time_seconds"),
        "inference": _s("trtllm_request_inference_time_seconds", "trtllm:request_inference_time_seconds"),
    },
    gauges={
        "running": (
            *_s("trtllm_num_requests_running", "trtllm:num_requests_running"),
            Source("nv_trt_llm_request_metrics", match=(("request_type", "scheduled"),)),
        ),
        "waiting": (
            *_s("trtllm_num_requests_waiting", "trtllm:num_requests_waiting"),
            Source("nv_trt_llm_request_metrics", match=(("request_type", "waiting"),)),
        ),
        "kv_usage": (
            *_s("trtllm_kv_cache_utilization", "trtllm:kv_cache_utilization"),
            Source("nv_trt_llm_kv_cache_block_metrics", match=(("kv_cache_block_type", "fraction"),)),
        ),
    },
    counters={
        "prompt_tokens": _s("trtllm_prompt_tokens_total", "trtllm:prompt_tokens_total", "nv_llm_input_token_len_sum"),
        "generation_tokens": _s(
            "trtllm_generation_tokens_total", "trtllm:generation_tokens_total", "nv_llm_output_token_len_sum"
        ),
        "finished": (
            *_s("trtllm_request_success_total", "trtllm:request_success_total", dimension="finished_reason"),
            *_s("trtllm_request_error_total", "trtllm:request_error_total", fixed="error"),
        ),
    },
)

ADAPTERS: dict[str, Adapter] = {a.kind: a for a in (VLLM, SGLANG, TGI, LLAMACPP, TRTLLM)}


def detect(text: str) -> str | None:
    """The engine whose prefix starts a sample line of ``text`` (first in ENGINE_KINDS order), else None."""
    for kind in ENGINE_KINDS:
        for prefix in ADAPTERS[kind].prefixes:
            if text.startswith(prefix) or ("\n" + prefix) in text:
                return kind
    return None


@dataclass
class ModelReading:
    """What one model's series say, summed over data-parallel ranks (histograms kept per series)."""

    histograms: dict[str, dict[Labels, Histogram]] = field(default_factory=dict)  # quantity → series → hist
    gauges: dict[str, float] = field(default_factory=dict)
    counters: dict[str, dict[str, float]] = field(default_factory=dict)  # name → dimension value → total
    sources: dict[str, str] = field(default_factory=dict)  # quantity/gauge/counter → family it came from


@dataclass
class EngineReading:
    kind: str
    models: dict[str, ModelReading]
    series: int  # samples read


_LE_CACHE: dict[str, float] = {}


def _le(text: str) -> float:
    v = _LE_CACHE.get(text)
    if v is None:
        v = float(text)  # "+Inf" → inf
        if len(_LE_CACHE) < 10_000:
            _LE_CACHE[text] = v
    return v


class _Split:
    """Splits a label tuple into (model, dimension value, other labels) with per-tuple memoisation."""

    def __init__(self, model_labels: tuple[str, ...], default_model: str) -> None:
        self.model_labels = model_labels
        self.default_model = default_model

    def model_of(self, d: dict[str, str]) -> str:
        for key in self.model_labels:
            v = d.pop(key, None)
            if v is not None:
                for other in self.model_labels:
                    d.pop(other, None)
                return v
        return self.default_model


def _matches(d: dict[str, str], match: tuple[tuple[str, str], ...]) -> bool:
    ok = True
    for k, v in match:  # pops every matched label, so it does not split the series
        ok = d.pop(k, None) == v and ok
    return ok


def read(adapter: Adapter, expo: Exposition, default_model: str = DEFAULT_MODEL) -> EngineReading:
    """Map an exposition's samples to per-model canonical quantities (see the module docstring)."""
    split = _Split(adapter.model_labels, default_model)
    models: dict[str, ModelReading] = {}

    def model(name: str) -> ModelReading:
        m = models.get(name)
        if m is None:
            m = models[name] = ModelReading()
        return m

    for quantity, cands in adapter.histograms.items():
        taken: set[str] = set()
        for src in cands:
            for mname, series in _histograms(src, expo, split).items():
                if mname in taken:
                    continue
                reading = model(mname)
                reading.histograms[quantity] = series
                reading.sources[quantity] = src.name
            taken.update(m for m, r in models.items() if quantity in r.histograms)

    for gname, cands in adapter.gauges.items():
        for src in cands:
            for mname, (total, n) in _scalars(src, expo, split, per_dimension=False).items():
                reading = model(mname)
                if gname in reading.gauges:
                    continue
                value = total[""] / n if gname in GAUGE_MEAN else total[""]
                reading.gauges[gname] = value * src.scale
                reading.sources[gname] = src.name

    for cname, cands in adapter.counters.items():
        for src in cands:
            for mname, (total, _n) in _scalars(src, expo, split, per_dimension=True).items():
                reading = model(mname)
                if cname in reading.counters and cname not in COUNTER_ALL:
                    continue
                acc = reading.counters.setdefault(cname, {})
                for dim, v in total.items():
                    acc[dim] = acc.get(dim, 0.0) + v * src.scale
                reading.sources.setdefault(cname, src.name)
    return EngineReading(adapter.kind, models, expo.matched)


def _histograms(src: Source, expo: Exposition, split: _Split) -> dict[str, dict[Labels, Histogram]]:
    buckets: dict[tuple[str, Labels], dict[float, float]] = {}
    sums: dict[tuple[str, Labels], float] = {}
    counts: dict[tuple[str, Labels], float] = {}
    for labels, value in expo.get(src.name + "_bucket"):
        d = dict(labels)
        le = d.pop("le", None)
        if le is None or (src.match and not _matches(d, src.match)):
            continue
        key = (split.model_of(d), tuple(sorted(d.items())))
        b = buckets.get(key)
        if b is None:
            b = buckets[key] = {}
        bound = _le(le) * (src.scale if math.isfinite(_le(le)) else 1.0)
        b[bound] = b.get(bound, 0.0) + value
    for suffix, into in (("_sum", sums), ("_count", counts)):
        for labels, value in expo.get(src.name + suffix):
            d = dict(labels)
            if src.match and not _matches(d, src.match):
                continue
            key = (split.model_of(d), tuple(sorted(d.items())))
            into[key] = into.get(key, 0.0) + value * (src.scale if suffix == "_sum" else 1.0)
    out: dict[str, dict[Labels, Histogram]] = {}
    for (mname, series), b in buckets.items():
        if math.inf not in b:
            continue  # not a usable histogram (no +Inf bucket); Prometheus would return NaN
        ordered = tuple(sorted(b.items()))
        count = counts.get((mname, series), ordered[-1][1])
        out.setdefault(mname, {})[series] = Histogram(ordered, sums.get((mname, series), math.nan), count)
    return out


def _scalars(
    src: Source, expo: Exposition, split: _Split, per_dimension: bool
) -> dict[str, tuple[dict[str, float], int]]:
    out: dict[str, tuple[dict[str, float], int]] = {}
    for labels, value in expo.get(src.name):
        if math.isnan(value):
            continue
        d = dict(labels)
        if src.match and not _matches(d, src.match):
            continue
        mname = split.model_of(d)
        if src.fixed is not None:
            dim = src.fixed
        elif per_dimension and src.dimension:
            dim = d.get(src.dimension, "")
        else:
            dim = ""
        total, n = out.get(mname, ({}, 0))
        total[dim] = total.get(dim, 0.0) + value
        out[mname] = (total, n + 1)
    return out
