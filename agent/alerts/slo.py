"""Generate multiwindow, multi-burn-rate SLO alerts from ``alerts/slo.yml`` into ``alerts/slo.rules.yml``.

Two kinds of SLI, both an error ratio recorded as ``slo:sli_error:ratio_rate<window>{slo=…}``:

- ``latency`` (the default): from a classic histogram, error ratio = 1 − rate(bucket{le=T}) / rate(count), so T
  must be an exact bucket edge of the histogram (checked against the metric catalog), written as the agent's
  exporter writes ``le`` (``repr(float)``: ``0.5``, ``1.0``).
- ``availability``: from two counter selectors, error ratio = rate(errors) / rate(total), e.g. the engine's
  ``http_requests_total{status="5xx"}`` over ``http_requests_total`` (vLLM and SGLang expose it through
  prometheus_fastapi_instrumentator).

Either kind may add a ``fast_page``: a plain error-ratio alert over one short window that pages a burst within
minutes, before the 1 h burn window has filled (after an hour of clean traffic the 1 h window needs 8.6 minutes
of a total outage to pass 14.4x). With its own ``alert`` name it is a separate alert (an availability SLO's
EngineErrorRateHigh); without one it is the SLO's own burn alert with ``long`` = ``short`` = its window and
``burn_rate`` = its ratio / the budget (the TTFT SLO's 30x page over 5m), so routing and runbook are the SLO's.

Numbers are printed as written in the spec (decimal arithmetic: an objective of 0.999 gives an error budget of
``0.001``, never ``0.000999…``).

    python -m inferwatch.agent.alerts.slo            # write alerts/slo.rules.yml
    python -m inferwatch.agent.alerts.slo --check    # exit 1 when the file differs from a fresh generation
"""

from __future__ import annotations

import argparse
import re
import sys
from dataclasses import dataclass
from decimal import Decimal
from pathlib import Path
from typing import Any

import yaml

from inferwatch.agent.alerts import links
from inferwatch.agent.catalog import CATALOG
from inferwatch.agent.catalog.spec import Kind
from inferwatch.agent.errors import ConfigError

ROOT = Path(__file__).resolve().parents[2]
SPEC_PATH = ROOT / "alerts" / "slo.yml"
OUT_PATH = ROOT / "alerts" / "slo.rules.yml"
PERIOD_DAYS = 30
SLO_NAME_RE = re.compile(r"^[a-z0-9][a-z0-9-]{0,62}$")
# A metric name with an optional label matcher list (what rate() takes): name{label op "value", ...}
SELECTOR_RE = re.compile(
    r'^[a-zA-Z_:][a-zA-Z0-9_:]*(\{\s*[a-zA-Z_][a-zA-Z0-9_]*\s*(=|!=|=~|!~)\s*"[^"]*"'
    r'(\s*,\s*[a-zA-Z_][a-zA-Z0-9_]*\s*(=|!=|=~|!~)\s*"[^"]*")*\s*,?\s*\})?$'
)
DURATION_RE = re.compile(r"^[1-9][0-9]*[smh]$")
ALERT_NAME_RE = re.compile(r"^[A-Z][A-Za-z0-9]{0,127}$")
LABEL_RE = re.compile(r"^[a-zA-Z_][a-zA-Z0-9_]*$")


@dataclass(frozen=True, slots=True)
class BurnWindow:
    """One alert of the multiwindow set: error ratio above ``factor`` × budget over both windows."""

    factor: str
    long: str
    short: str
    severity: str
    for_: str
    exhaustion: str  # time to spend the whole 30-day budget at this burn rate
    guard: str | None = None  # a third window the ratio must also exceed: the burn is still on now


