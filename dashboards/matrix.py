"""Hardware × model matrix: TTFT P95 and generation tokens/s per model on each hardware type.

The PromQL comes from :mod:`inferwatch.agent.fleet.matrix`, which ``inferwatch matrix`` runs too.
"""

from __future__ import annotations

from grafana_foundation_sdk.models import dashboard as dm

from inferwatch.agent.fleet.matrix import (
    cost_per_mtok_recorded,
    hardware_match_recorded,
    nodes_recorded,
    price_per_hour_query,
    tokens_recorded,
    ttft_p95_recorded,
)
from inferwatch.dashboards.common import (
    Board,
    Target,
    describe,
    engine_variables,
    merge,
    organize,
    table_panel,
)

UID = "inferwatch-matrix"
# The key columns of the tables with one line per model and hardware type, as the tables name them.
_KEY_COLUMNS = {
    "gen_ai_request_model": "Model",
    "machine_type": "Machine type",
    "cpu_model": "CPU model",
    "hw_model": "GPU model",
}
# alerts/matrix.rules.yml's records (the conformance band)
CONFORMANCE_P95 = "instance_model:inferwatch_conformance_p95_seconds:rate5m"
CONFORMANCE_LOWER = "model_hardware:inferwatch_conformance_band_lower_seconds:1h"
CONFORMANCE_UPPER = "model_hardware:inferwatch_conformance_band_upper_seconds:1h"
_WINDOW = "$__range"  # the dashboard's time range is the matrix's window
_MODEL = 'gen_ai_request_model=~"$model"'


def _hardware_label(expr: str) -> str:
    return f'label_join({expr}, "hardware", " / ", "machine_type", "cpu_model", "hw_model")'


def _grid(value_field: str = "Value") -> dm.DataTransformerConfig:
    return dm.DataTransformerConfig(
        id_val="groupingToMatrix",
        options={
            "columnField": "hardware",
            "rowField": "gen_ai_request_model",
            "valueField": value_field,
            "emptyValue": "null",
        },
    )


def _add_grid_table(b: Board, title: str, text: str, runbook: str | None, unit: str, expr: str, width: int) -> None:
    """A model × hardware grid: one instant query, its hardware label built, pivoted by ``groupingToMatrix``."""
    b.add(
        table_panel(
            title,
            describe(text, runbook),
            unit,
            [Target(_hardware_label(expr), instant=True, fmt="table")],
            transformations=[_grid()],
        ),
        width,
        9,
    )


