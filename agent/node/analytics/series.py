"""The agent's own cardinality: how many series its ``/metrics`` holds, against a budget (``series_budget``).

A processor (run by the runner on the processing schedule, like the span analytics): it counts the series of
every catalog metric in the state as the Prometheus exposition writes them (one per label set; a histogram
one per bucket, ``+Inf`` included, plus ``_sum`` and ``_count``) and reports

- ``inferwatch.agent.series``: the total, its own four series included;
- ``inferwatch.agent.series.budget``: the configured budget (``AgentSeriesBudgetExceeded`` compares the two);
- ``inferwatch.agent.series.models``: the models (``gen_ai.request.model`` values) with at least one series;
- ``inferwatch.agent.series.max_per_model``: the most series one model has.

The count is of the state one processing cycle old (the processor's own previous samples are left out and its
four added), so it matches a scrape taken while nothing changes. docs/cardinality.md has the budget per model.
"""

from __future__ import annotations

from collections import Counter
from collections.abc import Iterable
from typing import ClassVar

from inferwatch.agent import catalog
from inferwatch.agent.catalog.engine import MODEL
from inferwatch.agent.catalog.spec import Kind
from inferwatch.agent.common.samples import AnySample, Collection, HistogramSample, Sample
from inferwatch.agent.node.state import AgentState

OWN = (
    "inferwatch.agent.series",
    "inferwatch.agent.series.budget",
    "inferwatch.agent.series.models",
    "inferwatch.agent.series.max_per_model",
)


def count(samples: Iterable[AnySample]) -> tuple[int, Counter[str]]:
    """(series in the exposition, series per model) of these samples, deduplicated as the exporter does."""
    seen: set[tuple[str, tuple[str, ...]]] = set()
    total = 0
    per_model: Counter[str] = Counter()
    for s in samples:
        spec = catalog.CATALOG.get(s.name)
        if spec is None or s.name in OWN:
            continue
        a = dict(s.attributes)
        key = (s.name, tuple(a.get(k, "") for k in spec.attributes))
        if key in seen:
            continue
        seen.add(key)
        if isinstance(s, HistogramSample):
            if spec.kind is not Kind.HISTOGRAM:
                continue
            n = len(s.buckets) + (2 if s.buckets and s.buckets[0][0] >= 0 else 0)
        elif spec.kind is Kind.HISTOGRAM:
            continue
        else:
            n = 1
        total += n
        model = a.get(MODEL)
        if model:
            per_model[model] += n
    return total, per_model


class SeriesBudget:
    """Counts the state's series for the runner (the collector protocol: name, collect, close)."""

    name: ClassVar[str] = "series"

    def __init__(self, state: AgentState, budget: int) -> None:
        self.state = state
        self.budget = budget

    def collect(self) -> Collection:
        total, per_model = count(self.state.samples())
        return Collection(
            samples=[
                Sample(OWN[0], total + len(OWN)),
                Sample(OWN[1], self.budget),
                Sample(OWN[2], len(per_model)),
                Sample(OWN[3], max(per_model.values(), default=0)),
            ]
        )

    def close(self) -> None:
        """Nothing to release."""
