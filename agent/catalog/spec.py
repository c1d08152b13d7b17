"""The metric declaration type and the OpenTelemetry-to-Prometheus name translation.

Names are translated exactly as the OpenTelemetry Collector (prometheus/otlptranslator,
``UnderscoreEscapingWithSuffixes``) translates them, so a rule or panel works whether Prometheus
scrapes the agent or receives its data through a Collector:

1. characters outside ``[a-zA-Z0-9:]`` become ``_`` (runs collapse), a leading digit gets ``_``;
2. the unit adds a suffix (``s`` → ``seconds``, ``By`` → ``bytes`` ...), not repeated if already a token;
3. monotonic sums (counters) get ``_total`` last;
4. gauges with unit ``1`` get ``_ratio``.

The agent never emits colons (they are for recording rules), so rule 1 is applied to ``:`` as well.
"""

from __future__ import annotations

import enum
import re
from dataclasses import dataclass


class Kind(str, enum.Enum):
    GAUGE = "gauge"
    COUNTER = "counter"  # monotonic sum
    UPDOWNCOUNTER = "updowncounter"  # non-monotonic sum: a gauge in Prometheus, no _total
    HISTOGRAM = "histogram"


UNIT_SUFFIXES: dict[str, str] = {
    "s": "seconds",
    "ms": "milliseconds",
    "us": "microseconds",
    "By": "bytes",
    "KiBy": "kibibytes",
    "MiBy": "mebibytes",
    "W": "watts",
    "J": "joules",
    "Hz": "hertz",
    "Cel": "celsius",
    "%": "percent",
}
PER_UNIT_SUFFIXES: dict[str, str] = {"s": "second", "m": "minute", "h": "hour", "d": "day"}

_INVALID = re.compile(r"[^a-zA-Z0-9]+")


def _unit_suffix(unit: str) -> str:
    if not unit or unit == "1" or (unit.startswith("{") and unit.endswith("}")):
        return ""
    if "/" in unit:
        num, _, den = unit.partition("/")
        num_s = "" if num.startswith("{") else UNIT_SUFFIXES.get(num, num)
        den_s = PER_UNIT_SUFFIXES.get(den, UNIT_SUFFIXES.get(den, den))
        return f"{num_s}_per_{den_s}" if num_s else f"per_{den_s}"
    return UNIT_SUFFIXES.get(unit, unit)


def prometheus_name(name: str, kind: Kind, unit: str) -> str:
    """Translate an OpenTelemetry metric name as the Collector's Prometheus exporter does."""
    tokens = [t for t in _INVALID.sub("_", name).split("_") if t]
    suffix = _unit_suffix(unit)
    if suffix:
        suffix_tokens = suffix.split("_")
        if tokens[-len(suffix_tokens) :] != suffix_tokens:
            tokens += suffix_tokens
    if kind is Kind.COUNTER and tokens[-1] != "total":
        tokens.append("total")
    if kind is Kind.GAUGE and unit == "1" and tokens[-1] != "ratio":
        tokens.append("ratio")
    out = "_".join(tokens)
    return "_" + out if out[:1].isdigit() else out


def prometheus_label(attribute: str) -> str:
    """Translate an attribute key to a Prometheus label name (dots and other characters → ``_``)."""
    label = _INVALID.sub("_", attribute)
    return "_" + label if label[0].isdigit() else label


@dataclass(frozen=True, slots=True)
class MetricSpec:
    """One metric, declared once: every sink, the docs and the rule/dashboard lint read this."""

    name: str
    kind: Kind
    unit: str
    description: str
    attributes: tuple[str, ...] = ()
    buckets: tuple[float, ...] = ()  # histogram upper bounds (seconds), without +Inf

    @property
    def prometheus(self) -> str:
        return prometheus_name(self.name, self.kind, self.unit)

    @property
    def prometheus_labels(self) -> tuple[str, ...]:
        return tuple(prometheus_label(a) for a in self.attributes)

    def series_names(self) -> tuple[str, ...]:
        """Every Prometheus series name this metric produces (histograms have three)."""
        base = self.prometheus
        if self.kind is Kind.HISTOGRAM:
            return (f"{base}_bucket", f"{base}_sum", f"{base}_count")
        return (base,)
