"""Plain values that collectors return and sinks translate.

A collector returns one :class:`Collection`: a list of :class:`Sample` (gauge/counter values) and
:class:`HistogramSample` (cumulative bucket counts). Names are the catalog's OpenTelemetry names
(``process.memory.usage``); values are in the catalog's base unit (seconds, bytes, ratio 0..1).
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass, field
from itertools import groupby
from operator import attrgetter
from typing import Any

Attributes = tuple[tuple[str, str], ...]
Exemplar = tuple[str, float, float]  # (trace id hex, observed value, Unix seconds)


# Attribute pairs are few and repeat in every collection (a model's name in each of its ~120 samples): each is one
# shared tuple, up to this many distinct pairs (past it, new pairs are not shared). At 200 models the engine
# collection's samples hold ~89k pairs: ~5 MB as tuples of their own (docs/benchmarks.md, "Engine scale").
MAX_SHARED_PAIRS = 16_384
_PAIRS: dict[tuple[str, str], tuple[str, str]] = {}


def attrs(mapping: Mapping[str, object] | None = None, **kwargs: object) -> Attributes:
    """Build a canonical (sorted, stringified) attribute tuple; its pairs are shared (see :data:`MAX_SHARED_PAIRS`)."""
    merged: dict[str, object] = dict(mapping or {})
    merged.update(kwargs)
    shared = _PAIRS
    out = []
    for k, v in merged.items():
        pair = (str(k), str(v))
        hit = shared.get(pair)
        if hit is None:
            hit = shared.setdefault(pair, pair) if len(shared) < MAX_SHARED_PAIRS else pair
        out.append(hit)
    out.sort()
    return tuple(out)


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
    # Per bucket (same order as ``buckets``), the last request observed in it: (trace id hex, seconds, Unix time),
    # or None; empty when the histogram keeps none. Written as OpenMetrics exemplars (exporters/prometheus.py).
    exemplars: tuple[Exemplar | None, ...] = ()


@dataclass(frozen=True, slots=True)
class Finding:
    """A diagnostic conclusion a collector or analyser reached (shown by doctor and the status API)."""

    id: str
    status: str  # ok | warn | fail | skip
    summary: str
    evidence: Mapping[str, object] = field(default_factory=dict)
    runbook: str = ""


AnySample = Sample | HistogramSample
UNKNOWN_MODEL = "unknown"  # the model of a span that names none (inferwatch.agent.node.receiver.spans)


@dataclass(frozen=True, slots=True)
class RequestTiming:
    """One finished request, from a span (the receiver) to the span analytics.

    ``seconds`` maps a quantity (``ttft``, ``itl``, ``e2e``, ``queue``, ``prefill``, ``decode``,
    ``inference``) to its value in seconds.
    """

    model: str
    seconds: dict[str, float] = field(default_factory=dict)
    prompt_tokens: int | None = None
    completion_tokens: int | None = None
    # Who the request was, for the tail explainer (inferwatch.agent.node.analytics.explain): trace id (hex), the
    # engine's request id, preemptions when the span says, and the attributes that may separate a tail (dp_rank, lora,
    # tenant).
    trace_id: str | None = None
    request_id: str | None = None
    preemptions: int | None = None
    labels: Attributes = ()
    # GenAI semantic-convention attributes of the span (inferwatch.agent.catalog.genai), None where the span has none;
    # error_type is set for a request that failed (the span's error.type, else "_OTHER" for a span with status ERROR).
    operation: str | None = None
    provider: str | None = None
    error_type: str | None = None
    # Which engine sent it: the span's resource identity (k8s.namespace.name, k8s.pod.name, k8s.container.name where
    # set, sorted pairs), by which the span analytics tell the engines of one node apart.
    resource: Attributes = ()


@dataclass(frozen=True, slots=True)
class Collection:
    """What one collector run (or one action) produced.

    ``events`` are documents for the log sinks (a redacted runtime_profile snapshot): a sink that listens
    on the state (:meth:`inferwatch.agent.node.state.AgentState.add_listener`) stores or exports them; the source never
    knows which sink does.
    """

    samples: Sequence[AnySample] = ()
    findings: Sequence[Finding] = ()
    details: Mapping[str, Any] = field(default_factory=dict)  # shown in the status API
    events: Sequence[Mapping[str, Any]] = ()
    # What a sink made of this collection for reuse until the next one (the Prometheus exposition's rendered text,
    # inferwatch.exporters.prometheus.prerender), by sink; not part of its value.
    rendered: dict[str, Any] = field(default_factory=dict, compare=False, hash=False, repr=False)


def by_name(samples: Iterable[AnySample]) -> dict[str, list[AnySample]]:
    """The samples of each name, in order, the names in the order they first come. A run of samples of one name (a
    collector writes a family's samples together) is taken in one C-level step, not sample by sample: the exposition
    and the series count group an engine's thousands of samples so on every collection."""
    grouped: dict[str, list[AnySample]] = {}
    for name, run in groupby(samples, _NAME):
        group = grouped.get(name)
        if group is None:
            grouped[name] = list(run)
        else:
            group.extend(run)
    return grouped


_NAME = attrgetter("name")
