"""OTLP trace receiver: per-request timing from the engine's spans (vLLM ``--otlp-traces-endpoint``).

::

    engine ──OTLP/gRPC :4317──┐                             ┌─► LatencyAnalytics (sketches, windows)
                              ├─► SpanIntake (decode, count)─┤
    engine ──OTLP/HTTP :4318──┘                             └─► Forwarder (bounded queue) ─► downstream

:class:`Receiver` owns the transports; ``start``/``stop`` are idempotent and ``stop`` is bounded. The intake
keeps the last finished requests for the evidence bundles (:meth:`Receiver.recent_spans`).
"""

from __future__ import annotations

import logging
import threading
from typing import Any

from inferwatch.agent.config import ReceiverSettings
from inferwatch.agent.errors import ConfigError
from inferwatch.agent.node.receiver.forward import Forwarder
from inferwatch.agent.node.receiver.intake import FinishedSpan, SpanIntake, TimingSink

log = logging.getLogger(__name__)


class Receiver:
    """The gRPC and HTTP transports around one :class:`SpanIntake`."""

    def __init__(self, settings: ReceiverSettings, analytics: TimingSink) -> None:
        self.settings = settings
        self.analytics = analytics
        forwarder = None
        if settings.forward_endpoint:
            try:
                forwarder = Forwarder(
                    settings.forward_endpoint,
                    settings.forward_queue_requests,
                    settings.forward_timeout_s,
                    settings.forward_phase_spans,
                )
            except ValueError as exc:
                raise ConfigError(f"receiver.forward_endpoint: {exc}") from None
        self.intake = SpanIntake(analytics, forwarder)
        self.grpc: Any = None
        self.http: Any = None
        self._lock = threading.Lock()
        self._started = self._stopped = False

    @property
    def grpc_port(self) -> int | None:
        return self.grpc.port if self.grpc is not None else None

    @property
    def http_port(self) -> int | None:
        return self.http.port if self.http is not None else None

    def start(self) -> None:
        """Bind and serve; raise ConfigError when an endpoint cannot be bound (nothing left running)."""
        with self._lock:
            if self._started:
                return
            self._started = True
        s = self.settings
        try:
            if s.grpc_endpoint:
                from inferwatch.agent.node.receiver.grpc_server import GrpcReceiver

                self.grpc = GrpcReceiver(self.intake, s.grpc_endpoint, s.max_message_bytes)
                self.grpc.start()
                self.intake.up["grpc"] = True
            if s.http_endpoint:
                from inferwatch.agent.node.receiver.http_server import HttpReceiver

                self.http = HttpReceiver(self.intake, s.http_endpoint, s.max_message_bytes)
                self.http.start()
                self.intake.up["http"] = True
        except OSError as exc:
            self.stop()
            raise ConfigError(f"receiver: {exc}") from None
        if self.intake.forwarder is not None:
            self.intake.forwarder.start()
        log.info(
            "OTLP trace receiver listening: grpc %s, http %s%s",
            f"{s.grpc_endpoint.rpartition(':')[0]}:{self.grpc_port}" if s.grpc_endpoint else "off",
            f"{s.http_endpoint.rpartition(':')[0]}:{self.http_port}/v1/traces" if s.http_endpoint else "off",
            f", forwarding to {s.forward_endpoint}" if s.forward_endpoint else "",
        )

    def stop(self) -> None:
        with self._lock:
            if self._stopped:
                return
            self._stopped = True
        for name, transport in (("grpc", self.grpc), ("http", self.http)):
            if transport is not None:
                try:
                    transport.stop()
                except Exception:
                    log.warning("stopping the OTLP/%s receiver failed", name, exc_info=True)
                self.intake.up[name] = False
        if self.intake.forwarder is not None:
            self.intake.forwarder.stop()

    def samples(self) -> list[Any]:
        return list(self.intake.samples())

    def recent_spans(self) -> list[FinishedSpan]:
        """The last finished requests received, newest first (what an evidence bundle shows of the spans)."""
        return self.intake.recent()
