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
