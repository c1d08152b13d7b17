"""LLM serving SLOs: latency percentiles, tail shape, error-budget burn, traffic and errors."""

from __future__ import annotations

from grafana_foundation_sdk.models import dashboard as dm

from inferwatch.dashboards.common import (
    SEL_MODEL,
    Board,
    Target,
    describe,
    engine_variables,
    quantiles,
    stat_panel,
    ts,
    value_map,
)

UID = "inferwatch-slo"

# The TTFT SLO is alerts/slo.yml's "ttft-500ms" (99 % of requests within 500 ms over 30 days); its burn-rate
# panels read the recording rules generated from it (alerts/slo.rules.yml), so panel and page agree.
TTFT_SLO_THRESHOLD_S = 0.5
TAIL_RATIO_THRESHOLD = 3  # P99/P50 above 3: jitter that more replicas will not fix (alerts: TAIL_RATIO_MAX)
FAST_BURN = 14.4  # spends 2 % of a 30-day budget in 1 h: pages (SRE workbook multiwindow, alerts/slo.rules.yml)
SLOW_BURN = 6  # spends 5 % of the budget in 6 h: pages
_BURN_WINDOWS = ("5m", "1h", "6h")
TTFT_SLO = "ttft-500ms"
AVAILABILITY_SLO = "availability-999"  # alerts/slo.yml: 99.9 % of inference requests answered without a 5xx
FAST_ERROR_RATIO = 0.05  # its fast page, EngineErrorRateHigh: above 5 % over 5 m

_TTFT = "gen_ai_server_time_to_first_token_seconds"
_FINISHED = "inferwatch_engine_requests_finished_total"
_BY = "instance, gen_ai_request_model"


def _burn(window: str) -> str:
    return (
        f'slo:sli_error:ratio_rate{window}{{slo="{TTFT_SLO}", gen_ai_request_model=~"$model"}} '
        "/ on (slo) group_left () slo:error_budget:ratio"
    )


def _availability_burn(window: str) -> str:
    return (
        f'slo:sli_error:ratio_rate{window}{{slo="{AVAILABILITY_SLO}"}} / on (slo) group_left () slo:error_budget:ratio'
    )


