"""Plain values that collectors return and sinks translate.

A collector returns a list of :class:`Sample` (gauge/counter values) and :class:`HistogramSample`
(cumulative bucket counts). Names are the catalog's OpenTelemetry names (``process.memory.usage``);
values are in the catalog's base unit (seconds, bytes, ratio 0..1).
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, field

Attributes = tuple[tuple[str, str], ...]


def attrs(mapping: Mapping[str, object] | None = None, **kwargs: object) -> Attributes:
    """Build a canonical (sorted, stringified) attribute tuple."""
    merged: dict[str, object] = dict(mapping or {})
    merged.update(kwargs)
    return tuple(sorted((str(k), str(v)) for k, v in merged.items()))


@dataclass(frozen=True, slots=True)
class Sample:
    """One value of a catalog metric with its attributes."""

    name: str
    value: float
    attributes: Attributes = ()


@dataclass(frozen=True, slots=True)
class HistogramSample:
    """A cumulative histogram: ``buckets`` holds (upper bound, cumulative count), ``+Inf`` last."""

    name: str
    buckets: tuple[tuple[float, float], ...]
    sum: float
    count: float
    attributes: Attributes = ()


@dataclass(frozen=True, slots=True)
class Finding:
    """A diagnostic conclusion a collector or analyser reached (shown by doctor and the status API)."""

    id: str
    status: str  # ok | warn | fail | skip
    summary: str
    evidence: Mapping[str, object] = field(default_factory=dict)
    runbook: str = ""


AnySample = Sample | HistogramSample
