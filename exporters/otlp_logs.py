"""Runtime profile snapshots as OTLP log records (OpenTelemetry SDK LoggerProvider + OTLP log exporter).

Configured by the standard ``OTEL_*`` variables (endpoint, protocol, headers), like the metric sink.
Only already-redacted snapshots reach :meth:`SnapshotLogSink.emit`. Export failures are dropped by the
SDK's batch processor (bounded queue), never retried forever.
"""

from __future__ import annotations

import json
import logging
import os
import threading
from typing import Any

from opentelemetry._logs import SeverityNumber
from opentelemetry.sdk._logs import LoggerProvider
from opentelemetry.sdk._logs.export import BatchLogRecordProcessor, LogRecordExporter
from opentelemetry.sdk.resources import Resource

from inferwatch.agent import __version__

log = logging.getLogger(__name__)
SHUTDOWN_TIMEOUT_MS = 5_000
EVENT_NAME = "inferwatch.runtime.profile.snapshot"


def make_log_exporter() -> LogRecordExporter:
    proto = (
        os.environ.get("OTEL_EXPORTER_OTLP_LOGS_PROTOCOL") or os.environ.get("OTEL_EXPORTER_OTLP_PROTOCOL") or "grpc"
    ).strip()
    if proto == "grpc":
        from opentelemetry.exporter.otlp.proto.grpc._log_exporter import OTLPLogExporter as GrpcExporter

        return GrpcExporter()
    if proto == "http/protobuf":
        from opentelemetry.exporter.otlp.proto.http._log_exporter import OTLPLogExporter as HttpExporter

        from inferwatch.exporters.otlp_http import transport

        own = transport("LOGS")  # httpx, not the SDK's requests session (otlp_http.py)
        return HttpExporter(_transport=own) if own is not None else HttpExporter()
    raise ValueError(f"OTEL_EXPORTER_OTLP_PROTOCOL={proto!r} is not supported (use grpc or http/protobuf)")


class SnapshotLogSink:
    """Emit / flush / shutdown (idempotent, bounded)."""

    def __init__(self, resource: Resource, exporter: LogRecordExporter) -> None:
        self.provider = LoggerProvider(resource=resource)
        self.provider.add_log_record_processor(BatchLogRecordProcessor(exporter, schedule_delay_millis=1000))
        self.logger = self.provider.get_logger("inferwatch.agent.runtime_profile", __version__)
        self._closed = False
        self._lock = threading.Lock()

    def emit(self, snapshot: dict[str, Any]) -> None:
        meta = snapshot.get("meta", {})
        self.logger.emit(
            severity_number=SeverityNumber.INFO,
            severity_text="INFO",
            body=json.dumps(snapshot, sort_keys=True, default=str),
            attributes={
                "inferwatch.snapshot.id": str(meta.get("id", "")),
                "inferwatch.snapshot.outcome": str(meta.get("outcome", "")),
                "inferwatch.snapshot.redacted_fields": len(meta.get("redacted_paths", [])),
            },
            event_name=EVENT_NAME,
        )

    def force_flush(self, timeout_ms: int = SHUTDOWN_TIMEOUT_MS) -> bool:
        return bool(self.provider.force_flush(timeout_millis=timeout_ms))

    def shutdown(self) -> None:
        with self._lock:
            if self._closed:
                return
            self._closed = True
        try:
            self.provider.force_flush(timeout_millis=SHUTDOWN_TIMEOUT_MS)
            self.provider.shutdown()
        except Exception:
            log.warning("OTLP log shutdown incomplete", exc_info=True)
