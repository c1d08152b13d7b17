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

What was left were the collections *during* such a read: it allocates millions of containers in a second, which set
off young and middle collections that walk them, and full ones (after a freeze, any full threshold finds the new
objects "many" against the few left unfrozen) — pauses of up to 160 ms, each one a stall of ``/metrics`` and the API.
So :meth:`CollectionFreezer.around` turns automatic collection off for the run of a collector whose last collection
was large, and for its ``prepare``, which freezes what it left before collection is turned on again: no collection
walks the read's objects at all. Other threads' garbage cycles wait that run (a second at 200 models); their
reference-counted objects are freed as ever.
"""

from __future__ import annotations

import gc
import logging
import threading
import time
from collections.abc import Callable, Iterator
from contextlib import AbstractContextManager, contextmanager

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
        self.pauses = 0  # runs with automatic collection off (around)
        self._large: set[str | None] = set()  # collectors whose last collection was large
        self._local = threading.local()  # the collector running in this thread (around), for after()
        self._paused = 0  # runs under way with collection off
        self._was_enabled = True

    def around(self, name: str) -> AbstractContextManager[object]:
        """The runner's ``around``: automatic collection off while collector ``name`` runs and its collection is
        prepared, if its last collection was large (frozen by :meth:`after` before collection is on again)."""
        return self._run(name)

    @contextmanager
    def _run(self, name: str) -> Iterator[object]:
        self._local.name = name
        pause = name in self._large
        if pause:
            with self._lock:
                self._paused += 1
                if self._paused == 1:
                    self._was_enabled = gc.isenabled()
                    gc.disable()
                    self.pauses += 1
        try:
            yield None
        finally:
            self._local.name = None
            if pause:
                with self._lock:
                    self._paused -= 1
                    if self._paused == 0 and self._was_enabled:
                        gc.enable()

    def after(self, collection: Collection) -> None:
        """Called with each collection, in the collector's thread (the runner's ``prepare``)."""
        name = getattr(self._local, "name", None)
        if len(collection.samples) < self.large:
            self._large.discard(name)
            return
        if name is not None:
            self._large.add(name)
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