# SRE Workbook "Alerting on SLOs" (rows 1, 2, 4) + the 3d/6h row of Sloth and kubernetes-mixin; 30-day period.
# The workbook's short window (1/12 of the long one) is what ends an alert after recovery: 30m for the 6x page,
# 2h for the 3x ticket. With their for: (15m, 1h) running on while the short window still holds the fault, they
# fired *after* recovery (measured: a 3x ticket 43 min after; the 6x page ~29 min up). A 5m guard at the same
# burn rate, as the 14.4x pair's short window already is, ends both ~5 min after recovery (and resets their
# for:). Its price: a burn within noise of the threshold over 5m (a low-traffic model just above 6x or 3x)
# resets the for:, and such a leak ends up at the 1x ticket, which keeps the workbook's windows on purpose: it
# is the net for slow leaks a 5m window cannot see (a 1.5x burn at 1 request/s is 4-5 slow requests in 5m), and
# a guard at 1x would make it blind to them.
WINDOWS = (
    BurnWindow("14.4", "1h", "5m", "critical", "2m", "about 2 days"),
    BurnWindow("6", "6h", "30m", "critical", "15m", "5 days", guard="5m"),
    BurnWindow("3", "1d", "2h", "warning", "1h", "10 days", guard="5m"),
    BurnWindow("1", "3d", "6h", "warning", "3h", "30 days"),
)
RECORD_WINDOWS = ("5m", "30m", "1h", "2h", "6h", "1d", "3d")
COMMON_KEYS = {"name", "alert", "kind", "description", "objective", "group_by", "min_requests_per_s"}
KIND_KEYS = {"latency": {"histogram", "threshold_s", "fast_page"}, "availability": {"total", "errors", "fast_page"}}


@dataclass(frozen=True, slots=True)
class FastPage:
    """An SLO's burst page: error ratio above ``error_ratio`` over ``window`` for ``for_``. ``alert`` None: the
    page is the SLO's own alert, labelled as a burn over that one window (``burn_rate`` = ratio / budget)."""

    alert: str | None
    error_ratio: Decimal
    window: str
    for_: str


@dataclass(frozen=True, slots=True)
class SLO:
    name: str
    alert: str
    description: str
    histogram: str  # latency: the histogram; availability: ""
    threshold: Decimal  # latency: seconds, as written; availability: 0
    objective: Decimal
    group_by: tuple[str, ...]
    min_requests_per_s: Decimal
    kind: str = "latency"  # latency | availability
    total: str = ""  # availability: the counter selector of all requests
    errors: str = ""  # availability: the counter selector of failed requests
    fast_page: FastPage | None = None

    @property
    def budget(self) -> Decimal:
        return 1 - self.objective

    @property
    def le(self) -> str:
        return repr(float(self.threshold))


def _decimal(value: Any, field: str) -> Decimal:
    if isinstance(value, bool) or not isinstance(value, (int, float, str)):
        raise ConfigError(f"{field}: expected a number, got {value!r}")
    try:
        # repr() of a float is the shortest string that reads back to it: the number as written in YAML.
        return Decimal(repr(value) if isinstance(value, float) else str(value))
    except ArithmeticError:
        raise ConfigError(f"{field}: not a number: {value!r}") from None


def _fmt(d: Decimal) -> str:
    """Plain decimal notation without trailing zeros (0.010 → 0.01, 1E+1 → 10)."""
    text = format(d.normalize(), "f")
    return text


def histogram_buckets(prometheus_name: str) -> tuple[float, ...]:
    for spec in CATALOG.values():
        if spec.prometheus == prometheus_name:
            if spec.kind is not Kind.HISTOGRAM or not spec.buckets:
                raise ConfigError(f"{prometheus_name} is not a histogram with buckets in the metric catalog")
            return tuple(spec.buckets)
    raise ConfigError(f"histogram {prometheus_name!r} is not in the metric catalog")


