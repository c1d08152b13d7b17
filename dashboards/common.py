"""Building blocks shared by the four dashboards (grafana-foundation-sdk builders, Grafana 11.6 schema).

Every panel goes through :class:`Board`, which enforces the house rules: the datasource is the
``${datasource}`` template variable, every panel has a unit, a description that says how to read it and
which runbook applies, explicit ``refId``s, and ids assigned in layout order (so the JSON is stable).
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import Any

from grafana_foundation_sdk.builders import common as cb
from grafana_foundation_sdk.builders import dashboard as db
from grafana_foundation_sdk.builders import heatmap, stat, table, timeseries
from grafana_foundation_sdk.builders import prometheus as pb
from grafana_foundation_sdk.cog import builder as cogbuilder
from grafana_foundation_sdk.models import common as cm
from grafana_foundation_sdk.models import dashboard as dm
from grafana_foundation_sdk.models import heatmap as hm
from grafana_foundation_sdk.models.prometheus import PromQueryFormat

from inferwatch.agent.alerts import rulefiles

DATASOURCE = dm.DataSourceRef(type_val="prometheus", uid="${datasource}")
RUNBOOK_BASE = "runbooks/"  # relative to the repository; the agent serves them at /runbooks/<AlertName>
TAGS = ["inferwatch"]
REFRESH = "30s"

# Selectors every per-model panel applies (variables chained engine → node → model, see variables()).
# ``job`` picks the data path when Prometheus holds the agent's series twice (direct scrape of the agent's
# /metrics and the OpenTelemetry Collector's export, as in docker-compose.yml): summing both would double rates.
SEL_JOB = 'job=~"$job"'
SEL_MODEL = 'job=~"$job", instance=~"$instance", gen_ai_request_model=~"$model"'
SEL_NODE = 'job=~"$job", instance=~"$instance"'


@dataclass(frozen=True, slots=True)
class Target:
    """One PromQL query of a panel. ``instant`` for tables and stats that show the current value."""

    expr: str
    legend: str = ""
    instant: bool = False
    fmt: str = "time_series"  # time_series | table | heatmap
    exemplar: bool = False  # ask for the histogram's exemplars (trace ids of recent requests per bucket)


@dataclass
class Board:
    """A dashboard under construction: rows of panels laid out on Grafana's 24-column grid."""

    uid: str
    title: str
    description: str
    variables: Sequence[cogbuilder.Builder[dm.VariableModel]]
    time_from: str = "now-1h"
    _builder: db.Dashboard = field(init=False)
    _next_id: int = field(init=False, default=1)

    def __post_init__(self) -> None:
        self._builder = (
            db.Dashboard(self.title)
            .uid(self.uid)
            .description(self.description)
            .tags([*TAGS])
            .editable()
            .tooltip(dm.DashboardCursorSync.CROSSHAIR)
            .time(self.time_from, "now")
            .timezone("browser")
            .refresh(REFRESH)
            .version(1)
            .variables(list(self.variables))
            .link(
                db.DashboardLink("inferwatch dashboards")
                .type(dm.DashboardLinkType.DASHBOARDS)
                .tags([*TAGS])
                .as_dropdown(True)
                .include_vars(True)
                .keep_time(True)
            )
        )

    def _id(self) -> int:
        n = self._next_id
        self._next_id += 1
        return n

    def row(self, title: str) -> Board:
        self._builder.with_row(db.Row(title).id(self._id()))
        return self

    def add(self, panel: Any, width: int, height: int) -> Board:
        self._builder.with_panel(panel.id(self._id()).span(width).height(height))
        return self

    def build(self) -> dm.Dashboard:
        return self._builder.build()


def describe(how_to_read: str, runbook: str | None) -> str:
    """A panel description: how to read it, then the runbook that applies (or why none does).

    ``runbook`` is an alert name (runbooks/<AlertName>.md); one that no rule file defines stops the generation.
    """
    if runbook:
        return f"{how_to_read}\n\nRunbook: {RUNBOOK_BASE}{rulefiles.check_alert(runbook)}.md"
    return f"{how_to_read}\n\nRunbook: none (context panel; no alert is derived from it)."


def _targets(panel: Any, targets: Sequence[Target]) -> Any:
    for i, t in enumerate(targets):
        q = pb.Dataquery().expr(t.expr).ref_id(chr(ord("A") + i))
        if t.legend:
            q = q.legend_format(t.legend)
        q = q.instant() if t.instant else q.range()
        if t.fmt == "table":
            q = q.format(PromQueryFormat.TABLE)
        elif t.fmt == "heatmap":
            q = q.format(PromQueryFormat.HEATMAP)
        if t.exemplar:
            q = q.exemplar(True)
        panel = panel.with_target(q)
    return panel


