"""OTLP/HTTP trace intake: ``POST /v1/traces`` with ``Content-Type: application/x-protobuf``.

A plain ASGI app served by uvicorn on its own thread and event loop (not the agent's API server:
vLLM's exporter expects the OTLP port and path). Answers follow the OTLP/HTTP specification: 200 with
an ``ExportTraceServiceResponse``; errors carry a protobuf ``google.rpc.Status`` body:

- 400 payload is not an ExportTraceServiceRequest, or a broken gzip stream;
- 404 another path; 405 another method (``Allow: POST``);
- 408 the body did not arrive within :data:`BODY_TIMEOUT_S`;
- 413 body (or its gzip-decompressed form) larger than ``max_message_bytes``;
- 415 content type other than ``application/x-protobuf`` (OTLP/JSON is not accepted), or a
  ``Content-Encoding`` other than ``gzip``/``identity``.

Gzip is decompressed incrementally with an output cap, so a decompression bomb costs at most
``max_message_bytes`` of memory. Concurrency is capped by uvicorn (``limit_concurrency``: 503 above it).
"""

from __future__ import annotations

import asyncio
import logging
import socket
import threading
import time
import zlib
from collections.abc import Awaitable, Callable, MutableMapping
from typing import Any

from google.rpc import status_pb2
from opentelemetry.proto.collector.trace.v1.trace_service_pb2 import ExportTraceServiceResponse

from inferwatch.agent.node.receiver.intake import SpanIntake
from inferwatch.agent.node.receiver.spans import PayloadError

log = logging.getLogger(__name__)

PATH = "/v1/traces"
PROTOBUF = "application/x-protobuf"
BODY_TIMEOUT_S = 10.0
LIMIT_CONCURRENCY = 64
KEEP_ALIVE_S = 5
START_TIMEOUT_S = 10.0
STOP_TIMEOUT_S = 5.0
_OK_BODY = ExportTraceServiceResponse().SerializeToString()

Scope = MutableMapping[str, Any]
Receive = Callable[[], Awaitable[MutableMapping[str, Any]]]
Send = Callable[[MutableMapping[str, Any]], Awaitable[None]]


class _Reject(Exception):
    def __init__(self, status: int, reason: str, message: str) -> None:
        super().__init__(message)
        self.status = status
        self.reason = reason


def _status_body(code: int, message: str) -> bytes:
    # google.rpc.Code: 3 INVALID_ARGUMENT, 8 RESOURCE_EXHAUSTED, 4 DEADLINE_EXCEEDED, 12 UNIMPLEMENTED
    return status_pb2.Status(code=code, message=message).SerializeToString()


_RPC_CODE = {400: 3, 404: 12, 405: 12, 408: 4, 413: 8, 415: 3}


def gunzip(body: bytes, limit: int) -> bytes:
    """Decompress a gzip body, never producing more than ``limit`` bytes (413 beyond, 400 if broken)."""
    d = zlib.decompressobj(wbits=16 + zlib.MAX_WBITS)
    try:
        out = d.decompress(body, limit + 1)
    except zlib.error as exc:
        raise _Reject(400, "bad_gzip", f"invalid gzip body: {exc}") from None
    if len(out) > limit or d.unconsumed_tail:
        raise _Reject(413, "too_large", f"decompressed body exceeds {limit} bytes")
    if not d.eof:
        raise _Reject(400, "bad_gzip", "truncated gzip body")
    return out


