"""Prometheus exposition of the agent state, with names and labels from the catalog, so they match what the
OpenTelemetry Collector produces from our OTLP export.

``/metrics`` is answered by :func:`render`, which writes the text format straight from the state: byte for
byte what prometheus_client's ``generate_latest`` makes of the agent's registry
(:mod:`inferwatch.exporters.openmetrics`, a custom collector on its own registry; tests/test_exposition.py holds
it to that),
without building a family object per metric and re-validating every name and label on every scrape (a
scrape's cost grows with the code and memory it touches: docs/benchmarks.md, "The agent's CPU target").
"""

from __future__ import annotations

import math
from collections import defaultdict
from collections.abc import Callable, Iterable, Iterator
from itertools import chain
from operator import attrgetter, is_, itemgetter

from inferwatch.agent import catalog
from inferwatch.agent.catalog.engine import TARGET_ATTRIBUTES
from inferwatch.agent.catalog.spec import Kind, MetricSpec
from inferwatch.agent.common.precedence import step_aside
from inferwatch.agent.common.samples import AnySample, Collection, HistogramSample, by_name
from inferwatch.agent.node.state import AgentState

CONTENT_TYPE = "text/plain; version=0.0.4; charset=utf-8"
OPENMETRICS_CONTENT_TYPE = "application/openmetrics-text; version=1.0.0; charset=utf-8"


def float_text(value: float) -> str:
    """A sample value as prometheus_client writes it (``prometheus_client.utils.floatToGoString``, Apache-2.0):
    Python's repr, ``+Inf``/``-Inf``/``NaN``, and Go's exponent form for positive values of 10^7 and above. Here
    so that the text path does not import prometheus_client (~4 MB per agent); tests/test_exposition.py compares
    the two byte for byte."""
    s = repr(float(value))
    dot = s.find(".")
    if dot > 6 and s[0] != "-":  # a positive value of 10^7 and above (repr has no exponent below 10^16)
        mantissa = f"{s[0]}.{s[1:dot]}{s[dot + 1 :]}".rstrip("0.")
        return f"{mantissa}e+{dot - 1:02d}"
    return _SPECIAL.get(s, s) if dot < 0 else s  # inf, -inf, nan; or an exponent form, as it is


_SPECIAL = {"inf": "+Inf", "-inf": "-Inf", "nan": "NaN"}


def fmt_le(bound: float) -> str:
    return "+Inf" if math.isinf(bound) else repr(float(bound))


Series = list[tuple[tuple[str, ...], AnySample]]


def state_series(state: AgentState) -> Iterator[tuple[MetricSpec, tuple[str, ...], Series]]:
    """Every catalog metric in the state, by name: its spec, the target attributes its series carry, and (label
    values: catalog order, then those target attributes; sample).

    A target attribute (:data:`~inferwatch.agent.catalog.engine.TARGET_ATTRIBUTES`: which engine, when the agent
    watches several) is a label of a family where one of its series has it, empty on the others (an empty label is
    no label to Prometheus); a family without any is as the catalog declares it. The same series from two sources
    keeps the first; a sample whose name the catalog lacks is dropped (the runner validates; an attached source
    might not). Both :func:`render` and the OpenMetrics collector read this.
    """
    grouped: dict[str, list[AnySample]] = defaultdict(list)
    for s in state.samples():
        grouped[s.name].append(s)
    for name in sorted(grouped):
        spec = catalog.CATALOG.get(name)
        if spec is None:
            continue
        present = {k for s in grouped[name] for k, _ in s.attributes if k in TARGET_ATTRIBUTES}
        keys = (*spec.attributes, *(k for k in TARGET_ATTRIBUTES if k in present))
        seen: set[tuple[str, ...]] = set()
        series = []
        for s in grouped[name]:
            a = dict(s.attributes)
            values = tuple(a.get(k, "") for k in keys)
            if values not in seen:
                seen.add(values)
                series.append((values, s))
        yield spec, keys[len(spec.attributes) :], series


def _picker(order: tuple[int, ...]) -> Callable[[tuple[str, ...]], tuple[str, ...]]:
    """A function that takes the items ``order`` names out of a tuple, as a tuple (one C call from two items up)."""
    if not order:
        return lambda values: ()
    if len(order) == 1:
        i = order[0]
        return lambda values: (values[i],)
    return itemgetter(*order)


