"""The agent's HTTP API (Starlette): /metrics, /healthz, /readyz, /api/v1/status, /runbooks/<AlertName>."""

from __future__ import annotations

import logging
from collections.abc import Awaitable, Callable, Iterator
from typing import Any

from starlette.applications import Starlette
from starlette.requests import Request
from starlette.responses import HTMLResponse, JSONResponse, PlainTextResponse, Response

from inferwatch.agent import __version__
from inferwatch.agent.common.precedence import GATE
from inferwatch.agent.common.redact import redact_url
from inferwatch.agent.common.runbooks import MARKDOWN_TYPE, Runbooks, to_html, wants_markdown
from inferwatch.agent.config import EngineSettings, ReadinessSettings, RunbooksSettings
from inferwatch.agent.node.api.auth import Authenticator
from inferwatch.agent.node.api.endpoints import query_str, route
from inferwatch.agent.node.api.routes import finding_dict, install
from inferwatch.agent.node.api.services import ApiServices
from inferwatch.agent.node.state import AgentState
from inferwatch.exporters.prometheus import CONTENT_TYPE, OPENMETRICS_CONTENT_TYPE, render_openmetrics, render_parts

log = logging.getLogger(__name__)
Pull = Callable[[float], Awaitable[None]]  # Runner.pull_async: bring the due collections into this scrape


class MetricsEndpoint:
    """``GET /metrics`` as plain ASGI, in front of the whole API (its routes and middleware).

    A scrape runs no routing, no middleware stack and no thread hand-off (why: docs/benchmarks.md, "The agent's CPU
    target"): it checks the token when ``/metrics`` is not an open path, pulls the collections due for it on the
    event loop (:meth:`Runner.pull_async`: the loop waits, the lane workers collect), and writes the state with
    :func:`inferwatch.exporters.prometheus.render_parts`, in pieces. A request the token check refuses goes on to the
    API, whose authentication middleware answers (and counts) the 401/403 as for any other path.

    ``pull`` None (``collect_on_scrape`` off): a scrape writes the state as it is; else it waits at most
    ``scrape_wait_s`` for the pulled collections. ``exemplars``: the span receiver feeds histograms with exemplars
    (``receiver.enabled`` and ``receiver.emit_histograms``), so a scrape that asks for OpenMetrics gets it.
    """

    def __init__(
        self,
        app: Any,
        state: AgentState,
        auth: Authenticator,
        pull: Pull | None,
        scrape_wait_s: float,
        exemplars: bool,
    ) -> None:
        self.app = app
        self.state = state
        self.pull = pull
        self.scrape_wait_s = scrape_wait_s
        self.auth = auth
        self._headers = [(b"content-type", CONTENT_TYPE.encode())]
        self._openmetrics_headers = [(b"content-type", OPENMETRICS_CONTENT_TYPE.encode())]
        # Exemplars exist only on the histograms the span receiver feeds: OpenMetrics (and its slower path) only then
        self._exemplars = exemplars
        self._openmetrics_failed = False  # logged once

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
        if self.pull is not None:
            with GATE.waiting_on_background():  # the collection this scrape waits for does not wait for it
                await self.pull(self.scrape_wait_s)
        accept = next((v for k, v in scope["headers"] if k == b"accept"), b"")
        parts: list[bytes] | None = None
        if self._exemplars and b"application/openmetrics-text" in accept:
            try:
                parts, head = [render_openmetrics(self.state)], self._openmetrics_headers
            except Exception:  # a family OpenMetrics refuses: the scrape still gets every value, as plain text
                if not self._openmetrics_failed:
                    log.warning("OpenMetrics exposition failed; answering in the text format", exc_info=True)
                    self._openmetrics_failed = True
        if parts is None:
            parts, head = render_parts(self.state), self._headers
        headers = [*head, (b"content-length", str(sum(map(len, parts))).encode())]
        await send({"type": "http.response.start", "status": 200, "headers": headers})
        if scope["method"] != "GET":
            await send({"type": "http.response.body", "body": b""})
            return
        # Written in pieces of ~256 KiB, each after the one before has left (the server's flow control): the answer
        # is never copied whole, in the server's framing or the socket's buffer (at 200 models the agent's memory
        # peaked there: docs/benchmarks.md, "/metrics and the API while a 200-model engine is read").
        for piece, last in _pieces(parts, WRITE_PIECE_BYTES):
            await send({"type": "http.response.body", "body": piece, "more_body": not last})


