"""The agent's HTTP API (FastAPI): /metrics, /healthz, /readyz, /api/v1/status, /runbooks/<AlertName>."""

from __future__ import annotations

from typing import Any

from fastapi import FastAPI, Request, Response
from fastapi.responses import HTMLResponse, JSONResponse, PlainTextResponse

from agent import __version__
from agent.app import Agent
from agent.runbooks import Runbooks, to_html
from exporters.prometheus import CONTENT_TYPE, exposition


def create_app(agent: Agent) -> FastAPI:
    app = FastAPI(title="inferwatch agent", version=__version__, docs_url=None, redoc_url=None)
    app.state.agent = agent

    @app.get("/metrics")
    def metrics() -> Response:
        # A plain route, not a mounted ASGI app: a mount answers 307 to /metrics/. A sync route: it runs on a
        # worker thread, where waiting for the collections pulled into this scrape blocks no other request.
        if agent.settings.collect_on_scrape:
            agent.runner.pull(agent.settings.scrape_wait_s)
        return Response(exposition(agent.registry), media_type=CONTENT_TYPE)

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
