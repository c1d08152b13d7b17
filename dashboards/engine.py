"""Engine internals: where request time goes, batch and KV-cache state, preemptions, TTFT distribution."""

from __future__ import annotations

from grafana_foundation_sdk.models import dashboard as dm

from inferwatch.dashboards.common import (
    SEL_MODEL,
    SEL_NODE,
    Board,
    Target,
    describe,
    engine_variables,
    heatmap_panel,
    stat_panel,
    trace_link,
    trace_url_variable,
    ts,
    value_map,
)

UID = "inferwatch-engine"
KV_CACHE_HIGH_RATIO = 0.9  # above 90 % the scheduler starts preempting (vLLM's default watermark area)
_BY = "instance, gen_ai_request_model"
_LAT = "inferwatch_engine_latency_seconds"


def build() -> dm.Dashboard:
    b = Board(
        UID,
        "inferwatch / Engine internals",
        "Where request time goes inside the engine (queue, prefill, decode, front-end), batch and KV-cache "
        "state, preemptions and the TTFT distribution.",
        [*engine_variables(), trace_url_variable()],
    )
    b.row("Where time goes (agent analytics, 5-minute window)")
    b.add(
        ts(
            "Queue, prefill and decode time P95",
            describe(
                "P95 of the time requests spend queued, in prefill and in decode, per model and node. Prefill "
                "grows with prompt length and batch contention; decode with output length and ITL. Queue time "
                "growing first means the node is saturated.",
                "TailLatencyRatioHigh",
            ),
            "s",
            [
                Target(
                    f"max by ({_BY}, quantity) "
                    f'({_LAT}{{{SEL_MODEL}, quantity=~"queue|prefill|decode", quantile="0.95", window="5m"}})',
                    "{{quantity}} {{gen_ai_request_model}} @ {{instance}}",
                )
            ],
        ),
        12,
        9,
    )
    b.add(
        ts(
            "TTFT vs queue + prefill (front-end gap)",
            describe(
                "Median TTFT next to median queue + prefill time, and the agent's front-end gap (mean TTFT − "
                "(queue + prefill)): time spent in the API server, tokenisation, chat templating and IPC before "
                "the engine sees the request. A gap that grows while prefill stays flat is a front-end problem "
                "(CPU-starved API server, slow tokenizer), not a GPU one.",
                None,
            ),
            "s",
            [
                Target(
                    f'max by ({_BY}) ({_LAT}{{{SEL_MODEL}, quantity="ttft", quantile="0.5", window="5m"}})',
                    "TTFT P50 {{gen_ai_request_model}} @ {{instance}}",
                ),
                Target(
                    f"sum by ({_BY}) (max by ({_BY}, quantity) "
                    f'({_LAT}{{{SEL_MODEL}, quantity=~"queue|prefill", quantile="0.5", window="5m"}}))',
                    "queue + prefill P50 {{gen_ai_request_model}} @ {{instance}}",
                ),
                Target(
                    f'inferwatch_engine_frontend_gap_seconds{{{SEL_MODEL}, window="5m"}}',
                    "front-end gap {{gen_ai_request_model}} @ {{instance}}",
                ),
            ],
        ),
        12,
        9,
    )

    b.add(
        ts(
            "TTFT and request duration P99 from spans, with exemplars",
            describe(
                "P99 of time to first token and of request duration from the span receiver's histograms "
                "(receiver.emit_histograms), with exemplars: each dot is a recent request in that latency bucket; "
                "its link opens the trace ($trace_url followed by the trace id). inferwatch explain --model M "
                "names the phase behind the tail (docs/explain.md).",
                "TailLatencyRatioHigh",
            ),
            "s",
            [
                Target(
                    f"histogram_quantile(0.99, sum by ({_BY}, le) "
                    f"(rate(gen_ai_server_time_to_first_token_seconds_bucket{{{SEL_MODEL}}}[$__rate_interval])))",
                    "TTFT P99 {{gen_ai_request_model}} @ {{instance}}",
                    exemplar=True,
                ),
                Target(
                    f"histogram_quantile(0.99, sum by ({_BY}, le) "
                    f"(rate(gen_ai_server_request_duration_seconds_bucket{{{SEL_MODEL}}}[$__rate_interval])))",
                    "duration P99 {{gen_ai_request_model}} @ {{instance}}",
                    exemplar=True,
                ),
            ],
        ).data_links([trace_link()]),
        24,
        9,
    )

    b.row("Batch and KV cache")
    b.add(
        ts(
            "Running and waiting requests",
            describe(
                "Requests in the running batch and in the waiting queue, per model and node. A waiting queue "
                "that does not drain while running is flat means the batch is capped (KV cache or max_num_seqs). "
                "Requests running with no tokens produced is a "
                "hung engine.",
                "EngineHungButHealthy",
            ),
            "short",
            [
                Target(
                    f"inferwatch_engine_requests_running{{{SEL_MODEL}}}",
                    "running {{gen_ai_request_model}} @ {{instance}}",
                ),
                Target(
                    f"inferwatch_engine_requests_waiting{{{SEL_MODEL}}}",
                    "waiting {{gen_ai_request_model}} @ {{instance}}",
                ),
            ],
        ),
        8,
        8,
    )
    b.add(
        ts(
            "KV-cache usage",
            describe(
                "Fraction of KV-cache blocks in use. Sustained above "
                f"{KV_CACHE_HIGH_RATIO:.0%} (dashed line) the scheduler preempts requests, which shows up as "
                "ITL spikes and preemptions.",
                None,
            ),
            "percentunit",
            [
                Target(
                    f"inferwatch_engine_kv_cache_usage_ratio{{{SEL_MODEL}}}", "{{gen_ai_request_model}} @ {{instance}}"
                )
            ],
            steps=((None, "green"), (KV_CACHE_HIGH_RATIO, "red")),
            max_val=1,
        ),
        8,
        8,
    )
    b.add(
        ts(
            "Preemptions per second",
            describe(
                "Requests preempted (evicted from the batch and recomputed or swapped) per second. Any "
                "sustained rate wastes prefill work and inflates ITL; lower max_num_seqs or add KV memory.",
                None,
            ),
            "short",
            [
                Target(
                    f"sum by ({_BY}) (rate(inferwatch_engine_preemptions_total{{{SEL_MODEL}}}[$__rate_interval]))",
                    "{{gen_ai_request_model}} @ {{instance}}",
                )
            ],
        ),
        8,
        8,
    )

    b.row("Distribution and health")
    b.add(
        heatmap_panel(
            "TTFT distribution",
            describe(
                "Requests per TTFT bucket over time (engine histogram increases, all selected models and "
                "nodes). Two bright bands instead of one is bimodal latency; a band creeping upwards is "
                "queueing.",
                "TTFTErrorBudgetBurn",
            ),
            "s",
            [
                Target(
                    "sum by (le) (increase(gen_ai_server_time_to_first_token_seconds_bucket"
                    f"{{{SEL_MODEL}}}[$__rate_interval]))",
                    "{{le}}",
                    fmt="heatmap",
                )
            ],
        ),
        18,
        9,
    )
    b.add(
        stat_panel(
            "Engine metrics scrape",
            describe(
                "Whether the agent could read and parse the engine's /metrics on its last scrape, per node "
                "and engine. 'down' blanks every other panel for that node.",
                "EngineDown",
            ),
            "none",
            [
                Target(
                    'inferwatch_engine_up{job=~"$job", instance=~"$instance", engine=~"$engine"}',
                    "{{engine}} @ {{instance}}",
                    instant=True,
                )
            ],
            steps=((None, "red"), (1, "green")),
            mappings=[value_map({"0": ("down", "red"), "1": ("up", "green")})],
        ),
        6,
        9,
    )
    b.row("Synthetic probe (client's view)")
    b.add(
        ts(
            "Probe TTFT and ITL",
            describe(
                "Time to first token and mean inter-token latency measured by the agent's synthetic streaming "
                "request, per protocol (OpenAI chat, Anthropic messages). The client's view: when it diverges "
                "from the engine's TTFT, the time is lost in front of the engine (proxy, API server).",
                "TailLatencyRatioHigh",
            ),
            "s",
            [
                Target(f"inferwatch_probe_ttft_seconds{{{SEL_NODE}}}", "TTFT {{protocol}} @ {{instance}}"),
                Target(f"inferwatch_probe_itl_seconds{{{SEL_NODE}}}", "ITL {{protocol}} @ {{instance}}"),
            ],
        ),
        12,
        8,
    )
    b.add(
        ts(
            "Stream schema violations and probe HTTP errors",
            describe(
                "Probe stream chunks off-schema (empty delta carrying usage, malformed JSON, missing [DONE], "
                "wrong event order ...) and probe requests answered with an HTTP error, per minute, by kind. "
                "Any violation breaks strict client SDKs even though the server reports success.",
                "StreamSchemaViolation",
            ),
            "short",
            [
                Target(
                    "sum by (instance, protocol, kind) "
                    f"(increase(inferwatch_probe_schema_violations_total{{{SEL_NODE}}}[$__rate_interval]))",
                    "{{kind}} {{protocol}} @ {{instance}}",
                ),
                Target(
                    "sum by (instance, protocol, error_type) "
                    f"(increase(inferwatch_probe_http_errors_total{{{SEL_NODE}}}[$__rate_interval]))",
                    "HTTP {{error_type}} {{protocol}} @ {{instance}}",
                ),
            ],
        ),
        12,
        8,
    )
    engine_signal_rows(b)
    return b.build()


