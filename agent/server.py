"""The agent's HTTP API (FastAPI): /metrics, /healthz, /readyz, /api/v1/status, /runbooks/<AlertName>."""

from __future__ import annotations

from typing import Any

from fastapi import FastAPI, Request, Response
from fastapi.responses import HTMLResponse, JSONResponse, PlainTextResponse

from agent import __version__
from agent.app import Agent
from agent.diag.auth import Authenticator
from agent.runbooks import Runbooks, to_html
from exporters.prometheus import CONTENT_TYPE, render


class MetricsEndpoint:
    """``GET /metrics`` as plain ASGI, in front of the whole API (FastAPI and its middleware).

    A scrape is the agent's one regular wake-up, and on a VM its cost grows with the code and memory it
    touches (docs/benchmarks.md), so a scrape runs no routing, no middleware stack and no thread hand-off:
    it checks the token when ``/metrics`` is not an open path, pulls the collections due for it on the
    event loop (:meth:`Runner.pull_async`: the loop waits, the lane workers collect), and writes the state
    with :func:`exporters.prometheus.render`. A request the token check refuses goes on to the API, whose
    authentication middleware answers (and counts) the 401/403 as for any other path.
    """

    def __init__(self, app: Any, agent: Agent, auth: Authenticator) -> None:
        self.app = app
        self.agent = agent
        self.auth = auth
        self._headers = [(b"content-type", CONTENT_TYPE.encode())]

    def _allowed(self, scope: dict[str, Any]) -> bool:
        if self.auth.is_open("/metrics"):
            return True
        header = next((v for k, v in scope["headers"] if k == b"authorization"), None)
        return self.auth.check(None if header is None else header.decode("latin-1"), "read") == 200

    async def __call__(self, scope: dict[str, Any], receive: Any, send: Any) -> None:
        if scope["type"] != "http" or scope["path"] != "/metrics" or not self._allowed(scope):
            await self.app(scope, receive, send)
            return
        if scope["method"] not in ("GET", "HEAD"):
            await PlainTextResponse("method not allowed\n", 405, headers={"Allow": "GET, HEAD"})(scope, receive, send)
            return
        settings = self.agent.settings
        if settings.collect_on_scrape:
            await self.agent.runner.pull_async(settings.scrape_wait_s)
        body = render(self.agent.state)
        headers = [*self._headers, (b"content-length", str(len(body)).encode())]
        await send({"type": "http.response.start", "status": 200, "headers": headers})
        await send({"type": "http.response.body", "body": body if scope["method"] == "GET" else b""})


def create_app(agent: Agent) -> MetricsEndpoint:
    """The agent's ASGI application: :class:`MetricsEndpoint` in front of the FastAPI app."""
    auth = agent.ctx.services.get("auth")
    if not isinstance(auth, Authenticator):
        auth = agent.ctx.services["auth"] = Authenticator(agent.settings.api)
    return MetricsEndpoint(create_api(agent), agent, auth)


def create_api(agent: Agent) -> FastAPI:
    """Every route but ``/metrics`` (answered in front of it by :class:`MetricsEndpoint`)."""
    app = FastAPI(title="inferwatch agent", version=__version__, docs_url=None, redoc_url=None)
    app.state.agent = agent

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
