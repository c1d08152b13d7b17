"""``/metrics`` exactly as vLLM v1 (≈0.11–0.12) exposes it, on the simulator's own registry.

Families, types, HELP text, label names (``model_name``, ``engine``) and default buckets are vLLM's
(``vllm/v1/metrics/loggers.py``; checked against ``tests/fixtures/vllm/v1_contract.json``). Counters
are declared without ``_total`` and prometheus_client exposes ``_total`` and ``_created``, as vLLM
does. The deprecated ``vllm:gpu_cache_usage_perc`` and ``vllm:time_per_output_token_seconds`` exist
only with ``show_hidden=True`` (vLLM's ``--show-hidden-metrics-for-version``). The HTTP families are
those of prometheus_fastapi_instrumentator that vLLM mounts (``status`` grouped as ``2xx``).

Observation points follow vLLM: scheduler gauges and token counters per engine step; TTFT and ITL as
tokens come out; the phase histograms, token-count histograms and ``request_success`` when a request
finishes.
"""

from __future__ import annotations

from prometheus_client import (
    GC_COLLECTOR,
    PLATFORM_COLLECTOR,
    PROCESS_COLLECTOR,
    CollectorRegistry,
    Counter,
    Gauge,
    Histogram,
)

from inferwatch.simulator.engine import SOURCES, EngineCore, Features, SimRequest
from inferwatch.simulator.profiles import Deployment

TTFT_BUCKETS = (
    0.001, 0.005, 0.01, 0.02, 0.04, 0.06, 0.08, 0.1, 0.25, 0.5, 0.75, 1.0, 2.5, 5.0, 7.5, 10.0, 20.0, 40.0,
    80.0, 160.0, 640.0, 2560.0,
)  # fmt: skip
ITL_BUCKETS = (
    0.01, 0.025, 0.05, 0.075, 0.1, 0.15, 0.2, 0.3, 0.4, 0.5, 0.75, 1.0, 2.5, 5.0, 7.5, 10.0, 20.0, 40.0, 80.0,
)  # fmt: skip
REQUEST_LATENCY_BUCKETS = (
    0.3, 0.5, 0.8, 1.0, 1.5, 2.0, 2.5, 5.0, 10.0, 15.0, 20.0, 30.0, 40.0, 50.0, 60.0, 120.0, 240.0, 480.0,
    960.0, 1920.0, 7680.0,
)  # fmt: skip
ITERATION_TOKENS_BUCKETS = (1, 8, 16, 32, 64, 128, 256, 512, 1024, 2048, 4096, 8192, 16384)
PARAMS_N_BUCKETS = (1, 2, 5, 10, 20)
HTTP_LOWR_BUCKETS = (0.1, 0.5, 1.0)
HTTP_HIGHR_BUCKETS = (
    0.01, 0.025, 0.05, 0.075, 0.1, 0.25, 0.5, 0.75, 1.0, 1.5, 2.0, 2.5, 3.0, 3.5, 4.0, 4.5, 5.0, 7.5, 10.0,
    30.0, 60.0,
)  # fmt: skip
FINISH_REASONS = ("stop", "length", "abort", "error")
# NixlPromMetrics (vllm/distributed/kv_transfer/kv_connector/v1/nixl_connector.py): xfer time drops the first edge
NIXL_TIME_BUCKETS = (0.001, 0.005, 0.01, 0.025, 0.05, 0.075, 0.1, 0.2, 0.3, 0.5, 0.75, 1.0, 5.0)
NIXL_BYTES_BUCKETS = tuple(2 ** (10 + i) for i in range(1, 25, 2))  # 2 KiB .. 8 GiB
# vLLM keeps every label set it ever set; the simulator the newest 256 (the agent reads those of the last 15 s: at
# 8 adapters contending for one slot a step's set changes every few steps)
LORA_INFO_KEEP = 256
LABELS = ["model_name", "engine"]