def _rec(name: str, legend: str, extra: str = "") -> Target:
    """A recorded series of alerts/engine-signals.rules.yml (per node and model, summed over DP ranks)."""
    return Target(f"{name}{{{SEL_MODEL}{extra}}}", legend + " {{gen_ai_request_model}} @ {{instance}}")


def engine_signal_rows(b: Board) -> None:
    """A row per engine-signal family, from the recording rules of alerts/engine-signals.rules.yml."""
    b.row("Prefix cache and tokens")
    b.add(
        ts(
            "Prefix-cache hit ratio",
            describe(
                "Prompt tokens found in the prefix cache / prompt tokens looked up, over 1 and 5 minutes (vLLM's "
                "prefix_cache_hits / queries; SGLang and TensorRT-LLM: cached / prompt tokens), and the external "
                "(KV-connector) cache's ratio where there is one. A collapse against the same hour yesterday is a "
                "prompt that stopped sharing its prefix, eviction, or prefix caching switched off.",
                "PrefixCacheHitRatioCollapsed",
            ),
            "percentunit",
            [
                _rec("instance_model:inferwatch_engine_prefix_cache_hit:ratio_rate1m", "1m"),
                _rec("instance_model:inferwatch_engine_prefix_cache_hit:ratio_rate5m", "5m"),
                _rec("instance_model:inferwatch_engine_external_prefix_cache_hit:ratio_rate5m", "external 5m"),
            ],
            max_val=1,
        ),
        8,
        8,
    )
    b.add(
        ts(
            "Tokens per second by type",
            describe(
                "Prompt, generation and cached prompt tokens per second (1m rate), summed over data-parallel "
                "ranks. Cached tokens rising with prompt tokens flat is the prefix cache saving prefill work.",
                None,
            ),
            "short",
            [_rec("instance_model_type:inferwatch_engine_tokens:rate1m", "{{type}}")],
        ),
        8,
        8,
    )
    b.add(
        ts(
            "Prompt tokens by source",
            describe(
                "Prompt tokens per second by where their KV came from (vLLM's prompt_tokens_by_source): "
                "computed here, local prefix-cache hit, or pulled over a KV connector from another instance "
                "(the decode side of a prefill/decode pair).",
                "PrefixCacheHitRatioCollapsed",
            ),
            "short",
            [_rec("instance_model_source:inferwatch_engine_prompt_tokens_by_source:rate5m", "{{source}}")],
        ),
        8,
        8,
    )
    b.row("Preemption")
    b.add(
        ts(
            "Preemptions per finished request, with KV usage",
            describe(
                "Preemptions per finished request over 5 minutes, beside the KV-cache usage: preemptions while the "
                "cache is full are capacity (more KV memory, fewer sequences); preemptions with a half-empty cache "
                "point elsewhere. Above 1, requests are preempted more than once on average (thrashing).",
                "KVCacheSaturatedWithPreemptions",
            ),
            "short",
            [
                _rec("instance_model:inferwatch_engine_preemptions_per_request:ratio_rate5m", "per request"),
                Target(
                    f"inferwatch_engine_kv_cache_usage_ratio{{{SEL_MODEL}}}",
                    "KV usage {{gen_ai_request_model}} @ {{instance}}",
                ),
            ],
        ),
        24,
        8,
    )
    b.row("Speculative decoding")
    b.add(
        ts(
            "Draft acceptance rate",
            describe(
                "Accepted / proposed draft tokens over 5 minutes (vLLM's spec_decode counters; SGLang's own "
                "spec_accept_rate). A fall to a fraction of its usual level after a deploy is a draft that no "
                "longer matches the target model.",
                "SpecDecodeAcceptanceCollapsed",
            ),
            "percentunit",
            [_rec("instance_model:inferwatch_engine_spec_decode_acceptance:ratio_rate5m", "acceptance")],
            max_val=1,
        ),
        8,
        8,
    )
    b.add(
        ts(
            "Mean acceptance length",
            describe(
                "Tokens produced per target-model step: 1 + accepted / drafts over 5 minutes (SGLang: its "
                "spec_accept_length). Near 1, speculation saves no step and only costs draft compute.",
                "SpecDecodeAcceptanceCollapsed",
            ),
            "short",
            [_rec("instance_model:inferwatch_engine_spec_decode_acceptance_length:mean_rate5m", "length")],
        ),
        8,
        8,
    )
    b.add(
        ts(
            "Acceptance by draft position",
            describe(
                "Share of drafts whose token at each position was accepted (vLLM's per-position counter / drafts). "
                "Position 0 collapsing means the draft is wrong from its first token (a mismatch); only later "
                "positions falling means harder text: speculate fewer tokens.",
                "SpecDecodeAcceptanceCollapsed",
            ),
            "percentunit",
            [
                _rec(
                    "instance_model_position:inferwatch_engine_spec_decode_acceptance:ratio_rate5m",
                    "position {{position}}",
                )
            ],
            max_val=1,
        ),
        8,
        8,
    )
    b.row("LoRA adapters")
    b.add(
        ts(
            "LoRA adapters running, waiting and slots",
            describe(
                "Adapters with requests in the batch and in the queue, and the adapter slots per batch (vLLM "
                "--max-loras), from vLLM's lora_requests_info (its newest label set).",
                "LoRARequestsWaitingForAdapterSlot",
            ),
            "short",
            [
                Target(
                    f"inferwatch_engine_lora_adapters{{{SEL_MODEL}}}",
                    "{{state}} {{gen_ai_request_model}} @ {{instance}}",
                ),
                Target(
                    f"inferwatch_engine_lora_max_adapters{{{SEL_MODEL}}}",
                    "slots {{gen_ai_request_model}} @ {{instance}}",
                ),
            ],
        ),
        12,
        8,
    )
    b.add(
        ts(
            "Adapters waiting for a slot",
            describe(
                "Adapters whose requests waited while every slot was taken by other adapters, at any step of the 15 s "
                "before each scrape: their requests queue however idle the GPU is. Above 0 at half the scrapes of 3 "
                "minutes pages.",
                "LoRARequestsWaitingForAdapterSlot",
            ),
            "short",
            [Target(f"inferwatch_engine_lora_blocked{{{SEL_MODEL}}}", "{{gen_ai_request_model}} @ {{instance}}")],
        ),
        12,
        8,
    )
    b.row("Prefill/decode KV transfer and goodput")
    b.add(
        ts(
            "KV-transfer time",
            describe(
                "Time to move a request's KV cache from the prefill to the decode instance: mean over 5 minutes "
                "(vLLM's NIXL connector histogram, SGLang's own latency gauge) and P95 from the histogram.",
                "GoodputBelowTarget",
            ),
            "s",
            [
                _rec("instance_model:inferwatch_engine_kv_transfer_duration_seconds:mean_rate5m", "mean"),
                Target(
                    f"histogram_quantile(0.95, sum by ({_BY}, le) (rate(inferwatch_engine_kv_transfer_duration_seconds"
                    f"_bucket{{{SEL_MODEL}}}[$__rate_interval])))",
                    "P95 {{gen_ai_request_model}} @ {{instance}}",
                ),
            ],
        ),
        6,
        8,
    )
    b.add(
        ts(
            "KV-transfer share of TTFT",
            describe(
                "Mean KV-transfer time / mean TTFT: the prefill-to-decode handoff's share of time to first token on "
                "the decode instance. A share that grows while prefill is unchanged is the transfer path (RDMA "
                "link, UCX transports), not compute.",
                "GoodputBelowTarget",
            ),
            "percentunit",
            [_rec("instance_model:inferwatch_engine_kv_transfer_ttft_share:ratio_rate5m", "TTFT share")],
        ),
        6,
        8,
    )
    b.add(
        ts(
            "KV-transfer throughput",
            describe(
                "Bytes per second moved by KV transfers (vLLM's NIXL connector), over 5 minutes. Divided by the "
                "transfer time it is the link's effective bandwidth.",
                "GoodputBelowTarget",
            ),
            "suffix:B/s",
            [_rec("instance_model:inferwatch_engine_kv_transfer_bytes:rate5m", "bytes/s")],
        ),
        6,
        8,
    )
    b.add(
        ts(
            "Goodput (bounded from histograms)",
            describe(
                "Share of requests that met TTFT <= 0.5 s and time per output token <= 0.1 s together: exact from "
                "the agent's spans where it has them; the histograms only bound it (at most the smaller of the two "
                "shares, at least their sum minus one). The alert reads the exact figure, else the upper bound, "
                "against the 90% objective.",
                "GoodputBelowTarget",
            ),
            "percentunit",
            [
                Target(
                    f'inferwatch_engine_goodput_ratio{{{SEL_MODEL}, window="5m"}}',
                    "exact (spans) {{gen_ai_request_model}} @ {{instance}}",
                ),
                _rec("instance_model:inferwatch_goodput:ratio_upper_rate5m", "upper bound"),
                _rec("instance_model:inferwatch_goodput:ratio_lower_rate5m", "lower bound"),
            ],
            max_val=1,
        ),
        6,
        8,
    )
