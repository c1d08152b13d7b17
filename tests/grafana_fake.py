"""A local HTTP server that answers like Grafana's HTTP API for the endpoints ``grafana push`` uses.

No Grafana server package exists here, so this mimics Grafana 11's documented behaviour for:
``GET /api/frontend/settings``, ``GET/POST /api/folders``, ``GET /api/folders/:uid``,
``GET /api/datasources/uid/:uid``, ``POST /api/datasources``, ``GET /api/dashboards/uid/:uid``,
``POST /api/dashboards/db``. Every request is recorded (method, path, headers, JSON body).
Authentication: a bearer token or basic user:password must match, else 401 like Grafana.
"""

from __future__ import annotations

import base64
import json
import threading
from dataclasses import dataclass, field
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from typing import Any


@dataclass
class FakeGrafana:
    version: str = "11.6.0"
    token: str = "glsa_test_token"
    basic: tuple[str, str] = ("admin", "secret")
    requests: list[dict[str, Any]] = field(default_factory=list)
    folders: dict[str, dict[str, Any]] = field(default_factory=dict)
    datasources: dict[str, dict[str, Any]] = field(default_factory=dict)
    dashboards: dict[str, dict[str, Any]] = field(default_factory=dict)
    forbid_datasources: bool = False  # answer 403 on datasource writes (an Editor token)
    _server: ThreadingHTTPServer | None = None
    _thread: threading.Thread | None = None

    @property
    def url(self) -> str:
        assert self._server is not None
        host, port = self._server.server_address[:2]
        return f"http://{host!s}:{port}"

    def start(self) -> FakeGrafana:
        fake = self

        class Handler(BaseHTTPRequestHandler):
            def log_message(self, *args: object) -> None:
                pass

            def _send(self, code: int, body: Any) -> None:
                data = json.dumps(body).encode()
                self.send_response(code)
                self.send_header("Content-Type", "application/json")
                self.send_header("Content-Length", str(len(data)))
                self.end_headers()
                self.wfile.write(data)

            def _handle(self, method: str) -> None:
                length = int(self.headers.get("Content-Length") or 0)
                raw = self.rfile.read(length) if length else b""
                body = json.loads(raw) if raw else None
                fake.requests.append(
                    {"method": method, "path": self.path, "headers": dict(self.headers.items()), "body": body}
                )
                if not fake._authorized(self.headers.get("Authorization", "")):
                    self._send(401, {"message": "Unauthorized", "messageId": "auth.unauthorized"})
                    return
                code, answer = fake._route(method, self.path.split("?")[0], body)
                self._send(code, answer)

            def do_GET(self) -> None:
                self._handle("GET")

            def do_POST(self) -> None:
                self._handle("POST")

        self._server = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
        self._thread = threading.Thread(target=self._server.serve_forever, daemon=True)
        self._thread.start()
        return self

    def stop(self) -> None:
        if self._server is not None:
            self._server.shutdown()
            self._server.server_close()

    def _authorized(self, header: str) -> bool:
        if header == f"Bearer {self.token}":
            return True
        if header.startswith("Basic "):
            user, _, pw = base64.b64decode(header[6:]).decode().partition(":")
            return (user, pw) == self.basic
        return False

    def _route(self, method: str, path: str, body: Any) -> tuple[int, Any]:
        parts = path.strip("/").split("/")
        if path == "/api/frontend/settings" and method == "GET":
            return 200, {"buildInfo": {"version": self.version, "edition": "Open Source", "env": "production"}}
        if path == "/api/folders" and method == "GET":
            return 200, [{"id": f["id"], "uid": f["uid"], "title": f["title"]} for f in self.folders.values()]
        if path == "/api/folders" and method == "POST":
            uid = body.get("uid") or f"f{len(self.folders) + 1}"
            if uid in self.folders:
                return 409, {"message": "a folder with the same uid already exists"}
            if any(f["title"] == body["title"] for f in self.folders.values()):
                return 409, {"message": "a folder with the same name already exists"}
            self.folders[uid] = {"id": len(self.folders) + 1, "uid": uid, "title": body["title"], "version": 1}
            return 200, self.folders[uid]
        if len(parts) == 3 and parts[:2] == ["api", "folders"] and method == "GET":
            f = self.folders.get(parts[2])
            return (200, f) if f else (404, {"message": "folder not found", "status": "not-found"})
        if len(parts) == 4 and parts[:3] == ["api", "datasources", "uid"] and method == "GET":
            ds = self.datasources.get(parts[3])
            return (200, ds) if ds else (404, {"message": "Data source not found"})
        if path == "/api/datasources" and method == "POST":
            if self.forbid_datasources:
                return 403, {"message": "You'll need additional permissions to perform this action."}
            ds = {**body, "id": len(self.datasources) + 1}
            self.datasources[body["uid"]] = ds
            return 200, {"datasource": ds, "id": ds["id"], "message": "Datasource added", "name": body["name"]}
        if len(parts) == 4 and parts[:3] == ["api", "dashboards", "uid"] and method == "GET":
            d = self.dashboards.get(parts[3])
            return (200, d) if d else (404, {"message": "Dashboard not found"})
        if path == "/api/dashboards/db" and method == "POST":
            dash = body["dashboard"]
            folder = body.get("folderUid", "")
            if folder and folder not in self.folders:
                return 400, {"message": "folder not found", "status": "folder-not-found"}
            uid = dash["uid"]
            old = self.dashboards.get(uid)
            if old and not body.get("overwrite"):
                return 412, {"message": "A dashboard with the same uid already exists", "status": "name-exists"}
            version = (old["dashboard"]["version"] + 1) if old else 1
            ident = old["dashboard"]["id"] if old else len(self.dashboards) + 1
            stored = {**dash, "id": ident, "version": version}
            url = f"/d/{uid}/{dash['title'].lower().replace(' ', '-')}"
            self.dashboards[uid] = {"dashboard": stored, "meta": {"folderUid": folder, "url": url}}
            return 200, {"id": ident, "uid": uid, "url": url, "status": "success", "version": version}
        return 404, {"message": "Not found"}
