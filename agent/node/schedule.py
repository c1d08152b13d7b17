"""The collection schedule as pure functions: times in, runs and the next wake-up out.

No threads, no sleeps, no clock of its own: the runner (:mod:`inferwatch.agent.node.runner`) keeps one
:class:`SlotTimes` per collector, asks :func:`timed_runs` / :func:`pulled_runs` which to start and :func:`next_wake`
when to look again, and moves a slot on with :func:`after_run`. Tests drive these with any numbers they like.

Times are monotonic seconds. Every collector with the same interval wakes on the same grid point
(:func:`next_due`), so a cycle is one burst of work (why: docs/benchmarks.md, "The agent's CPU target").
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from dataclasses import dataclass


@dataclass(frozen=True, slots=True)
class SlotTimes:
    """What the schedule needs to know about one collector."""

    interval_s: float
    due: float = 0.0  # its next timed run
    started: float = -math.inf  # when its last call started
    running: bool = False  # queued or running
    stuck: bool = False  # its last call timed out and has not returned
    on_scrape: bool = False  # runs on every scrape (a processor of in-memory input)


def next_due(started: float, interval: float, now: float) -> float:
    """The next run of a collector that started at ``started``: the next point on a grid of ``interval``.

    The first run is at start; a run that overran its interval skips the grid points it missed instead
    of running twice.
    """
    due = (math.floor(started / interval + 0.5) + 1) * interval
    if due <= now:
        due += (math.floor((now - due) / interval) + 1) * interval
    return due


def timed_runs(now: float, slots: Sequence[SlotTimes]) -> list[int]:
    """Indexes of the slots whose timed run is due now (a stuck one is due too: it is recorded as hung)."""
    return [i for i, s in enumerate(slots) if not s.running and s.due <= now]


def pulled_runs(now: float, slots: Sequence[SlotTimes], gap: float | None) -> list[int]:
    """Indexes of the slots a scrape at ``now`` brings forward (``gap``: seconds since the previous scrape).

    A slot is pulled when its next timed run would come before the next scrape (expected one gap from
    now; half its interval for the first scrape) and its last run started at least half an interval ago;
    a processor that runs on every scrape is always pulled. A running or stuck slot is not started again.
    """
    out = []
    for i, s in enumerate(slots):
        if s.running or s.stuck:
            continue
        window = s.interval_s / 2 if gap is None else gap
        if s.on_scrape or (s.due - now <= window and now - s.started >= s.interval_s / 2):
            out.append(i)
    return out


def after_run(slot: SlotTimes, started: float, now: float, scraped: bool) -> float:
    """The next timed run after a cycle that started at ``started`` and ended at ``now``.

    While scrapes pull (``scraped``), one interval after this run, in phase with the scrapes (the next
    scrape normally comes first); otherwise the next point of the shared grid.
    """
    return started + slot.interval_s if scraped else next_due(started, slot.interval_s, now)


READ_BUDGET = 0.10  # an adaptive collector's reads may take this fraction of their interval


def adaptive_interval(fast_s: float, slow_s: float, cost_s: float, budget: float = READ_BUDGET) -> float:
    """The next interval of a collector that reads at ``fast_s`` while a read is cheap: the one at which its last
    read's cost ``cost_s`` (seconds) is ``budget`` of the interval, between ``fast_s`` and ``slow_s``.

    A read costing up to ``budget × fast_s`` keeps the fast cadence; a costlier one stretches the interval in
    proportion (the reads keep to ``budget`` of the time), up to ``slow_s``.
    """
    return max(fast_s, min(slow_s, cost_s / budget)) if budget > 0 else slow_s


def next_wake(slots: Sequence[SlotTimes], deadline: float = math.inf) -> float:
    """When the scheduler must look again: the earliest timed run of an idle slot, or a call's deadline."""
    return min(min((s.due for s in slots if not s.running), default=math.inf), deadline)