class _Format:
    """One metric's fixed text: HELP and TYPE lines, sample names, label names in output (sorted) order."""

    __slots__ = ("at", "bucket", "count", "header", "kind", "line", "name", "order", "sum")

    def __init__(self, spec: MetricSpec, targets: tuple[str, ...] = ()) -> None:
        name = spec.prometheus
        kind = "histogram" if spec.kind is Kind.HISTOGRAM else "counter" if spec.kind is Kind.COUNTER else "gauge"
        doc = spec.description.replace("\\", r"\\").replace("\n", r"\n")
        self.header = f"# HELP {name} {doc}\n# TYPE {name} {kind}\n".encode()
        self.name = name
        self.kind = spec.kind
        # prometheus_client writes labels sorted by label name; a histogram's "le" takes its sorted place too (``at``
        # label values come before it). ``order`` takes a series' label values from catalog attribute order (its key)
        # into that order, in one C call; each line is written from a template with "%s" for each label value
        # (escaped first) and the sample value.
        all_labels = (*spec.prometheus_labels, *(TARGET_ATTRIBUTES[k] for k in targets))
        ranked = sorted((label, i) for i, label in enumerate(all_labels))
        names = [label for label, _ in ranked]
        self.order = _picker(tuple(i for _, i in ranked))
        labels = ",".join(f'{label}="%s"' for label in names)
        braces = f"{{{labels}}}" if names else ""
        self.line = f"{name}{braces} %s\n"
        self.count = f"{name}_count{braces} %s\n"
        self.sum = f"{name}_sum{braces} %s\n"
        self.at = at = sorted([*names, "le"]).index("le")
        before = "".join(f'{label}="%s",' for label in names[:at])
        after = "".join(f',{label}="%s"' for label in names[at:])
        self.bucket = f'{name}_bucket{{{before}le="%s"{after}}} %s\n'


_FORMATS: dict[tuple[str, tuple[str, ...]], _Format] = {}
_ATTRIBUTES = attrgetter("attributes")  # by (metric, target attributes its family carries)


def _escape(value: str) -> str:
    if "\\" in value or "\n" in value or '"' in value:
        return value.replace("\\", r"\\").replace("\n", r"\n").replace('"', r"\"")
    return value


def _target_keys(present: set[str] | frozenset[str]) -> tuple[str, ...]:
    return tuple(k for k in TARGET_ATTRIBUTES if k in present)


class _Block:
    """One family's samples from one collection, and their series lines once rendered.

    The lines depend only on the samples and on the target attributes the whole family carries (a label of every
    series of the family once one series has it, :func:`state_series`), so a collection's block is rendered once,
    for the targets it was asked with, and reused by every scrape until the collector records a new collection.
    ``values`` are the label values of its series (deduplicated), kept only when the family has another source to
    be checked against.
    """

    __slots__ = ("_present", "_text", "_values", "samples")

    def __init__(self, samples: list[AnySample]) -> None:
        self.samples = samples
        self._present: frozenset[str] | None = None
        self._text: tuple[tuple[str, ...], bytes] | None = None
        self._values: tuple[tuple[str, ...], set[tuple[str, ...]]] | None = None

    @property
    def present(self) -> frozenset[str]:
        """The target attributes its samples carry (found when first asked: a block :func:`prerender` replaces by
        its predecessor's is never asked)."""
        if self._present is None:
            pairs = set(chain.from_iterable(map(_ATTRIBUTES, self.samples)))  # few: the samples share their pairs
            self._present = frozenset(k for k, _ in pairs if k in TARGET_ATTRIBUTES)
        return self._present

    def values(self, spec: MetricSpec, targets: tuple[str, ...]) -> set[tuple[str, ...]]:
        if self._values is None or self._values[0] != targets:
            keys = (*spec.attributes, *targets)
            self._values = (targets, {tuple(dict(s.attributes).get(k, "") for k in keys) for s in self.samples})
        return self._values[1]

    def text(self, spec: MetricSpec, targets: tuple[str, ...], skip: set[tuple[str, ...]] | None = None) -> bytes:
        """The series lines, encoded; ``skip``: label values already written by another source (never cached then)."""
        if skip is None and self._text is not None and self._text[0] == targets:
            return self._text[1]
        text = _lines(spec, targets, self.samples, skip).encode()
        if skip is None:
            self._text = (targets, text)
        return text


def _lines(
    spec: MetricSpec, targets: tuple[str, ...], samples: list[AnySample], skip: set[tuple[str, ...]] | None
) -> str:
    fmt = _FORMATS.get((spec.name, targets))
    if fmt is None:
        fmt = _FORMATS[(spec.name, targets)] = _Format(spec, targets)
    keys = (*spec.attributes, *targets)
    blanks = ("",) * len(keys)
    seen: set[tuple[str, ...]] = set() if skip is None else set(skip)
    histogram = fmt.kind is Kind.HISTOGRAM
    order, line, at = fmt.order, fmt.line, fmt.at
    out: list[str] = []
    les: dict[float, str] = {}  # bucket bounds as text
    for s in samples:
        a = dict(s.attributes)
        values = tuple(map(a.get, keys, blanks))
        if values in seen:  # the same series twice: the first is kept, as prometheus_client's registry would
            continue
        seen.add(values)
        labels = order(values)
        text = "".join(labels)
        if "\\" in text or "\n" in text or '"' in text:
            labels = tuple(map(_escape, labels))
        if isinstance(s, HistogramSample):
            if not histogram:
                continue
            head, tail = labels[:at], labels[at:]
            bucket = fmt.bucket
            for le, count in s.buckets:
                bound = les.get(le)
                if bound is None or not le:  # 0.0 and -0.0 are one key, two texts
                    bound = les[le] = fmt_le(le)
                out.append(bucket % (*head, bound, *tail, float_text(count)))
            if s.buckets and s.buckets[0][0] >= 0:  # prometheus_client drops count and sum below zero
                out.append(fmt.count % (*labels, float_text(s.buckets[-1][1])))
                out.append(fmt.sum % (*labels, float_text(s.sum)))
        elif not histogram:
            out.append(line % (*labels, float_text(s.value)))
    return "".join(out)


