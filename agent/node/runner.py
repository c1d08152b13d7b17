"""Runs each enabled collector on its interval, with a timeout, isolating failures.

When to run what is decided by the pure functions of :mod:`inferwatch.agent.node.schedule` on the runner's clock (a
parameter); this module adds the threads. One scheduler thread; collectors run on lane worker threads (see
:class:`Runner`), so a hang is detected by the timeout without blocking anyone else. A hung call is never
started twice: the collector stays "failed (hung)" until that call returns. A scrape can pull due runs
forward (:meth:`Runner.pull`). Samples are checked against the catalog before they reach the state; a
collector that returns garbage fails, it does not break a sink. A failure is logged when it starts (one error
line) and when it ends (recovered, or no data), never per cycle: while it lasts, only a cause not yet logged in it
adds a line (:func:`failure_cause`; a timeout is one cause, whichever deadline cut the run). A failure the runner
decides itself (``timeout``, ``hung``) is told to the collector
(:meth:`~inferwatch.agent.node.collectors.base.BaseCollector.run_failed`), so health it exports itself (``engine.up``)
is true. A collector that has a verdict due before its next timed run (the engine collector's hang window) says so
with ``read_again_in()`` after a run, and its next run comes then.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import math
import operator
import threading
import time
from collections import deque
from collections.abc import Callable, Iterable, Mapping, Sequence
from dataclasses import dataclass, field
from itertools import compress
from operator import itemgetter

from inferwatch.agent import catalog
from inferwatch.agent.catalog.engine import TARGET_ATTRIBUTES
from inferwatch.agent.catalog.spec import Kind
from inferwatch.agent.common.precedence import step_aside
from inferwatch.agent.common.redact import redact_text
from inferwatch.agent.common.samples import Collection, HistogramSample, Sample
from inferwatch.agent.errors import CatalogError, NoDataError
from inferwatch.agent.node.collectors import Schedule
from inferwatch.agent.node.collectors.base import Collector
from inferwatch.agent.node.schedule import SlotTimes, adaptive_interval, after_run, next_wake, pulled_runs, timed_runs
from inferwatch.agent.node.state import AgentState, CollectorHealth, next_health

log = logging.getLogger(__name__)


def _check(s: object) -> tuple[str, type, tuple[str, ...]]:
    """Check one sample against the catalog (CatalogError on a mismatch); return what its check depended on besides
    its value: (name, type, attribute names), the key under which :func:`validate` remembers that it passed."""
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
    names = tuple(k for k, _ in s.attributes)
    keys = tuple(k for k in names if k not in TARGET_ATTRIBUTES)  # a target's identity is allowed
    if set(keys) != set(spec.attributes) or len(keys) != len(spec.attributes):
        raise CatalogError(f"{s.name}: attributes {sorted(keys)} differ from the catalog's {sorted(spec.attributes)}")
    return s.name, type(s), names


_NAME = itemgetter(0)
# (name, type, attribute names) of the samples that passed :func:`_check`: a sample of one of them needs only its own
# value checked (the catalog does not change while the agent runs). Bounded: past it, samples are checked in full.
_PASSED: set[tuple[str, type, tuple[str, ...]]] = set()
MAX_PASSED = 65_536


def validate(collection: object, known: Sequence[object] = ()) -> Collection:
    """Check a collector's return value against the catalog; raise CatalogError on any mismatch.

    ``known``: samples already validated (the collector's last collection): the ones of them this collection holds
    again, the very same objects (samples are immutable), are not checked again; an engine's progress pass repeats
    its full read's ~2,200 samples at 10 models. A sample whose name, type and attribute names passed before has
    only its value checked; the first sample that fails is reported as a full check reports it."""
    if not isinstance(collection, Collection):
        raise CatalogError(f"collect() returned {type(collection).__name__}, not Collection")
    samples: Iterable[object] = collection.samples
    if known:
        seen = set(map(id, known))  # held by the caller: no id among them is reused meanwhile
        samples = compress(samples, map(operator.not_, map(seen.__contains__, map(id, samples))))
    passed = _PASSED
    for s in samples:
        cls = type(s)
        if cls is Sample:
            value = s.value  # type: ignore[attr-defined]
            ok = (type(value) is float and value == value) or type(value) is int
        elif cls is HistogramSample:
            buckets = s.buckets  # type: ignore[attr-defined]
            ok = bool(buckets) and buckets[-1][0] == math.inf
        else:
            ok = False
        if ok and (s.name, cls, tuple(map(_NAME, s.attributes))) in passed:  # type: ignore[attr-defined]
            continue
        key = _check(s)
        if len(passed) < MAX_PASSED:
            passed.add(key)
    return collection


def _all_cycled(waiting: list[tuple[_Slot, int]]) -> bool:
    return all(slot.cycles > seen for slot, seen in waiting)


_NO_HOOK = object()


def _hook(collector: Collector, name: str) -> object:
    """The value of the collector's optional hook ``name()``, or ``_NO_HOOK`` when it has none or it fails (a
    collector's bug must not stop the scheduler)."""
    hook = getattr(collector, name, None)
    if not callable(hook):
        return _NO_HOOK
    try:
        return hook()
    except Exception:
        log.debug("collector %s: %s() failed", collector.name, name, exc_info=True)
        return _NO_HOOK


def _read_again_in(collector: Collector) -> float | None:
    """The collector's ``read_again_in()`` (seconds; the engine collector's, for a hang verdict due before its next
    timed run), None when it has none or it fails: the timed run stands."""
    value = _hook(collector, "read_again_in")
    return float(value) if isinstance(value, int | float) and value == value else None


def _paces_cadence(collector: Collector) -> bool:
    """The collector's ``paces_cadence()``: False when its last run's cost is not to set its next interval (the
    engine collector's full read, made once per collection interval between its cheap progress passes); True when
    it has no such hook or the hook fails."""
    value = _hook(collector, "paces_cadence")
    return True if value is _NO_HOOK else bool(value)


def run_collection(collector: Collector, known: Sequence[object] = ()) -> Collection:
    """Run one collector in the calling thread and validate what it returns (``known``: see :func:`validate`)."""
    return validate(collector.collect(), known)


# Scrapes drive the collections when they come at most this many times the shortest interval apart.
STANDBY_GAP_RATIO = 1.5
STANDBY_FALLBACK_GAPS = 2.5  # no scrape for this many gaps: the scheduler takes the timed runs back
STANDBY_SAFETY_S = 60.0  # a standing-by scheduler still looks once a minute (should the loop have died)
RUNNER_FAILURES = ("timeout", "hung")  # outcomes the runner records without the collector having raised them
MAX_LOGGED_CAUSES = 8  # causes logged (and kept) within one failure; past them, further causes are only counted

# A scrape waits for a pulled run only if that collector's last call took at most this long (see Runner.pull):
# /metrics answers within ~0.1 s whatever the slowest source costs (issue 38: median <= 100 ms at 200 models).
PULL_WAIT_BUDGET_S = 0.1


def failure_cause(exc: BaseException) -> str:
    """What a failure is logged under: the ``reason`` an error carries (an engine scrape's ``timeout``,
    ``connect``, ``http_status``...), else its type. The runner's own ``timeout`` and ``hung`` are ``timeout``,
    so a source cut sometimes by its own deadline and sometimes by the runner's is one failure, not two."""
    reason = getattr(exc, "reason", None)
    return reason if isinstance(reason, str) and reason else type(exc).__name__


@dataclass
class _Failure:
    """A collector's failure in progress: since when, how many failed runs, which causes were logged."""

    since: float
    runs: int = 0
    causes: set[str] = field(default_factory=set)


@dataclass(eq=False)
class _Slot:
    """One collector's schedule; every field is guarded by the runner's lock."""

    collector: Collector
    interval: float
    timeout: float
    lane: str
    on_scrape: bool = False  # run on every scrape (a processor of in-memory input: cheap, and the scrape sees it)
    absence_final: bool = False  # an absence is not retried (nothing configured to watch)
    absent_retry_s: float | None = None  # an absence is retried after this long
    slow_interval: float | None = None  # adaptive: ``interval`` follows the last run's CPU time up to this
    fast_interval: float = 0.0  # adaptive: the interval while a run is cheap (the schedule's)
    due: float = 0.0  # monotonic time of its next run
    started: float = -math.inf  # monotonic time its last call started
    running: bool = False  # queued in or running on its lane
    stuck: bool = False  # its last call timed out and has not returned yet
    cycles: int = 0  # completed cycles (any outcome)
    removed: bool = False  # taken off the runner (Runner.remove): a call still running records nothing
    last_s: float = 0.0  # wall seconds of its last completed call: a scrape waits only for a quick one
    # the samples of its last validated collection (a copy), for the next validation (validate's ``known``); touched
    # only by the thread making its call, which is never made twice at once
    validated: tuple[object, ...] = ()

    def times(self) -> SlotTimes:
        return SlotTimes(self.interval, self.due, self.started, self.running, self.stuck, self.on_scrape)


@dataclass(eq=False)
class _Lane:
    """A worker thread that runs its queued calls one after another."""

    name: str
    cond: threading.Condition
    queue: deque[_Slot] = field(default_factory=deque)
    worker: object = None  # the current worker's token; a worker whose token is replaced exits
    current: _Slot | None = None
    deadline: float = math.inf  # when the current call times out
    threads: list[threading.Thread] = field(default_factory=list)


class Runner:
    """Runs each enabled collector on its interval, with a timeout, isolating failures.

    One scheduler thread, and one worker thread per lane: the host collectors (quick /proc, /sys and NVML
    reads) share the ``host`` lane and run one after another; a collector that waits on the network or a
    subprocess (engine, probe, runtime_profile) has a lane of its own (the registry says which). A cycle is
    thus a handful of thread wake-ups, not two per collector (why: docs/benchmarks.md, "The agent's CPU target"). A call
    that passes its timeout is recorded as failed (``timeout``) and its lane gets a new worker for the calls
    queued behind it; the stuck call's thread is abandoned, and the collector is not called again ("failed
    (hung)" each cycle) until that call returns.

    While an event loop's scrapes come at the collection interval (:meth:`pull_async`), they drive the runs
    and expire overdue calls themselves, and the scheduler stands by: it sleeps (looking once a minute) until
    the loop's fallback timer, pushed back by every scrape, finds no scrape for 2.5 gaps and hands the timed
    runs back to it. A standing-by scheduler costs no wake-up per cycle.
    """

    def __init__(
        self,
        state: AgentState,
        collectors: Iterable[Collector],
        schedules: Mapping[str, Schedule],
        clock: Callable[[], float] = time.monotonic,
        prepare: Callable[[Collection], None] | None = None,
        around: Callable[[str], contextlib.AbstractContextManager[object]] | None = None,
    ) -> None:
        """``schedules``: each collector's, by name (the composition root takes them from the registry,
        :func:`inferwatch.agent.node.collectors.schedules`); a collector without one is a ValueError. ``prepare``:
        called with each run's collection in the collector's thread, before it is recorded and outside the runner's
        lock (a sink's work done ahead of its readers: the exposition's text). ``around``: a context each run and its
        ``prepare`` are made in, given the collector's name (the garbage collector's policy, agent/node/gcpolicy.py)."""
        self._prepare = prepare
        self._around = around
        self.state = state
        self.collectors = list(collectors)
        missing = sorted({c.name for c in self.collectors} - set(schedules))
        if missing:
            raise ValueError(f"no schedule for collector(s) {', '.join(missing)}")
        self._clock = clock  # monotonic seconds; the schedule itself is pure (inferwatch.agent.node.schedule)
        self._stop = threading.Event()
        self._lock = threading.Lock()
        self._wake = threading.Condition(self._lock)  # the scheduler waits on it
        self._cycled = threading.Condition(self._lock)  # pull() waits on it
        self._lanes: dict[str, _Lane] = {}
        self._slots: list[_Slot] = []
        self._scheduler: threading.Thread | None = None
        self._last_pull: float | None = None
        self._pull_gap: float | None = None  # time between the last two pulls
        self._planned = -math.inf  # when the sleeping scheduler wakes next (-inf: awake)
        # While an event loop's scrapes drive the collections (pull_async at the collection interval), the
        # scheduler stands by: it sleeps until the loop's fallback timer says the scrapes stopped.
        self._standby = False
        self._fallback: asyncio.TimerHandle | None = None  # that timer; touched on the loop's thread only
        self._waiters: list[tuple[list[tuple[_Slot, int]], Callable[[], None]]] = []  # pull_async's scrapes
        self._failures: dict[str, _Failure] = {}  # collectors failing now, by name (logged once per cause)
        self._running = False  # started: a lane added later (Runner.add) gets its worker at once
        for c in self.collectors:
            plan = schedules[c.name]
            interval, timeout, lane = plan.interval_s, plan.timeout_s, plan.lane
            if lane not in self._lanes:
                self._lanes[lane] = _Lane(lane, threading.Condition(self._lock))
            slow = plan.slow_interval_s
            self._slots.append(
                _Slot(
                    c, interval, timeout, lane, plan.on_scrape, plan.absence_final, plan.absent_retry_s, slow, interval
                )
            )
            state.register(CollectorHealth(c.name, max(interval, slow or 0.0), timeout))

    def start(self) -> None:
        with self._lock:
            self._running = True
            for lane in self._lanes.values():
                self._new_worker(lane)
        self._scheduler = threading.Thread(target=self._schedule, name="collector-scheduler", daemon=True)
        self._scheduler.start()

    def pull(self, wait_s: float) -> None:
        """Bring forward, into the caller's scrape, every run that was due before the next scrape; wait for them.

        A collector is run now when its next timed run would come before the next scrape (expected one scrape
        gap from now; half its interval before the second scrape) and its last run started at least half an
        interval ago. Its timed runs then follow in phase with the scrapes, so with Prometheus scraping at the
        collection interval each cycle runs on the scrape: one wake-up instead of two, and the scrape sees values
        collected for it, as an exporter that collects on scrape would. Two scrapers (an HA pair) at most double
        the collection rate. A run in progress is waited for, not repeated; a hung collector is left to its
        schedule. Waits at most ``wait_s``; whatever has not finished by then is served from the last cycle.
        A collector whose last call took longer than :data:`PULL_WAIT_BUDGET_S` (an engine with hundreds of
        models: ~1 s) is pulled forward but not waited for: the scrape gets its previous cycle at once, the new
        values the next scrape, instead of every scrape taking as long as that collection.
        """
        with self._lock:
            waiting = self._begin_pull()
            if waiting:
                self._cycled.wait_for(lambda: _all_cycled(waiting), wait_s)

    async def pull_async(self, wait_s: float) -> None:
        """:meth:`pull` for an asyncio caller: the event loop waits, no thread is parked for the scrape.

        The lane worker that finishes the last awaited run resolves the scrape's future through
        ``call_soon_threadsafe``, so a scrape costs the loop one wake-up for the answer and no thread hand-off.
        """
        loop = asyncio.get_running_loop()
        done = loop.create_future()

        def resolve() -> None:
            if not done.done():
                done.set_result(None)

        def notify() -> None:
            with contextlib.suppress(RuntimeError):  # the loop closed meanwhile: nobody is waiting any more
                loop.call_soon_threadsafe(resolve)

        with self._lock:
            waiting = self._begin_pull()
            gap = self._pull_gap
            driving = gap is not None and gap <= STANDBY_GAP_RATIO * self._shortest_interval()
            self._standby = driving  # the scheduler sees it at its next wake; no need to wake it for this
            if waiting:
                waiter = (waiting, notify)
                self._waiters.append(waiter)
        if self._fallback is not None:  # rescheduling a loop timer wakes no thread
            self._fallback.cancel()
            self._fallback = None
        if driving:
            assert gap is not None
            self._fallback = loop.call_later(STANDBY_FALLBACK_GAPS * gap, self._scrapes_stopped)
        if not waiting:
            return
        timer = loop.call_later(wait_s, resolve)
        try:
            await done
        finally:
            timer.cancel()
            with self._lock:
                if waiter in self._waiters:
                    self._waiters.remove(waiter)

    def _scrapes_stopped(self) -> None:
        """The loop's fallback timer: no scrape for several gaps; the scheduler takes the timed runs back."""
        self._fallback = None
        with self._lock:
            self._standby = False
            self._wake.notify()

    def _shortest_interval(self) -> float:
        return min((s.interval for s in self._slots if not math.isinf(s.due)), default=math.inf)

    def _begin_pull(self) -> list[tuple[_Slot, int]]:
        """Under the lock: queue the runs a scrape pulls (see :meth:`pull`); return (slot, cycles seen) to await.

        The pulled runs are queued on their lanes here, by the scraping thread: the scheduler is not woken for
        them (it wakes for its own timed runs and deadlines only; why: docs/benchmarks.md, "The agent's CPU target").
        A call past its deadline is expired here too, so a scrape never waits on a lane a hung call holds.
        """
        now = self._clock()
        gap = None if self._last_pull is None else now - self._last_pull
        self._last_pull, self._pull_gap = now, gap
        self._expire(now)
        quick = PULL_WAIT_BUDGET_S
        waiting: list[tuple[_Slot, int]] = [
            (slot, slot.cycles) for slot in self._slots if slot.running and slot.last_s <= quick
        ]
        for i in pulled_runs(now, [slot.times() for slot in self._slots], gap):
            slot = self._slots[i]
            slot.due = now
            if slot.last_s <= quick:
                waiting.append((slot, slot.cycles))
        self._queue_due(now)  # the pulled runs, and a hung collector's due cycle
        if not self._standby and self._deadline() < self._planned:  # a deadline before its planned wake
            self._wake.notify()
        return waiting

    def stop(self, timeout_s: float = 5.0) -> None:
        """Stop scheduling; wait (bounded) for the threads to end; close collectors. Safe to call twice."""
        self._stop.set()
        with self._lock:
            self._wake.notify_all()
            for lane in self._lanes.values():
                lane.cond.notify_all()
            threads = [t for lane in self._lanes.values() for t in lane.threads]
        deadline = time.monotonic() + timeout_s  # a real wait, whatever clock schedules
        for t in ([self._scheduler] if self._scheduler else []) + threads:
            t.join(max(0.0, deadline - time.monotonic()))
        for c in self.collectors:
            try:
                c.close()
            except Exception:
                log.debug("closing collector %s failed", c.name, exc_info=True)
        self._scheduler = None

    def add(self, collector: Collector, plan: Schedule) -> None:
        """Run one more collector (an engine target that appeared), first at once; its health is registered as for
        one given at construction. A name already running is a ValueError."""
        with self._lock:
            if any(s.collector.name == collector.name for s in self._slots):
                raise ValueError(f"collector {collector.name!r} is already running")
            lane = self._lanes.get(plan.lane)
            if lane is None:
                lane = self._lanes[plan.lane] = _Lane(plan.lane, threading.Condition(self._lock))
                if self._running and not self._stop.is_set():
                    self._new_worker(lane)
            slot = _Slot(
                collector,
                plan.interval_s,
                plan.timeout_s,
                plan.lane,
                plan.on_scrape,
                plan.absence_final,
                plan.absent_retry_s,
                plan.slow_interval_s,
                plan.interval_s,
                due=self._clock(),
            )
            self._slots.append(slot)
            self.collectors.append(collector)
            self.state.register(
                CollectorHealth(collector.name, max(plan.interval_s, plan.slow_interval_s or 0.0), plan.timeout_s)
            )
            self._wake.notify()

    def remove(self, name: str) -> Collector | None:
        """Stop running a collector (an engine target that went away) and return it for the caller to close; None
        when no such collector runs. A call of it still running is abandoned: its outcome is not recorded. Its lane
        ends with it when no other collector uses it. Its health and collection stay in the state until the caller
        forgets them (:meth:`~inferwatch.agent.node.state.AgentState.forget`)."""
        with self._lock:
            slot = next((s for s in self._slots if s.collector.name == name), None)
            if slot is None:
                return None
            slot.removed = True
            self._slots.remove(slot)
            self.collectors.remove(slot.collector)
            self._failures.pop(name, None)
            lane = self._lanes[slot.lane]
            if slot in lane.queue:
                lane.queue.remove(slot)
            if not any(s.lane == slot.lane for s in self._slots):  # its own lane: the worker ends
                del self._lanes[slot.lane]
                lane.worker = None
                lane.current, lane.deadline = None, math.inf
                lane.cond.notify_all()
            slot.cycles += 1  # a scrape waiting for it waits no longer
            self._cycled.notify_all()
            for waiter in [w for w in self._waiters if _all_cycled(w[0])]:
                self._waiters.remove(waiter)
                waiter[1]()
            return slot.collector

    # -- scheduler -------------------------------------------------------------------------------------

    def _schedule(self) -> None:
        with self._lock:
            while not self._stop.is_set():
                try:
                    wake = self._dispatch()
                except Exception:  # a bug here must not end every collection: log it, retry in a second
                    log.exception("collector scheduler failed; retrying in 1s")
                    wake = self._clock() + 1.0
                if self._standby:  # scrapes drive (and expire) the runs; the loop's timer ends the standby
                    wake = self._clock() + STANDBY_SAFETY_S  # in case that loop died
                self._planned = wake
                self._wake.wait(None if math.isinf(wake) else max(0.0, wake - self._clock()))
                self._planned = -math.inf  # awake: nobody needs to notify

    def _dispatch(self) -> float:
        """Under the lock: expire overdue calls, queue the due runs; return when to wake next."""
        now = self._clock()
        self._expire(now)
        self._queue_due(now)
        return next_wake([s.times() for s in self._slots], self._deadline())

    def _deadline(self) -> float:
        """Under the lock: the earliest deadline of a running or queued call (inf when every lane is idle)."""
        return min(
            (lane.deadline for lane in self._lanes.values() if lane.current is not None or lane.queue),
            default=math.inf,
        )

    def _queue_due(self, now: float) -> None:
        """Under the lock: queue every due run on its lane (a hung collector's run is recorded as hung)."""
        for i in timed_runs(now, [s.times() for s in self._slots]):
            slot = self._slots[i]
            if slot.stuck:
                self._finish(slot.collector, now, None, "hung", f"previous run still running after {slot.timeout:g}s")
                self._cycle_done(slot, now, now)
                continue
            slot.running = True
            lane = self._lanes[slot.lane]
            lane.queue.append(slot)
            if lane.current is None and len(lane.queue) == 1:
                lane.deadline = now + slot.timeout  # the worker sets the exact one when it starts
            lane.cond.notify()

    def _expire(self, now: float) -> None:
        """Time out every call past its deadline; its lane gets a new worker for the calls behind it."""
        for lane in self._lanes.values():
            slot = lane.current
            if slot is None or now < lane.deadline:
                continue
            slot.stuck = True
            self._finish(slot.collector, slot.started, None, "timeout", f"timed out after {slot.timeout:g}s")
            self._cycle_done(slot, slot.started, now)
            lane.current, lane.deadline = None, math.inf
            self._new_worker(lane)
            if lane.queue:
                lane.deadline = now + lane.queue[0].timeout

    def _cycle_done(self, slot: _Slot, started: float, now: float) -> None:
        """Under the lock: the slot's cycle ended; schedule its next run and wake pull() waiters."""
        slot.running = False
        slot.cycles += 1
        # While scrapes pull, the timed run is one interval after this one (in phase with the scrapes, so the
        # next scrape normally comes first); otherwise the next point of the shared grid.
        last_pull = self._last_pull
        scraped = last_pull is not None and now - last_pull < 2 * slot.interval
        slot.due = after_run(slot.times(), started, now, scraped)
        self._cycled.notify_all()
        if self._waiters:
            for waiter in [w for w in self._waiters if _all_cycled(w[0])]:
                self._waiters.remove(waiter)
                waiter[1]()

    # -- lanes -----------------------------------------------------------------------------------------

    def _new_worker(self, lane: _Lane) -> None:
        token = lane.worker = object()
        t = threading.Thread(target=self._work, args=(lane, token), name=f"collect-{lane.name}", daemon=True)
        lane.threads = [x for x in lane.threads if x.is_alive()] + [t]
        t.start()

    def _work(self, lane: _Lane, token: object) -> None:
        while True:
            with self._lock:
                while lane.worker is token and not lane.queue and not self._stop.is_set():
                    lane.cond.wait()
                if lane.worker is not token or self._stop.is_set():
                    return
                slot = lane.queue.popleft()
                started = slot.started = self._clock()
                lane.current, lane.deadline = slot, started + slot.timeout
            cpu = time.thread_time()
            with self._around(slot.collector.name) if self._around is not None else contextlib.nullcontext():
                step_aside()  # a request the API answers goes first (agent/common/precedence.py)
                outcome, retry_s = self._call(slot)
                if self._prepare is not None and outcome[0] is not None:
                    step_aside()
                    try:
                        self._prepare(outcome[0])
                    except Exception:  # a sink's bug must not fail the collector that fed it; it renders on demand
                        log.debug("preparing %s's collection failed", slot.collector.name, exc_info=True)
            cpu = time.thread_time() - cpu
            with self._lock:
                if slot.removed:  # taken off the runner meanwhile (Runner.remove): nothing of it is recorded
                    if lane.current is slot:
                        lane.current, lane.deadline = None, math.inf
                    if lane.worker is not token:
                        return
                    continue
                if lane.worker is not token:  # timed out meanwhile: recorded by the scheduler; we are abandoned
                    slot.stuck = False
                    if slot.slow_interval is not None:  # past its timeout: costly if it was working, not waiting
                        slot.interval = adaptive_interval(slot.fast_interval, slot.slow_interval, cpu)
                    return
                self._finish(slot.collector, started, *outcome)
                slot.last_s = self._clock() - started
                lane.current, lane.deadline = None, math.inf
                if slot.slow_interval is not None and _paces_cadence(slot.collector):  # a costly run stretches it
                    # A read's cost: its wall time when it succeeded (the peer rendering, the transfer, the parse:
                    # what every read costs the engine and the agent); only its own CPU when it failed, so a peer
                    # that is down or silent (a timeout is waiting, not work) is still looked at at the fast pace.
                    cost = self._clock() - started if outcome[1] == "ok" else cpu
                    slot.interval = adaptive_interval(slot.fast_interval, slot.slow_interval, cost)
                self._cycle_done(slot, started, self._clock())
                if outcome[1] == "ok":  # a collector waiting on a verdict due sooner than its cadence asks for it
                    sooner = _read_again_in(slot.collector)
                    if sooner is not None:
                        slot.due = min(slot.due, self._clock() + sooner)
                if retry_s is not None:  # an absence that lasts: not called again before then (inf: never)
                    slot.due = max(slot.due, started + retry_s)
                # The scheduler sleeps until its next timed run or this call's deadline. A timeout longer than the
                # interval puts the deadline after the next run: wake it for that run (only then, so a run that
                # ends before its deadline, the usual case, costs no wake-up).
                if not self._standby and slot.due < self._planned:
                    self._wake.notify()

    @staticmethod
    def _call(slot: _Slot) -> tuple[tuple[Collection | None, str, str | None, str | None, str | None], float | None]:
        """Run one collection: ((collection, outcome, message, hint, cause), seconds before the next call if absent).

        The delay is the schedule's, as the registry declares it: inf for an absence only configuration can
        end (nothing configured to watch: the status keeps the hint), ``absent_retry_s`` for one that
        lasts, None otherwise.

        Messages and hints reach the status API and the log: credentials in them (a URL's password, a
        token parameter) are taken out here, for every collector.
        """
        collector = slot.collector
        try:
            collection = run_collection(collector, slot.validated)
            slot.validated = tuple(collection.samples)
            return (collection, "ok", None, None, None), None
        except NoDataError as exc:
            message = redact_text(str(exc.args[0] if exc.args else exc))
            try:
                absent = validate(Collection(samples=list(exc.samples))) if exc.samples else Collection()
            except CatalogError as bad:
                return (None, "bad_sample", redact_text(str(bad)), None, "bad_sample"), None
            hint = redact_text(exc.hint)
            return (absent, "absent", message, hint, None), math.inf if slot.absence_final else slot.absent_retry_s
        except CatalogError as exc:
            return (None, "bad_sample", redact_text(str(exc)), None, "bad_sample"), None
        except Exception as exc:
            message = redact_text(f"{type(exc).__name__}: {exc}")
            return (None, "exception", message, None, failure_cause(exc)), None

    def _finish(
        self,
        collector: Collector,
        started: float,
        collection: Collection | None,
        outcome: str,
        message: str | None = None,
        hint: str | None = None,
        cause: str | None = None,
    ) -> None:
        """Under the lock: record one run's outcome; ``cause`` (a failure's, :func:`failure_cause`) is what it is
        logged under (the runner's own ``timeout`` and ``hung``: ``timeout``)."""
        prev = self.state.health_of(collector.name)
        health = next_health(prev, outcome, self._clock() - started, time.time(), message, hint)
        self._log_outcome(prev, health, message, hint, cause or ("timeout" if outcome in RUNNER_FAILURES else outcome))
        self.state.record(collector.name, health, collection)
        if outcome in RUNNER_FAILURES:  # the collector did not raise this one; health it exports must say so too
            hook = getattr(collector, "run_failed", None)  # BaseCollector's; a bare processor may not have it
            if callable(hook):
                try:
                    hook(outcome)
                except Exception:  # a collector's bug must not stop the scheduler
                    log.debug("collector %s: run_failed(%s) failed", collector.name, outcome, exc_info=True)

    def _log_outcome(
        self, prev: CollectorHealth, new: CollectorHealth, message: str | None, hint: str | None, cause: str
    ) -> None:
        """Under the lock: one error line when a failure starts, one line when it ends (recovered, or no data);
        in between, a line only for a cause not yet logged in this failure (a flapping cause logs nothing)."""
        failure = self._failures.get(new.name)
        if new.state == "failed":
            if failure is None:
                failure = self._failures[new.name] = _Failure(self._clock())
                log.error("collector %s failing (%s): %s", new.name, cause, message)
                failure.causes.add(cause)
            elif cause not in failure.causes and len(failure.causes) < MAX_LOGGED_CAUSES:
                log.error("collector %s still failing, now also (%s): %s", new.name, cause, message)
                failure.causes.add(cause)
            failure.runs += 1
            return
        if failure is not None:
            del self._failures[new.name]
            lasted = f"after {failure.runs} failed runs in {self._clock() - failure.since:.0f}s"
            causes = ", ".join(sorted(failure.causes))
            if new.state == "absent":
                note = f" (hint: {hint})" if hint else ""
                log.warning("collector %s: no data %s (%s): %s%s", new.name, lasted, causes, message, note)
            else:
                log.info("collector %s recovered %s (%s)", new.name, lasted, causes)
        elif new.state == "absent" and prev.state != "absent":
            log.warning("collector %s: no data: %s%s", new.name, message, f" (hint: {hint})" if hint else "")
        elif new.state == "ok" and prev.state == "absent":
            log.info("collector %s recovered", new.name)
