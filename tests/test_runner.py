"""The runner isolates collectors: one that raises, hangs or returns garbage breaks nothing else."""

from __future__ import annotations

import itertools
import threading
import time
from typing import ClassVar

import pytest
from prometheus_client.parser import text_string_to_metric_families

from inferwatch.agent.common.samples import Collection, Sample, attrs
from inferwatch.agent.config import Settings, load_settings
from inferwatch.agent.errors import NoDataError
from inferwatch.agent.node.collectors import Schedule, schedules
from inferwatch.agent.node.collectors.base import BaseCollector, CollectContext
from inferwatch.agent.node.runner import STANDBY_GAP_RATIO, Runner
from inferwatch.agent.node.state import AgentState
from inferwatch.agent.node.wiring import collect_context
from inferwatch.exporters.prometheus import render


def _runner(
    settings: Settings, state: AgentState, collectors: list[BaseCollector], given: dict[str, Schedule] | None = None
) -> Runner:
    """The runner as the agent builds it: the registry's schedule for each collector, ``given`` ones instead."""
    return Runner(state, collectors, {**schedules(collectors, settings), **(given or {})})


class Good(BaseCollector):
    name: ClassVar[str] = "good"

    def collect(self) -> Collection:
        return Collection([Sample("process.uptime", 42.0, attrs(runtime="r"))])


class Raises(BaseCollector):
    name: ClassVar[str] = "raises"

    def collect(self) -> Collection:
        raise RuntimeError("boom")


class Hangs(BaseCollector):
    name: ClassVar[str] = "hangs"
    release = threading.Event()

    def collect(self) -> Collection:
        self.release.wait(30)
        return Collection()


class Garbage(BaseCollector):
    name: ClassVar[str] = "garbage"

    def collect(self) -> Collection:
        return Collection([Sample("not.in.catalog", 1.0)])


class WrongAttrs(BaseCollector):
    name: ClassVar[str] = "wrongattrs"

    def collect(self) -> Collection:
        return Collection([Sample("process.uptime", 1.0, attrs(nope="x"))])


class NotACollection(BaseCollector):
    name: ClassVar[str] = "notacollection"

    def collect(self):  # type: ignore[override]
        return "garbage"


class Absent(BaseCollector):
    name: ClassVar[str] = "absent"

    def collect(self) -> Collection:
        raise NoDataError("no GPU", hint="install the NVIDIA driver")


def _wait(pred, timeout=10.0):
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if pred():
            return True
        time.sleep(0.02)
    return False


def test_failures_are_isolated_and_reported(caplog) -> None:
    settings = load_settings(overrides={"interval_s": 0.2, "timeout_s": 0.3})
    ctx = collect_context(settings)
    state = AgentState()
    kinds = [Good, Raises, Hangs, Garbage, WrongAttrs, NotACollection, Absent]
    runner = _runner(settings, state, [k(ctx) for k in kinds])
    Hangs.release.clear()
    runner.start()
    try:
        assert _wait(lambda: all(h.runs >= 3 for h in state.health().values()))
        health = state.health()
        assert health["good"].state == "ok"
        assert health["raises"].state == "failed" and "boom" in (health["raises"].last_error or "")
        assert health["hangs"].state == "failed" and health["hangs"].error_reason in ("timeout", "hung")
        assert health["garbage"].state == "failed" and health["garbage"].error_reason == "bad_sample"
        assert health["wrongattrs"].error_reason == "bad_sample"
        assert health["notacollection"].error_reason == "bad_sample"
        assert health["absent"].state == "absent" and health["absent"].hint == "install the NVIDIA driver"

        text = render(state).decode()
        families = {f.name: f for f in text_string_to_metric_families(text)}
        assert families["process_uptime_seconds"].samples[0].value == 42.0
        success = {s.labels["collector"]: s.value for s in families["inferwatch_collector_success"].samples}
        assert success == {
            "good": 1,
            "raises": 0,
            "hangs": 0,
            "garbage": 0,
            "wrongattrs": 0,
            "notacollection": 0,
            "absent": 1,
        }
        absent = {s.labels["collector"]: s.value for s in families["inferwatch_collector_data_absent"].samples}
        assert absent["absent"] == 1 and absent["good"] == 0
        errors = families["inferwatch_collector_errors"].samples
        assert any(s.labels == {"collector": "raises", "reason": "exception"} and s.value >= 3 for s in errors)
        # Logged once per change of state, not per cycle.
        assert sum("collector raises failing" in r.getMessage() for r in caplog.records) == 1
    finally:
        Hangs.release.set()
        runner.stop()


