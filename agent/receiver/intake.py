"""Transport-independent span intake: decode, extract, record, forward, count.

Both transports hand :meth:`SpanIntake.handle` the serialized ``ExportTraceServiceRequest``
(decompressed, size already checked); it raises :class:`~agent.receiver.spans.PayloadError` for a
payload that does not decode, and the transport maps that to HTTP 400 / gRPC INVALID_ARGUMENT.
"""

from __future__ import annotations

import threading
from collections import Counter
from collections.abc import Iterable
from typing import Protocol

from agent.receiver.forward import Forwarder
from agent.receiver.spans import decode, extract
from agent.samples import RequestTiming, Sample, attrs


class TimingSink(Protocol):
    """Where the timings go (the span analytics, a processor the receiver does not import)."""

    def record(self, timings: Iterable[RequestTiming]) -> int:
        """Take the timings; return how many were dropped."""
        ...


TRANSPORTS = ("grpc", "http")
REJECT_REASONS = (
    "too_large",
    "bad_content_type",
    "bad_encoding",
    "bad_protobuf",
    "bad_gzip",
    "timeout",
    "bad_method",
    "not_found",
)
VALUE_REASONS = ("not_a_number", "out_of_range", "too_many_models")


class SpanIntake:
    """Counts everything it sees; thread-safe (gRPC worker threads and the HTTP loop call it)."""

    def __init__(self, analytics: TimingSink, forwarder: Forwarder | None = None) -> None:
        self.analytics = analytics
        self.forwarder = forwarder
        self._lock = threading.Lock()
        self.accepted: Counter[str] = Counter()
        self.rejected: Counter[tuple[str, str]] = Counter()
        self.spans: Counter[str] = Counter()
        self.requests: Counter[str] = Counter()
        self.invalid: Counter[str] = Counter()
        self.up: dict[str, bool] = {}

    def handle(self, payload: bytes, transport: str) -> int:
        """Decode and record one export request; return the number of per-request samples taken."""
        try:
            req = decode(payload)
        except Exception:
            self.reject(transport, "bad_protobuf")
            raise
        got = extract(req)
        dropped = self.analytics.record(got.timings) if got.timings else 0
        if self.forwarder is not None:
            self.forwarder.submit(payload)
        with self._lock:
            self.accepted[transport] += 1
            self.spans[transport] += got.spans
            self.requests[transport] += len(got.timings) - dropped
            self.invalid.update(got.invalid)
            if dropped:
                self.invalid["too_many_models"] += dropped
        return len(got.timings) - dropped

    def reject(self, transport: str, reason: str) -> None:
        with self._lock:
            self.rejected[(transport, reason)] += 1

    def samples(self) -> list[Sample]:
        out: list[Sample] = []
        with self._lock:
            for t, listening in sorted(self.up.items()):
                out.append(Sample("inferwatch.receiver.up", 1.0 if listening else 0.0, attrs(transport=t)))
            for t in sorted(self.up):
                a = attrs(transport=t)
                out.append(Sample("inferwatch.receiver.exports.accepted", self.accepted[t], a))
                out.append(Sample("inferwatch.receiver.spans", self.spans[t], a))
                out.append(Sample("inferwatch.receiver.requests", self.requests[t], a))
                for reason in REJECT_REASONS:
                    out.append(
                        Sample(
                            "inferwatch.receiver.exports.rejected",
                            self.rejected[(t, reason)],
                            attrs(transport=t, reason=reason),
                        )
                    )
            for reason in VALUE_REASONS:
                out.append(Sample("inferwatch.receiver.values.rejected", self.invalid[reason], attrs(reason=reason)))
        f = self.forwarder
        if f is not None:
            out.append(Sample("inferwatch.receiver.forward", f.sent, attrs(outcome="sent")))
            out.append(Sample("inferwatch.receiver.forward", f.dropped, attrs(outcome="dropped")))
            out.append(Sample("inferwatch.receiver.forward", f.failed, attrs(outcome="failed")))
            out.append(Sample("inferwatch.receiver.forward.queued", f.queued(), ()))
        return out
