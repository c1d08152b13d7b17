"""The agent state: the latest collection of every collector and the runner's health record.

Collectors write through the runner, actions (the binary check) through :meth:`AgentState.post`; sinks
(Prometheus, OTLP, the API, the CLI) only read snapshots, or listen for new collections
(:meth:`AgentState.add_listener`: the snapshot store and the OTLP log sink). Imports nothing but the
value types (:mod:`inferwatch.agent.common.samples`).
"""

from __future__ import annotations

import logging
import threading
import time
from collections.abc import Callable, Iterator
from dataclasses import dataclass, field, replace
from typing import Any

from inferwatch.agent import __version__
from inferwatch.agent.common.samples import AnySample, Collection, Finding, Sample, attrs

log = logging.getLogger(__name__)


@dataclass(frozen=True, slots=True)
class CollectorHealth:
    """How a collector's runs went. Times are Unix seconds; ``duration_s`` is the last run's wall time."""

    name: str
    interval_s: float
    timeout_s: float
    runs: int = 0
    errors: int = 0
    last_run_at: float | None = None
    last_success_at: float | None = None
    duration_s: float | None = None
    state: str = "pending"  # pending | ok | absent | failed
    last_error: str | None = None
    error_reason: str | None = None  # exception | timeout | bad_sample | hung
    hint: str | None = None
    error_counts: dict[str, int] = field(default_factory=dict)

    def as_dict(self) -> dict[str, Any]:
        return {
            "name": self.name,
            "state": self.state,
            "interval_s": self.interval_s,
            "timeout_s": self.timeout_s,
            "runs": self.runs,
            "errors": self.errors,
            "last_run_at": self.last_run_at,
            "last_success_at": self.last_success_at,
            "duration_s": self.duration_s,
            "last_error": self.last_error,
            "error_reason": self.error_reason,
            "hint": self.hint,
        }


SampleSource = Callable[[], list[AnySample]]
Listener = Callable[[str, Collection], None]


def next_health(
    prev: CollectorHealth,
    outcome: str,
    duration_s: float,
    now: float,
    message: str | None = None,
    hint: str | None = None,
) -> CollectorHealth:
    """The record after one run: ``outcome`` is ok | absent | exception | timeout | bad_sample | hung."""
    failed = outcome not in ("ok", "absent")
    counts = dict(prev.error_counts)
    if failed:
        reason = "timeout" if outcome == "hung" else outcome
        counts[reason] = counts.get(reason, 0) + 1
    return CollectorHealth(  # not dataclasses.replace: this runs for every collection
        prev.name,
        prev.interval_s,
        prev.timeout_s,
        runs=prev.runs + 1,
        errors=prev.errors + (1 if failed else 0),
        last_run_at=now,
        last_success_at=prev.last_success_at if failed else now,
        duration_s=duration_s,
        state="failed" if failed else outcome,
        last_error=message if failed else prev.last_error,
        error_reason=outcome if failed else prev.error_reason,
        hint=hint if outcome == "absent" else None,
        error_counts=counts,
    )


class AgentState:
    """Thread-safe store of the latest values. Extra sample sources (analytics) can be attached."""

    def __init__(self, environment: str = "unknown") -> None:
        self._lock = threading.Lock()
        self._collections: dict[str, Collection] = {}
        self._health: dict[str, CollectorHealth] = {}
        self._sources: dict[str, SampleSource] = {}
        self._listeners: list[Listener] = []
        self.environment = environment
        self.started_at = time.time()
        self.identity: dict[str, str] = {}

    # --- writers (the runner) ---
    def register(self, health: CollectorHealth) -> None:
        with self._lock:
            self._health[health.name] = health

    def record(self, name: str, health: CollectorHealth, collection: Collection | None) -> None:
        """Keep a run's health and collection; then tell the listeners (outside the lock)."""
        with self._lock:
            self._health[name] = health
            if collection is None:
                self._collections.pop(name, None)
            else:
                self._collections[name] = collection
            listeners = list(self._listeners) if collection is not None else []
        for listener in listeners:
            try:
                listener(name, collection)  # type: ignore[arg-type]
            except Exception:  # a sink's bug must not fail the collector that fed it
                log.debug("state listener %r failed", listener, exc_info=True)

    def post(
        self,
        name: str,
        collection: Collection | None,
        outcome: str,
        duration_s: float,
        message: str | None = None,
        hint: str | None = None,
    ) -> CollectorHealth:
        """An action's result (the binary check): recorded as one run of ``name``, as the runner records one."""
        with self._lock:
            prev = self._health.get(name) or CollectorHealth(name, 0.0, 0.0)
        health = next_health(prev, outcome, duration_s, time.time(), message, hint)
        self.record(name, health, collection)
        return health

    def forget(self, name: str) -> None:
        """Drop a collector that no longer runs (an engine target that went away): its health, its collection and
        the sample sources attached under its name (``name`` or ``name.<part>``), so none of its series outlive it."""
        with self._lock:
            self._health.pop(name, None)
            self._collections.pop(name, None)
            for key in [k for k in self._sources if k == name or k.startswith(name + ".")]:
                del self._sources[key]

    def add_listener(self, listener: Listener) -> None:
        """Call ``listener(name, collection)`` after every recorded collection (a sink of events)."""
        with self._lock:
            self._listeners.append(listener)

    def add_source(self, name: str, source: SampleSource) -> None:
        """Attach a callable that returns samples on demand (e.g. windowed analytics)."""
        with self._lock:
            self._sources[name] = source

    # --- readers (sinks) ---
    def health(self) -> dict[str, CollectorHealth]:
        with self._lock:
            return {k: replace(v) for k, v in self._health.items()}

    def health_of(self, name: str) -> CollectorHealth:
        """One collector's record (immutable, so not copied)."""
        with self._lock:
            return self._health[name]

    def collections(self) -> dict[str, Collection]:
        with self._lock:
            return dict(self._collections)

    def findings(self) -> list[Finding]:
        return [f for c in self.collections().values() for f in c.findings]

    def ready(self) -> bool:
        return all(h.runs > 0 for h in self.health().values())

    def samples(self) -> Iterator[AnySample]:
        """Every current sample: collectors' latest values, attached sources, and the runner's health."""
        for collection in self.collections().values():
            yield from collection.samples
        yield from self.loose_samples()

    def loose_samples(self) -> Iterator[AnySample]:
        """The samples not held in a collection: attached sources' (computed now), the agent's info and the runner's
        health of every collector."""
        with self._lock:
            sources = list(self._sources.values())
        for source in sources:
            yield from source()
        yield Sample("inferwatch.agent.info", 1, attrs(version=__version__, environment=self.environment))
        for h in self.health().values():
            a = attrs(collector=h.name)
            if h.duration_s is not None:
                yield Sample("inferwatch.collector.duration", h.duration_s, a)
            if h.runs:
                yield Sample("inferwatch.collector.success", 0 if h.state == "failed" else 1, a)
                yield Sample("inferwatch.collector.data_absent", 1 if h.state == "absent" else 0, a)
            if h.last_success_at is not None:
                yield Sample("inferwatch.collector.last_success_timestamp", h.last_success_at, a)
            for reason in ("exception", "timeout", "bad_sample"):
                yield Sample(
                    "inferwatch.collector.errors", h.error_counts.get(reason, 0), attrs(collector=h.name, reason=reason)
                )
