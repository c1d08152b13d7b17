"""Fetch an engine's ``/metrics`` over HTTP (or read a file) with a size cap and a deadline.

The body is streamed and abandoned as soon as it passes ``max_bytes`` (a ``Content-Length`` above the
cap is refused before reading); a server that answers slowly is cut at ``timeout_s`` in total, not
only per read (the time a sink spends reading the chunks is not the server's, and is not counted).
Every failure is an :class:`EngineScrapeError` whose ``reason`` is one of :data:`REASONS`, so the
collector can count failures by cause.
"""

from __future__ import annotations

import time
from pathlib import Path
from typing import TYPE_CHECKING, Protocol

from inferwatch.agent.common.precedence import step_aside
from inferwatch.agent.errors import CollectorError
from inferwatch.agent.node.engine.limits import LIMIT_REASONS, SampleLineCounter

if TYPE_CHECKING:  # a fetch is given its client: httpx is the caller's import (none without an engine URL)
    import httpx

REASONS = (
    "connect",
    "timeout",
    "http_status",
    "too_large",
    "truncated",
    "not_utf8",
    "not_prometheus",
    "unknown_engine",  # valid exposition, no family of a known engine
    "parse",
    "duplicate_series",  # one series twice in an exposition (Prometheus rejects the scrape)
    "type_conflict",  # a second TYPE/HELP line for a family, or TYPE after its samples
    "negative_value",  # a counter, histogram bucket/count/duration sum or summary count below zero
    "out_of_range",  # a gauge outside its quantity's domain (KV-cache usage outside 0..1)
    "openmetrics",  # an OpenMetrics family rule broken (body ending in # EOF)
    *LIMIT_REASONS,  # a limit of agent/node/engine/limits.py: sample_limit, label_value_length_limit, label_bytes_limit
)
# The text format only: prometheus_client's exposition app (vLLM's, SGLang's /metrics) answers OpenMetrics whenever the
# header names it, whatever its q (choose_encoder), and since 0.23 with its names escaped to underscores in the samples
# but not in their HELP and TYPE lines ("vllm_num_preemptions_total" under "# TYPE vllm:num_preemptions counter"):
# every family clashes. An engine that only speaks OpenMetrics still answers */*, and is read.
ACCEPT = "text/plain;version=0.0.4;q=1,*/*;q=0.1"
_REFUSED_TYPES = ("text/html", "application/json", "application/xml", "text/xml", "application/x-protobuf")


class EngineScrapeError(CollectorError):
    """The engine's exposition could not be used; ``reason`` says why (one of :data:`REASONS`)."""

    def __init__(self, reason: str, message: str) -> None:
        super().__init__(f"{message} (reason: {reason})")
        self.reason = reason


class Sink(Protocol):
    """Where :func:`fetch_into` puts the body as it arrives.

    (:class:`~inferwatch.agent.node.engine.scrape.ExpositionStream`)
    """

    def begin(self, content_type: str) -> None: ...

    def feed(self, chunk: bytes) -> None: ...


class _Collect:
    def __init__(self) -> None:
        self.body = bytearray()

    def begin(self, content_type: str) -> None:
        pass

    def feed(self, chunk: bytes) -> None:
        self.body += chunk


def fetch(client: httpx.Client, url: str, timeout_s: float, max_bytes: int, max_series: int | None = None) -> bytearray:
    """GET ``url``; return the body (at most ``max_bytes``) or raise EngineScrapeError (see :func:`fetch_into`).

    The buffer the chunks were gathered in, not a ``bytes`` copy of it: at 200 models x 2 ranks of vLLM a copy was
    12 MB more at the agent's peak (the held body twice), docs/benchmarks.md "/metrics and the API while a 200-model
    engine is read"."""
    sink = _Collect()
    fetch_into(client, url, timeout_s, max_bytes, sink, max_series)
    return sink.body


def fetch_into(
    client: httpx.Client,
    url: str | httpx.URL,
    timeout_s: float,
    max_bytes: int,
    sink: Sink,
    max_series: int | None = None,
) -> int:
    """GET ``url`` and hand each chunk of the body to ``sink`` as it arrives; return the body's size in bytes.

    Nothing is held here: the sink reads each chunk (an error it raises stops the fetch and closes the
    connection). ``max_series``: stop reading once the body holds more sample lines (reason
    ``sample_limit``), before the chunk that crosses it reaches the sink.
    """
    import httpx  # the client's own import: already loaded

    deadline = time.monotonic() + timeout_s
    try:
        with client.stream("GET", url, timeout=httpx.Timeout(timeout_s), headers={"Accept": ACCEPT}) as resp:
            if resp.status_code != 200:
                raise EngineScrapeError("http_status", f"{url} answered HTTP {resp.status_code}")
            ctype = resp.headers.get("content-type", "").split(";")[0].strip().lower()
            if ctype in _REFUSED_TYPES:
                raise EngineScrapeError("not_prometheus", f"{url} answered {ctype}, not a Prometheus text exposition")
            length = resp.headers.get("content-length")
            if length is not None and length.isdigit() and int(length) > max_bytes:
                raise EngineScrapeError("too_large", f"{url} announced {length} bytes, over the {max_bytes}-byte cap")
            sink.begin(ctype)
            size = 0
            counter = SampleLineCounter() if max_series is not None else None
            for chunk in resp.iter_bytes():
                size += len(chunk)
                if size > max_bytes:
                    raise EngineScrapeError("too_large", f"{url} sent more than the {max_bytes}-byte cap")
                if counter is not None and max_series is not None and counter.feed(chunk) > max_series:
                    raise EngineScrapeError(
                        "sample_limit", f"{url} sent more than {max_series} sample lines (engine.max_series)"
                    )
                if time.monotonic() > deadline:
                    raise EngineScrapeError("timeout", f"{url} still sending after {timeout_s:g}s")
                fed = time.monotonic()
                step_aside()  # a request the API is answering goes first (agent/common/precedence.py)
                sink.feed(chunk)
                deadline += time.monotonic() - fed  # the deadline is the server's: our parsing is not counted
            return size
    except httpx.TimeoutException as exc:
        raise EngineScrapeError("timeout", f"{url}: no answer within {timeout_s:g}s ({type(exc).__name__})") from None
    except httpx.RemoteProtocolError as exc:
        raise EngineScrapeError("truncated", f"{url}: connection closed before the body was complete ({exc})") from None
    except httpx.DecodingError as exc:
        raise EngineScrapeError("parse", f"{url}: bad content encoding ({exc})") from None
    except httpx.TransportError as exc:
        raise EngineScrapeError("connect", f"{url}: {type(exc).__name__}: {exc}") from None


def read_file(path: Path, max_bytes: int) -> bytes:
    """Read an exposition file with the same cap; OSError becomes a ``connect``-less CollectorError."""
    try:
        size = path.stat().st_size
        if size > max_bytes:
            raise EngineScrapeError("too_large", f"{path} is {size} bytes, over the {max_bytes}-byte cap")
        with path.open("rb") as f:
            data = f.read(max_bytes + 1)
    except OSError as exc:
        raise CollectorError(f"cannot read {path}: {exc.strerror or exc}") from None
    if len(data) > max_bytes:
        raise EngineScrapeError("too_large", f"{path} is over the {max_bytes}-byte cap")
    return data