def test_hung_collector_is_not_started_twice() -> None:
    calls = []

    class Slow(BaseCollector):
        name: ClassVar[str] = "slow"
        gate = threading.Event()

        def collect(self) -> Collection:
            calls.append(time.monotonic())
            self.gate.wait(5)
            return Collection()

    settings = load_settings(overrides={"interval_s": 0.1, "timeout_s": 0.1})
    state = AgentState()
    runner = _runner(settings, state, [Slow(collect_context(settings))])
    runner.start()
    try:
        assert _wait(lambda: state.health()["slow"].runs >= 5)
        assert len(calls) == 1
        Slow.gate.set()
        assert _wait(lambda: len(calls) >= 2)
    finally:
        Slow.gate.set()
        runner.stop()


class Counting(BaseCollector):
    name: ClassVar[str] = "counting"

    def __init__(self, ctx: CollectContext) -> None:
        super().__init__(ctx)
        self.calls: list[float] = []

    def collect(self) -> Collection:
        self.calls.append(time.monotonic())
        return Collection([Sample("process.uptime", float(len(self.calls)), attrs(runtime="r"))])


class Network(Counting):
    name: ClassVar[str] = "network"


def test_host_collectors_share_one_worker_thread() -> None:
    settings = load_settings(overrides={"interval_s": 0.2, "timeout_s": 0.3})
    ctx = collect_context(settings)
    state = AgentState()
    own_lane = {"network": Schedule(0.2, 0.2, "network")}  # as the registry declares lane=None
    runner = _runner(settings, state, [Good(ctx), Absent(ctx), Counting(ctx), Network(ctx)], own_lane)
    runner.start()
    try:
        assert _wait(lambda: all(h.runs >= 3 for h in state.health().values()))
        names = [t.name for t in threading.enumerate()]
        assert names.count("collector-scheduler") == 1
        assert names.count("collect-host") == 1  # three host collectors, one thread
        assert names.count("collect-network") == 1  # a lane of its own
    finally:
        runner.stop()
    assert _wait(lambda: not any(t.name.startswith("collect") for t in threading.enumerate()), 5)


def test_a_scrape_pulls_due_runs_forward_and_waits_for_them() -> None:
    settings = load_settings(overrides={"interval_s": 2.0, "timeout_s": 1.0})
    collector = Counting(collect_context(settings))
    state = AgentState()
    runner = _runner(settings, state, [collector])
    # Start just after a point of the runner's 2 s grid, so the first timed run after the start is ~1.95 s on.
    while time.monotonic() % 2.0 > 0.05:
        time.sleep(0.01)
    runner.start()
    try:
        assert _wait(lambda: len(collector.calls) == 1)
        runner.pull(1.0)  # just after the first run: not due before the next scrape, nothing to pull
        assert len(collector.calls) == 1
        time.sleep(1.2)  # past half the interval; the timed run is ~0.7 s away, before the next scrape
        t = time.monotonic()
        runner.pull(1.0)
        assert len(collector.calls) == 2 and collector.calls[1] - t < 0.5  # run for this scrape, waited for
        assert state.health()["counting"].runs == 2
        # In phase with the scrapes from now on: the next timed run is one interval after the pulled one.
        assert _wait(lambda: len(collector.calls) == 3, 5)
        assert 1.9 < collector.calls[2] - collector.calls[1] < 2.6
    finally:
        runner.stop()


class Costly(Counting):
    """A collection that takes 0.6 s of wall time (an engine with hundreds of models)."""

    name: ClassVar[str] = "costly"

    def collect(self) -> Collection:
        self.calls.append(time.monotonic())
        time.sleep(0.6)
        return Collection([Sample("process.uptime", float(len(self.calls)), attrs(runtime="r"))])


