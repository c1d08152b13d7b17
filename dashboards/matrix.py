"""Hardware × model matrix: TTFT P95 and generation tokens/s per model on each hardware type.

The PromQL comes from :mod:`agent.matrix`, which ``inferwatch matrix`` runs too.
"""

from __future__ import annotations

from grafana_foundation_sdk.models import dashboard as dm

from agent.matrix import nodes_recorded, tokens_recorded, ttft_p95_recorded
from dashboards.common import (
    Board,
    Target,
    describe,
    engine_variables,
    merge,
    organize,
    table_panel,
)

UID = "inferwatch-matrix"
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
    b.add(
        table_panel(
            "TTFT P95 by model × hardware",
            describe(
                "Each cell: P95 time to first token of the row's model on every node of the column's hardware "
                "type (machine type / CPU model / GPU model; 'none' = CPU only), from the engine histograms "
                "summed over those nodes by the recording rules (alerts/recording.rules.yml, 5 m rates averaged "
                "over the dashboard's time range; fleet-wide, the job filter does not apply). "
                "Read across a row: the same model should order "
                "hardware the same way everywhere; a cell out of line is a node problem, not a model one.",
                "LatencyRegressionAfterNodeChange",
            ),
            "s",
            [Target(_hardware_label(ttft_p95_recorded(_WINDOW, _MODEL)), instant=True, fmt="table")],
            transformations=[_grid()],
        ),
        24,
        9,
    )
    b.add(
        table_panel(
            "Generation tokens/s per node by model × hardware",
            describe(
                "Each cell: generated tokens per second per node, averaged over the nodes of the column's "
                "hardware type, over the dashboard's time range. Throughput depends on load as well as "
                "hardware: compare cells under similar request rates.",
                None,
            ),
            "suffix: tok/s",
            [Target(_hardware_label(tokens_recorded(_WINDOW, _MODEL)), instant=True, fmt="table")],
            transformations=[_grid()],
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
                        "gen_ai_request_model": "Model",
                        "machine_type": "Machine type",
                        "cpu_model": "CPU model",
                        "hw_model": "GPU model",
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
