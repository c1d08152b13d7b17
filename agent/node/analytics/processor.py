"""The span analytics as a processor: run by the runner on its schedule, written through ``record()``.

:class:`SpanAnalytics` is scheduled like a collector (the ``host`` lane, the agent's interval, pulled
forward by a scrape like the collectors), so its samples reach the state validated against the catalog
and are never computed when a sink reads. Its input is the engine collector's last collection, read
from the state (:class:`~inferwatch.agent.node.analytics.latency.EngineSeries`), and the timings the receiver recorded.
"""

from __future__ import annotations

from typing import ClassVar

from inferwatch.agent.common.samples import Collection
from inferwatch.agent.node.analytics.explain import TailExplainer
from inferwatch.agent.node.analytics.latency import EngineSeries, LatencyAnalytics
from inferwatch.agent.node.state import AgentState

ENGINE = "engine"  # the collector whose collection says which models and frontend_gap series it has


class SpanAnalytics:
    """Runs :meth:`LatencyAnalytics.compute` for the runner (the collector protocol: name, collect, close)."""

    name: ClassVar[str] = "spans"

    def __init__(
        self,
        analytics: LatencyAnalytics,
        state: AgentState,
        explainer: TailExplainer | None = None,
        engine: str = ENGINE,
    ) -> None:
        """``engine``: the collector whose models the spans are matched to (an engine target's ``engine:<name>``)."""
        self.analytics = analytics
        self.state = state
        self.explainer = explainer
        self.engine = engine

    def collect(self) -> Collection:
        collection = self.state.collections().get(self.engine)
        engine = EngineSeries.of(collection)
        if self.explainer is not None and collection is not None:  # preemptions and per-rank ITL, for stock spans
            self.explainer.observe_engine(collection.samples, collection.details.get("rank_itl"))
        samples = self.analytics.compute(engine)
        samples.extend(self.analytics.failures.samples())
        if self.explainer is not None:  # the tail verdict the alerts quote (inferwatch.engine.tail.driver)
            samples.extend(self.explainer.samples(engine.models, self.analytics.published))
            samples.extend(self.explainer.failures.samples())
        return Collection(samples=samples)

    def close(self) -> None:
        """Nothing to release."""
