"""Span analytics per engine target: two engines' latencies on one node are two sets of series, never one.

With discovered engine targets (agent/node/targets.py) and the span receiver on, :class:`TargetSpans` is the
receiver's sink. Each finished request goes to the latency analytics and tail explainer of the engine whose pod its
span's resource names (``RequestTiming.resource``: ``k8s.namespace.name``, ``k8s.pod.name``, ``k8s.container.name``,
set by the engine from the Downward API in ``OTEL_RESOURCE_ATTRIBUTES``); a request no target claims (no such
attributes, or a pod the agent does not watch) goes to the node's own analytics, as without discovery. Each target's
:class:`TargetSpanAnalytics` processor (``spans:<target>``) computes its series from its own requests and its own
engine collector's models (``engine:<target>``), and stamps them with the target's identity, as the target's
collectors' series are.

Matching is by namespace and pod, and by container where the span names one: a pod with two engine containers
needs ``k8s.container.name`` on its spans to keep them apart (without it, the pod's first target takes them).
"""

from __future__ import annotations

import threading
from collections.abc import Callable, Iterable, Mapping
from dataclasses import dataclass, replace
from typing import ClassVar

from inferwatch.agent.common.samples import AnySample, Attributes, Collection, RequestTiming
from inferwatch.agent.node.analytics.explain import RecordingSink, TailExplainer
from inferwatch.agent.node.analytics.latency import LatencyAnalytics
from inferwatch.agent.node.analytics.processor import SpanAnalytics
from inferwatch.agent.node.state import AgentState

NAMESPACE, POD, CONTAINER = "k8s.namespace.name", "k8s.pod.name", "k8s.container.name"
Factory = Callable[[], tuple[LatencyAnalytics, TailExplainer]]


@dataclass(frozen=True, slots=True)
class EngineSpans:
    """One engine target's span analytics and tail explainer."""

    name: str
    analytics: LatencyAnalytics
    explainer: TailExplainer

    def sink(self) -> RecordingSink:
        return RecordingSink(self.analytics, self.explainer)


class TargetSpans:
    """The receiver's sink with engine targets: each request to its engine's analytics (see the module docstring).

    ``default``: the node's sink, for requests no target claims; ``make``: a new (analytics, explainer) pair, built
    as the node's is. Thread-safe: the receiver records while the supervisor adds and removes targets.
    """

    def __init__(self, default: RecordingSink, make: Factory) -> None:
        self.default = default
        self._make = make
        self._lock = threading.Lock()
        self._engines: dict[str, tuple[EngineSpans, RecordingSink]] = {}
        self._by_pod: dict[tuple[str, str, str], str] = {}  # (namespace, pod, container or "") → target name

    def add(self, name: str, identity: Mapping[str, str]) -> EngineSpans | None:
        """Analytics of its own for target ``name`` (its identity's ``k8s.*`` attributes); None when the identity
        names no pod, so that no span can be told to be its."""
        pod = identity.get(POD, "")
        if not pod:
            return None
        namespace, container = identity.get(NAMESPACE, ""), identity.get(CONTAINER, "")
        analytics, explainer = self._make()
        engine = EngineSpans(name, analytics, explainer)
        with self._lock:
            self._engines[name] = (engine, engine.sink())
            self._by_pod[(namespace, pod, container)] = name
            self._by_pod.setdefault((namespace, pod, ""), name)  # spans that name no container: the pod's first
        return engine

    def remove(self, name: str) -> None:
        with self._lock:
            self._engines.pop(name, None)
            for key in [k for k, v in self._by_pod.items() if v == name]:
                del self._by_pod[key]
            for (namespace, pod, container), other in list(self._by_pod.items()):  # the pod's next target, if any
                if container:
                    self._by_pod.setdefault((namespace, pod, ""), other)

    def explainer(self, name: str) -> TailExplainer | None:
        """Target ``name``'s tail explainer; None when it has none (no pod identity, or gone)."""
        with self._lock:
            found = self._engines.get(name)
        return found[0].explainer if found is not None else None

    def engine_of(self, resource: Attributes) -> str | None:
        """The target a span's resource identity names, or None."""
        if not resource:
            return None
        r = dict(resource)
        key = (r.get(NAMESPACE, ""), r.get(POD, ""), r.get(CONTAINER, ""))
        with self._lock:
            return self._by_pod.get(key) or (self._by_pod.get((key[0], key[1], "")) if key[2] else None)

    def record(self, timings: Iterable[RequestTiming]) -> int:
        """Hand each request to its engine's sink (the node's for none); the number dropped (too many models)."""
        groups: dict[str | None, list[RequestTiming]] = {}
        for t in timings:
            groups.setdefault(self.engine_of(t.resource), []).append(t)
        dropped = 0
        for name, batch in groups.items():
            with self._lock:
                found = self._engines.get(name) if name is not None else None
            dropped += (found[1] if found is not None else self.default).record(batch)
        return dropped

    def record_client(self, pairs: Iterable[tuple[str, float]]) -> None:
        """Clients' own TTFTs carry no engine: every explainer gets them (each pairs them with its own traces)."""
        batch = list(pairs)
        self.default.record_client(batch)
        with self._lock:
            sinks = [sink for _, sink in self._engines.values()]
        for sink in sinks:
            sink.record_client(batch)


class TargetSpanAnalytics:
    """One target's span analytics on the runner (``spans:<target>``): its own requests, its own engine collector's
    models, its series stamped with the target's identity."""

    name: ClassVar[str] = SpanAnalytics.name  # shadowed per instance: one processor (and health) per target

    def __init__(self, engine: EngineSpans, state: AgentState, identity: Attributes) -> None:
        self.name = f"{SpanAnalytics.name}:{engine.name}"  # type: ignore[misc]
        self.identity = identity
        self.inner = SpanAnalytics(engine.analytics, state, engine.explainer, engine=f"engine:{engine.name}")

    def collect(self) -> Collection:
        c = self.inner.collect()
        return Collection(samples=[_stamped(s, self.identity) for s in c.samples])

    def close(self) -> None:
        self.inner.close()


def _stamped(sample: AnySample, identity: Attributes) -> AnySample:
    return replace(sample, attributes=tuple(sorted((*sample.attributes, *identity))))