def _blocks(samples: Iterable[AnySample]) -> dict[str, _Block]:
    return {name: _Block(group) for name, group in by_name(samples).items() if name in catalog.CATALOG}


def prerender(collection: Collection) -> None:
    """Render ``collection``'s series lines now, in the collector's thread, for the scrapes that will serve it.

    The runner calls it after a run, outside its lock (the composition root passes it as the runner's
    ``prepare``): a scrape then writes the collection's families from text made before it arrived, and an engine of
    hundreds of models costs its scrape a concatenation, not a render. Each family is rendered for the target
    attributes it carries itself; a scrape that finds the family carrying more (another source's) renders again.
    A collection that carries its predecessor's blocks (``rendered``, as the engine collector's progress passes do)
    keeps each block whose samples are the very same objects, text and all: only the families that changed are
    rendered.
    """
    before: dict[str, _Block] = collection.rendered.get("prometheus") or {}
    blocks = _blocks(collection.samples)
    for name, block in blocks.items():
        old = before.get(name)
        if old is not None and len(old.samples) == len(block.samples) and all(map(is_, old.samples, block.samples)):
            blocks[name] = old
            continue
        step_aside()  # a request the API answers goes first (agent/common/precedence.py)
        block.text(catalog.CATALOG[name], _target_keys(block.present))
    collection.rendered["prometheus"] = blocks


def _collection_blocks(collection: Collection) -> dict[str, _Block]:
    blocks = collection.rendered.get("prometheus")
    if blocks is None:  # not prerendered (an action's result, a test's state): made now, kept for the next scrape
        blocks = collection.rendered["prometheus"] = _blocks(collection.samples)
    return blocks


def render(state: AgentState) -> bytes:
    """The state in the Prometheus text format, as ``generate_latest(make_registry(state))`` writes it: the parts
    of :func:`render_parts`, joined."""
    return b"".join(render_parts(state))


def render_parts(state: AgentState) -> list[bytes]:
    """The Prometheus text format of the state, in parts (a family's header, its blocks' lines), to be written one
    after the other: the scrape's answer is never one more copy of the whole text (5.7 MB at 200 models).

    Each collection's families come from its blocks (:func:`prerender`: rendered once per collection, in the
    collector's thread); the attached sources and the runner's health, small and computed on demand, are rendered
    here. A family is written once, its sources' lines one after the other, in the order :func:`state_series`
    reads them; a series a later source repeats is dropped.
    """
    families: dict[str, list[_Block]] = defaultdict(list)
    for collection in state.collections().values():
        for name, block in _collection_blocks(collection).items():
            families[name].append(block)
    for name, block in _blocks(state.loose_samples()).items():
        families[name].append(block)
    body: list[bytes] = []
    for name in sorted(families):
        spec = catalog.CATALOG[name]
        blocks = families[name]
        targets = _target_keys(frozenset().union(*(b.present for b in blocks)))
        fmt = _FORMATS.get((spec.name, targets))
        if fmt is None:
            fmt = _FORMATS[(spec.name, targets)] = _Format(spec, targets)
        body.append(fmt.header)
        if len(blocks) == 1:
            body.append(blocks[0].text(spec, targets))
            continue
        written: set[tuple[str, ...]] = set()
        for block in blocks:
            values = block.values(spec, targets)
            body.append(block.text(spec, targets, None if written.isdisjoint(values) else written))
            written |= values
    return body  # the prerendered text itself, no re-encoding on the scrape


def render_openmetrics(state: AgentState) -> bytes:
    """The state in the OpenMetrics text format, with the latency histograms' exemplars (trace ids).

    Served when the scraper asks for it (Prometheus does, first, in its Accept header) and the span receiver feeds
    histograms (``receiver.emit_histograms``): through prometheus_client's registry
    (:mod:`inferwatch.exporters.openmetrics`, imported on the first such scrape: an agent without exemplars never
    loads prometheus_client, ~4 MB), slower than :func:`render`.
    """
    from inferwatch.exporters.openmetrics import render_openmetrics as render

    return render(state)