def test_a_scrape_pulls_a_costly_run_forward_but_does_not_wait_for_it() -> None:
    """A collector slower than PULL_WAIT_BUDGET_S is run for the scrape, which answers with its previous cycle."""
    settings = load_settings(overrides={"interval_s": 2.0, "timeout_s": 1.5})
    ctx = collect_context(settings)
    costly, quick = Costly(ctx), Counting(ctx)
    state = AgentState()
    runner = _runner(settings, state, [costly, quick], {"costly": Schedule(2.0, 1.5, "engine")})  # own lane, as engines
    while time.monotonic() % 2.0 > 0.05:  # just after a grid point: the next timed run is ~1.95 s away
        time.sleep(0.01)
    runner.start()
    try:
        assert _wait(lambda: state.health()["costly"].runs == 1 and state.health()["counting"].runs == 1)
        time.sleep(1.2)  # past half the interval: both are due before the next scrape
        t = time.monotonic()
        runner.pull(3.0)
        waited = time.monotonic() - t
        costly_runs = state.health()["costly"].runs  # what the scrape answers with
        assert len(quick.calls) == 2 and state.health()["counting"].runs == 2  # the quick one: run and waited for
        # the costly one: pulled forward too (its lane's thread may start it just after pull returns, under load) ...
        assert _wait(lambda: len(costly.calls) == 2, 2) and costly.calls[1] - t < 0.5, (costly.calls, t)
        assert waited < 0.5 and costly_runs == 1, waited  # ... but not waited for
        assert _wait(lambda: state.health()["costly"].runs == 2, 3)  # its values come for the next scrape
    finally:
        runner.stop()


def test_pull_never_waits_on_a_hung_collector() -> None:
    settings = load_settings(overrides={"interval_s": 0.2, "timeout_s": 0.2})
    ctx = collect_context(settings)
    state = AgentState()
    runner = _runner(settings, state, [Hangs(ctx), Good(ctx)])
    Hangs.release.clear()
    runner.start()
    try:
        assert _wait(lambda: state.health()["hangs"].state == "failed" and state.health()["good"].runs >= 2)
        t = time.monotonic()
        runner.pull(3.0)
        assert time.monotonic() - t < 1.0
        assert state.health()["good"].state == "ok"
    finally:
        Hangs.release.set()
        runner.stop()


def test_absence_only_configuration_can_end_is_not_retried() -> None:
    class Unconfigured(BaseCollector):
        name: ClassVar[str] = "unconfigured"
        calls = 0

        def collect(self) -> Collection:
            type(self).calls += 1
            raise NoDataError("no engine URL configured", hint="set engine.metrics_url")

    settings = load_settings(overrides={"interval_s": 0.1, "timeout_s": 0.1})
    ctx = collect_context(settings)
    state = AgentState()
    final = {"unconfigured": Schedule(0.1, 0.1, "host", absence_final=True)}  # as Entry(configured=...) says
    runner = _runner(settings, state, [Unconfigured(ctx), Absent(ctx), Good(ctx)], final)
    runner.start()
    try:
        assert _wait(lambda: state.health()["good"].runs >= 5 and state.health()["absent"].runs >= 5)
        runner.pull(1.0)
        health = state.health()["unconfigured"]
        assert Unconfigured.calls == 1 and health.runs == 1
        assert health.state == "absent" and health.hint == "set engine.metrics_url"  # still reported
    finally:
        runner.stop()


def test_a_scheduler_bug_is_logged_and_collection_goes_on(caplog) -> None:
    settings = load_settings(overrides={"interval_s": 0.1, "timeout_s": 0.1})
    state = AgentState()
    runner = _runner(settings, state, [Good(collect_context(settings))])
    real_expire, failures = runner._expire, []

    def expire_failing_once(now: float) -> None:
        if not failures:
            failures.append(now)
            raise RuntimeError("scheduler bug")
        real_expire(now)

    runner._expire = expire_failing_once  # type: ignore[method-assign]
    runner.start()
    try:
        assert _wait(lambda: state.health()["good"].runs >= 3, 5)
        assert failures and any("collector scheduler failed" in r.getMessage() for r in caplog.records)
    finally:
        runner.stop()


