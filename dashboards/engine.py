"""Engine internals: where request time goes, batch and KV-cache state, preemptions, TTFT distribution."""

from __future__ import annotations

from grafana_foundation_sdk.models import dashboard as dm

from dashboards.common import (
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
    return b.build()