WRITE_PIECE_BYTES = 256 << 10


def _pieces(parts: list[bytes], size: int) -> Iterator[tuple[bytes, bool]]:
    """``parts`` as pieces of about ``size`` bytes (small parts joined, a large one cut), each with whether it is the
    last; made one at a time, as they are written."""

    def made() -> Iterator[bytes]:
        batch: list[bytes] = []
        held = 0
        for part in parts:
            if len(part) > size:  # a large family: pieces of its own
                if batch:
                    yield b"".join(batch)
                    batch, held = [], 0
                for i in range(0, len(part), size):
                    yield part[i : i + size]
                continue
            batch.append(part)
            held += len(part)
            if held >= size:
                yield b"".join(batch)
                batch, held = [], 0
        if batch:
            yield b"".join(batch)

    pending: bytes | None = None
    for piece in made():
        if pending is not None:
            yield pending, False
        pending = piece
    yield (pending if pending is not None else b""), True


def create_app(
    state: AgentState,
    services: ApiServices,
    *,
    engine_cfg: EngineSettings,
    readiness_cfg: ReadinessSettings,
    runbooks_cfg: RunbooksSettings,
    pull: Pull | None,
    scrape_wait_s: float,
    exemplars: bool,
) -> MetricsEndpoint:
    """The agent's ASGI application: :class:`MetricsEndpoint` (``pull``, ``scrape_wait_s``, ``exemplars``) in front
    of the API's routes (:func:`create_api`)."""
    api = create_api(state, services, engine_cfg=engine_cfg, readiness_cfg=readiness_cfg, runbooks_cfg=runbooks_cfg)
    return MetricsEndpoint(api, state, services.auth, pull, scrape_wait_s, exemplars)


def create_api(
    state: AgentState,
    services: ApiServices,
    *,
    engine_cfg: EngineSettings,
    readiness_cfg: ReadinessSettings,
    runbooks_cfg: RunbooksSettings,
) -> Starlette:
    """Every route but ``/metrics`` (answered in front of it by :class:`MetricsEndpoint`); ``runbooks_cfg``: where
    the runbook links point, the engine and readiness sections: ``GET /engines/{name}/ready``."""
    app = Starlette()

    # Answered from the state on the event loop (no thread hand-off): they are what probes and routers poll, and a
    # read of the state takes microseconds.
    @route(app, "GET", "/healthz")
    async def healthz(request: Request) -> dict[str, str]:
        return {"status": "alive"}

    @route(app, "GET", "/readyz")
    async def readyz(request: Request) -> JSONResponse:
        health = state.health()
        pending = sorted(n for n, h in health.items() if h.runs == 0)
        code = 200 if not pending else 503
        return JSONResponse({"ready": not pending, "pending": pending}, status_code=code)

    @route(app, "GET", "/api/v1/status")
    async def status(request: Request) -> dict[str, Any]:
        return {
            "version": __version__,
            "environment": state.environment,
            "started_at": state.started_at,
            "node": state.identity,
            "collectors": [h.as_dict() for h in state.health().values()],
            "findings": [finding_dict(f) for f in state.findings()],
        }

    runbooks = Runbooks.load()

    # runbooks.base_url when set; else this agent's own /runbooks, as the request reached it (host and port the
    # agent serves on, not the default's 9435).
    runbooks_base = runbooks_cfg.base_url

    @route(app, "GET", "/runbooks")
    def runbook_index(request: Request) -> dict[str, Any]:
        base = runbooks_base or f"{str(request.base_url).rstrip('/')}/runbooks"
        base = redact_url(base)  # an open path: never a credential in a link
        return {"runbooks": [{"alert": n, "url": f"{base}/{n}"} for n in runbooks.names()]}

    @route(app, "GET", "/runbooks/{name}")
    def runbook(request: Request) -> Response:
        name = request.path_params["name"]
        text = runbooks.read(name)
        if text is None:
            return PlainTextResponse(f"no runbook named {name[:128]!r}\n", status_code=404)
        if wants_markdown(query_str(request, "format"), request.headers.get("accept", "")):
            return Response(text, media_type=MARKDOWN_TYPE)
        return HTMLResponse(to_html(name, text))

    install(app, state, services, engine_cfg=engine_cfg, readiness_cfg=readiness_cfg)
    return app