def thresholds(*steps: tuple[float | None, str]) -> db.ThresholdsConfig:
    return (
        db.ThresholdsConfig().mode(dm.ThresholdsMode.ABSOLUTE).steps([dm.Threshold(value=v, color=c) for v, c in steps])
    )


DEFAULT_STEPS: tuple[tuple[float | None, str], ...] = ((None, "green"),)


def ts(
    title: str,
    description: str,
    unit: str,
    targets: Sequence[Target],
    *,
    steps: Sequence[tuple[float | None, str]] = DEFAULT_STEPS,
    min_val: float | None = 0,
    max_val: float | None = None,
    stack: bool = False,
) -> timeseries.Panel:
    """A timeseries panel; extra threshold steps are drawn as dashed lines."""
    p = (
        timeseries.Panel()
        .title(title)
        .description(description)
        .datasource(DATASOURCE)
        .unit(unit)
        .thresholds(thresholds(*steps))
        .legend(
            cb.VizLegendOptions()
            .display_mode(cm.LegendDisplayMode.TABLE)
            .placement(cm.LegendPlacement.BOTTOM)
            .show_legend(True)
            .calcs(["lastNotNull", "max"])
        )
        .tooltip(cb.VizTooltipOptions().mode(cm.TooltipDisplayMode.MULTI).sort(cm.SortOrder.DESCENDING))
        .fill_opacity(10)
        .line_width(1)
    )
    if len(steps) > 1:
        p = p.thresholds_style(cb.GraphThresholdsStyleConfig().mode(cm.GraphThresholdsStyleMode.DASHED))
    if min_val is not None:
        p = p.min(min_val)
    if max_val is not None:
        p = p.max(max_val)
    if stack:
        p = p.stacking(cb.StackingConfig().mode(cm.StackingMode.NORMAL))
    return _targets(p, targets)


def stat_panel(
    title: str,
    description: str,
    unit: str,
    targets: Sequence[Target],
    *,
    steps: Sequence[tuple[float | None, str]] = DEFAULT_STEPS,
    mappings: Sequence[dm.ValueMap] = (),
) -> stat.Panel:
    p = (
        stat.Panel()
        .title(title)
        .description(description)
        .datasource(DATASOURCE)
        .unit(unit)
        .thresholds(thresholds(*steps))
        .color_mode(cm.BigValueColorMode.BACKGROUND)
        .graph_mode(cm.BigValueGraphMode.NONE)
        .reduce_options(cb.ReduceDataOptions().calcs(["lastNotNull"]).values(False))
    )
    if mappings:
        p = p.mappings(list(mappings))
    return _targets(p, targets)


def table_panel(
    title: str,
    description: str,
    unit: str,
    targets: Sequence[Target],
    *,
    transformations: Sequence[dm.DataTransformerConfig] = (),
    overrides: Sequence[tuple[str, list[dm.DynamicConfigValue]]] = (),
    steps: Sequence[tuple[float | None, str]] = DEFAULT_STEPS,
) -> table.Panel:
    p = (
        table.Panel()
        .title(title)
        .description(description)
        .datasource(DATASOURCE)
        .unit(unit)
        .thresholds(thresholds(*steps))
        .show_header(True)
    )
    for t in transformations:
        p = p.with_transformation(t)
    for name, props in overrides:
        p = p.override_by_name(name, props)
    return _targets(p, targets)


def heatmap_panel(title: str, description: str, unit: str, targets: Sequence[Target]) -> heatmap.Panel:
    p = (
        heatmap.Panel()
        .title(title)
        .description(description)
        .datasource(DATASOURCE)
        .unit(unit)
        .calculate(False)
        .y_axis(heatmap.YAxisConfig().unit(unit))
        .color(heatmap.HeatmapColorOptions().mode(hm.HeatmapColorMode.SCHEME).scheme("Oranges").exponent(0.5))
        .cell_values(heatmap.CellValues().unit("short"))
        .max_data_points(60)
    )
    return _targets(p, targets)


def value_map(options: dict[str, tuple[str, str]]) -> dm.ValueMap:
    """Map exact values to display text and colour: ``{"1": ("bimodal", "red")}``."""
    return dm.ValueMap(options={k: dm.ValueMappingResult(text=t, color=c) for k, (t, c) in options.items()})


def organize(rename: dict[str, str], exclude: Sequence[str] = ("Time",)) -> dm.DataTransformerConfig:
    return dm.DataTransformerConfig(
        id_val="organize",
        options={
            "excludeByName": {name: True for name in exclude},
            "renameByName": dict(rename),
            "indexByName": {name: i for i, name in enumerate(rename)},
        },
    )


def merge() -> dm.DataTransformerConfig:
    return dm.DataTransformerConfig(id_val="merge", options={})


