"""OTLP/gRPC trace intake: ``opentelemetry.proto.collector.trace.v1.TraceService/Export``.

Registered as a generic handler that receives the raw request bytes, so the intake decodes them itself
and a payload that is not an ``ExportTraceServiceRequest`` gets INVALID_ARGUMENT (the OTLP
specification's code for malformed data) rather than grpcio's INTERNAL. Size: requests over
``max_message_bytes`` get RESOURCE_EXHAUSTED and are counted; gRPC's own receive limit is set to twice
that, so anything larger is refused by gRPC itself (also RESOURCE_EXHAUSTED, but before our counter).
gRPC applies the same limit to the decompressed size of gzip-compressed messages.

**The server is made at the first connection.** grpcio and its server (its core's threads, the worker pool) are
~12 MB of the agent's RSS (docs/benchmarks.md, "Where everything-on's megabytes go"), and an engine that sends its
spans over OTLP/HTTP never uses them. Until a client connects, a plain listening socket holds the endpoint (a port
that cannot be bound is still an error at start; port 0 is chosen then). At the first connection grpcio is imported
and its server bound to the same address beside that socket (``SO_REUSEPORT``, which grpcio sets on Linux); the
connections already waiting on that socket are relayed to the server byte for byte for as long as they stay open,
then the socket is closed and every later connection reaches the server directly (one arriving in the instant the
socket closes is refused; OTLP exporters retry it).
"""

from __future__ import annotations

import contextlib
import logging
import select
import socket
import threading
from concurrent import futures
from typing import Any

from opentelemetry.proto.collector.trace.v1.trace_service_pb2 import ExportTraceServiceResponse

from inferwatch.agent.node.receiver.intake import SpanIntake
from inferwatch.agent.node.receiver.spans import PayloadError

log = logging.getLogger(__name__)

SERVICE = "opentelemetry.proto.collector.trace.v1.TraceService"
MAX_WORKERS = 4
MAX_CONCURRENT_RPCS = 64
STOP_GRACE_S = 2.0
RELAY_CHUNK = 1 << 16
_OK = ExportTraceServiceResponse().SerializeToString()


def _listeners(host: str, port: int) -> list[socket.socket]:
    """Listening sockets on every address of ``host`` (all interfaces when empty), ``SO_REUSEPORT`` set so grpcio can
    bind beside them; raises OSError when one cannot be bound."""
    out: list[socket.socket] = []
    chosen = port  # port 0: the first address's pick, then the same port on the others
    try:
        for family, kind, proto, _, addr in socket.getaddrinfo(
            host or None, port, type=socket.SOCK_STREAM, flags=socket.AI_PASSIVE
        ):
            sock = socket.socket(family, kind, proto)
            out.append(sock)
            sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
            sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEPORT, 1)
            if family == socket.AF_INET6:
                sock.setsockopt(socket.IPPROTO_IPV6, socket.IPV6_V6ONLY, 1)
            sock.bind((addr[0], chosen, *addr[2:]))
            sock.listen(128)
            chosen = chosen or int(sock.getsockname()[1])
    except OSError:
        for sock in out:
            sock.close()
        raise
    return out


def _relay(a: socket.socket, b: socket.socket) -> None:
    """Copy bytes both ways until both directions are closed (an end that closes its side is passed on)."""
    open_ = {a: b, b: a}
    try:
        while open_:
            ready, _, _ = select.select(list(open_), [], [])
            for src in ready:
                data = src.recv(RELAY_CHUNK)
                if data:
                    open_[src].sendall(data)
                    continue
                dst = open_.pop(src)
                with contextlib.suppress(OSError):
                    dst.shutdown(socket.SHUT_WR)
    except OSError:
        pass
    finally:
        a.close()
        b.close()