def test_an_async_scrape_pulls_and_waits_on_the_loop_not_a_thread() -> None:
    import asyncio

    settings = load_settings(overrides={"interval_s": 2.0, "timeout_s": 1.0})
    collector = Counting(collect_context(settings))
    state = AgentState()
    runner = _runner(settings, state, [collector])
    while time.monotonic() % 2.0 > 0.05:  # just after a point of the 2 s grid: the next timed run ~1.95 s on
        time.sleep(0.01)
    runner.start()
    try:
        assert _wait(lambda: len(collector.calls) == 1)
        time.sleep(1.1)  # past half the interval: the next scrape pulls the run due before the one after

        async def scrape() -> tuple[float, list[str]]:
            t = time.monotonic()
            await runner.pull_async(1.5)
            return time.monotonic() - t, [th.name for th in threading.enumerate()]

        took, threads = asyncio.run(scrape())
        assert len(collector.calls) == 2 and state.health()["counting"].runs == 2  # collected for the scrape
        assert took < 0.5  # resolved by the worker's call_soon_threadsafe, not by the 1.5 s timer
        assert not any(n.startswith(("AnyIO", "asyncio")) for n in threads)  # no thread parked for it
    finally:
        runner.stop()


def test_an_async_scrape_stops_waiting_on_a_hung_collector_after_wait_s() -> None:
    import asyncio

    settings = load_settings(overrides={"interval_s": 5.0, "timeout_s": 5.0})
    state = AgentState()
    ctx = collect_context(settings)

    own_lane = {"hangs": Schedule(5.0, 5.0, "hangs")}  # a lane of its own, as the registry declares lane=None
    runner = _runner(settings, state, [Hangs(ctx), Good(ctx)], own_lane)
    Hangs.release.clear()
    runner.start()
    try:
        assert _wait(lambda: state.health()["good"].runs == 1)
        t = time.monotonic()
        asyncio.run(runner.pull_async(0.3))  # "hangs" is still in its first call: waited for, up to 0.3 s
        assert 0.25 < time.monotonic() - t < 2.0
        assert state.health()["good"].state == "ok"
    finally:
        Hangs.release.set()
        runner.stop()


def test_a_lasting_absence_is_retried_after_absent_retry_s_not_every_interval() -> None:
    class NoDriver(BaseCollector):
        name: ClassVar[str] = "nodriver"
        calls: ClassVar[list[float]] = []

        def collect(self) -> Collection:
            self.calls.append(time.monotonic())
            raise NoDataError("NVML library not found", hint="install the driver")

    settings = load_settings(overrides={"interval_s": 0.1, "timeout_s": 0.1})
    ctx = collect_context(settings)
    state = AgentState()
    lasting = {"nodriver": Schedule(0.1, 0.1, "host", absent_retry_s=0.6)}  # as Entry(absent_retry_s=...) says
    runner = _runner(settings, state, [NoDriver(ctx), Good(ctx)], lasting)
    runner.start()
    try:
        assert _wait(lambda: len(NoDriver.calls) >= 3, 5)
        runner.pull(0.5)  # a scrape does not bring the retry forward either
    finally:
        runner.stop()
    gaps = [b - a for a, b in zip(NoDriver.calls, NoDriver.calls[1:], strict=False)]
    assert all(g >= 0.55 for g in gaps), gaps
    assert state.health()["good"].runs >= 10 and state.health()["nodriver"].state == "absent"


