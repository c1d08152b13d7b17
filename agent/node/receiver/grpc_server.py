"""OTLP/gRPC trace intake: ``opentelemetry.proto.collector.trace.v1.TraceService/Export``.

Registered as a generic handler that receives the raw request bytes, so the intake decodes them itself
and a payload that is not an ``ExportTraceServiceRequest`` gets INVALID_ARGUMENT (the OTLP
specification's code for malformed data) rather than grpcio's INTERNAL. Size: requests over
``max_message_bytes`` get RESOURCE_EXHAUSTED and are counted; gRPC's own receive limit is set to twice
that, so anything larger is refused by gRPC itself (also RESOURCE_EXHAUSTED, but before our counter).
gRPC applies the same limit to the decompressed size of gzip-compressed messages.
"""

from __future__ import annotations

import logging
from concurrent import futures
from typing import Any

import grpc
from opentelemetry.proto.collector.trace.v1.trace_service_pb2 import ExportTraceServiceResponse

from inferwatch.agent.node.receiver.intake import SpanIntake
from inferwatch.agent.node.receiver.spans import PayloadError

log = logging.getLogger(__name__)

SERVICE = "opentelemetry.proto.collector.trace.v1.TraceService"
MAX_WORKERS = 4
MAX_CONCURRENT_RPCS = 64
STOP_GRACE_S = 2.0
_OK = ExportTraceServiceResponse().SerializeToString()


class GrpcReceiver:
    def __init__(self, intake: SpanIntake, endpoint: str, max_bytes: int) -> None:
        self.intake = intake
        self.max_bytes = max_bytes
        self._server = grpc.server(
            futures.ThreadPoolExecutor(max_workers=MAX_WORKERS, thread_name_prefix="otlp-grpc"),
            handlers=[
                grpc.method_handlers_generic_handler(
                    SERVICE, {"Export": grpc.unary_unary_rpc_method_handler(self._export)}
                )
            ],
            options=[
                ("grpc.max_receive_message_length", 2 * max_bytes),
                ("grpc.max_send_message_length", 1 << 20),
            ],
            maximum_concurrent_rpcs=MAX_CONCURRENT_RPCS,
        )
        try:
            self.port = self._server.add_insecure_port(endpoint)
        except RuntimeError as exc:
            raise OSError(f"cannot bind {endpoint}: {exc}") from None
        if not self.port:
            raise OSError(f"cannot bind {endpoint}")

    def _export(self, request: bytes, context: Any) -> bytes:
        if len(request) > self.max_bytes:
            self.intake.reject("grpc", "too_large")
            context.abort(
                grpc.StatusCode.RESOURCE_EXHAUSTED, f"message of {len(request)} bytes exceeds {self.max_bytes}"
            )
        try:
            self.intake.handle(request, "grpc")
        except PayloadError as exc:
            context.abort(grpc.StatusCode.INVALID_ARGUMENT, str(exc))
        return _OK

    def start(self) -> None:
        self._server.start()

    def stop(self) -> None:
        self._server.stop(STOP_GRACE_S).wait(STOP_GRACE_S + 1)