def parse_spec(data: Any) -> list[SLO]:
    if not isinstance(data, dict) or data.get("version") != 1:
        raise ConfigError("SLO spec: expected a mapping with version: 1")
    if data.get("period") != f"{PERIOD_DAYS}d":
        raise ConfigError(f"SLO spec: period must be {PERIOD_DAYS}d (the burn-rate factors assume it)")
    slos = data.get("slos")
    if not isinstance(slos, list) or not slos:
        raise ConfigError("SLO spec: slos must be a non-empty list")
    out: list[SLO] = []
    for i, raw in enumerate(slos):
        where = f"slos[{i}]"
        if not isinstance(raw, dict):
            raise ConfigError(f"{where}: expected a mapping")
        kind = raw.get("kind", "latency")
        if kind not in KIND_KEYS:
            raise ConfigError(f"{where}.kind: {kind!r} must be one of {', '.join(sorted(KIND_KEYS))}")
        unknown = set(raw) - COMMON_KEYS - KIND_KEYS[kind]
        if unknown:
            raise ConfigError(f"{where}: unknown keys {sorted(unknown)} for a {kind} SLO")
        name = str(raw.get("name", ""))
        if not SLO_NAME_RE.match(name):
            raise ConfigError(f"{where}.name: {name!r} must be lower-case letters, digits and dashes")
        alert = _alert_name(raw.get("alert", ""), f"{where}.alert")
        histogram, threshold, total, errors, fast = "", Decimal(0), "", "", None
        if kind == "latency":
            histogram = str(raw.get("histogram", ""))
            threshold = _decimal(raw.get("threshold_s"), f"{where}.threshold_s")
            buckets = histogram_buckets(histogram)
            if float(threshold) not in buckets:
                edges = ", ".join(repr(b) for b in buckets)
                raise ConfigError(
                    f"{where}.threshold_s: {_fmt(threshold)} is not a bucket edge of {histogram} ({edges}); "
                    "a latency SLI needs an exact edge"
                )
        else:
            total = _selector(raw.get("total"), f"{where}.total")
            errors = _selector(raw.get("errors"), f"{where}.errors")
        if "fast_page" in raw:
            fast = _fast_page(raw["fast_page"], f"{where}.fast_page")
        objective = _decimal(raw.get("objective"), f"{where}.objective")
        if not Decimal(0) < objective < Decimal(1):
            raise ConfigError(f"{where}.objective: {objective} must be between 0 and 1 (e.g. 0.99)")
        group_by = raw.get("group_by", [])
        if not isinstance(group_by, list) or not all(isinstance(g, str) and LABEL_RE.match(g) for g in group_by):
            raise ConfigError(f"{where}.group_by: expected a list of label names")
        floor = _decimal(raw.get("min_requests_per_s", 0), f"{where}.min_requests_per_s")
        if floor < 0:
            raise ConfigError(f"{where}.min_requests_per_s: must be >= 0")
        description = str(raw.get("description", ""))
        out.append(
            SLO(
                name,
                alert,
                description,
                histogram,
                threshold,
                objective,
                tuple(group_by),
                floor,
                kind,
                total,
                errors,
                fast,
            )
        )
    names = [s.name for s in out]
    if len(set(names)) != len(names):
        raise ConfigError("SLO spec: duplicate slo names")
    alerts = [s.alert for s in out] + [s.fast_page.alert for s in out if s.fast_page and s.fast_page.alert]
    if len(set(alerts)) != len(alerts):
        raise ConfigError("SLO spec: two SLOs (or an SLO and a fast_page) share an alert name")
    return out


def _alert_name(value: Any, field: str) -> str:
    alert = str(value)
    if not ALERT_NAME_RE.match(alert):
        raise ConfigError(f"{field}: {alert!r} must be a CamelCase alert name")
    return alert


def _selector(value: Any, field: str) -> str:
    if not isinstance(value, str) or not SELECTOR_RE.match(value.strip()):
        raise ConfigError(f'{field}: expected a counter selector such as http_requests_total{{status="5xx"}}, '
                          f"got {value!r}")  # fmt: skip
    return value.strip()


def _fast_page(raw: Any, where: str) -> FastPage:
    if not isinstance(raw, dict):
        raise ConfigError(f"{where}: expected a mapping with alert, error_ratio, window, for")
    unknown = set(raw) - {"alert", "error_ratio", "window", "for"}
    if unknown:
        raise ConfigError(f"{where}: unknown keys {sorted(unknown)}")
    ratio = _decimal(raw.get("error_ratio"), f"{where}.error_ratio")
    if not Decimal(0) < ratio < Decimal(1):
        raise ConfigError(f"{where}.error_ratio: {ratio} must be between 0 and 1 (e.g. 0.05)")
    window, for_ = str(raw.get("window", "")), str(raw.get("for", ""))
    for field, value in (("window", window), ("for", for_)):
        if not DURATION_RE.match(value):
            raise ConfigError(f"{where}.{field}: {value!r} must be a duration such as 5m")
    if window not in RECORD_WINDOWS:
        raise ConfigError(f"{where}.window: {window} must be one of the recorded windows {', '.join(RECORD_WINDOWS)}")
    alert = _alert_name(raw["alert"], f"{where}.alert") if "alert" in raw else None
    return FastPage(alert, ratio, window, for_)


