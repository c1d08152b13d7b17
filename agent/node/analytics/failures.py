"""Per-model isolation of a span analytics step: one model's failure costs that model's series, not everyone's.

The span analytics run once per cycle for every model with spans (:class:`~agent.processor.SpanAnalytics`); a
step that raised for one model used to fail the whole cycle, and every model's span series left ``/metrics``
while the offending records stayed in the window. :class:`ModelFailures` runs each model's step on its own:
a model whose step raises is left out of that cycle and counted (``inferwatch.analytics.errors{stage}``), and
the problem is logged once when the model starts failing and once when it recovers (or leaves the window),
never per cycle.
"""

from __future__ import annotations

import logging
import threading
from collections.abc import Callable, Iterable
from typing import TypeVar

from inferwatch.agent.common.samples import Sample, attrs

T = TypeVar("T")
METRIC = "inferwatch.analytics.errors"
STAGES = ("latency", "explain")

log = logging.getLogger(__name__)


class ModelFailures:
    """Runs one step per model, counting and logging the models whose step raised (thread-safe)."""

    def __init__(self, stage: str) -> None:
        if stage not in STAGES:
            raise ValueError(f"stage must be one of {', '.join(STAGES)}, got {stage!r}")
        self.stage = stage
        self.errors = 0
        self._failing: set[str] = set()
        self._lock = threading.Lock()

    def run(self, model: str, step: Callable[[], T]) -> T | None:
        """``step()``, or None when it raised (counted; logged when ``model`` starts failing)."""
        try:
            out = step()
        except Exception as exc:  # isolation is the point: any bug here costs one model, not all
            with self._lock:
                self.errors += 1
                first = model not in self._failing
                self._failing.add(model)
            if first:
                log.warning(
                    "span analytics (%s) failed for model %r; its series are left out until it recovers: %s: %s",
                    self.stage,
                    model,
                    type(exc).__name__,
                    exc,
                    exc_info=log.isEnabledFor(logging.DEBUG),
                )
            return None
        if model in self._failing:
            self._recovered(model, "recovered")
        return out

    def keep(self, models: Iterable[str]) -> None:
        """Forget the failing models not among ``models`` (they left the window: nothing fails any more)."""
        gone = self._failing.difference(models)
        for model in gone:
            self._recovered(model, "has no records left in the window")

    def _recovered(self, model: str, why: str) -> None:
        with self._lock:
            if model not in self._failing:
                return
            self._failing.discard(model)
        log.info("span analytics (%s) for model %r %s", self.stage, model, why)

    def failing(self) -> list[str]:
        with self._lock:
            return sorted(self._failing)

    def samples(self) -> list[Sample]:
        return [Sample(METRIC, float(self.errors), attrs(stage=self.stage))]
