"""Real OTLP metric receivers on 127.0.0.1 for tests: gRPC (MetricsService) and HTTP/protobuf (/v1/metrics).

Both decode with opentelemetry-proto and keep every ExportMetricsServiceRequest they receive.
"""

from __future__ import annotations

import gzip
import threading
import time
from collections.abc import Callable, Iterator
from concurrent import futures
from contextlib import contextmanager
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from typing import Any

import grpc
from opentelemetry.proto.collector.metrics.v1 import metrics_service_pb2, metrics_service_pb2_grpc


class Received:
    """Requests received so far, thread-safe; ``wait`` polls (bounded) until a predicate holds."""

    def __init__(self) -> None:
        self._lock = threading.Lock()
        self.requests: list[metrics_service_pb2.ExportMetricsServiceRequest] = []

    def add(self, req: metrics_service_pb2.ExportMetricsServiceRequest) -> None:
        with self._lock:
            self.requests.append(req)

    def snapshot(self) -> list[metrics_service_pb2.ExportMetricsServiceRequest]:
        with self._lock:
            return list(self.requests)

    def wait(
        self, ok: Callable[[list[metrics_service_pb2.ExportMetricsServiceRequest]], bool], timeout_s: float = 120.0
    ) -> list[metrics_service_pb2.ExportMetricsServiceRequest]:
        """The requests once ``ok`` accepts them; the default bounds a hang (an agent at CI's load 10-17 on 2 cores
        takes tens of seconds to start and export), never how soon a healthy sender sends."""
        deadline = time.monotonic() + timeout_s
        while time.monotonic() < deadline:
            reqs = self.snapshot()
            if reqs and ok(reqs):
                return reqs
            time.sleep(0.1)
        raise TimeoutError(f"receiver: condition not met within {timeout_s}s ({len(self.snapshot())} requests)")


class _Servicer(metrics_service_pb2_grpc.MetricsServiceServicer):
    def __init__(self, received: Received) -> None:
        self.received = received

    def Export(self, request: Any, context: Any) -> Any:
        self.received.add(request)
        return metrics_service_pb2.ExportMetricsServiceResponse()


@contextmanager
def grpc_receiver(port: int) -> Iterator[Received]:
    received = Received()
    server = grpc.server(futures.ThreadPoolExecutor(max_workers=4))
    metrics_service_pb2_grpc.add_MetricsServiceServicer_to_server(_Servicer(received), server)
    if server.add_insecure_port(f"127.0.0.1:{port}") == 0:
        raise RuntimeError(f"cannot bind 127.0.0.1:{port}")
    server.start()
    try:
        yield received
    finally:
        server.stop(grace=1).wait(5)


@contextmanager
def http_receiver(port: int) -> Iterator[Received]:
    received = Received()

    class Handler(BaseHTTPRequestHandler):
        def do_POST(self) -> None:
            body = self.rfile.read(int(self.headers.get("Content-Length", "0")))
            if self.headers.get("Content-Encoding") == "gzip":
                body = gzip.decompress(body)
            if self.path != "/v1/metrics" or self.headers.get("Content-Type") != "application/x-protobuf":
                self.send_response(404)
                self.end_headers()
                return
            req = metrics_service_pb2.ExportMetricsServiceRequest()
            req.ParseFromString(body)
            received.add(req)
            out = metrics_service_pb2.ExportMetricsServiceResponse().SerializeToString()
            self.send_response(200)
            self.send_header("Content-Type", "application/x-protobuf")
            self.send_header("Content-Length", str(len(out)))
            self.end_headers()
            self.wfile.write(out)

        def log_message(self, *_args: Any) -> None:
            pass

    server = ThreadingHTTPServer(("127.0.0.1", port), Handler)
    thread = threading.Thread(target=server.serve_forever, daemon=True)
    thread.start()
    try:
        yield received
    finally:
        server.shutdown()
        server.server_close()
        thread.join(5)