def _q(s: str) -> str:
    """A YAML single-quoted scalar."""
    return "'" + s.replace("'", "''") + "'"


def _threshold_text(slo: SLO) -> str:
    t = slo.threshold
    return f"{_fmt(t * 1000)}ms" if t < 1 else f"{_fmt(t)}s"


def _total(slo: SLO) -> str:
    return slo.total if slo.kind == "availability" else f"{slo.histogram}_count"


def _sli_lines(slo: SLO, by: str, rw: str) -> list[str]:
    if slo.kind == "availability":
        # no series for failures until the first one (prometheus_fastapi_instrumentator): 0, not absent
        return [
            "        expr: |",
            f"          (sum by ({by}) (rate({slo.errors}[{rw}])) or 0 * sum by ({by}) (rate({slo.total}[{rw}])))",
            f"          / sum by ({by}) (rate({slo.total}[{rw}]))",
        ]
    return [
        "        expr: |",
        "          1 - (",
        f'            sum by ({by}) (rate({slo.histogram}_bucket{{le="{slo.le}"}}[{rw}]))',
        f"            / sum by ({by}) (rate({slo.histogram}_count[{rw}]))",
        "          )",
    ]


def _subject(slo: SLO) -> str:
    if "gen_ai_request_model" in slo.group_by:
        return "{{ $labels.gen_ai_request_model }}"
    if "instance" in slo.group_by:
        return "{{ $labels.instance }}"
    return "all models" if slo.kind == "latency" else "all engines"


def _burn_summary(slo: SLO) -> str:
    if slo.kind == "availability":
        return "The availability SLO error budget is burning too fast."
    return "The TTFT SLO error budget is burning too fast."


def _burn_description(slo: SLO, w: BurnWindow) -> str:
    pct = _fmt(slo.objective * 100)
    tail = f"At {w.factor}x the 30-day error budget is gone in {w.exhaustion}."
    also = f"{w.short} and {w.guard}" if w.guard else w.short
    if slo.kind == "availability":
        return (
            f"{_subject(slo)}: {{{{ $value | humanizePercentage }}}} of requests failed over the last {w.long} "
            f"(and over {also}); SLO {slo.name}: {pct}% succeed. {tail}"
        )
    thr = _threshold_text(slo)
    return (
        f"{_subject(slo)}: {{{{ $value | humanizePercentage }}}} of requests took longer than {thr} to the "
        f"first token over the last {w.long} (and over {also}); SLO {slo.name}: {pct}% within {thr}. {tail}" + _why(slo)
    )


# The tail explainer's verdict (agent/node/analytics/explain.py, inferwatch_engine_tail_driver_ratio) on the node of the
# model whose TTFT tail has the most dominant driver, and the link to that agent's explain view. A TTFT SLO is per
# model across nodes, so the worst node is named; none when no node has spans or a confident driver.
_TTFT_WHY = (
    ' Why: {{ with printf "topk(1, inferwatch_engine_tail_driver_ratio{gen_ai_request_model=%q,quantity=\\"ttft\\",'
    'window=\\"5m\\",phase!=\\"none\\"})" $labels.gen_ai_request_model | query }}{{ with . | first }}on '
    "{{ .Labels.instance }} {{ .Labels.phase }} is {{ .Value | humanizePercentage }} of the TTFT P99-P50 gap"
    '{{ if ne .Labels.attribute "none" }}, {{ .Labels.attribute }} separates the tail{{ end }}; explain: '
    "http://{{ .Labels.instance }}/api/v1/explain?model={{ $labels.gen_ai_request_model | urlquery }}&format=text"
    "{{ end }}{{ else }}no node names a dominant driver of the TTFT tail (or no spans){{ end }}."
)


