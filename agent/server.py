"""The agent's HTTP API (FastAPI): /metrics, /healthz, /readyz, /api/v1/status, /runbooks/<AlertName>."""

from __future__ import annotations

from typing import Any

import anyio.to_thread
from fastapi import FastAPI, Request, Response
from fastapi.responses import HTMLResponse, JSONResponse, PlainTextResponse

from agent import __version__
from agent.app import Agent
from agent.runbooks import Runbooks, to_html
from exporters.prometheus import CONTENT_TYPE, exposition


class MetricsEndpoint:
    """``GET /metrics`` as plain ASGI, ahead of FastAPI's routing.

    A scrape is the agent's one regular wake-up, and on a VM the cost of a wake-up grows with the code it
    runs: FastAPI's routing, dependency solving and response classes made a cold scrape cost about 1.6x a
    bare ASGI answer (docs/benchmarks.md). The exposition (and any collection pulled into the scrape) runs on
    a worker thread, so waiting for it blocks no other request. Authentication still applies: the auth
    middleware sits outside this one.
    """

    def __init__(self, app: Any, agent: Agent) -> None:
        self.app = app
        self.agent = agent
        self._headers = [(b"content-type", CONTENT_TYPE.encode())]

    def _render(self) -> bytes:
        settings = self.agent.settings
        if settings.collect_on_scrape:
            self.agent.runner.pull(settings.scrape_wait_s)
        return exposition(self.agent.registry)

    async def __call__(self, scope: dict[str, Any], receive: Any, send: Any) -> None:
        if scope["type"] != "http" or scope["path"] != "/metrics":
            await self.app(scope, receive, send)
            return
        if scope["method"] not in ("GET", "HEAD"):
            await PlainTextResponse("method not allowed\n", 405, headers={"Allow": "GET, HEAD"})(scope, receive, send)
            return
        body = await anyio.to_thread.run_sync(self._render)
        headers = [*self._headers, (b"content-length", str(len(body)).encode())]
        await send({"type": "http.response.start", "status": 200, "headers": headers})
        await send({"type": "http.response.body", "body": body if scope["method"] == "GET" else b""})


def create_app(agent: Agent) -> FastAPI:
    app = FastAPI(title="inferwatch agent", version=__version__, docs_url=None, redoc_url=None)
    app.state.agent = agent

    # /metrics is served by MetricsEndpoint below the auth middleware, not by a route (see its docstring).
    app.add_middleware(MetricsEndpoint, agent=agent)

    @app.get("/healthz")
    def healthz() -> dict[str, str]:
        return {"status": "alive"}

    @app.get("/readyz")
    def readyz() -> JSONResponse:
        health = agent.state.health()
        pending = sorted(n for n, h in health.items() if h.runs == 0)
        code = 200 if not pending else 503
        return JSONResponse({"ready": not pending, "pending": pending}, status_code=code)

    @app.get("/api/v1/status")
    def status() -> dict[str, Any]:
        state = agent.state
        return {
            "version": __version__,
            "environment": state.environment,
            "started_at": state.started_at,
            "node": state.identity,
            "collectors": [h.as_dict() for h in state.health().values()],
            "findings": [
                {
                    "id": f.id,
                    "status": f.status,
                    "summary": f.summary,
                    "evidence": dict(f.evidence),
                    "runbook": f.runbook,
                }
                for f in state.findings()
            ],
        }

    runbooks = Runbooks.load()

    @app.get("/runbooks")
    def runbook_index() -> dict[str, Any]:
        base = agent.settings.runbooks.base_url
        return {"runbooks": [{"alert": n, "url": f"{base}/{n}"} for n in runbooks.names()]}

    @app.get("/runbooks/{name}")
    def runbook(name: str, request: Request, format: str | None = None) -> Response:
        text = runbooks.read(name)
        if text is None:
            return PlainTextResponse(f"no runbook named {name[:128]!r}\n", status_code=404)
        wants_html = format == "html" or (format is None and "text/html" in request.headers.get("accept", ""))
        if wants_html:
            return HTMLResponse(to_html(name, text))
        return Response(text, media_type="text/markdown; charset=utf-8")

    from agent.diag.api import install

    install(app, agent)
    return app