def colored_cells() -> list[dm.DynamicConfigValue]:
    return [dm.DynamicConfigValue(id_val="custom.cellOptions", value={"type": "color-background"})]


def query_variable(
    name: str, label: str, query: str, description: str, *, include_all: bool = True, multi: bool = True
) -> db.QueryVariable:
    v = (
        db.QueryVariable(name)
        .label(label)
        .description(description)
        .datasource(DATASOURCE)
        .query(query)
        .refresh(dm.VariableRefresh.ON_TIME_RANGE_CHANGED)
        .sort(dm.VariableSort.ALPHABETICAL_ASC)
        .multi(multi)
        .include_all(include_all)
    )
    if include_all:
        v = v.current(dm.VariableOption(selected=True, text="All", value="$__all"))
    return v


def datasource_variable() -> db.DatasourceVariable:
    return (
        db.DatasourceVariable("datasource")
        .label("Data source")
        .description("The Prometheus holding inferwatch data (agent scrape or OpenTelemetry Collector export).")
        .type("prometheus")
    )


def job_variable() -> db.QueryVariable:
    return query_variable(
        "job",
        "Data path",
        "label_values(inferwatch_agent_info, job)",
        "Prometheus job holding the agent's series: the direct scrape (inferwatch-agent) or the OpenTelemetry "
        "Collector's export (job = the agent's OTLP service.name, inferwatch-agent-otlp in docker-compose). "
        "Pick one; both together would count everything twice.",
        include_all=False,
        multi=False,
    )


# The compose stack's trace store (Phoenix): a UI route that finds the trace's project and opens it; the id is appended
TRACE_URL_DEFAULT = "http://localhost:6006/redirects/traces/"


def trace_url_variable() -> cogbuilder.Builder[dm.VariableModel]:
    """``$trace_url``: the trace backend's page for a trace, up to the id (exemplar data links append the id)."""
    return (
        db.TextBoxVariable("trace_url")
        .label("Trace URL")
        .description(
            "Where an exemplar's trace opens: this text followed by the trace id. Phoenix (the compose stack's): "
            "http://localhost:6006/redirects/traces/ ; Jaeger: http://jaeger:16686/trace/ ; Tempo: "
            "http://tempo:3200/api/traces/ ; any URL that ends where the trace id goes."
        )
        .default_value(TRACE_URL_DEFAULT)
    )


def trace_link() -> db.DashboardLink:
    """The data link of an exemplar: ``$trace_url`` followed by the exemplar's trace id (new tab)."""
    return (
        db.DashboardLink("Open trace ${__data.fields.trace_id}")
        .type(dm.DashboardLinkType.LINK)
        .url("${trace_url}${__data.fields.trace_id}")
        .target_blank(True)
    )


def engine_variables(include_node: bool = True) -> list[cogbuilder.Builder[dm.VariableModel]]:
    """datasource → job → engine → node → model, each list filtered by the ones before it."""
    out: list[cogbuilder.Builder[dm.VariableModel]] = [
        datasource_variable(),
        job_variable(),
        query_variable(
            "engine",
            "Engine",
            'label_values(inferwatch_engine_info{job=~"$job"}, engine)',
            "Inference engine detected by the agent (vllm, sglang, tgi, llamacpp, trtllm).",
        ),
    ]
    if include_node:
        out.append(
            query_variable(
                "instance",
                "Node",
                'label_values(inferwatch_engine_info{job=~"$job", engine=~"$engine"}, instance)',
                "Agent scrape target (one per node).",
            )
        )
    out.append(
        query_variable(
            "model",
            "Model",
            (
                'label_values(inferwatch_engine_info{job=~"$job", engine=~"$engine", instance=~"$instance"}, '
                "gen_ai_request_model)"
            )
            if include_node
            else 'label_values(inferwatch_engine_info{job=~"$job", engine=~"$engine"}, gen_ai_request_model)',
            "Served model (OpenTelemetry gen_ai.request.model).",
        )
    )
    return out


def quantiles(metric: str, sel: str, by: str = "instance, gen_ai_request_model") -> list[Target]:
    """P50/P95/P99 of an engine histogram per model and node, from the 5 m bucket rates the recording rules keep
    (``instance_model_le:<metric>_bucket:rate5m``, alerts/recording.rules.yml): one series per node, model and
    bucket at query time instead of every raw bucket series over the panel's range."""
    record = f"instance_model_le:{metric}_bucket:rate5m"
    return [
        Target(
            f"histogram_quantile({q}, sum by (le, {by}) ({record}{{{sel}}}))",
            f"P{int(float(q) * 100)} {{{{gen_ai_request_model}}}} @ {{{{instance}}}}",
        )
        for q in ("0.5", "0.95", "0.99")
    ]
