"""A local HTTP server on 127.0.0.1 that replays a recorded Kubernetes API conversation (tests/fixtures/k8s/).

Each exchange is a request (path, and the query parameters it must carry) and the API server's answer: a JSON body
with a status, or a watch: ``Transfer-Encoding: chunked``, one JSON event per line, each in its own chunk and
flushed, then the end of the stream (as the API server ends a watch at ``timeoutSeconds``). A request is answered
by the first unused exchange for its path; a request whose query differs from the exchange's, or one with no
exchange left, is answered 500 and recorded in :attr:`Replay.mismatches`, so a client that drifts from the
conversation fails the test. With no exchange left for a watch, the stream is held open (no events) until
:meth:`Replay.close` or ``idle_watch_s``, as a quiet API server does.

An exchange may name its ``method`` (default GET; PATCH is served too): a PATCH must also carry the exchange's
``content_type`` and a JSON body that contains ``json_match`` (every key, list item by position, and value it names;
more is allowed), else it is a mismatch. The body of each PATCH is kept in :attr:`Replay.bodies`.
"""

from __future__ import annotations

import json
import threading
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path
from typing import Any
from urllib.parse import parse_qsl, urlsplit

FIXTURES = Path(__file__).resolve().parent / "fixtures" / "k8s"


def _contains(got: Any, want: Any) -> bool:
    """``got`` holds everything ``want`` names: a mapping's keys (recursively), a list's items by position."""
    if isinstance(want, dict):
        return isinstance(got, dict) and all(k in got and _contains(got[k], v) for k, v in want.items())
    if isinstance(want, list):
        return isinstance(got, list) and len(got) == len(want) and all(map(_contains, got, want))
    return bool(got == want)


class Replay:
    def __init__(self, conversation: dict[str, Any], idle_watch_s: float = 20.0) -> None:
        self.exchanges = list(conversation["exchanges"])
        self.used = [False] * len(self.exchanges)
        self.requests: list[tuple[str, dict[str, str], dict[str, str]]] = []  # path, query, headers
        self.mismatches: list[str] = []
        self.bodies: list[tuple[str, Any]] = []  # (path, JSON body) of each PATCH, in order
        self.idle_watch_s = idle_watch_s
        self.lock = threading.Lock()
        self.closing = threading.Event()
        replay = self

        class Handler(BaseHTTPRequestHandler):
            protocol_version = "HTTP/1.1"

            def log_message(self, *args: Any) -> None:
                pass

            def do_GET(self) -> None:
                replay._serve(self)

            def do_PATCH(self) -> None:
                replay._serve(self)

        self.server = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
        self.server.daemon_threads = True
        self.thread = threading.Thread(target=self.server.serve_forever, kwargs={"poll_interval": 0.05}, daemon=True)
        self.thread.start()

    @classmethod
    def from_fixture(cls, name: str, **kwargs: Any) -> Replay:
        return cls(json.loads((FIXTURES / name).read_text()), **kwargs)

    @property
    def url(self) -> str:
        return f"http://127.0.0.1:{self.server.server_address[1]}"

    def remaining(self) -> int:
        with self.lock:
            return self.used.count(False)

    def _next(
        self, path: str, query: dict[str, str], method: str = "GET", content_type: str = "", body: Any = None
    ) -> dict[str, Any] | None:
        with self.lock:
            self.requests.append((path, query, {}))
            for i, ex in enumerate(self.exchanges):
                request = ex["request"]
                if not self.used[i] and request["path"] == path and request.get("method", "GET") == method:
                    self.used[i] = True
                    want = request["query"]
                    wrong = {k: (query.get(k), v) for k, v in want.items() if query.get(k) != v}
                    if "content_type" in request and content_type != request["content_type"]:
                        wrong["content-type"] = (content_type, request["content_type"])
                    if "json_match" in request and not _contains(body, request["json_match"]):
                        wrong["body"] = (body, request["json_match"])
                    if query.get("watch") and "watch" not in want:
                        wrong["watch"] = (query["watch"], None)
                    if wrong:
                        self.mismatches.append(f"{path} exchange {i}: (got, want) {wrong}")
                        return None
                    return dict(ex["response"])
        if query.get("watch"):
            return {"status": 200, "watch": [], "idle": True}
        self.mismatches.append(f"{method} {path}: no exchange left for {query}")
        return None

    def _serve(self, h: BaseHTTPRequestHandler) -> None:
        parts = urlsplit(h.path)
        query = dict(parse_qsl(parts.query))
        body: Any = None
        if h.command == "PATCH":
            raw = h.rfile.read(int(h.headers.get("Content-Length") or 0))
            try:
                body = json.loads(raw)
            except ValueError:
                body = raw.decode("utf-8", "replace")
            with self.lock:
                self.bodies.append((parts.path, body))
        response = self._next(parts.path, query, h.command, h.headers.get("Content-Type", ""), body)
        with self.lock:
            self.requests[-1] = (parts.path, query, dict(h.headers))
        if response is None:
            body = b'{"kind":"Status","code":500,"message":"not in the recorded conversation"}'
            h.send_response(500)
            h.send_header("Content-Type", "application/json")
            h.send_header("Content-Length", str(len(body)))
            h.end_headers()
            h.wfile.write(body)
            return
        if "watch" not in response:
            body = json.dumps(response["body"]).encode()
            h.send_response(response["status"])
            h.send_header("Content-Type", "application/json")
            h.send_header("Content-Length", str(len(body)))
            h.end_headers()
            h.wfile.write(body)
            return
        h.send_response(200)
        h.send_header("Content-Type", "application/json")
        h.send_header("Transfer-Encoding", "chunked")
        h.end_headers()
        try:
            for event in response["watch"]:
                data = json.dumps(event).encode() + b"\n"
                h.wfile.write(f"{len(data):x}\r\n".encode() + data + b"\r\n")
                h.wfile.flush()
            if response.get("idle"):
                self.closing.wait(self.idle_watch_s)
            h.wfile.write(b"0\r\n\r\n")
            h.wfile.flush()
        except OSError:
            pass  # the client went away (a watcher stopping)

    def close(self) -> None:
        self.closing.set()
        self.server.shutdown()
        self.server.server_close()
        self.thread.join(10)
