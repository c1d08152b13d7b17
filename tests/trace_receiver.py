"""A real downstream OTLP trace receiver on 127.0.0.1 for tests: gRPC (TraceService/Export) and HTTP/protobuf
(/v1/traces). Keeps the raw bytes of every export request it receives, so a test can compare them exactly."""

from __future__ import annotations

import threading
import time
from collections.abc import Callable, Iterator
from concurrent import futures
from contextlib import contextmanager
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from typing import Any

import grpc
from opentelemetry.proto.collector.trace.v1.trace_service_pb2 import (
    ExportTraceServiceRequest,
    ExportTraceServiceResponse,
)

SERVICE = "opentelemetry.proto.collector.trace.v1.TraceService"
_OK = ExportTraceServiceResponse().SerializeToString()


class Received:
    """Export requests received so far (raw bytes), thread-safe; ``wait`` polls with a deadline."""

    def __init__(self) -> None:
        self._lock = threading.Lock()
        self.payloads: list[bytes] = []

    def add(self, payload: bytes) -> None:
        with self._lock:
            self.payloads.append(payload)

    def snapshot(self) -> list[bytes]:
        with self._lock:
            return list(self.payloads)

    def requests(self) -> list[ExportTraceServiceRequest]:
        return [ExportTraceServiceRequest.FromString(p) for p in self.snapshot()]

    def spans(self) -> list[Any]:
        return [s for r in self.requests() for rs in r.resource_spans for ss in rs.scope_spans for s in ss.spans]

    def wait(self, ok: Callable[[Received], bool], timeout_s: float = 120.0) -> None:
        """Until ``ok`` accepts what arrived; the default bounds a hang (senders at CI's load 10-17 on 2 cores take
        tens of seconds to start and flush), never how soon a healthy sender sends."""
        deadline = time.monotonic() + timeout_s
        while not ok(self):
            if time.monotonic() > deadline:
                raise TimeoutError(
                    f"trace receiver: condition not met in {timeout_s} s ({len(self.snapshot())} requests)"
                )
            time.sleep(0.05)


@contextmanager
def grpc_trace_receiver() -> Iterator[tuple[Received, int]]:
    received = Received()

    def export(request: bytes, context: Any) -> bytes:
        received.add(request)
        return _OK

    server = grpc.server(
        futures.ThreadPoolExecutor(max_workers=4),
        handlers=[
            grpc.method_handlers_generic_handler(SERVICE, {"Export": grpc.unary_unary_rpc_method_handler(export)})
        ],
    )
    port = server.add_insecure_port("127.0.0.1:0")
    server.start()
    try:
        yield received, port
    finally:
        server.stop(grace=1).wait(5)


@contextmanager
def http_trace_receiver() -> Iterator[tuple[Received, int]]:
    received = Received()

    class Handler(BaseHTTPRequestHandler):
        def do_POST(self) -> None:
            body = self.rfile.read(int(self.headers.get("Content-Length", "0")))
            ok = self.path == "/v1/traces" and self.headers.get("Content-Type") == "application/x-protobuf"
            if ok:
                received.add(body)
            self.send_response(200 if ok else 404)
            self.send_header("Content-Type", "application/x-protobuf")
            self.send_header("Content-Length", str(len(_OK)))
            self.end_headers()
            self.wfile.write(_OK)

        def log_message(self, *_args: Any) -> None:
            pass

    server = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
    thread = threading.Thread(target=server.serve_forever, daemon=True)
    thread.start()
    try:
        yield received, int(server.server_address[1])
    finally:
        server.shutdown()
        server.server_close()
        thread.join(5)
