"""Generate multiwindow, multi-burn-rate SLO alerts from ``alerts/slo.yml`` into ``alerts/slo.rules.yml``.

Latency SLI from a classic histogram: error ratio = 1 − rate(bucket{le=T}) / rate(count), so T must be an
exact bucket edge of the histogram (checked against the metric catalog), written as the agent's exporter
writes ``le`` (``repr(float)``: ``0.5``, ``1.0``). Numbers are printed as written in the spec (decimal
arithmetic: an objective of 0.999 gives an error budget of ``0.001``, never ``0.000999…``).

    python -m agent.alerts.slo            # write alerts/slo.rules.yml
    python -m agent.alerts.slo --check    # exit 1 when the file differs from a fresh generation
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

from agent.alerts import links
from agent.catalog import CATALOG
from agent.catalog.spec import Kind
from agent.errors import ConfigError

ROOT = Path(__file__).resolve().parents[2]
SPEC_PATH = ROOT / "alerts" / "slo.yml"
OUT_PATH = ROOT / "alerts" / "slo.rules.yml"
PERIOD_DAYS = 30
SLO_NAME_RE = re.compile(r"^[a-z0-9][a-z0-9-]{0,62}$")
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


# SRE Workbook "Alerting on SLOs" (rows 1, 2, 4) + the 3d/6h row of Sloth and kubernetes-mixin; 30-day period.
WINDOWS = (
    BurnWindow("14.4", "1h", "5m", "critical", "2m", "about 2 days"),
    BurnWindow("6", "6h", "30m", "critical", "15m", "5 days"),
    BurnWindow("3", "1d", "2h", "warning", "1h", "10 days"),
    BurnWindow("1", "3d", "6h", "warning", "3h", "30 days"),
)
RECORD_WINDOWS = ("5m", "30m", "1h", "2h", "6h", "1d", "3d")


@dataclass(frozen=True, slots=True)
class SLO:
    name: str
    alert: str
    description: str
    histogram: str
    threshold: Decimal  # seconds, as written
    objective: Decimal
    group_by: tuple[str, ...]
    min_requests_per_s: Decimal

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
        unknown = set(raw) - {
            "name",
            "alert",
            "description",
            "histogram",
            "threshold_s",
            "objective",
            "group_by",
            "min_requests_per_s",
        }
        if unknown:
            raise ConfigError(f"{where}: unknown keys {sorted(unknown)}")
        name = str(raw.get("name", ""))
        if not SLO_NAME_RE.match(name):
            raise ConfigError(f"{where}.name: {name!r} must be lower-case letters, digits and dashes")
        alert = str(raw.get("alert", ""))
        if not ALERT_NAME_RE.match(alert):
            raise ConfigError(f"{where}.alert: {alert!r} must be a CamelCase alert name")
        histogram = str(raw.get("histogram", ""))
        threshold = _decimal(raw.get("threshold_s"), f"{where}.threshold_s")
        buckets = histogram_buckets(histogram)
        if float(threshold) not in buckets:
            edges = ", ".join(repr(b) for b in buckets)
            raise ConfigError(
                f"{where}.threshold_s: {_fmt(threshold)} is not a bucket edge of {histogram} ({edges}); "
                "a latency SLI needs an exact edge"
            )
        objective = _decimal(raw.get("objective"), f"{where}.objective")
        if not Decimal(0) < objective < Decimal(1):
            raise ConfigError(f"{where}.objective: {objective} must be between 0 and 1 (e.g. 0.99)")
        group_by = raw.get("group_by", [])
        if not isinstance(group_by, list) or not all(isinstance(g, str) and LABEL_RE.match(g) for g in group_by):
            raise ConfigError(f"{where}.group_by: expected a list of label names")
        floor = _decimal(raw.get("min_requests_per_s", 0), f"{where}.min_requests_per_s")
        if floor < 0:
            raise ConfigError(f"{where}.min_requests_per_s: must be >= 0")
        out.append(
            SLO(name, alert, str(raw.get("description", "")), histogram, threshold, objective, tuple(group_by), floor)
        )
    names = [s.name for s in out]
    if len(set(names)) != len(names):
        raise ConfigError("SLO spec: duplicate slo names")
    return out


def _q(s: str) -> str:
    """A YAML single-quoted scalar."""
    return "'" + s.replace("'", "''") + "'"


def _threshold_text(slo: SLO) -> str:
    t = slo.threshold
    return f"{_fmt(t * 1000)}ms" if t < 1 else f"{_fmt(t)}s"


def render(slos: list[SLO], spec_name: str = "alerts/slo.yml") -> str:
    lines = [
        "# DO NOT EDIT: generated by `python -m agent.alerts.slo` from " + spec_name + ".",
        "# Edit the spec and regenerate; the test suite fails when this file differs from a fresh generation.",
        "groups:",
    ]
    for slo in slos:
        by = ", ".join(slo.group_by)
        sel = f'{{slo="{slo.name}"}}'
        lines += [f"  - name: {links.SLO_GROUP_PREFIX}{slo.name}-sli", "    rules:"]
        for rw in RECORD_WINDOWS:
            lines += [
                f"      - record: slo:sli_error:ratio_rate{rw}",
                f"        labels: {{slo: {slo.name}}}",
                "        expr: |",
                "          1 - (",
                f'            sum by ({by}) (rate({slo.histogram}_bucket{{le="{slo.le}"}}[{rw}]))',
                f"            / sum by ({by}) (rate({slo.histogram}_count[{rw}]))",
                "          )",
                f"      - record: slo:sli_requests:rate{rw}",
                f"        labels: {{slo: {slo.name}}}",
                f"        expr: sum by ({by}) (rate({slo.histogram}_count[{rw}]))",
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
        pct = _fmt(slo.objective * 100)
        thr = _threshold_text(slo)
        model = "{{ $labels.gen_ai_request_model }}" if "gen_ai_request_model" in slo.group_by else "all models"
        for w in WINDOWS:
            lines += [
                f"      - alert: {slo.alert}",
                f"        # {w.factor}x burn over {w.long} and {w.short}: the budget is gone in {w.exhaustion}.",
                "        expr: |",
                f"          slo:sli_error:ratio_rate{w.long}{sel} > ({w.factor} * {budget})",
                f"          and slo:sli_error:ratio_rate{w.short}{sel} > ({w.factor} * {budget})",
                f"          and slo:sli_requests:rate{w.short}{sel} >= {_fmt(slo.min_requests_per_s)}",
                f"        for: {w.for_}",
                "        labels:",
                f"          severity: {w.severity}",
                f"          long: {w.long}",
                f"          short: {w.short}",
                f'          burn_rate: "{w.factor}"',
                "        annotations:",
                f"          summary: {_q('The TTFT SLO error budget is burning too fast.')}",
                "          description: "
                + _q(
                    f"{model}: {{{{ $value | humanizePercentage }}}} of requests took longer than {thr} to the "
                    f"first token over the last {w.long} (and over {w.short}); SLO {slo.name}: {pct}% within {thr}. "
                    f"At {w.factor}x the 30-day error budget is gone in {w.exhaustion}."
                ),
                *links.annotation_lines(slo.alert, alerts_group, "          "),
            ]
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
    ap = argparse.ArgumentParser(prog="python -m agent.alerts.slo", description=__doc__.split("\n")[0])
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
            print(f"{args.out} is out of date: run python -m agent.alerts.slo", file=sys.stderr)
            return 1
        return 0
    args.out.write_text(text, encoding="utf-8")
    print(f"wrote {args.out}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