class GrpcReceiver:
    def __init__(self, intake: SpanIntake, endpoint: str, max_bytes: int) -> None:
        self.intake = intake
        self.max_bytes = max_bytes
        host, _, port = endpoint.rpartition(":")
        self._host = host
        try:
            self._socks = _listeners(host.strip("[]"), int(port))
        except OSError as exc:
            raise OSError(f"cannot bind {endpoint}: {exc}") from None
        self.port = int(self._socks[0].getsockname()[1])
        self._server: Any = None
        self._pool: futures.ThreadPoolExecutor | None = None
        self._lock = threading.Lock()
        self._stopped = False
        self._wake_r, self._wake_w = socket.socketpair()
        self._relays: list[tuple[threading.Thread, socket.socket, socket.socket]] = []
        self._waiter = threading.Thread(target=self._first_connection, name="otlp-grpc-wait", daemon=True)

    def _make_server(self) -> Any:
        import grpc  # here: ~10 MB that an agent whose engines send OTLP/HTTP never loads

        self._pool = futures.ThreadPoolExecutor(max_workers=MAX_WORKERS, thread_name_prefix="otlp-grpc")
        server = grpc.server(
            self._pool,
            handlers=[
                grpc.method_handlers_generic_handler(
                    SERVICE, {"Export": grpc.unary_unary_rpc_method_handler(self._export)}
                )
            ],
            options=[
                ("grpc.max_receive_message_length", 2 * self.max_bytes),
                ("grpc.max_send_message_length", 1 << 20),
                ("grpc.so_reuseport", 1),
            ],
            maximum_concurrent_rpcs=MAX_CONCURRENT_RPCS,
        )
        try:
            bound = server.add_insecure_port(f"{self._host}:{self.port}")
        except RuntimeError as exc:
            raise OSError(f"cannot bind {self._host}:{self.port}: {exc}") from None
        if bound != self.port:
            raise OSError(f"cannot bind {self._host}:{self.port} beside the waiting socket")
        server.start()
        return server

    def _first_connection(self) -> None:
        try:
            select.select([*self._socks, self._wake_r], [], [])
        except (OSError, ValueError):
            return
        accepted: list[socket.socket] = []
        with self._lock:
            if self._stopped:
                return
            try:
                self._server = self._make_server()
            except Exception:
                log.exception("OTLP/gRPC receiver: the server could not start; gRPC exports are refused")
                self.intake.up["grpc"] = False
            for sock in self._socks:  # what the socket holds goes to the server through a relay; then it closes
                sock.setblocking(False)
                while self._server is not None:
                    try:
                        accepted.append(sock.accept()[0])
                    except OSError:
                        break
                sock.close()
            for conn in accepted:
                if self._server is None:
                    conn.close()
                    continue
                conn.setblocking(True)
                try:
                    # the address the client reached (the server listens there now, the socket is closed)
                    peer = socket.create_connection(conn.getsockname()[:2], timeout=STOP_GRACE_S)
                except OSError:
                    log.warning("OTLP/gRPC receiver: could not relay a first connection", exc_info=True)
                    conn.close()
                    continue
                peer.settimeout(None)
                relay = threading.Thread(target=_relay, args=(conn, peer), name="otlp-grpc-relay", daemon=True)
                self._relays.append((relay, conn, peer))
                relay.start()

    def _export(self, request: bytes, context: Any) -> bytes:
        import grpc  # loaded with the server

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
        self._waiter.start()

    def stop(self) -> None:
        with self._lock:
            if self._stopped:
                return
            self._stopped = True
            server = self._server
        with contextlib.suppress(OSError):
            self._wake_w.send(b"x")
        self._waiter.join(STOP_GRACE_S + 1)
        for sock in (*self._socks, self._wake_r, self._wake_w):
            sock.close()
        for _, conn, peer in self._relays:
            for end in (conn, peer):
                with contextlib.suppress(OSError):
                    end.shutdown(socket.SHUT_RDWR)
        if server is not None:
            server.stop(STOP_GRACE_S).wait(STOP_GRACE_S + 1)
        if self._pool is not None:  # grpcio leaves its workers to the caller
            self._pool.shutdown(wait=False)
        for relay, _, _ in self._relays:
            relay.join(STOP_GRACE_S)
