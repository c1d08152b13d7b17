"""Transport-independent span intake: decode, extract, record, forward, count.

Both transports hand :meth:`SpanIntake.handle` the serialized ``ExportTraceServiceRequest``
(decompressed, size already checked); it raises :class:`~inferwatch.agent.node.receiver.spans.PayloadError` for a
payload that does not decode, and the transport maps that to HTTP 400 / gRPC INVALID_ARGUMENT.

It also keeps the last :data:`RECENT_SPANS_KEPT` finished requests (:class:`FinishedSpan`, :meth:`SpanIntake.recent`)
for the evidence bundles. Only finished ones: an engine sends a request's span when the request ends (vLLM's
``llm_request``), so a request in flight, or stuck, has no span here yet.
"""

from __future__ import annotations

import threading
import time
from collections import Counter, deque
from collections.abc import Callable, Iterable
from dataclasses import dataclass
from typing import Any, Protocol

from inferwatch.agent.common.samples import RequestTiming, Sample, attrs
from inferwatch.agent.node.receiver.forward import Forwarder
from inferwatch.agent.node.receiver.phases import phase_request
from inferwatch.agent.node.receiver.spans import SpanRef, decode, extract, span_ref


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
VALUE_REASONS = ("not_a_number", "out_of_range", "too_many_models", "end_before_start", "too_long")
RECENT_SPANS_KEPT = 32  # the last finished requests kept for an evidence bundle


@dataclass(frozen=True, slots=True)
class FinishedSpan:
    """One finished request as received: when (Unix s), its timing (seconds) and which span it came from."""

    received_at: float
    timing: RequestTiming
    ref: SpanRef

    def as_dict(self) -> dict[str, Any]:
        t, r = self.timing, self.ref
        return {
            "received_at": round(self.received_at, 3),
            "start_unix_s": r.start_unix_s,
            "end_unix_s": r.end_unix_s,
            "trace_id": r.trace_id,
            "span_id": r.span_id,
            "request_id": r.request_id,
            "model": t.model,
            "seconds": {q: round(v, 6) for q, v in sorted(t.seconds.items())},
            "prompt_tokens": t.prompt_tokens,
            "completion_tokens": t.completion_tokens,
        }


class SpanIntake:
    """Counts everything it sees; thread-safe (gRPC worker threads and the HTTP loop call it)."""

    def __init__(
        self, analytics: TimingSink, forwarder: Forwarder | None = None, wall_clock: Callable[[], float] = time.time
    ) -> None:
        self.analytics = analytics
        self.forwarder = forwarder
        self.wall_clock = wall_clock
        self._lock = threading.Lock()
        self._recent: deque[FinishedSpan] = deque(maxlen=RECENT_SPANS_KEPT)
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
        if got.client:  # clients' own TTFTs, for the explainer's client − engine reconciliation
            record_client = getattr(self.analytics, "record_client", None)
            if record_client is not None:
                record_client(got.client)
        if self.forwarder is not None:
            self.forwarder.submit(payload)
            if self.forwarder.phase_spans and got.timings:
                children = phase_request(req)
                if children is not None:
                    self.forwarder.submit(children)
        now, first = self.wall_clock(), max(0, len(got.timings) - RECENT_SPANS_KEPT)
        recent = [
            FinishedSpan(now, t, span_ref(span, t))
            for t, span in zip(got.timings[first:], got.sources[first:], strict=True)
        ]
        with self._lock:
            self._recent.extend(recent)
            self.accepted[transport] += 1
            self.spans[transport] += got.spans
            self.requests[transport] += len(got.timings) - dropped
            self.invalid.update(got.invalid)
            if dropped:
                self.invalid["too_many_models"] += dropped
        return len(got.timings) - dropped

    def recent(self) -> list[FinishedSpan]:
        """The last finished requests received (at most :data:`RECENT_SPANS_KEPT`), newest first."""
        with self._lock:
            return list(reversed(self._recent))

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
