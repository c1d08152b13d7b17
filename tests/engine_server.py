"""A tiny real HTTP server on 127.0.0.1 that serves engine expositions (and misbehaves on request).

``EngineServer(routes)`` maps a path to a callable ``(handler) -> None`` that writes the response;
helpers build the usual behaviours. ``server.served`` records (path, body) of every exposition sent.
"""

from __future__ import annotations

import threading
import time
from collections.abc import Callable
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from types import TracebackType

from tests.conftest import free_port

Route = Callable[[BaseHTTPRequestHandler], None]


def body(data: bytes | str, ctype: str = "text/plain; version=0.0.4; charset=utf-8", length: bool = True) -> Route:
    raw = data.encode() if isinstance(data, str) else data

    def send(h: BaseHTTPRequestHandler) -> None:
        h.send_response(200)
        h.send_header("Content-Type", ctype)
        if length:
            h.send_header("Content-Length", str(len(raw)))
        else:
            h.send_header("Connection", "close")
        h.end_headers()
        h.wfile.write(raw)
        if not length:
            h.close_connection = True

    return send


def status(code: int) -> Route:
    def send(h: BaseHTTPRequestHandler) -> None:
        h.send_response(code)
        h.send_header("Content-Length", "0")
        h.end_headers()

    return send


def truncated(data: str, claimed: int) -> Route:
    """Announce ``claimed`` bytes, send ``data``, close: the client sees an incomplete body."""

    def send(h: BaseHTTPRequestHandler) -> None:
        h.send_response(200)
        h.send_header("Content-Type", "text/plain; version=0.0.4")
        h.send_header("Content-Length", str(claimed))
        h.end_headers()
        h.wfile.write(data.encode())
        h.wfile.flush()
        h.close_connection = True

    return send


def slow(delay_s: float, then: Route) -> Route:
    def send(h: BaseHTTPRequestHandler) -> None:
        time.sleep(delay_s)
        then(h)

    return send


def trickle(line: bytes, every_s: float, total_s: float) -> Route:
    """Answer at once, then send ``line`` every ``every_s`` for ``total_s`` (no Content-Length)."""

    def send(h: BaseHTTPRequestHandler) -> None:
        h.send_response(200)
        h.send_header("Content-Type", "text/plain; version=0.0.4")
        h.send_header("Connection", "close")
        h.end_headers()
        deadline = time.monotonic() + total_s
        try:
            while time.monotonic() < deadline:
                h.wfile.write(line)
                h.wfile.flush()
                time.sleep(every_s)
        except OSError:
            pass  # the client gave up, as it should
        h.close_connection = True

    return send


class EngineServer:
    def __init__(self, routes: dict[str, Route] | None = None) -> None:
        self.routes: dict[str, Route] = dict(routes or {})
        self.requests: list[tuple[float, str]] = []
        server = self

        class Handler(BaseHTTPRequestHandler):
            protocol_version = "HTTP/1.1"

            def do_GET(self) -> None:
                server.requests.append((time.time(), self.path))
                # a path's route answers it with any query too (an engine that ignores ``name[]=``, as TGI and
                # llama.cpp do), unless the path with that query has a route of its own
                route = server.routes.get(self.path) or server.routes.get(self.path.split("?", 1)[0])
                try:
                    (route or status(404))(self)
                except (BrokenPipeError, ConnectionResetError):
                    self.close_connection = True  # the client gave up first (cap, deadline): expected

            def log_message(self, format: str, *args: object) -> None:
                pass

        self.httpd = ThreadingHTTPServer(("127.0.0.1", free_port()), Handler)
        self.httpd.daemon_threads = True
        self.port = self.httpd.server_address[1]
        self._thread = threading.Thread(target=self.httpd.serve_forever, kwargs={"poll_interval": 0.05}, daemon=True)

    def url(self, path: str) -> str:
        return f"http://127.0.0.1:{self.port}{path}"

    def __enter__(self) -> EngineServer:
        self._thread.start()
        return self

    def __exit__(
        self, exc_type: type[BaseException] | None, exc: BaseException | None, tb: TracebackType | None
    ) -> None:
        self.httpd.shutdown()
        self.httpd.server_close()
        self._thread.join(5)
