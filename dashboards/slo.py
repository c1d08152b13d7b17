"""LLM serving SLOs: latency percentiles, tail shape, error-budget burn, traffic and errors."""

from __future__ import annotations

from grafana_foundation_sdk.models import dashboard as dm

from dashboards.common import (
    RB_BIMODAL,
    RB_ERROR_BURN,
    RB_TAIL_RATIO,
    RB_TTFT_BURN,
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

# SLOs drawn on this dashboard. The TTFT threshold must be an engine bucket boundary (agent/catalog/engine.py
# TTFT_BUCKETS_S) so the good-request count is exact, not interpolated.
TTFT_SLO_THRESHOLD_S = "2.5"  # le label value: requests with TTFT <= 2.5 s are good
TTFT_SLO_OBJECTIVE = 0.99  # 99 % of requests within the threshold
AVAILABILITY_OBJECTIVE = 0.999  # 99.9 % of finished requests not ended by an engine error
TAIL_RATIO_THRESHOLD = 3  # P99/P50 above 3: jitter that more replicas will not fix (catalog description)
FAST_BURN = 14.4  # burn rate that spends 2 % of a 30-day budget in 1 h (Google SRE workbook, multiwindow)
SLOW_BURN = 6  # 5 % of the budget in 6 h

_TTFT = "gen_ai_server_time_to_first_token_seconds"
_FINISHED = "inferwatch_engine_requests_finished_total"
_BY = "instance, gen_ai_request_model"


def _ttft_burn(window: str) -> str:
    good = f'sum by ({_BY}) (rate({_TTFT}_bucket{{{SEL_MODEL}, le="{TTFT_SLO_THRESHOLD_S}"}}[{window}]))'
    total = f"sum by ({_BY}) (rate({_TTFT}_count{{{SEL_MODEL}}}[{window}]))"
    return f"(1 - {good} / {total}) / {1 - TTFT_SLO_OBJECTIVE:.3g}"


def _error_burn(window: str) -> str:
    bad = f'sum by ({_BY}) (rate({_FINISHED}{{{SEL_MODEL}, reason="error"}}[{window}]))'
    total = f"sum by ({_BY}) (rate({_FINISHED}{{{SEL_MODEL}}}[{window}]))"
    return f"({bad} or {total} * 0) / {total} / {1 - AVAILABILITY_OBJECTIVE:.3g}"


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
                "TTFT quantiles per model and node, computed with histogram_quantile over the engine's TTFT "
                "buckets at the panel's rate interval. P99 far above P95 points at queueing or a slow node; "
                f"the dashed line is the SLO threshold ({TTFT_SLO_THRESHOLD_S} s).",
                RB_TTFT_BURN,
            ),
            "s",
            quantiles(_TTFT, SEL_MODEL),
            steps=((None, "green"), (float(TTFT_SLO_THRESHOLD_S), "red")),
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
                RB_TAIL_RATIO,
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
                RB_TAIL_RATIO,
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
                f"or OTLP spans). Above {TAIL_RATIO_THRESHOLD} (dashed line) the tail is jitter — page cache, "
                "CPU contention, a slow node — that more replicas will not fix.",
                RB_TAIL_RATIO,
            ),
            "x",
            [
                Target(
                    f'inferwatch_engine_latency_tail_ratio{{{SEL_MODEL}, window="5m", quantity=~"ttft|itl|e2e"}}',
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
                RB_BIMODAL,
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
                RB_BIMODAL,
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

    b.row("Error budget")
    b.add(
        ts(
            "TTFT error-budget burn rate",
            describe(
                f"How fast the TTFT SLO ({TTFT_SLO_OBJECTIVE:.0%} of requests ≤ {TTFT_SLO_THRESHOLD_S} s) spends "
                "its budget: 1 = exactly on budget over 30 days. Fast burn (1 h window) above "
                f"{FAST_BURN} and slow burn (6 h) above {SLOW_BURN} are the paging thresholds (dashed lines).",
                RB_TTFT_BURN,
            ),
            "x",
            [
                Target(_ttft_burn("1h"), "1h {{gen_ai_request_model}} @ {{instance}}"),
                Target(_ttft_burn("6h"), "6h {{gen_ai_request_model}} @ {{instance}}"),
            ],
            steps=((None, "green"), (SLOW_BURN, "orange"), (FAST_BURN, "red")),
        ),
        12,
        8,
    )
    b.add(
        ts(
            "Availability error-budget burn rate",
            describe(
                f"How fast the availability SLO ({AVAILABILITY_OBJECTIVE:.1%} of finished requests not ended by "
                "an engine error) spends its budget; same thresholds as the TTFT burn.",
                RB_ERROR_BURN,
            ),
            "x",
            [
                Target(_error_burn("1h"), "1h {{gen_ai_request_model}} @ {{instance}}"),
                Target(_error_burn("6h"), "6h {{gen_ai_request_model}} @ {{instance}}"),
            ],
            steps=((None, "green"), (SLOW_BURN, "orange"), (FAST_BURN, "red")),
        ),
        12,
        8,
    )

    b.row("Traffic and errors")
    b.add(
        ts(
            "Requests finished per second",
            describe(
                "Finished requests per second by model and node, all finish reasons (stop, length, abort, "
                "error). A drop to zero with steady load is a hung engine.",
                RB_ERROR_BURN,
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
                "reason. 'error' spends the availability budget; 'abort' is usually a client timeout caused by "
                "high TTFT.",
                RB_ERROR_BURN,
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
