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

The count is kept per family and per collection, and a family is counted again only when what its count depends on
changed (:func:`_shape`: the samples' attributes, types and histogram bucket counts, never their values): a collection
whose samples are the very same sequence as at the last count is not looked at, and a new one (an engine's next read, a
progress pass carrying its predecessor's samples) is compared family by family, in C-speed tuple comparisons. At 200
models x 2 ranks (41k series) a full count takes ~0.1 s of the interpreter, which the processor spent on every scrape
and every interval (docs/benchmarks.md, "``/metrics`` and the API while a 200-model engine is read"); a count that finds
nothing changed takes ~1 ms. The result is :func:`count` over every sample: a series is counted once (its first
source's), and the families that more than one source writes are counted together, from their samples.
"""

from __future__ import annotations

from collections import Counter
from collections.abc import Iterable, Sequence
from itertools import chain
from operator import attrgetter
from typing import ClassVar

from inferwatch.agent import catalog
from inferwatch.agent.catalog.engine import MODEL
from inferwatch.agent.catalog.spec import Kind, MetricSpec
from inferwatch.agent.common.samples import AnySample, Collection, HistogramSample, Sample, by_name
from inferwatch.agent.node.state import AgentState

OWN = (
    "inferwatch.agent.series",
    "inferwatch.agent.series.budget",
    "inferwatch.agent.series.models",
    "inferwatch.agent.series.max_per_model",
)


def _families(samples: Iterable[AnySample]) -> dict[str, list[AnySample]]:
    """The samples of each counted family (a catalog metric, not one of :data:`OWN`), in order."""
    return {name: group for name, group in by_name(samples).items() if name in catalog.CATALOG and name not in OWN}


def _count_family(spec: MetricSpec, samples: Iterable[AnySample]) -> tuple[int, Counter[str]]:
    """(series, series per model) of one family's samples: the first sample of each label set (in the catalog's
    attributes) counts, as the exporter keeps it; one of the wrong kind for the family counts nothing."""
    keys = spec.attributes
    blanks = ("",) * len(keys)
    histogram = spec.kind is Kind.HISTOGRAM
    at = keys.index(MODEL) if MODEL in keys else -1
    seen: set[tuple[str | None, ...]] = set()
    total = 0
    per_model: Counter[str] = Counter()
    for s in samples:
        a = dict(s.attributes)
        key = tuple(map(a.get, keys, blanks))
        if key in seen:
            continue
        seen.add(key)
        if isinstance(s, HistogramSample):
            if not histogram:
                continue
            n = len(s.buckets) + (2 if s.buckets and s.buckets[0][0] >= 0 else 0)
        elif histogram:
            continue
        else:
            n = 1
        total += n
        model = key[at] if at >= 0 else a.get(MODEL)
        if model:
            per_model[model] += n
    return total, per_model


def count(samples: Iterable[AnySample]) -> tuple[int, Counter[str]]:
    """(series in the exposition, series per model) of these samples, deduplicated as the exporter does."""
    total = 0
    per_model: Counter[str] = Counter()
    for name, group in _families(samples).items():
        n, models = _count_family(catalog.CATALOG[name], group)
        total += n
        per_model.update(models)
    return total, per_model


def _shape(samples: list[AnySample]) -> tuple[object, ...]:
    """What a family's count depends on, for each sample: its attributes, its type and, for a histogram, its number
    of buckets and whether the first bound is at least zero (never its values). Equal shapes, equal counts."""
    types = tuple(map(type, samples))
    buckets = tuple(
        (len(s.buckets), bool(s.buckets) and s.buckets[0][0] >= 0) for s in samples if isinstance(s, HistogramSample)
    )
    return tuple(map(_ATTRIBUTES, samples)), types, buckets


_ATTRIBUTES = attrgetter("attributes")


class _Family:
    """One family's count in one collection, and the shape of the samples it was counted from (:func:`_shape`)."""

    __slots__ = ("per_model", "shape", "total")

    total: int
    per_model: Counter[str]

    def __init__(self, name: str, samples: list[AnySample], before: _Family | None) -> None:
        self.shape = _shape(samples)
        if before is not None and before.shape == self.shape:  # the same objects: compared by identity, at once
            self.total, self.per_model = before.total, before.per_model
        else:
            self.total, self.per_model = _count_family(catalog.CATALOG[name], samples)


class SeriesBudget:
    """Counts the state's series for the runner (the collector protocol: name, collect, close)."""

    name: ClassVar[str] = "series"

    def __init__(self, state: AgentState, budget: int) -> None:
        self.state = state
        self.budget = budget
        # per collector: the samples of its collection at the last count (held until the next count, for the identity
        # check; not the collection, whose rendered text would be held with it) and that collection's families
        self._counted: dict[str, tuple[Sequence[AnySample], dict[str, _Family]]] = {}

    def _collection_families(self, name: str, collection: Collection) -> dict[str, _Family]:
        last = self._counted.get(name)
        if last is not None and last[0] is collection.samples:
            return last[1]
        before = last[1] if last is not None else {}
        families = {f: _Family(f, group, before.get(f)) for f, group in _families(collection.samples).items()}
        self._counted[name] = (collection.samples, families)
        return families

    def totals(self) -> tuple[int, Counter[str]]:
        """:func:`count` of the state's samples, each unchanged family's count reused."""
        collections = self.state.collections()
        for gone in self._counted.keys() - collections.keys():
            del self._counted[gone]
        counted = [self._collection_families(name, c) for name, c in collections.items()]
        loose = _families(self.state.loose_samples())  # small, computed now: counted each time
        seen: set[str] = set()
        shared: set[str] = set()  # families of more than one source: their samples counted together
        for names in [*(fs.keys() for fs in counted), loose.keys()]:
            shared.update(seen.intersection(names))
            seen.update(names)
        total = 0
        per_model: Counter[str] = Counter()
        parts = [(f.total, f.per_model) for fs in counted for name, f in fs.items() if name not in shared]
        parts += [_count_family(catalog.CATALOG[name], group) for name, group in loose.items() if name not in shared]
        for name in shared:
            groups = [[x for x in c.samples if x.name == name] for c in collections.values()]
            parts.append(_count_family(catalog.CATALOG[name], chain(*groups, loose.get(name, ()))))
        for n, models in parts:
            total += n
            per_model.update(models)
        return total, per_model

    def collect(self) -> Collection:
        total, per_model = self.totals()
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
