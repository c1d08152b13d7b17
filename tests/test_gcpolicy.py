"""The garbage-collection policy: large collections frozen out of full collections, a full one every hour."""

from __future__ import annotations

import gc

from inferwatch.agent.common.samples import Collection, Sample
from inferwatch.agent.node.gcpolicy import CollectionFreezer, chain


class Clock:
    def __init__(self) -> None:
        self.now = 0.0

    def __call__(self) -> float:
        return self.now


def _collection(n: int) -> Collection:
    return Collection(samples=[Sample("process.uptime", float(i)) for i in range(n)])


def test_only_large_collections_freeze_and_a_full_collection_comes_each_hour() -> None:
    clock = Clock()
    freezer = CollectionFreezer(large=100, thaw_every_s=3600.0, clock=clock)
    try:
        gc.unfreeze()
        freezer.after(_collection(99))
        assert freezer.freezes == 0 and gc.get_freeze_count() == 0  # small: left to the collector
        kept = _collection(100)
        freezer.after(kept)
        assert freezer.freezes == 1 and freezer.thaws == 0
        assert gc.get_freeze_count() > 0  # the collection's objects are out of the collector's reach
        clock.now = 3599.0
        freezer.after(kept)
        assert freezer.thaws == 0
        cycle: list[object] = []
        cycle.append(cycle)  # a garbage cycle that gets frozen with the next large collection
        del cycle
        freezer.after(kept)
        clock.now = 3600.0
        freezer.after(kept)  # an hour on: thaw, collect everything, freeze again
        assert freezer.thaws == 1 and freezer.freezes == 4
    finally:
        gc.unfreeze()


def test_chain_runs_each_step_in_order() -> None:
    seen: list[str] = []
    chain(lambda c: seen.append("a"), lambda c: seen.append("b"))(Collection())
    assert seen == ["a", "b"]


def test_a_large_collectors_run_is_made_with_collection_off_and_frozen_before_it_is_on_again() -> None:
    """The first large run shows the collector is large; its next runs and their prepare have automatic collection
    off, and what they left is frozen (after) before it is turned on: no collection walks a large read's objects."""
    freezer = CollectionFreezer(large=100, clock=Clock())
    try:
        gc.unfreeze()
        assert gc.isenabled()
        with freezer.around("engine"):
            assert gc.isenabled()  # not known to be large yet
            freezer.after(_collection(100))
        seen: list[tuple[bool, int]] = []
        with freezer.around("engine"):
            made = [(i,) for i in range(1000)]  # a read's containers
            seen.append((gc.isenabled(), freezer.freezes))
            freezer.after(_collection(100))
            seen.append((gc.isenabled(), freezer.freezes))
        assert seen == [(False, 1), (False, 2)] and gc.isenabled() and freezer.pauses == 1
        assert gc.get_freeze_count() >= len(made)  # frozen while collection was off
        with freezer.around("cpu"):  # another collector, small: collection stays on
            assert gc.isenabled()
            freezer.after(_collection(3))
        with freezer.around("engine"):
            freezer.after(_collection(5))  # the engine got small: no longer paused after this run
        with freezer.around("engine"):
            assert gc.isenabled()
    finally:
        gc.enable()
        gc.unfreeze()


def test_collection_stays_off_until_the_last_of_two_paused_runs_ends() -> None:
    freezer = CollectionFreezer(large=10, clock=Clock())
    try:
        for name in ("engine:a", "engine:b"):
            with freezer.around(name):
                freezer.after(_collection(10))
        a, b = freezer.around("engine:a"), freezer.around("engine:b")
        a.__enter__()
        b.__enter__()
        a.__exit__(None, None, None)
        assert not gc.isenabled()  # b still runs
        b.__exit__(None, None, None)
        assert gc.isenabled()
    finally:
        gc.enable()
        gc.unfreeze()
