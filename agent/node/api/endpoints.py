"""Routes as plain Starlette endpoints: a handler takes the request and returns a response, a dict or a list.

The agent's API is a dozen small JSON and HTML routes that validate their own input; Starlette serves them
directly. FastAPI on top would load its OpenAPI models, a pydantic v1 compatibility layer and OpenTelemetry's logs
API into every agent (~6 MB; docs/benchmarks.md, "Where the megabytes go"). What this module does for the routes:
a dict or list answer becomes JSON, a sync handler runs in Starlette's thread pool (never on the event loop), a bad
query parameter or body is a 400 with the API's JSON error shape.
"""

from __future__ import annotations

import inspect
import json
from collections.abc import Awaitable, Callable
from typing import Any

from starlette.applications import Starlette
from starlette.concurrency import run_in_threadpool
from starlette.requests import Request
from starlette.responses import JSONResponse, Response

Answer = Response | dict[str, Any] | list[Any]
Handler = Callable[[Request], Answer] | Callable[[Request], Awaitable[Answer]]


class BadRequest(ValueError):
    """A query parameter or body the route cannot use; answered 400 ``{"error": "bad_request", "message": ...}``."""


def bad_request(message: str) -> JSONResponse:
    return JSONResponse({"error": "bad_request", "message": message}, status_code=400)


def _response(answer: Answer) -> Response:
    return answer if isinstance(answer, Response) else JSONResponse(answer)


def route(app: Starlette, method: str, path: str) -> Callable[[Handler], Handler]:
    """Register ``handler`` for ``method path`` (``{name}`` path parameters: ``request.path_params``)."""

    def register(handler: Handler) -> Handler:
        is_async = inspect.iscoroutinefunction(handler)

        async def endpoint(request: Request) -> Response:
            try:
                if is_async:
                    answer = await handler(request)  # type: ignore[misc]
                else:
                    answer = await run_in_threadpool(handler, request)
            except BadRequest as exc:
                return bad_request(str(exc))
            return _response(answer)

        app.add_route(path, endpoint, methods=[method])
        return handler

    return register


def query_int(request: Request, name: str, default: int | None = None) -> int | None:
    """The integer query parameter ``name``, ``default`` when absent; :class:`BadRequest` when not an integer."""
    raw = request.query_params.get(name)
    if raw is None:
        return default
    try:
        return int(raw)
    except ValueError:
        raise BadRequest(f"{name} must be an integer, got {raw[:40]!r}") from None


def query_str(request: Request, name: str, default: str | None = None) -> str | None:
    return request.query_params.get(name, default)


async def json_object(request: Request) -> dict[str, Any]:
    """The request body as a JSON object (``{}`` when empty); :class:`BadRequest` for anything else."""
    raw = await request.body()
    if not raw.strip():
        return {}
    try:
        body = json.loads(raw)
    except ValueError as exc:
        raise BadRequest(f"the body is not JSON: {exc}") from None
    if not isinstance(body, dict):
        raise BadRequest(f"the body must be a JSON object, got {type(body).__name__}")
    return body
