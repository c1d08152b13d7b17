"""A static runbook server that stays up when the agent does not: the target of Prometheus's ``runbook_base``.

Every alert's ``runbook_url`` is ``<runbook_base>/<AlertName>`` (agent/alerts/links.py). By default that base is
the agent's own ``/runbooks``, which is exactly what is unreachable when AgentDown (or any alert about the agent)
fires. This process serves the same files, the same way (``GET /runbooks/<AlertName>`` as an HTML page rendered
from the Markdown, or the Markdown with ``?format=md`` / ``Accept: text/markdown``; ``GET /runbooks`` as a JSON
index; ``/healthz``), from a
separate process that reads nothing but the runbook directory: point ``runbook_base`` at it and every link
resolves whatever state the agent, the engine or the node's collectors are in.

    python deploy/runbook_server.py [--listen-address 127.0.0.1] [--port 9436] [--dir runbooks]

Names are looked up in the directory listing taken at start (inferwatch.agent.common.runbooks.Runbooks), never joined
into a path. For a web server you already run, the equivalent is a copy of ``runbooks/`` with a rewrite from
``/runbooks/<Name>`` to ``<Name>.md`` (docs/alerts.md, "Runbook links that stay up").
"""

from __future__ import annotations

import argparse
import json
import sys
from http.server import BaseHTTPRequestHandler
from pathlib import Path
from urllib.parse import parse_qs, urlsplit

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))  # the checkout's package, when run from it

from small_http import QuietHandler, serve

from inferwatch.agent.common.runbooks import HTML_TYPE, MARKDOWN_TYPE, Runbooks, to_html, wants_markdown

DEFAULT_PORT = 9436  # next to the agent's 9435


def handler(runbooks: Runbooks, base_url: str | None = None) -> type[BaseHTTPRequestHandler]:
    """The request handler serving ``runbooks`` (``base_url``: the public URL of /runbooks, for the index)."""

    class Handler(QuietHandler):
        def do_GET(self) -> None:
            url = urlsplit(self.path)
            path = url.path.rstrip("/")
            text_plain = "text/plain; charset=utf-8"
            if path == "/healthz":
                self.send_body(200, text_plain, b"ok\n")
            elif path == "/runbooks":
                base = base_url or f"http://{self.headers.get('Host', 'localhost')}/runbooks"
                index = {"runbooks": [{"alert": n, "url": f"{base}/{n}"} for n in runbooks.names()]}
                self.send_body(200, "application/json", json.dumps(index).encode())
            elif path.startswith("/runbooks/"):
                name = path.removeprefix("/runbooks/")
                text = runbooks.read(name)
                if text is None:
                    self.send_body(404, text_plain, f"no runbook {name!r}\n".encode())
                elif wants_markdown((parse_qs(url.query).get("format") or [None])[0], self.headers.get("Accept", "")):
                    self.send_body(200, MARKDOWN_TYPE, text.encode())
                else:
                    self.send_body(200, HTML_TYPE, to_html(name, text).encode())
            else:
                self.send_body(404, text_plain, b"not found\n")

    return Handler


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description="Serve runbooks/<AlertName>.md at /runbooks/<AlertName>.")
    ap.add_argument("--listen-address", default="127.0.0.1")
    ap.add_argument("--port", type=int, default=DEFAULT_PORT)
    ap.add_argument("--dir", type=Path, default=None, help="runbook directory (default: the package's runbooks)")
    ap.add_argument("--base-url", default=None, help="the public URL of /runbooks, for the index")
    args = ap.parse_args(argv)
    runbooks = Runbooks.load(args.dir) if args.dir else Runbooks.load()
    if not runbooks.names():
        print(f"no runbooks in {args.dir or 'the package'}", file=sys.stderr)
        return 2
    print(f"serving {len(runbooks.names())} runbooks at /runbooks", file=sys.stderr, flush=True)
    return serve("runbook server", args.listen_address, args.port, handler(runbooks, args.base_url))


if __name__ == "__main__":
    sys.exit(main())
