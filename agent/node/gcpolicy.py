"""When the cyclic garbage collector may stop the agent: not in the middle of every scrape.

CPython's full (generation 2) collection walks every tracked object while holding the interpreter. An engine of
200 models x 2 ranks keeps a few million of them (its samples, windows and caches) and replaces a large part with
each read, which keeps setting off full collections: 200–635 ms pauses, two or three a minute, in which neither
``/metrics`` nor the API answers, and which found nothing to free (collected=0: the engine's data are trees of
tuples and floats, freed by reference counting, not cycles). Measured in docs/benchmarks.md, "Engine scale".

:class:`CollectionFreezer` moves what a large collection left behind out of the collector's reach
(:func:`gc.freeze`, what the agent already does with its startup objects), so full collections walk only what is
new. Frozen objects are still freed by reference counting when the next collection replaces them; a garbage cycle
that got frozen waits for the hourly thaw-collect-freeze, the one full pause the agent then takes. At 200 models
x 2 ranks (load 3–5, 90 s each): full collections took 1.1 s of the agent's time against 2.9 s without it,
8 pauses over 50 ms against 18.
"""

from __future__ import annotations

import gc
import logging
import threading
import time
from collections.abc import Callable

from inferwatch.agent.common.samples import Collection

log = logging.getLogger(__name__)

LARGE_COLLECTION = 2_000  # samples: an engine of ~15 models and up; smaller ones cost a full collection little
THAW_EVERY_S = 3600.0


class CollectionFreezer:
    """Freeze after each collection of at least ``large`` samples; thaw, collect and freeze every ``thaw_every_s``."""

    def __init__(
        self,
        large: int = LARGE_COLLECTION,
        thaw_every_s: float = THAW_EVERY_S,
        clock: Callable[[], float] = time.monotonic,
    ) -> None:
        self.large = large
        self.thaw_every_s = thaw_every_s
        self.clock = clock
        self._lock = threading.Lock()
        self._last_thaw = clock()
        self.freezes = 0
        self.thaws = 0

    def after(self, collection: Collection) -> None:
        """Called with each collection, in the collector's thread (the runner's ``prepare``)."""
        if len(collection.samples) < self.large:
            return
        with self._lock:  # two lanes finishing at once: one freeze is enough
            now = self.clock()
            if now - self._last_thaw >= self.thaw_every_s:
                self._last_thaw = now
                gc.unfreeze()
                found = gc.collect()
                self.thaws += 1
                log.debug("hourly full collection: %d objects freed", found)
            gc.freeze()
            self.freezes += 1


def chain(*steps: Callable[[Collection], None]) -> Callable[[Collection], None]:
    """One ``prepare`` for the runner that runs each step in turn."""

    def prepare(collection: Collection) -> None:
        for step in steps:
            step(collection)

    return prepare