def _why(slo: SLO) -> str:
    """The one-line tail explanation for a latency SLO grouped by model; empty otherwise."""
    return _TTFT_WHY if slo.kind != "availability" and "gen_ai_request_model" in slo.group_by else ""


def _exhaustion(factor: Decimal) -> str:
    """How long the 30-day budget lasts at ``factor`` x burn, in words."""
    hours = Decimal(PERIOD_DAYS * 24) / factor
    if hours < 48:
        return f"{_fmt(hours.quantize(Decimal(1)))} hours"
    return f"{_fmt((hours / 24).quantize(Decimal(1)))} days"


def _fast_page_lines(slo: SLO, fp: FastPage, alerts_group: str) -> list[str]:
    """The fast page: error ratio above ``fp.error_ratio`` over ``fp.window`` for ``fp.for_``, with traffic."""
    sel = f'{{slo="{slo.name}"}}'
    ratio, pct = _fmt(fp.error_ratio), _fmt(fp.error_ratio * 100)
    expr = [
        "        expr: |",
        f"          slo:sli_error:ratio_rate{fp.window}{sel} > {ratio}",
        f"          and slo:sli_requests:rate{fp.window}{sel} >= {_fmt(slo.min_requests_per_s)}",
        f"        for: {fp.for_}",
        "        labels:",
        "          severity: critical",
    ]
    if fp.alert is not None:  # an alert of its own (availability: EngineErrorRateHigh)
        return [
            f"      - alert: {fp.alert}",
            f"        # a burst of failures pages within minutes, before the {WINDOWS[0].long} burn window fills.",
            *expr,
            "        annotations:",
            f"          summary: {_q('Requests to the engine are failing.')}",
            "          description: "
            + _q(
                f"{_subject(slo)}: {{{{ $value | humanizePercentage }}}} of requests failed over the last "
                f"{fp.window} (page above {pct}%); SLO {slo.name}: {_fmt(slo.objective * 100)}% succeed."
            ),
            *links.annotation_lines(fp.alert, alerts_group, "          ", "critical"),
        ]
    factor = fp.error_ratio / slo.budget
    burn = BurnWindow(_fmt(factor), fp.window, fp.window, "critical", fp.for_, _exhaustion(factor))
    objective = _fmt(slo.objective * 100)
    if slo.kind == "availability":
        what, target = f"of requests failed over the last {fp.window}", f"{objective}% succeed"
    else:
        thr = _threshold_text(slo)
        what = f"of requests took longer than {thr} to the first token over the last {fp.window}"
        target = f"{objective}% within {thr}"
    return [
        f"      - alert: {slo.alert}",
        f"        # fast page: a {burn.factor}x burn over {fp.window} alone (the budget gone in {burn.exhaustion}),",
        f"        # pages a burst before the {WINDOWS[0].long} window of the {WINDOWS[0].factor}x pair fills.",
        *expr,
        f"          long: {fp.window}",
        f"          short: {fp.window}",
        f'          burn_rate: "{burn.factor}"',
        "        annotations:",
        f"          summary: {_q(_burn_summary(slo))}",
        "          description: "
        + _q(
            f"{_subject(slo)}: {{{{ $value | humanizePercentage }}}} {what} (page above {pct}%: a {burn.factor}x "
            f"burn, the 30-day error budget gone in {burn.exhaustion}); SLO {slo.name}: {target}." + _why(slo)
        ),
        *links.annotation_lines(slo.alert, alerts_group, "          ", "critical"),
    ]


