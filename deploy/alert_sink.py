"""A local stand-in for PagerDuty and the ticket / dead-man's-switch webhooks in the docker-compose demo.

``POST /v2/enqueue`` answers like PagerDuty's Events API v2 (202 ``{"status": "success", ...}``); any other
``POST`` answers 200. Each event is printed as one JSON line (``docker compose logs pagerduty-sink``) and
kept in memory; ``GET /`` returns the last ``MAX_EVENTS`` as JSON (http://localhost:9099). Standard library
only; bodies above ``MAX_BODY_BYTES`` are refused with 413.
"""

from __future__ import annotations

import argparse
import collections
import hashlib
import json
import threading
import time
from typing import Any

from small_http import QuietHandler, serve

MAX_EVENTS = 200
MAX_BODY_BYTES = 1 << 20
EVENTS: collections.deque[dict[str, Any]] = collections.deque(maxlen=MAX_EVENTS)
LOCK = threading.Lock()


class Handler(QuietHandler):
    def _send(self, code: int, body: object) -> None:
        self.send_body(code, "application/json", json.dumps(body).encode())

    def do_GET(self) -> None:
        with LOCK:
            self._send(200, list(EVENTS))

    def do_POST(self) -> None:
        try:
            length = int(self.headers.get("Content-Length") or 0)
        except ValueError:
            length = -1
        if length < 0 or length > MAX_BODY_BYTES:
            self._send(413, {"status": "invalid event", "message": "body too large or bad length"})
            return
        raw = self.rfile.read(length)
        try:
            body: object = json.loads(raw)
        except ValueError:
            body = raw.decode("utf-8", "replace")
        event = {"t": time.time(), "path": self.path, "body": body}
        with LOCK:
            EVENTS.append(event)
        print(json.dumps(event), flush=True)
        if self.path == "/v2/enqueue":
            key = body.get("dedup_key") if isinstance(body, dict) else None
            dedup = key or hashlib.sha256(raw).hexdigest()[:32]
            self._send(202, {"status": "success", "message": "Event processed", "dedup_key": dedup})
        else:
            self._send(200, {"status": "ok"})


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__)
    ap.add_argument("--host", default="127.0.0.1")
    ap.add_argument("--port", type=int, default=9099)
    args = ap.parse_args(argv)
    return serve("alert sink", args.host, args.port, Handler)


if __name__ == "__main__":
    raise SystemExit(main())
