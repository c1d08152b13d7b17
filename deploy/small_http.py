"""What the demo's standard-library HTTP services share (deploy/alert_sink.py, deploy/runbook_server.py).

A quiet request handler base (no access line per request, the agent's logging rule) with one way to send a
body, and :func:`serve`: bind, say where once on stderr, serve until interrupted, close. A bind failure is
one line and exit status 2, never a traceback. Standard library only: these scripts run in the image next
to the package, and the sink does not need the package at all.
"""

from __future__ import annotations

import sys
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from typing import Any

BIND_FAILURE = 2  # exit status when the address cannot be bound


class QuietHandler(BaseHTTPRequestHandler):
    """A handler that logs nothing per request and sends whole bodies with their length."""

    def log_message(self, format: str, *args: Any) -> None:
        pass

    def send_body(self, code: int, content_type: str, body: bytes) -> None:
        self.send_response(code)
        self.send_header("Content-Type", content_type)
        self.send_header("Content-Length", str(len(body)))
        self.end_headers()
        self.wfile.write(body)


def bind(host: str, port: int, handler: type[BaseHTTPRequestHandler]) -> ThreadingHTTPServer:
    """A threading server on ``host:port`` (0: any free port), not yet serving; raises OSError."""
    return ThreadingHTTPServer((host, port), handler)


def serve(what: str, host: str, port: int, handler: type[BaseHTTPRequestHandler]) -> int:
    """Serve ``handler`` on ``host:port`` until interrupted; the process's exit status."""
    try:
        server = bind(host, port, handler)
    except OSError as exc:
        print(f"{what}: cannot listen on {host}:{port}: {exc.strerror or exc}", file=sys.stderr, flush=True)
        return BIND_FAILURE
    print(f"{what} listening on http://{host}:{server.server_port}", file=sys.stderr, flush=True)
    try:
        server.serve_forever()
    except KeyboardInterrupt:
        pass
    finally:
        server.server_close()
    return 0
