"""Forward accepted export requests, untouched, to a downstream OTLP endpoint.

A bounded queue between intake and one sender thread: intake never waits (a full queue drops the
request and counts it), the sender posts the exact ``ExportTraceServiceRequest`` bytes it was given.
Target: ``http(s)://host:port[/path]`` → OTLP/HTTP protobuf (path defaults to ``/v1/traces``);
``grpc://host:port`` or ``host:port`` → OTLP/gRPC, insecure. No retries: a failed send is counted and
the request is dropped, so a dead downstream costs one timeout per request at most and never memory.

With ``phase_spans`` (the default) each request that holds engine request spans is followed by a second one with
their phase children (:mod:`inferwatch.agent.node.receiver.phases`), so a trace view shows queue, prefill and decode as
bars; the original request is still sent as the exact bytes received.
"""

from __future__ import annotations

import logging
import queue
import threading
from collections.abc import Callable
from urllib.parse import urlsplit

log = logging.getLogger(__name__)

GRPC_METHOD = "/opentelemetry.proto.collector.trace.v1.TraceService/Export"
HTTP_PATH = "/v1/traces"
STOP_TIMEOUT_S = 5.0
_POLL_S = 0.2


def parse_target(endpoint: str) -> tuple[str, str]:
    """``("http", url)`` or ``("grpc", "host:port")``; ValueError when it is neither."""
    if endpoint.startswith(("http://", "https://")):
        parts = urlsplit(endpoint)
        if not parts.hostname:
            raise ValueError(f"forward endpoint {endpoint!r} has no host")
        path = parts.path if parts.path not in ("", "/") else HTTP_PATH
        return "http", f"{parts.scheme}://{parts.netloc}{path}"
    target = endpoint.removeprefix("grpc://")
    host, sep, port = target.rpartition(":")
    if not sep or not host or not port.isdigit():
        raise ValueError(f"forward endpoint {endpoint!r} is neither http(s)://host:port nor host:port")
    return "grpc", target


class Forwarder:
    """Bounded, non-blocking forwarding. ``start``/``stop`` are idempotent; ``stop`` is bounded."""

    def __init__(self, endpoint: str, max_queued: int, timeout_s: float, phase_spans: bool = True) -> None:
        self.kind, self.target = parse_target(endpoint)
        self.timeout_s = timeout_s
        self.phase_spans = phase_spans
        self._queue: queue.Queue[bytes] = queue.Queue(maxsize=max_queued)
        self._stop = threading.Event()
        self._thread: threading.Thread | None = None
        self._lock = threading.Lock()
        self.sent = 0
        self.dropped = 0
        self.failed = 0
        self._failing = False

    def queued(self) -> int:
        return self._queue.qsize()

    def submit(self, payload: bytes) -> bool:
        """Queue ``payload`` for sending; False (and counted) when the queue is full or stopped."""
        if self._stop.is_set():
            with self._lock:
                self.dropped += 1
            return False
        try:
            self._queue.put_nowait(payload)
        except queue.Full:
            with self._lock:
                self.dropped += 1
            return False
        return True

    def start(self) -> None:
        with self._lock:
            if self._thread is not None:
                return
            self._thread = threading.Thread(target=self._run, name="otlp-forward", daemon=True)
        self._thread.start()

    def stop(self) -> None:
        self._stop.set()
        t = self._thread
        if t is not None:
            t.join(STOP_TIMEOUT_S)
        while True:  # whatever is left was not sent
            try:
                self._queue.get_nowait()
            except queue.Empty:
                break
            with self._lock:
                self.dropped += 1

    def _sender(self) -> tuple[Callable[[bytes], None], Callable[[], None]]:
        if self.kind == "http":
            from inferwatch.agent.common.httpclient import http_client

            # a POST is never sent twice; idle connections are let go first by the client (KEEPALIVE_EXPIRY_S)
            client = http_client("receiver_forward", timeout=self.timeout_s, trust_env=True)
            headers = {"Content-Type": "application/x-protobuf"}

            def send_http(payload: bytes) -> None:
                r = client.post(self.target, content=payload, headers=headers)
                if r.status_code // 100 != 2:
                    raise RuntimeError(f"HTTP {r.status_code}")

            return send_http, client.close
        import grpc

        channel = grpc.insecure_channel(self.target)
        call = channel.unary_unary(GRPC_METHOD)  # no (de)serializers: bytes in, bytes out

        def send_grpc(payload: bytes) -> None:
            call(payload, timeout=self.timeout_s)

        return send_grpc, channel.close

    def _run(self) -> None:
        send, close = self._sender()
        try:
            while not self._stop.is_set():
                try:
                    payload = self._queue.get(timeout=_POLL_S)
                except queue.Empty:
                    continue
                try:
                    send(payload)
                except Exception as exc:
                    with self._lock:
                        self.failed += 1
                    if not self._failing:
                        log.warning("forwarding spans to %s failing (%s); requests are dropped", self.target, exc)
                        self._failing = True
                    continue
                with self._lock:
                    self.sent += 1
                if self._failing:
                    log.info("forwarding spans to %s recovered", self.target)
                    self._failing = False
        finally:
            close()