def build_1_2_5_buckets(max_value: int) -> list[int]:
    """1, 2, 5, 10, 20, 50, … up to ``max_value`` (vLLM's token-count buckets)."""
    out: list[int] = []
    exponent = 0
    while True:
        for m in (1, 2, 5):
            value = m * 10**exponent
            if value > max_value:
                return out
            out.append(value)
        exponent += 1


def cache_config_labels(dep: Deployment, engine: int) -> dict[str, str]:
    """vLLM's ``CacheConfig.metrics_info()``: every field as a string label, plus ``engine``."""
    return {
        "block_size": str(dep.block_size),
        "cache_dtype": "auto",
        "calculate_kv_scales": "False",
        "cpu_offload_gb": "0",
        "enable_prefix_caching": "True",
        "engine": str(engine),
        "gpu_memory_utilization": str(dep.gpu_memory_utilization),
        "is_attention_free": "False",
        "num_cpu_blocks": "None",
        "num_gpu_blocks": str(dep.num_gpu_blocks),
        "num_gpu_blocks_override": "None",
        "prefix_caching_hash_algo": "sha256",
        "sliding_window": "None",
        "swap_space": "4",
    }


class _PerEngine:
    """Bound children of one model's families for one engine (label lookups done once)."""

    def __init__(self, m: VllmMetrics, model: str, engine: int) -> None:
        lv = (model, str(engine))
        self.running = m.running.labels(*lv)
        self.waiting = m.waiting.labels(*lv)
        self.kv_usage = m.kv_usage.labels(*lv)
        self.gpu_cache_usage = m.gpu_cache_usage.labels(*lv) if m.gpu_cache_usage else None
        self.prefix_queries = m.prefix_queries.labels(*lv)
        self.prefix_hits = m.prefix_hits.labels(*lv)
        for fam in (m.mm_queries, m.mm_hits):
            fam.labels(*lv)
        self.ext_queries = m.ext_prefix_queries.labels(*lv)
        self.ext_hits = m.ext_prefix_hits.labels(*lv)
        self._ext_seen = (0, 0)
        self.preemptions = m.preemptions.labels(*lv)
        self.prompt_tokens = m.prompt_tokens.labels(*lv)
        self.generation_tokens = m.generation_tokens.labels(*lv)
        self.success = {r: m.success.labels(model, str(engine), r) for r in FINISH_REASONS}
        self.req_prompt = m.req_prompt.labels(*lv)
        self.req_generation = m.req_generation.labels(*lv)
        self.iteration_tokens = m.iteration_tokens.labels(*lv)
        self.max_num_generation = m.max_num_generation.labels(*lv)
        self.params_n = m.params_n.labels(*lv)
        self.params_max_tokens = m.params_max_tokens.labels(*lv)
        self.ttft = m.ttft.labels(*lv)
        self.tpot = m.tpot.labels(*lv) if m.tpot else None
        self.itl = m.itl.labels(*lv)
        self.req_tpot = m.req_tpot.labels(*lv)
        self.e2e = m.e2e.labels(*lv)
        self.queue = m.queue.labels(*lv)
        self.inference = m.inference.labels(*lv)
        self.prefill = m.prefill.labels(*lv)
        self.decode = m.decode.labels(*lv)
        for state, value in (("awake", 1), ("weights_offloaded", 0), ("discard_all", 0)):
            m.sleep_state.labels(model, str(engine), state).set(value)
        self._prefix_seen = (0, 0)
        self.by_source = {src: m.prompt_by_source.labels(model, str(engine), src) for src in SOURCES}
        self.cached = m.prompt_cached.labels(*lv)
        self._sources_seen = dict.fromkeys(SOURCES, 0)
        self._cached_seen = 0
        self.spec = (
            (m.spec_drafts.labels(*lv), m.spec_draft_tokens.labels(*lv), m.spec_accepted.labels(*lv))
            if m.spec_drafts is not None and m.spec_draft_tokens is not None and m.spec_accepted is not None
            else None
        )
        self.spec_pos = (
            [m.spec_per_pos.labels(model, str(engine), str(i)) for i in range(m.features.num_speculative_tokens)]
            if m.spec_per_pos is not None
            else []
        )
        self._spec_seen = (0, 0, 0, [0] * len(self.spec_pos))
        self.nixl = (
            (m.nixl_xfer.labels(*lv), m.nixl_bytes.labels(*lv), m.nixl_failed.labels(*lv))
            if m.nixl_xfer is not None and m.nixl_bytes is not None and m.nixl_failed is not None
            else None
        )
        if self.nixl is not None and m.nixl_notif is not None:
            m.nixl_notif.labels(*lv)
        self._metrics = m

    def step(self, core: EngineCore, prompt_tokens: int, generation_tokens: int, preempted: int) -> None:
        self.running.set(len(core.running))
        self.waiting.set(core.num_waiting)
        usage = core.kv_usage
        self.kv_usage.set(usage)
        if self.gpu_cache_usage is not None:
            self.gpu_cache_usage.set(usage)
        q, h = core.prefix_queries, core.prefix_hits
        if q != self._prefix_seen[0]:
            self.prefix_queries.inc(q - self._prefix_seen[0])
            self.prefix_hits.inc(h - self._prefix_seen[1])
            self._prefix_seen = (q, h)
        for src in SOURCES:
            n = core.prompt_by_source[src]
            if n != self._sources_seen[src]:
                self.by_source[src].inc(n - self._sources_seen[src])
                self._sources_seen[src] = n
        if core.external_queries != self._ext_seen[0]:
            self.ext_queries.inc(core.external_queries - self._ext_seen[0])
            self.ext_hits.inc(core.external_hits - self._ext_seen[1])
            self._ext_seen = (core.external_queries, core.external_hits)
        if core.prompt_cached != self._cached_seen:
            self.cached.inc(core.prompt_cached - self._cached_seen)
            self._cached_seen = core.prompt_cached
        if self.spec is not None and core.spec_drafts != self._spec_seen[0]:
            d, t, a, pos = self._spec_seen
            self.spec[0].inc(core.spec_drafts - d)
            self.spec[1].inc(core.spec_draft_tokens - t)
            self.spec[2].inc(core.spec_accepted - a)
            for i, child in enumerate(self.spec_pos):
                child.inc(core.spec_accepted_per_pos[i] - pos[i])
            self._spec_seen = (core.spec_drafts, core.spec_draft_tokens, core.spec_accepted,
                               list(core.spec_accepted_per_pos))  # fmt: skip
        if core.kv_transfers:
            if self.nixl is not None:
                for seconds, nbytes in core.kv_transfers:
                    self.nixl[0].observe(seconds)
                    self.nixl[1].observe(nbytes)
            core.kv_transfers.clear()
        if self._metrics.lora_info is not None:
            self._metrics.lora(core)
        if preempted:
            self.preemptions.inc(preempted)
        if prompt_tokens:
            self.prompt_tokens.inc(prompt_tokens)
        if generation_tokens:
            self.generation_tokens.inc(generation_tokens)
        if prompt_tokens or generation_tokens:
            self.iteration_tokens.observe(prompt_tokens + generation_tokens)

    def token(self, req: SimRequest, now: float, itl: float | None) -> None:
        if itl is None:
            if req.generated == 1:
                self.ttft.observe(now - req.arrival)
            return
        self.itl.observe(itl)
        if self.tpot is not None:
            self.tpot.observe(itl)

    def finish(self, req: SimRequest) -> None:
        self.success[req.finish_reason or "error"].inc()
        end = req.finished_at or 0.0
        self.e2e.observe(end - req.arrival)
        scheduled = req.first_scheduled  # vLLM keeps the first SCHEDULED timestamp across preemptions
        if scheduled is not None:
            self.queue.observe(scheduled - req.queued)
        if req.first_token is not None and scheduled is not None and req.last_token is not None:
            self.prefill.observe(req.first_token - scheduled)
            self.inference.observe(req.last_token - scheduled)
            self.decode.observe(req.last_token - req.first_token)
            decode = req.last_token - req.first_token
            self.req_tpot.observe(decode / (req.generated - 1) if req.generated > 1 else 0.0)
        self.req_prompt.observe(req.prompt_tokens)
        self.req_generation.observe(req.generated)
        self.max_num_generation.observe(req.max_tokens)
        self.params_n.observe(1)
        if req.max_tokens_param:
            self.params_max_tokens.observe(req.max_tokens_param)