def render(slos: list[SLO], spec_name: str = "alerts/slo.yml") -> str:
    lines = [
        "# DO NOT EDIT: generated by `python -m inferwatch.agent.alerts.slo` from " + spec_name + ".",
        "# Edit the spec and regenerate; the test suite fails when this file differs from a fresh generation.",
        "groups:",
    ]
    for slo in slos:
        by = ", ".join(slo.group_by)
        sel = f'{{slo="{slo.name}"}}'
        lines += [f"  - name: {links.SLO_GROUP_PREFIX}{slo.name}-sli", "    rules:"]
        for rw in RECORD_WINDOWS:
            lines += [f"      - record: slo:sli_error:ratio_rate{rw}", f"        labels: {{slo: {slo.name}}}"]
            lines += _sli_lines(slo, by, rw)
            lines += [
                f"      - record: slo:sli_requests:rate{rw}",
                f"        labels: {{slo: {slo.name}}}",
                f"        expr: sum by ({by}) (rate({_total(slo)}[{rw}]))",
            ]
        lines += [
            "      - record: slo:objective:ratio",
            f"        labels: {{slo: {slo.name}}}",
            f"        expr: vector({_fmt(slo.objective)})",
            "      - record: slo:error_budget:ratio",
            f"        labels: {{slo: {slo.name}}}",
            f"        expr: vector({_fmt(slo.budget)})",
        ]
        alerts_group = f"{links.SLO_GROUP_PREFIX}{slo.name}-alerts"
        lines += [f"  - name: {alerts_group}", "    rules:"]
        budget = _fmt(slo.budget)
        floor = _fmt(slo.min_requests_per_s)
        for w in WINDOWS:
            guard = (
                [
                    f"        # and over {w.guard}: the burn is still on now, so it stops ~{w.guard} after recovery.",
                    "        expr: |",
                    f"          slo:sli_error:ratio_rate{w.long}{sel} > ({w.factor} * {budget})",
                    f"          and slo:sli_error:ratio_rate{w.short}{sel} > ({w.factor} * {budget})",
                    f"          and slo:sli_error:ratio_rate{w.guard}{sel} > ({w.factor} * {budget})",
                ]
                if w.guard
                else [
                    "        expr: |",
                    f"          slo:sli_error:ratio_rate{w.long}{sel} > ({w.factor} * {budget})",
                    f"          and slo:sli_error:ratio_rate{w.short}{sel} > ({w.factor} * {budget})",
                ]
            )
            lines += [
                f"      - alert: {slo.alert}",
                f"        # {w.factor}x burn over {w.long} and {w.short}: the budget is gone in {w.exhaustion}.",
                *guard,
                f"          and slo:sli_requests:rate{w.short}{sel} >= {floor}",
                f"        for: {w.for_}",
                "        labels:",
                f"          severity: {w.severity}",
                f"          long: {w.long}",
                f"          short: {w.short}",
                f'          burn_rate: "{w.factor}"',
                "        annotations:",
                f"          summary: {_q(_burn_summary(slo))}",
                f"          description: {_q(_burn_description(slo, w))}",
                *links.annotation_lines(slo.alert, alerts_group, "          ", w.severity),
            ]
        if slo.fast_page is not None:
            lines += _fast_page_lines(slo, slo.fast_page, alerts_group)
    return "\n".join(lines) + "\n"


def generate(spec_path: Path = SPEC_PATH) -> str:
    try:
        data = yaml.safe_load(spec_path.read_text(encoding="utf-8"))
    except (OSError, yaml.YAMLError) as exc:
        raise ConfigError(f"cannot read SLO spec {spec_path}: {exc}") from exc
    try:
        name = str(spec_path.resolve().relative_to(ROOT))
    except ValueError:
        name = spec_path.name
    return render(parse_spec(data), name)


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(prog="python -m inferwatch.agent.alerts.slo", description=__doc__.split("\n")[0])
    ap.add_argument("--spec", type=Path, default=SPEC_PATH)
    ap.add_argument("--out", type=Path, default=OUT_PATH)
    ap.add_argument("--check", action="store_true", help="exit 1 if --out differs from a fresh generation")
    args = ap.parse_args(argv)
    try:
        text = generate(args.spec)
    except ConfigError as exc:
        print(f"error: {exc}", file=sys.stderr)
        return 2
    if args.check:
        current = args.out.read_text(encoding="utf-8") if args.out.exists() else ""
        if current != text:
            print(f"{args.out} is out of date: run python -m inferwatch.agent.alerts.slo", file=sys.stderr)
            return 1
        return 0
    args.out.write_text(text, encoding="utf-8")
    print(f"wrote {args.out}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
