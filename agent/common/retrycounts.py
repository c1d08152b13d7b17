"""How many requests each source's HTTP client sent again (:mod:`inferwatch.agent.common.httpclient`'s retry).

A module of its own, without httpx: every collector's context holds the counts (``inferwatch_http_retries_total``),
and an agent with no HTTP source switched on never imports httpx (docs/benchmarks.md, "Where the megabytes go").
"""

from __future__ import annotations

import threading

from inferwatch.agent.common.samples import AnySample, Sample, attrs


class RetryCounts:
    """Requests sent again after a reused connection failed under them, by source; thread-safe."""

    def __init__(self) -> None:
        self._lock = threading.Lock()
        self._counts: dict[str, int] = {}

    def add(self, source: str) -> None:
        with self._lock:
            self._counts[source] = self._counts.get(source, 0) + 1

    def count(self, source: str) -> int:
        with self._lock:
            return self._counts.get(source, 0)

    def samples(self) -> list[AnySample]:
        """``inferwatch.http.retries{source}``, one per source that has a client (0 until its first retry)."""
        with self._lock:
            counts = sorted(self._counts.items())
        return [Sample("inferwatch.http.retries", n, attrs(source=s)) for s, n in counts]

    def register(self, source: str) -> None:
        """Export ``source`` at 0 before its first retry (a counter that appears at 1 hides its first increase)."""
        with self._lock:
            self._counts.setdefault(source, 0)
