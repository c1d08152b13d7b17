"""Runs each enabled collector on its interval, with a timeout, isolating failures.

One scheduler thread per collector; the collector's ``collect`` runs on its own worker thread so a
hang is detected by the timeout without blocking anyone else. A hung call is never started twice: the
collector stays "failed (hung)" until that call returns. Samples are checked against the catalog
before they reach the state; a collector that returns garbage fails, it does not break a sink.
State changes are logged once (failed → ok → absent), never per cycle.
"""

from __future__ import annotations

import concurrent.futures
import logging
import math
import threading
import time
from collections.abc import Iterable
from dataclasses import replace

from agent import catalog
from agent.catalog.spec import Kind
from agent.collectors.base import BaseCollector, Collection
from agent.config import Settings
from agent.errors import CatalogError, NoDataError
from agent.samples import HistogramSample, Sample
from agent.state import AgentState, CollectorHealth

log = logging.getLogger(__name__)


def validate(collection: object) -> Collection:
    """Check a collector's return value against the catalog; raise CatalogError on any mismatch."""
    if not isinstance(collection, Collection):
        raise CatalogError(f"collect() returned {type(collection).__name__}, not Collection")
    for s in collection.samples:
        if isinstance(s, HistogramSample):
            spec = catalog.get(s.name)
            if spec.kind is not Kind.HISTOGRAM:
                raise CatalogError(f"{s.name} is a {spec.kind.value}, not a histogram")
            if not s.buckets or not math.isinf(s.buckets[-1][0]):
                raise CatalogError(f"{s.name}: histogram must end with a +Inf bucket")
        elif isinstance(s, Sample):
            spec = catalog.get(s.name)
            if spec.kind is Kind.HISTOGRAM:
                raise CatalogError(f"{s.name} is a histogram; got a plain sample")
            if not isinstance(s.value, (int, float)) or isinstance(s.value, bool) or math.isnan(float(s.value)):
                raise CatalogError(f"{s.name}: value {s.value!r} is not a number")
        else:
            raise CatalogError(f"sample of type {type(s).__name__} is not a Sample")
        keys = tuple(k for k, _ in s.attributes)
        if set(keys) != set(spec.attributes) or len(keys) != len(spec.attributes):
            raise CatalogError(
                f"{s.name}: attributes {sorted(keys)} differ from the catalog's {sorted(spec.attributes)}"
            )
    return collection


def run_collection(collector: BaseCollector) -> Collection:
    """Run one collector in the calling thread and validate what it returns (used by doctor)."""
    return validate(collector.collect())


class Runner:
    def __init__(self, settings: Settings, state: AgentState, collectors: Iterable[BaseCollector]) -> None:
        self.settings = settings
        self.state = state
        self.collectors = list(collectors)
        self._stop = threading.Event()
        self._threads: list[threading.Thread] = []
        for c in self.collectors:
            state.register(CollectorHealth(c.name, *self._timing(c)))

    def _timing(self, c: BaseCollector) -> tuple[float, float]:
        cfg = self.settings.collector(c.name)
        interval = cfg.interval_s or c.default_interval_s or self.settings.interval_s
        timeout = cfg.timeout_s or min(self.settings.timeout_s, interval)
        return interval, timeout

    def start(self) -> None:
        for c in self.collectors:
            t = threading.Thread(target=self._loop, args=(c,), name=f"collector-{c.name}", daemon=True)
            t.start()
            self._threads.append(t)

    def stop(self, timeout_s: float = 5.0) -> None:
        """Stop scheduling; wait (bounded) for loops to end; close collectors. Safe to call twice."""
        self._stop.set()
        deadline = time.monotonic() + timeout_s
        for t in self._threads:
            t.join(max(0.0, deadline - time.monotonic()))
        for c in self.collectors:
            try:
                c.close()
            except Exception:
                log.debug("closing collector %s failed", c.name, exc_info=True)
        self._threads = []

    def _loop(self, collector: BaseCollector) -> None:
        interval, timeout = self._timing(collector)
        pool = concurrent.futures.ThreadPoolExecutor(max_workers=1, thread_name_prefix=f"collect-{collector.name}")
        pending: concurrent.futures.Future[Collection] | None = None
        try:
            while not self._stop.is_set():
                started = time.monotonic()
                if pending is not None and not pending.done():
                    self._finish(collector, started, None, "hung", f"previous run still running after {timeout:g}s")
                else:
                    pending = pool.submit(run_collection, collector)
                    self._await(collector, pending, started, timeout)
                elapsed = time.monotonic() - started
                self._stop.wait(max(0.0, interval - elapsed))
        finally:
            pool.shutdown(wait=False, cancel_futures=True)

    def _await(
        self, collector: BaseCollector, fut: concurrent.futures.Future[Collection], started: float, timeout: float
    ) -> None:
        try:
            result = fut.result(timeout=timeout)
        except concurrent.futures.TimeoutError:
            self._finish(collector, started, None, "timeout", f"timed out after {timeout:g}s")
        except NoDataError as exc:
            try:
                absent = validate(Collection(samples=list(exc.samples))) if exc.samples else Collection()
            except CatalogError as bad:
                self._finish(collector, started, None, "bad_sample", str(bad))
                return
            self._finish(collector, started, absent, "absent", str(exc.args[0] if exc.args else exc), exc.hint)
        except CatalogError as exc:
            self._finish(collector, started, None, "bad_sample", str(exc))
        except Exception as exc:
            self._finish(collector, started, None, "exception", f"{type(exc).__name__}: {exc}")
        else:
            self._finish(collector, started, result, "ok")

    def _finish(
        self,
        collector: BaseCollector,
        started: float,
        collection: Collection | None,
        outcome: str,
        message: str | None = None,
        hint: str | None = None,
    ) -> None:
        now = time.time()
        prev = self.state.health()[collector.name]
        failed = outcome not in ("ok", "absent")
        new_state = "failed" if failed else outcome
        counts = dict(prev.error_counts)
        if failed:
            reason = "timeout" if outcome == "hung" else outcome
            counts[reason] = counts.get(reason, 0) + 1
        health = replace(
            prev,
            runs=prev.runs + 1,
            errors=prev.errors + (1 if failed else 0),
            last_run_at=now,
            last_success_at=prev.last_success_at if failed else now,
            duration_s=time.monotonic() - started,
            state=new_state,
            last_error=message if failed else prev.last_error,
            error_reason=outcome if failed else prev.error_reason,
            hint=hint if outcome == "absent" else None,
            error_counts=counts,
        )
        self._log_transition(prev, health, message, hint)
        self.state.record(collector.name, health, collection)

    @staticmethod
    def _log_transition(prev: CollectorHealth, new: CollectorHealth, message: str | None, hint: str | None) -> None:
        changed = prev.state != new.state or (new.state == "failed" and prev.error_reason != new.error_reason)
        if not changed:
            return
        if new.state == "failed":
            log.error("collector %s failing (%s): %s", new.name, new.error_reason, message)
        elif new.state == "absent":
            log.warning("collector %s: no data: %s%s", new.name, message, f" (hint: {hint})" if hint else "")
        elif prev.state in ("failed", "absent"):
            log.info("collector %s recovered", new.name)