class OTLPHttpApp:
    """The ASGI application."""

    def __init__(self, intake: SpanIntake, max_bytes: int) -> None:
        self.intake = intake
        self.max_bytes = max_bytes

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] == "lifespan":
            while True:
                msg = await receive()
                if msg["type"] == "lifespan.startup":
                    await send({"type": "lifespan.startup.complete"})
                elif msg["type"] == "lifespan.shutdown":
                    await send({"type": "lifespan.shutdown.complete"})
                    return
        if scope["type"] != "http":
            return
        try:
            payload = await self._payload(scope, receive)
            try:
                self.intake.handle(payload, "http")
            except PayloadError as exc:
                raise _Reject(400, "", str(exc)) from None  # already counted by the intake
        except _Reject as rej:
            if rej.reason:
                self.intake.reject("http", rej.reason)
            headers = [(b"content-type", PROTOBUF.encode())]
            if rej.status == 405:
                headers.append((b"allow", b"POST"))
            await _respond(send, rej.status, _status_body(_RPC_CODE[rej.status], str(rej)), headers)
            return
        await _respond(send, 200, _OK_BODY, [(b"content-type", PROTOBUF.encode())])

    async def _payload(self, scope: Scope, receive: Receive) -> bytes:
        if scope["path"] != PATH:
            raise _Reject(404, "not_found", f"no such path; OTLP traces go to POST {PATH}")
        if scope["method"] != "POST":
            raise _Reject(405, "bad_method", f"{PATH} accepts POST only")
        headers = {k.lower(): v for k, v in scope["headers"]}
        ctype = headers.get(b"content-type", b"").split(b";")[0].strip().lower().decode("latin-1")
        if ctype != PROTOBUF:
            raise _Reject(415, "bad_content_type", f"content type {ctype or '(none)'!r} not supported; use {PROTOBUF}")
        encoding = headers.get(b"content-encoding", b"identity").strip().lower()
        if encoding not in (b"identity", b"gzip", b""):
            raise _Reject(415, "bad_encoding", f"content encoding {encoding.decode('latin-1')!r} not supported")
        gz = encoding == b"gzip"
        raw_limit = self.max_bytes  # the compressed body can be no larger than the message limit either
        length = headers.get(b"content-length")
        if length is not None:
            try:
                n = int(length)
            except ValueError:
                raise _Reject(400, "bad_protobuf", "invalid Content-Length") from None
            if n > raw_limit:
                raise _Reject(413, "too_large", f"body of {n} bytes exceeds {raw_limit}")
        try:
            body = await asyncio.wait_for(_read_body(receive, raw_limit), BODY_TIMEOUT_S)
        except asyncio.TimeoutError:
            raise _Reject(408, "timeout", f"body not received within {BODY_TIMEOUT_S:g} s") from None
        return gunzip(body, self.max_bytes) if gz else body


async def _read_body(receive: Receive, limit: int) -> bytes:
    chunks: list[bytes] = []
    size = 0
    while True:
        msg = await receive()
        if msg["type"] == "http.disconnect":
            raise _Reject(400, "bad_protobuf", "client disconnected before the body was complete")
        chunk = msg.get("body", b"")
        size += len(chunk)
        if size > limit:
            raise _Reject(413, "too_large", f"body exceeds {limit} bytes")
        chunks.append(chunk)
        if not msg.get("more_body", False):
            return b"".join(chunks)


async def _respond(send: Send, status: int, body: bytes, headers: list[tuple[bytes, bytes]]) -> None:
    headers = [*headers, (b"content-length", str(len(body)).encode())]
    await send({"type": "http.response.start", "status": status, "headers": headers})
    await send({"type": "http.response.body", "body": body})


def bind(endpoint: str) -> socket.socket:
    """Bind a listening TCP socket for ``host:port`` (port 0 picks a free one); OSError if taken."""
    host, _, port = endpoint.rpartition(":")
    host = host.strip("[]")
    family = socket.AF_INET6 if ":" in host else socket.AF_INET
    sock = socket.socket(family, socket.SOCK_STREAM)
    try:
        sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        sock.bind((host, int(port)))
        sock.listen(128)
    except OSError:
        sock.close()
        raise
    return sock


class HttpReceiver:
    """uvicorn on a thread, serving :class:`OTLPHttpApp` on an already bound socket."""

    def __init__(self, intake: SpanIntake, endpoint: str, max_bytes: int) -> None:
        import uvicorn

        from inferwatch.agent.node.quietserver import DateHeader, QuietServer

        self.intake = intake
        self._sock = bind(endpoint)
        self.port = int(self._sock.getsockname()[1])
        config = uvicorn.Config(
            DateHeader(OTLPHttpApp(intake, max_bytes)),
            log_level="warning",
            access_log=False,
            lifespan="on",
            limit_concurrency=LIMIT_CONCURRENCY,
            timeout_keep_alive=KEEP_ALIVE_S,
            timeout_graceful_shutdown=int(STOP_TIMEOUT_S),
        )
        self._server = QuietServer(config)
        self._thread = threading.Thread(target=self._serve, name="otlp-http", daemon=True)

    def _serve(self) -> None:
        try:
            self._server.run(sockets=[self._sock])
        except BaseException:  # SystemExit from uvicorn on startup failure included
            log.exception("OTLP/HTTP receiver stopped unexpectedly")

    def start(self) -> None:
        self._thread.start()
        deadline = time.monotonic() + START_TIMEOUT_S
        while not self._server.started and self._thread.is_alive() and time.monotonic() < deadline:
            time.sleep(0.01)
        if not self._server.started:
            raise RuntimeError("OTLP/HTTP receiver did not start")

    def stop(self) -> None:
        self._server.request_exit()
        if self._thread.is_alive():
            self._thread.join(STOP_TIMEOUT_S + 1)
        if self._thread.is_alive():
            self._server.force_exit = True
            self._thread.join(1.0)
        self._sock.close()