def test_scrapes_at_the_interval_drive_the_runs_and_the_scheduler_stands_by() -> None:
    import asyncio

    settings = load_settings(overrides={"interval_s": 0.2, "timeout_s": 0.2})
    collector = Counting(collect_context(settings))
    state = AgentState()
    runner = _runner(settings, state, [collector])
    dispatches: list[float] = []
    real_dispatch = runner._dispatch

    def counting_dispatch() -> float:
        dispatches.append(time.monotonic())
        return real_dispatch()

    runner._dispatch = counting_dispatch  # type: ignore[method-assign]
    runner.start()

    async def driven_phase() -> tuple[int, int, float]:
        """10 scrapes at the interval: (collector calls, scheduler wakes, the longest gap between scrapes)."""
        calls, wakes = len(collector.calls), len(dispatches)
        starts: list[float] = []
        for _ in range(10):  # 2 s of scrapes at the interval
            starts.append(time.monotonic())
            await runner.pull_async(0.5)
            await asyncio.sleep(0.2)
        longest = max(b - a for a, b in itertools.pairwise(starts))
        return len(collector.calls) - calls, len(dispatches) - wakes, longest

    async def scrapes_then_silence() -> tuple[list[tuple[int, int, float]], int]:
        for _ in range(5):  # scrapes begin: the scheduler is told to stand by
            await runner.pull_async(0.5)
            await asyncio.sleep(0.2)
        # A scrape that came later than STANDBY_GAP_RATIO gaps (a starved test process on a loaded machine) rightly
        # hands the runs back to the scheduler, which then wakes: up to three phases for one whose scrapes kept time.
        phases = []
        for _ in range(3):
            phases.append(await driven_phase())
            if phases[-1][2] <= STANDBY_GAP_RATIO * 0.2:
                break
        calls = len(collector.calls)
        await asyncio.sleep(1.5)  # the scrapes stop; the loop's fallback timer (2.5 gaps) hands back the runs
        return phases, len(collector.calls) - calls

    try:
        phases, after_calls = asyncio.run(scrapes_then_silence())
    finally:
        runner.stop()
    driven_calls, driven_wakes, longest = phases[-1]
    assert longest <= STANDBY_GAP_RATIO * 0.2, f"no phase of scrapes at the interval in 3 tries: {phases}"
    assert driven_calls >= 8  # every scrape collected (pulled), ...
    assert driven_wakes == 0, phases  # ... and the scheduler slept through them
    assert after_calls >= 3  # then timed runs again, without scrapes


def test_a_timeout_and_a_hung_run_are_told_to_the_collector_and_raised_failures_are_not() -> None:
    """A collector that exports its own health (engine up) learns of the failures it could not raise itself."""
    told: dict[str, list[str]] = {"hangs": [], "raises": []}

    class Told(Hangs):
        def run_failed(self, reason: str) -> None:
            told[self.name].append(reason)

    class RaisesTold(Raises):
        def run_failed(self, reason: str) -> None:
            told[self.name].append(reason)

    settings = load_settings(overrides={"interval_s": 0.1, "timeout_s": 0.1})
    ctx = collect_context(settings)
    state = AgentState()
    runner = _runner(settings, state, [Told(ctx), RaisesTold(ctx)])
    Hangs.release.clear()
    runner.start()
    try:
        assert _wait(lambda: state.health()["hangs"].runs >= 3 and state.health()["raises"].runs >= 3)
    finally:
        Hangs.release.set()
        runner.stop()
    assert told["hangs"][:2] == ["timeout", "hung"] and set(told["hangs"]) == {"timeout", "hung"}
    assert told["raises"] == []  # it raised: it knows, and counted it itself


def test_a_timeout_longer_than_the_interval_keeps_the_interval() -> None:
    """A run that ends well before its deadline is followed one interval later, not at the deadline.

    The engine collector's timeout (its fetch's deadline plus the parse) is longer than its 2 s cadence; the
    scheduler, asleep until that deadline, must be woken for the next run when the current one ends.
    """
    settings = load_settings(overrides={"interval_s": 0.2, "timeout_s": 0.2})
    ctx = collect_context(settings)
    state = AgentState()
    counting = Counting(ctx)
    runner = Runner(state, [counting], {"counting": Schedule(0.2, 4.0, "counting")})
    runner.start()
    try:
        # every 0.2 s: 5 runs in ~1 s; woken only at each deadline (4 s): 3 in 8 s. A wait, not a fixed 2.5 s
        # sleep, so that a machine at CI's load 10-17, where a thread can wait for a core, still gets its 5 runs
        assert _wait(lambda: len(counting.calls) >= 5, 8.0), counting.calls
    finally:
        runner.stop()


def test_a_collector_without_a_schedule_is_refused() -> None:
    # the runner reads no settings: whoever builds it (the composition root) plans every collector
    ctx = collect_context(load_settings())
    with pytest.raises(ValueError, match="no schedule for collector"):
        Runner(AgentState(), [Good(ctx), Raises(ctx)], {"good": Schedule(1.0, 1.0, "host")})