def build() -> dm.Dashboard:
    b = Board(
        UID,
        "inferwatch / LLM serving SLOs",
        "Latency percentiles, tail shape and error-budget burn per model and node, from the engine's histograms "
        "and the agent's windowed analytics.",
        engine_variables(),
    )
    b.row("Latency percentiles (engine histograms)")
    b.add(
        ts(
            "Time to first token P50 / P95 / P99",
            describe(
                "TTFT quantiles per model and node: histogram_quantile over the engine's TTFT buckets as 5 m "
                "rates (recorded by alerts/recording.rules.yml). P99 far above P95 points at queueing or a slow node; "
                f"the dashed line is the SLO threshold ({TTFT_SLO_THRESHOLD_S} s, alerts/slo.yml).",
                "TTFTErrorBudgetBurn",
            ),
            "s",
            quantiles(_TTFT, SEL_MODEL),
            steps=((None, "green"), (TTFT_SLO_THRESHOLD_S, "red")),
        ),
        8,
        9,
    )
    b.add(
        ts(
            "Inter-token latency P50 / P95 / P99",
            describe(
                "Time between output tokens during decode, per model and node. Rising ITL with flat TTFT means "
                "the batch is too large or decode is starved (KV cache, preemptions): see Engine internals.",
                "TailLatencyRatioHigh",
            ),
            "s",
            quantiles("gen_ai_server_time_per_output_token_seconds", SEL_MODEL),
        ),
        8,
        9,
    )
    b.add(
        ts(
            "End-to-end latency P50 / P95 / P99",
            describe(
                "Request duration to the last output token, per model and node. Dominated by output length; "
                "compare with ITL × tokens before blaming the engine.",
                "TailLatencyRatioHigh",
            ),
            "s",
            quantiles("gen_ai_server_request_duration_seconds", SEL_MODEL),
        ),
        8,
        9,
    )

    b.row("Tail shape (agent analytics, 5-minute window)")
    b.add(
        ts(
            "P99 / P50 ratio",
            describe(
                "Tail ratio of each request phase over the agent's 5-minute window (source: engine histograms "
                f"or OTLP spans). TailLatencyRatioHigh reads prefill: above {TAIL_RATIO_THRESHOLD} (dashed line) "
                "its tail is jitter — page cache, CPU contention, a slow node — that more replicas will not fix. "
                "TTFT grows with prompt length, so a wide prompt mix alone puts its ratio above the line "
                '(docs/benchmarks.md, "Tail ratio: which quantity").',
                "TailLatencyRatioHigh",
            ),
            "suffix:×",
            [
                Target(
                    "inferwatch_engine_latency_tail_ratio"
                    f'{{{SEL_MODEL}, window="5m", quantity=~"prefill|ttft|itl|e2e"}}',
                    "{{quantity}} {{gen_ai_request_model}} @ {{instance}} ({{source}})",
                )
            ],
            steps=((None, "green"), (TAIL_RATIO_THRESHOLD, "red")),
        ),
        10,
        9,
    )
    b.add(
        ts(
            "Bimodality statistic",
            describe(
                "The agent's bimodality statistic for each phase over the 5-minute window (definition and "
                "threshold in docs/engine.md). A rise means requests split into a fast and a slow population: "
                "one slow node, a cold cache, or a fallback code path.",
                "LatencyBimodal",
            ),
            "none",
            [
                Target(
                    f'inferwatch_engine_latency_bimodality{{{SEL_MODEL}, window="5m", quantity=~"ttft|itl|e2e"}}',
                    "{{quantity}} {{gen_ai_request_model}} @ {{instance}} ({{source}})",
                )
            ],
        ),
        8,
        9,
    )
    b.add(
        stat_panel(
            "Bimodal now",
            describe(
                "The agent's current verdict per model, node and phase: 'bimodal' (red) when the 5-minute "
                "distribution has two modes. Drill into the node with the Node pitfalls dashboard.",
                "LatencyBimodal",
            ),
            "none",
            [
                Target(
                    "max by (instance, gen_ai_request_model, quantity) "
                    f'(inferwatch_engine_latency_bimodal{{{SEL_MODEL}, window="5m", quantity=~"ttft|itl|e2e"}})',
                    "{{quantity}} {{gen_ai_request_model}} @ {{instance}}",
                    instant=True,
                )
            ],
            steps=((None, "green"), (1, "red")),
            mappings=[value_map({"0": ("unimodal", "green"), "1": ("bimodal", "red")})],
        ),
        6,
        9,
    )

    b.row("Error budget (SLO recording rules)")
    b.add(
        ts(
            "TTFT error-budget burn rate",
            describe(
                "How fast each SLO in alerts/slo.yml spends its 30-day error budget, per model, over 5 m, 1 h and "
                "6 h (SLI error ratio / error budget, from the recording rules in alerts/slo.rules.yml; fleet-wide "
                f"per model, so the node filter does not apply). 1 = exactly on budget. Above {FAST_BURN} on 1 h "
                f"and 5 m, or above {SLOW_BURN} on 6 h and 30 m, TTFTErrorBudgetBurn pages (dashed lines).",
                "TTFTErrorBudgetBurn",
            ),
            "suffix:×",
            [Target(_burn(w), f"{{{{slo}}}} {w} {{{{gen_ai_request_model}}}}") for w in _BURN_WINDOWS],
            steps=((None, "green"), (SLOW_BURN, "orange"), (FAST_BURN, "red")),
        ),
        16,
        8,
    )
    b.add(
        stat_panel(
            "Burn rate now (1 h)",
            describe(
                "The 1-hour burn rate per SLO and model at the end of the time range: green below "
                f"{SLOW_BURN}, orange from {SLOW_BURN}, red from {FAST_BURN} (the fast-burn paging level).",
                "TTFTErrorBudgetBurn",
            ),
            "suffix:×",
            [Target(_burn("1h"), "{{slo}} {{gen_ai_request_model}}", instant=True)],
            steps=((None, "green"), (SLOW_BURN, "orange"), (FAST_BURN, "red")),
        ),
        8,
        8,
    )

    b.add(
        ts(
            "Engine error ratio (HTTP 5xx, availability SLO)",
            describe(
                f"Share of inference requests (handlers /v1/...) each engine answered with a 5xx, over 5 m and 1 h, "
                f"from the engine's own http_requests_total (vLLM; the SLI of {AVAILABILITY_SLO} in alerts/slo.yml, "
                f"legend: the engine's scrape address). Above {FAST_ERROR_RATIO:.0%} over 5 m for 1 m, "
                "EngineErrorRateHigh pages (dashed line). Engines without HTTP metrics (TGI, llama.cpp) have none.",
                "EngineErrorRateHigh",
            ),
            "percentunit",
            [
                Target(f'slo:sli_error:ratio_rate{w}{{slo="{AVAILABILITY_SLO}"}}', f"{w} {{{{instance}}}}")
                for w in ("5m", "1h")
            ],
            steps=((None, "green"), (FAST_ERROR_RATIO, "red")),
        ),
        16,
        8,
    )
    b.add(
        stat_panel(
            "Availability burn rate now (1 h)",
            describe(
                f"The 1-hour burn rate of {AVAILABILITY_SLO} per engine: green below {SLOW_BURN}, orange from "
                f"{SLOW_BURN}, red from {FAST_BURN} (EngineErrorBudgetBurn pages there with the 5 m window).",
                "EngineErrorBudgetBurn",
            ),
            "suffix:×",
            [Target(_availability_burn("1h"), "{{instance}}", instant=True)],
            steps=((None, "green"), (SLOW_BURN, "orange"), (FAST_BURN, "red")),
        ),
        8,
        8,
    )

    b.row("Traffic and errors")
    b.add(
        ts(
            "Requests finished per second",
            describe(
                "Finished requests per second by model and node, all finish reasons (stop, length, abort, "
                "error). A drop to zero while requests are running is a hung engine.",
                "EngineHungButHealthy",
            ),
            "reqps",
            [
                Target(
                    f"sum by ({_BY}) (rate({_FINISHED}{{{SEL_MODEL}}}[$__rate_interval]))",
                    "{{gen_ai_request_model}} @ {{instance}}",
                )
            ],
        ),
        8,
        8,
    )
    b.add(
        ts(
            "Tokens per second",
            describe(
                "Prompt (prefill) and generated (decode) tokens per second by model and node, summed over "
                "data-parallel ranks. Generation throughput per node is the matrix's tokens/s.",
                None,
            ),
            "suffix: tok/s",
            [
                Target(
                    f"sum by ({_BY}, type) (rate(inferwatch_engine_tokens_total{{{SEL_MODEL}}}[$__rate_interval]))",
                    "{{type}} {{gen_ai_request_model}} @ {{instance}}",
                )
            ],
        ),
        8,
        8,
    )
    b.add(
        ts(
            "Errors by reason",
            describe(
                "Requests per second that did not finish normally (reason other than stop or length), by "
                "reason, as the engine counts them. 'abort' is usually a client timeout caused by high TTFT. "
                "Failures before the engine (HTTP 5xx) are in the availability panels above.",
                None,
            ),
            "reqps",
            [
                Target(
                    f"sum by ({_BY}, reason) "
                    f'(rate({_FINISHED}{{{SEL_MODEL}, reason!~"stop|length"}}[$__rate_interval]))',
                    "{{reason}} {{gen_ai_request_model}} @ {{instance}}",
                )
            ],
        ),
        8,
        8,
    )
    return b.build()