class VllmMetrics:
    """All vLLM families on one registry; :meth:`engine` returns the bound children of one engine."""

    def __init__(
        self,
        max_model_len: int,
        show_hidden: bool = False,
        process_metrics: bool = True,
        features: Features | None = None,
    ) -> None:
        self.registry = CollectorRegistry(auto_describe=True)
        self.features = f = features or Features()
        if process_metrics:
            for c in (PROCESS_COLLECTOR, PLATFORM_COLLECTOR, GC_COLLECTOR):
                self.registry.register(c)
        r = self.registry
        tokens = build_1_2_5_buckets(max_model_len)
        self.running = Gauge(
            "vllm:num_requests_running", "Number of requests in model execution batches.", LABELS, registry=r
        )
        self.waiting = Gauge(
            "vllm:num_requests_waiting", "Number of requests waiting to be processed.", LABELS, registry=r
        )
        self.sleep_state = Gauge(
            "vllm:engine_sleep_state",
            "Engine sleep state; awake = 0 means engine is sleeping; awake = 1 means engine is awake; "
            "weights_offloaded = 1 means sleep level 1; discard_all = 1 means sleep level 2.",
            [*LABELS, "sleep_state"],
            registry=r,
        )
        self.gpu_cache_usage = (
            Gauge(
                "vllm:gpu_cache_usage_perc",
                "GPU KV-cache usage. 1 means 100 percent usage.DEPRECATED: Use vllm:kv_cache_usage_perc instead.",
                LABELS,
                registry=r,
            )
            if show_hidden
            else None
        )
        self.kv_usage = Gauge(
            "vllm:kv_cache_usage_perc", "KV-cache usage. 1 means 100 percent usage.", LABELS, registry=r
        )
        self.prefix_queries = Counter(
            "vllm:prefix_cache_queries",
            "Prefix cache queries, in terms of number of queried tokens.",
            LABELS,
            registry=r,
        )
        self.prefix_hits = Counter(
            "vllm:prefix_cache_hits", "Prefix cache hits, in terms of number of cached tokens.", LABELS, registry=r
        )
        self.ext_prefix_queries = Counter(
            "vllm:external_prefix_cache_queries",
            "External prefix cache queries from KV connector cross-instance cache sharing, in terms of number of "
            "queried tokens.",
            LABELS,
            registry=r,
        )
        self.ext_prefix_hits = Counter(
            "vllm:external_prefix_cache_hits",
            "External prefix cache hits from KV connector cross-instance cache sharing, in terms of number of "
            "cached tokens.",
            LABELS,
            registry=r,
        )
        self.mm_queries = Counter(
            "vllm:mm_cache_queries",
            "Multi-modal cache queries, in terms of number of queried items.",
            LABELS,
            registry=r,
        )
        self.mm_hits = Counter(
            "vllm:mm_cache_hits", "Multi-modal cache hits, in terms of number of cached items.", LABELS, registry=r
        )
        self.preemptions = Counter(
            "vllm:num_preemptions", "Cumulative number of preemption from the engine.", LABELS, registry=r
        )
        self.prompt_by_source = Counter(
            "vllm:prompt_tokens_by_source",
            "Number of prompt tokens by source.",
            [*LABELS, "source"],
            registry=r,
        )
        self.prompt_cached = Counter(
            "vllm:prompt_tokens_cached", "Number of cached prompt tokens (local + external).", LABELS, registry=r
        )
        # Speculative decoding (vllm/v1/spec_decode/metrics.py): registered only with a speculative config
        spec = f.num_speculative_tokens > 0
        self.spec_drafts = (
            Counter("vllm:spec_decode_num_drafts", "Number of spec decoding drafts.", LABELS, registry=r)
            if spec
            else None
        )
        self.spec_draft_tokens = (
            Counter("vllm:spec_decode_num_draft_tokens", "Number of draft tokens.", LABELS, registry=r)
            if spec
            else None
        )
        self.spec_accepted = (
            Counter("vllm:spec_decode_num_accepted_tokens", "Number of accepted tokens.", LABELS, registry=r)
            if spec
            else None
        )
        self.spec_per_pos = (
            Counter(
                "vllm:spec_decode_num_accepted_tokens_per_pos",
                "Accepted tokens per draft position.",
                [*LABELS, "position"],
                registry=r,
            )
            if spec
            else None
        )
        # LoRA (--enable-lora): an info gauge without model_name/engine, value = time the label set was last set
        self.lora_info = (
            Gauge(
                "vllm:lora_requests_info",
                "Running stats on lora requests.",
                ["max_lora", "waiting_lora_adapters", "running_lora_adapters"],
                registry=r,
            )
            if f.max_loras > 0
            else None
        )
        self._lora_sets: dict[tuple[str, str, str], None] = {}
        self._lora_state: dict[int, tuple[list[str], list[str]]] = {}
        # The NIXL KV connector (--kv-transfer-config '{"kv_connector":"NixlConnector",...}')
        nixl = f.kv_connector
        self.nixl_xfer = (
            Histogram(
                "vllm:nixl_xfer_time_seconds",
                "Histogram of transfer duration for NIXL KV Cache transfers.",
                LABELS,
                buckets=NIXL_TIME_BUCKETS[1:],
                registry=r,
            )
            if nixl
            else None
        )
        self.nixl_bytes = (
            Histogram(
                "vllm:nixl_bytes_transferred",
                "Histogram of bytes transferred per NIXL KV Cache transfers.",
                LABELS,
                buckets=NIXL_BYTES_BUCKETS,
                registry=r,
            )
            if nixl
            else None
        )
        self.nixl_failed = (
            Counter("vllm:nixl_num_failed_transfers", "Number of failed NIXL KV Cache transfers.", LABELS, registry=r)
            if nixl
            else None
        )
        self.nixl_notif = (
            Counter(
                "vllm:nixl_num_failed_notifications",
                "Number of failed NIXL KV Cache notifications.",
                LABELS,
                registry=r,
            )
            if nixl
            else None
        )
        self.prompt_tokens = Counter("vllm:prompt_tokens", "Number of prefill tokens processed.", LABELS, registry=r)
        self.generation_tokens = Counter(
            "vllm:generation_tokens", "Number of generation tokens processed.", LABELS, registry=r
        )
        self.success = Counter(
            "vllm:request_success",
            "Count of successfully processed requests.",
            [*LABELS, "finished_reason"],
            registry=r,
        )
        self.req_prompt = Histogram(
            "vllm:request_prompt_tokens", "Number of prefill tokens processed.", LABELS, buckets=tokens, registry=r
        )
        self.req_generation = Histogram(
            "vllm:request_generation_tokens", "Number of generation tokens processed.", LABELS, buckets=tokens,
            registry=r,
        )  # fmt: skip
        self.iteration_tokens = Histogram(
            "vllm:iteration_tokens_total",
            "Histogram of number of tokens per engine_step.",
            LABELS,
            buckets=ITERATION_TOKENS_BUCKETS,
            registry=r,
        )
        self.max_num_generation = Histogram(
            "vllm:request_max_num_generation_tokens",
            "Histogram of maximum number of requested generation tokens.",
            LABELS,
            buckets=tokens,
            registry=r,
        )
        self.params_n = Histogram(
            "vllm:request_params_n", "Histogram of the n request parameter.", LABELS, buckets=PARAMS_N_BUCKETS,
            registry=r,
        )  # fmt: skip
        self.params_max_tokens = Histogram(
            "vllm:request_params_max_tokens",
            "Histogram of the max_tokens request parameter.",
            LABELS,
            buckets=tokens,
            registry=r,
        )
        self.ttft = Histogram(
            "vllm:time_to_first_token_seconds",
            "Histogram of time to first token in seconds.",
            LABELS,
            buckets=TTFT_BUCKETS,
            registry=r,
        )
        self.tpot = (
            Histogram(
                "vllm:time_per_output_token_seconds",
                "Histogram of time per output token in seconds.DEPRECATED: Use vllm:inter_token_latency_seconds "
                "instead.",
                LABELS,
                buckets=ITL_BUCKETS,
                registry=r,
            )
            if show_hidden
            else None
        )
        self.itl = Histogram(
            "vllm:inter_token_latency_seconds",
            "Histogram of inter-token latency in seconds.",
            LABELS,
            buckets=ITL_BUCKETS,
            registry=r,
        )
        self.req_tpot = Histogram(
            "vllm:request_time_per_output_token_seconds",
            "Histogram of time_per_output_token_seconds per request.",
            LABELS,
            buckets=ITL_BUCKETS,
            registry=r,
        )
        phase = REQUEST_LATENCY_BUCKETS
        self.e2e = Histogram(
            "vllm:e2e_request_latency_seconds", "Histogram of e2e request latency in seconds.", LABELS,
            buckets=phase, registry=r,
        )  # fmt: skip
        self.queue = Histogram(
            "vllm:request_queue_time_seconds", "Histogram of time spent in WAITING phase for request.", LABELS,
            buckets=phase, registry=r,
        )  # fmt: skip
        self.inference = Histogram(
            "vllm:request_inference_time_seconds", "Histogram of time spent in RUNNING phase for request.", LABELS,
            buckets=phase, registry=r,
        )  # fmt: skip
        self.prefill = Histogram(
            "vllm:request_prefill_time_seconds", "Histogram of time spent in PREFILL phase for request.", LABELS,
            buckets=phase, registry=r,
        )  # fmt: skip
        self.decode = Histogram(
            "vllm:request_decode_time_seconds", "Histogram of time spent in DECODE phase for request.", LABELS,
            buckets=phase, registry=r,
        )  # fmt: skip
        self._cache_info: Gauge | None = None
        self.http_requests = Counter(
            "http_requests_total",
            "Total number of requests by method, status and handler.",
            ["handler", "method", "status"],
            registry=r,
        )
        self.http_duration = Histogram(
            "http_request_duration_seconds",
            "Latency with only few buckets by handler. Made to be only used if aggregation by handler is important. ",
            ["handler", "method"],
            buckets=HTTP_LOWR_BUCKETS,
            registry=r,
        )
        self.http_duration_highr = Histogram(
            "http_request_duration_highr_seconds",
            "Latency with many buckets but no API specific labels. Made for more accurate percentile calculations. ",
            buckets=HTTP_HIGHR_BUCKETS,
            registry=r,
        )

    def engine(self, model: str, index: int, dep: Deployment) -> _PerEngine:
        labels = cache_config_labels(dep, index)
        if self._cache_info is None:
            self._cache_info = Gauge(
                "vllm:cache_config_info",
                "Information of the LLMEngine CacheConfig",
                list(labels),
                registry=self.registry,
            )
        self._cache_info.labels(**labels).set(1)
        return _PerEngine(self, model, index)

    def lora(self, core: EngineCore) -> None:
        """Set the LoRA info gauge to now under the label set of every engine's adapters (vLLM joins the names)."""
        assert self.lora_info is not None
        self._lora_state[core.index] = core.lora_state()
        running = sorted({a for r, _ in self._lora_state.values() for a in r})
        waiting = sorted({a for _, w in self._lora_state.values() for a in w})
        key = (str(self.features.max_loras), ",".join(waiting), ",".join(running))
        self._lora_sets.pop(key, None)
        self._lora_sets[key] = None
        self.lora_info.labels(*key).set_to_current_time()
        while len(self._lora_sets) > LORA_INFO_KEEP:
            old = next(iter(self._lora_sets))
            del self._lora_sets[old]
            self.lora_info.remove(*old)

    def http(self, handler: str, method: str, status: int, seconds: float) -> None:
        self.http_requests.labels(handler, method, f"{status // 100}xx").inc()
        self.http_duration.labels(handler, method).observe(seconds)
        self.http_duration_highr.observe(seconds)