def build() -> dm.Dashboard:
    b = Board(
        UID,
        "inferwatch / Hardware × model matrix",
        "Is this latency normal for this hardware? TTFT P95 and tokens/s per model on each hardware type "
        "(machine type / CPU model / GPU model) over the dashboard's time range, from live fleet data.",
        engine_variables(include_node=False),
        time_from="now-1h",
    )
    b.row("Matrix (one row per model, one column per hardware type)")
    _add_grid_table(
        b,
        "TTFT P95 by model × hardware",
        (
            "Each cell: P95 time to first token of the row's model on every node of the column's hardware "
            "type (machine type / CPU model / GPU model; 'none' = CPU only), from the engine histograms "
            "summed over those nodes by the recording rules (alerts/recording.rules.yml, 5 m rates averaged "
            "over the dashboard's time range; fleet-wide, the job filter does not apply). "
            "Read across a row: the same model should order "
            "hardware the same way everywhere; a cell out of line is a node problem, not a model one."
        ),
        "LatencyRegressionAfterNodeChange",
        "s",
        ttft_p95_recorded(_WINDOW, _MODEL),
        24,
    )
    _add_grid_table(
        b,
        "Generation tokens/s per node by model × hardware",
        (
            "Each cell: generated tokens per second per node, averaged over the nodes of the column's "
            "hardware type, over the dashboard's time range. Throughput depends on load as well as "
            "hardware: compare cells under similar request rates."
        ),
        None,
        "suffix: tok/s",
        tokens_recorded(_WINDOW, _MODEL),
        24,
    )
    b.row("Effective cost (needs the price rules: inferwatch prices FILE --rules, docs/matrix.md)")
    _add_grid_table(
        b,
        "Effective cost per million generated tokens by model × hardware",
        (
            "Each cell: the price per hour of one machine of the column's type (from the price rules that "
            "`inferwatch prices FILE --rules` writes from your price file, in its currency) divided by the "
            "generated tokens per hour per node measured on that hardware for the row's model. A cheaper "
            "machine on which the model runs badly costs more per token. Empty: no price for the machine type "
            "(load the price rules) or no tokens generated. Throughput depends on load as well as hardware: "
            "compare cells under similar load. `inferwatch matrix --prices FILE` prints the same with a rank."
        ),
        None,
        "suffix: /MTok",
        cost_per_mtok_recorded(_WINDOW, _MODEL),
        12,
    )
    _add_grid_table(
        b,
        "Hardware match by model × hardware",
        (
            "Each cell: the generated tokens/s per node of the row's model on the column's hardware type "
            "divided by the best hardware type's for that model (100 % = the best). A low match on hardware "
            "expected to suit the model points at a node problem (a SIMD feature missing, a throttled GPU) "
            "before a price one."
        ),
        "CPUFeatureMissing",
        "percentunit",
        hardware_match_recorded(_WINDOW, _MODEL),
        12,
    )
    b.add(
        table_panel(
            "Cost ranking, one line per model and hardware type",
            describe(
                "Price per hour, effective cost per million generated tokens and hardware match per model and "
                "hardware type, cheapest first (sort by Model to group a model's cells). Rows appear only for "
                "machine types the price rules price.",
                None,
            ),
            "short",
            [
                Target(
                    f"{price_per_hour_query()} * on (machine_type) group_right () "
                    f"(0 * {tokens_recorded(_WINDOW, _MODEL)} + 1)",
                    instant=True,
                    fmt="table",
                ),
                Target(cost_per_mtok_recorded(_WINDOW, _MODEL), instant=True, fmt="table"),
                Target(hardware_match_recorded(_WINDOW, _MODEL), instant=True, fmt="table"),
            ],
            transformations=[
                merge(),
                organize(
                    {
                        **_KEY_COLUMNS,
                        "Value #A": "Price per hour",
                        "Value #B": "Per MTok",
                        "Value #C": "Hardware match",
                    }
                ),
                dm.DataTransformerConfig(id_val="sortBy", options={"sort": [{"field": "Per MTok", "desc": False}]}),
            ],
            overrides=[
                ("Price per hour", [dm.DynamicConfigValue(id_val="unit", value="suffix: /h")]),
                ("Per MTok", [dm.DynamicConfigValue(id_val="unit", value="suffix: /MTok")]),
                ("Hardware match", [dm.DynamicConfigValue(id_val="unit", value="percentunit")]),
            ],
        ),
        24,
        9,
    )
    b.row("Conformance band (alerts/matrix.rules.yml)")
    node_p95 = f"{CONFORMANCE_P95}{{{_MODEL}}}"
    cell = "on (gen_ai_request_model, quantity, prompt_band, machine_type, cpu_model, hw_model)"
    b.add(
        table_panel(
            "Nodes against their hardware type's conformance band",
            describe(
                "One line per node, model, prompt band and quantity (TTFT, ITL): the node's P95 over the last 5 "
                "minutes, the band its hardware type's nodes keep for that model and prompt band (median over the "
                "type's nodes of each node's 10th-90th percentile of its 5m P95 over the last hour) and the P95 over "
                "the band's upper edge (over 1.1 with two peers inside fires NodeOutsideConformanceBand). Sort by "
                "'Over upper edge'. Prompt band: <=1k, 1k-4k, 4k-16k or >16k prompt tokens where the agents export "
                "the span histograms split by prompt length (receiver.prompt_band_histograms), else 'all' (the "
                "engine's histograms, not split: a node fed longer prompts reads slower).",
                "NodeOutsideConformanceBand",
            ),
            "s",
            [
                Target(node_p95, instant=True, fmt="table"),
                Target(f"{CONFORMANCE_LOWER} * {cell} group_right () (0 * {node_p95} + 1)", instant=True, fmt="table"),
                Target(f"{CONFORMANCE_UPPER} * {cell} group_right () (0 * {node_p95} + 1)", instant=True, fmt="table"),
                Target(f"{node_p95} / {cell} group_left () {CONFORMANCE_UPPER}", instant=True, fmt="table"),
            ],
            transformations=[
                merge(),
                organize(
                    {
                        "instance": "Node",
                        "gen_ai_request_model": "Model",
                        "quantity": "Quantity",
                        "prompt_band": "Prompt band",
                        "machine_type": "Machine type",
                        "cpu_model": "CPU model",
                        "hw_model": "GPU model",
                        "Value #A": "P95 (5m)",
                        "Value #B": "Band lower",
                        "Value #C": "Band upper",
                        "Value #D": "Over upper edge",
                    }
                ),
                dm.DataTransformerConfig(
                    id_val="sortBy", options={"sort": [{"field": "Over upper edge", "desc": True}]}
                ),
            ],
            overrides=[("Over upper edge", [dm.DynamicConfigValue(id_val="unit", value="none")])],
        ),
        24,
        9,
    )
    b.row("Detail")
    b.add(
        table_panel(
            "Matrix, one line per model and hardware type",
            describe(
                "The same numbers in long form with the hardware identity split into its parts and the number "
                "of nodes behind each cell (a cell from one node is an anecdote). The same table is printed by "
                "`inferwatch matrix --prometheus URL`.",
                "TTFTErrorBudgetBurn",
            ),
            "short",
            [
                Target(ttft_p95_recorded(_WINDOW, _MODEL), instant=True, fmt="table"),
                Target(tokens_recorded(_WINDOW, _MODEL), instant=True, fmt="table"),
                Target(nodes_recorded(_WINDOW, _MODEL), instant=True, fmt="table"),
            ],
            transformations=[
                merge(),
                organize(
                    {
                        **_KEY_COLUMNS,
                        "Value #C": "Nodes",
                        "Value #A": "TTFT P95",
                        "Value #B": "Tokens/s per node",
                    }
                ),
            ],
            overrides=[
                ("TTFT P95", [dm.DynamicConfigValue(id_val="unit", value="s")]),
                ("Tokens/s per node", [dm.DynamicConfigValue(id_val="unit", value="suffix: tok/s")]),
                ("Nodes", [dm.DynamicConfigValue(id_val="unit", value="none")]),
            ],
        ),
        24,
        10,
    )
    return b.build()