def test_a_collector_that_has_a_verdict_due_sooner_is_run_then() -> None:
    """``read_again_in()`` (the engine collector's hang verdict, due before its next timed run) brings the next run
    forward to then; None leaves the interval."""

    class Due(Counting):
        name: ClassVar[str] = "due"
        ask: ClassVar[list[float | None]] = [0.3, 0.3, None]

        def read_again_in(self) -> float | None:
            n = len(self.calls)
            return self.ask[n - 1] if n <= len(self.ask) else None

    settings = load_settings(overrides={"interval_s": 30.0, "timeout_s": 5.0})
    ctx = collect_context(settings)
    state = AgentState()
    due = Due(ctx)
    runner = _runner(settings, state, [due], {"due": Schedule(30.0, 5.0, "due")})
    runner.start()
    try:
        assert _wait(lambda: len(due.calls) >= 3, 20), due.calls  # two runs asked for 0.3 s after the one before
        time.sleep(1.0)  # the third asked for nothing: the 30 s interval holds
        assert len(due.calls) == 3, due.calls
    finally:
        runner.stop()
    gaps = [b - a for a, b in itertools.pairwise(due.calls)]
    assert all(0.25 <= g < 15.0 for g in gaps), gaps  # asked-for runs, not the 30 s interval (generous under load)


def test_validation_remembers_what_passed_and_reports_a_failure_as_a_full_check(monkeypatch) -> None:
    """A sample whose name, type and attribute names passed has only its value checked; the known samples of the
    last collection (the same objects) are not checked again; a failure is reported as the full check reports it."""
    from inferwatch.agent.common.samples import HistogramSample
    from inferwatch.agent.errors import CatalogError
    from inferwatch.agent.node import runner as runner_module
    from inferwatch.agent.node.runner import validate

    checked: list[object] = []
    full_check = runner_module._check

    def counted(sample: object) -> tuple[str, type, tuple[str, ...]]:
        checked.append(sample)
        return full_check(sample)

    monkeypatch.setattr(runner_module, "_check", counted)
    good = [Sample("process.uptime", float(i), attrs(runtime=f"r{i}")) for i in range(5)]
    names = {"gen_ai.operation.name": "chat", "gen_ai.provider.name": "vllm", "gen_ai.request.model": "m"}
    hist = HistogramSample(
        "gen_ai.server.time_to_first_token", ((0.1, 1.0), (float("inf"), 2.0)), 0.3, 2.0, attrs(names)
    )
    validate(Collection([*good, hist]))
    passed = len(checked)
    validate(Collection([Sample("process.uptime", 7, attrs(runtime="other")), *good]))
    assert len(checked) == passed  # the same names, types and attribute names: values checked only
    checked.clear()
    fresh = Sample("process.uptime", 1.0, attrs(runtime="new"))
    validate(Collection([*good, fresh]), known=good)
    assert checked == []
    bad = [
        (Sample("process.uptime", float("nan"), attrs(runtime="r")), "value nan is not a number"),
        (Sample("process.uptime", True, attrs(runtime="r")), "value True is not a number"),
        (Sample("process.uptime", "1", attrs(runtime="r")), "value '1' is not a number"),  # type: ignore[arg-type]
        (Sample("process.uptime", 1.0, attrs(runtime="r", extra="x")), "differ from the catalog's"),
        (Sample("process.uptime", 1.0), "differ from the catalog's"),
        (Sample(hist.name, 1.0, hist.attributes), "is a histogram; got a plain sample"),
        (HistogramSample(hist.name, ((0.1, 1.0),), 0.3, 1.0, hist.attributes), "must end with a +Inf bucket"),
        (HistogramSample("process.uptime", hist.buckets, 0.3, 2.0, attrs(runtime="r")), "not a histogram"),
        ("garbage", "sample of type str is not a Sample"),
    ]
    for sample, message in bad:
        with pytest.raises(CatalogError, match=message.replace("+", r"\+")):
            validate(Collection([*good, sample]), known=good)  # type: ignore[list-item]
    assert validate(Collection([*good, hist, fresh]), known=[*good, hist, fresh]).samples[-1] is fresh
