"""The schedule as pure functions (agent/node/schedule.py): fake times in, runs and wake-ups out; no threads or
sleeps."""

from __future__ import annotations

import math

from inferwatch.agent.node.schedule import SlotTimes, after_run, next_due, next_wake, pulled_runs, timed_runs


def test_next_due_is_a_shared_grid_and_skips_missed_points() -> None:
    assert next_due(0.0, 15.0, 0.1) == 15.0
    assert next_due(14.9, 15.0, 15.0) == 30.0  # started on (about) the 15 s point: the next one
    assert next_due(15.0, 15.0, 61.0) == 75.0  # overran by three intervals: no catch-up burst
    assert next_due(7.0, 15.0, 8.0) == 15.0  # a collector started off the grid joins it
    assert next_due(0.0, 60.0, 0.1) == 60.0 and next_due(0.0, 15.0, 0.1) == 15.0  # multiples share points


def test_timed_runs_are_the_idle_due_slots() -> None:
    slots = [
        SlotTimes(15.0, due=10.0),
        SlotTimes(15.0, due=20.0),
        SlotTimes(15.0, due=5.0, running=True),
        SlotTimes(15.0, due=10.0, stuck=True),  # due: recorded as hung by the runner
    ]
    assert timed_runs(10.0, slots) == [0, 3]
    assert timed_runs(9.9, slots) == []


def test_a_scrape_pulls_what_would_run_before_the_next_scrape() -> None:
    slots = [
        SlotTimes(15.0, due=20.0, started=0.0),  # due within one gap (15 s) and last run 10 s ago: pulled
        SlotTimes(60.0, due=60.0, started=0.0),  # due in 50 s, after the next scrape: left to its schedule
        SlotTimes(15.0, due=12.0, started=9.0),  # ran 1 s ago (< half an interval): not again
        SlotTimes(15.0, due=20.0, started=0.0, running=True),  # running: waited for, not restarted
        SlotTimes(15.0, due=20.0, started=0.0, stuck=True),  # hung: left alone
        SlotTimes(15.0, due=99.0, started=9.9, on_scrape=True),  # a processor: every scrape
    ]
    assert pulled_runs(10.0, slots, gap=15.0) == [0, 5]
    # the first scrape (no gap yet) looks half an interval ahead
    assert pulled_runs(10.0, [SlotTimes(15.0, due=20.0, started=0.0)], gap=None) == []
    assert pulled_runs(13.0, [SlotTimes(15.0, due=20.0, started=0.0)], gap=None) == [0]


def test_after_a_run_the_next_is_in_phase_with_the_scrapes_or_on_the_grid() -> None:
    slot = SlotTimes(15.0)
    assert after_run(slot, started=101.0, now=101.2, scraped=True) == 116.0
    # off the grid: the run at 101 s counts for the 105 s point, the next is at 120 s
    assert after_run(slot, started=101.0, now=101.2, scraped=False) == next_due(101.0, 15.0, 101.2) == 120.0


def test_next_wake_is_the_earliest_idle_due_or_deadline() -> None:
    slots = [SlotTimes(15.0, due=30.0), SlotTimes(15.0, due=20.0, running=True), SlotTimes(60.0, due=60.0)]
    assert next_wake(slots) == 30.0
    assert next_wake(slots, deadline=25.0) == 25.0
    assert next_wake([]) == math.inf


def test_a_simulated_day_of_scrapes_runs_each_collector_once_per_scrape() -> None:
    """Prometheus scraping at the interval drives the runs: one run per scrape, none of the scheduler's own."""
    interval, slots, runs, scheduler_runs = 15.0, [SlotTimes(15.0)], 0, 0
    now = 0.0
    for i in timed_runs(now, slots):  # the run at start
        slots[i] = SlotTimes(interval, due=after_run(slots[i], now, now + 0.01, False), started=now)
    last = None
    for k in range(1, 5761):  # a day of scrapes every 15 s, 3 s after the grid
        scrape = k * interval + 3.0
        for _ in timed_runs(scrape - 0.5, slots):  # would the scheduler have woken before this scrape?
            scheduler_runs += 1
        gap = None if last is None else scrape - last
        for i in pulled_runs(scrape, slots, gap):
            runs += 1
            slots[i] = SlotTimes(interval, due=after_run(slots[i], scrape, scrape + 0.01, True), started=scrape)
        last = scrape
    assert runs == 5760
    assert scheduler_runs <= 1  # at most the first grid point before the scrapes took over
