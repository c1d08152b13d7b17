"""HTTP surface of the simulator (Starlette): OpenAI, Anthropic, /metrics, debug profile, control.

Endpoints: ``POST /v1/chat/completions``, ``POST /v1/completions`` (streamed as SSE with
``data: [DONE]`` and ``stream_options.include_usage``, or not), ``POST /v1/messages`` (Anthropic
Messages: message_start, content_block_start, content_block_delta…, content_block_stop,
message_delta with usage, message_stop), ``GET /v1/models``, ``GET /health``, ``GET /version``,
``GET /metrics``, ``GET /debug/runtime_profile``, ``GET|POST /control/scenario`` (bearer token).
Errors use the OpenAI error shape ``{"error": {"message", "type", "param", "code"}}`` (Anthropic's
``{"type": "error", "error": {...}}`` on /v1/messages).
"""

from __future__ import annotations

import asyncio
import contextlib
import hmac
import itertools
import json
import logging
import os
import random
import time
from collections.abc import AsyncIterator, Awaitable, Callable, Mapping
from typing import Any

from prometheus_client import CONTENT_TYPE_LATEST, generate_latest
from starlette.applications import Starlette
from starlette.requests import Request
from starlette.responses import JSONResponse, Response
from starlette.routing import Route
from starlette.types import ASGIApp, Message, Receive, Scope, Send

from inferwatch.simulator import scenarios as sc
from inferwatch.simulator.config import ENGINE_VERSION, MAX_BODY_BYTES, SimConfig
from inferwatch.simulator.engine import SimRequest
from inferwatch.simulator.profile import runtime_profile
from inferwatch.simulator.runtime import Runtime, TokenStream
from inferwatch.simulator.text import chat_prompt_tokens, count_tokens, dumps, full_text, token_text
from inferwatch.simulator.tracing import parent_context

log = logging.getLogger("simulator")
EXCLUDED_HANDLERS = {"/metrics", "/health", "/version", "/sim/stats"}
SSE_RAW_HEADERS = [
    (b"content-type", b"text/event-stream; charset=utf-8"),
    (b"cache-control", b"no-cache"),
    (b"x-accel-buffering", b"no"),
]


class SSEResponse:
    """A server-sent-events response written straight to the ASGI ``send`` (no per-chunk middleware).

    A watcher task reads ``receive`` for ``http.disconnect`` and cancels the writer, so the generator's
    ``finally`` aborts the engine request when the client goes away (what Starlette's
    StreamingResponse does, without its per-chunk layers).
    """

    def __init__(self, chunks: AsyncIterator[str]) -> None:
        self.chunks = chunks

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        task = asyncio.current_task()
        disconnected = False

        async def watch() -> None:
            nonlocal disconnected
            while (await receive())["type"] != "http.disconnect":
                pass
            disconnected = True
            if task is not None:
                task.cancel()

        watcher = asyncio.get_running_loop().create_task(watch())
        try:
            await send({"type": "http.response.start", "status": 200, "headers": SSE_RAW_HEADERS})
            async for chunk in self.chunks:
                await send({"type": "http.response.body", "body": chunk.encode(), "more_body": True})
            await send({"type": "http.response.body", "body": b"", "more_body": False})
        except asyncio.CancelledError:
            if not disconnected:
                raise
            if task is not None and hasattr(task, "uncancel"):
                task.uncancel()
        finally:
            watcher.cancel()
            await self.chunks.aclose()  # type: ignore[attr-defined]


class RequestError(Exception):
    def __init__(self, status: int, message: str, type_: str = "BadRequestError", param: str | None = None):
        super().__init__(message)
        self.status = status
        self.type = type_
        self.param = param


def openai_error(exc: RequestError) -> JSONResponse:
    body = {"error": {"message": str(exc), "type": exc.type, "param": exc.param, "code": exc.status}}
    return JSONResponse(body, status_code=exc.status)


def anthropic_error(exc: RequestError) -> JSONResponse:
    kind = exc.type if exc.type in ("hardware_mismatch",) else _ANTHROPIC_TYPES.get(exc.status, "api_error")
    return JSONResponse({"type": "error", "error": {"type": kind, "message": str(exc)}}, status_code=exc.status)


_ANTHROPIC_TYPES = {400: "invalid_request_error", 401: "authentication_error", 404: "not_found_error",
                    413: "request_too_large", 500: "api_error", 503: "overloaded_error"}  # fmt: skip


def _int_param(body: dict[str, Any], *names: str, default: int | None = None, lo: int = 1) -> int | None:
    for name in names:
        value = body.get(name)
        if value is None:
            continue
        if isinstance(value, bool) or not isinstance(value, int) or value < lo:
            raise RequestError(400, f"{name} must be an integer >= {lo}, got {value!r}", param=name)
        return value
    return default


class SimulatorApp:
    """The request handlers around one :class:`Runtime`."""

    def __init__(self, config: SimConfig) -> None:
        self.config = config
        self.runtime = Runtime(config)
        self.rng = random.Random(config.seed ^ 0x5EED)
        self._ids = itertools.count()
        self._id_prefix = os.urandom(4).hex()
        self._debug_header = config.debug_header_pair()
        self.server_impl: dict[str, str] = {}  # uvicorn loop and http parser, set by inferwatch.simulator.serve

    # -- helpers ---------------------------------------------------------------------------------
    async def _json_body(self, request: Request) -> dict[str, Any]:
        declared = request.headers.get("content-length", "0")
        if declared.isdigit() and int(declared) > MAX_BODY_BYTES:
            raise RequestError(413, f"request body of {declared} bytes exceeds {MAX_BODY_BYTES}")
        body = await request.body()
        if len(body) > MAX_BODY_BYTES:
            raise RequestError(413, f"request body of {len(body)} bytes exceeds {MAX_BODY_BYTES}")
        try:
            data = json.loads(body)
        except (UnicodeDecodeError, ValueError) as exc:
            raise RequestError(400, f"request body is not valid JSON: {exc}") from None
        if not isinstance(data, dict):
            raise RequestError(400, "request body must be a JSON object")
        return data

    def _faults(self) -> None:
        """Scenario failures that happen before the engine sees the request."""
        scenarios = self.runtime.scenarios
        if "hardware_mismatch" in scenarios:
            hw = self.runtime.config.hardware
            raise RequestError(
                400,
                f"model kernels were compiled for a different target than this {hw} host (simulated hardware_mismatch)",
                type_="hardware_mismatch",
            )
        burst = scenarios.get("error_burst")
        if burst is not None and self.rng.random() < burst.get("rate"):
            raise RequestError(
                int(burst.get("status")), "simulated engine failure (scenario error_burst)", "InternalServerError"
            )

    def _model(self, body: dict[str, Any]) -> str:
        name = body.get("model")
        if name is None:
            return next(iter(self.runtime.models))
        if not isinstance(name, str) or name not in self.runtime.models:
            raise RequestError(404, f"The model `{name}` does not exist.", "NotFoundError", "model")
        return name

    def _new_request(
        self, request: Request, body: dict[str, Any], model: str, prompt_tokens: int, max_tokens: int | None,
        prefix: str = "",
    ) -> SimRequest:  # fmt: skip
        n = _int_param(body, "n", default=1)
        if n != 1:
            raise RequestError(400, "the simulator supports n=1 only", param="n")
        dep = self.runtime.deployments[model]
        if prompt_tokens >= dep.size.max_model_len:
            raise RequestError(
                400,
                f"This model's maximum context length is {dep.size.max_model_len} tokens. However, your request "
                f"has {prompt_tokens} input tokens.",
                param="messages",
            )
        ignore_eos = body.get("ignore_eos") is True
        limit = dep.size.max_model_len - prompt_tokens
        req = SimRequest(
            request_id=f"{self._id_prefix}{next(self._ids):08x}",
            prompt_tokens=prompt_tokens,
            max_tokens=min(max_tokens, limit) if max_tokens else limit,
            arrival=time.monotonic(),
            ignore_eos=ignore_eos,
            prefix_key=hash(prefix) or 1 if prefix else 0,
            prefix_tokens=count_tokens(prefix) if prefix else 0,
            max_tokens_param=max_tokens,
        )
        req.params["model"] = model
        for key in ("temperature", "top_p"):
            value = body.get(key)
            if isinstance(value, (int, float)) and not isinstance(value, bool):
                req.params[key] = value
        ctx = parent_context(request.headers)
        if ctx is not None:
            req.params["trace_context"] = ctx
        req.sink = TokenStream()
        self.runtime.models[model].submit(req)
        return req

    async def _wait_done(self, req: SimRequest) -> None:
        stream: TokenStream = req.sink
        try:
            while not stream.done:
                stream.event.clear()
                await stream.event.wait()
        finally:
            if not stream.done:
                self.runtime.abort(req)

    async def _tokens(self, req: SimRequest) -> AsyncIterator[tuple[int, int]]:
        """Yield ``(first, end)`` index ranges of newly produced tokens until the request finishes."""
        stream: TokenStream = req.sink
        sent = 0
        try:
            while True:
                if stream.count == sent and not stream.done:
                    stream.event.clear()
                    await stream.event.wait()
                n = stream.count
                if n > sent:
                    yield sent, n
                    sent = n
                if stream.done and sent == stream.count:
                    return
        finally:
            if not stream.done:
                self.runtime.abort(req)

    # -- OpenAI ----------------------------------------------------------------------------------
    async def chat(self, request: Request) -> ASGIApp:
        return await self._openai(request, chat=True)

    async def completions(self, request: Request) -> ASGIApp:
        return await self._openai(request, chat=False)

    async def _openai(self, request: Request, chat: bool) -> ASGIApp:
        try:
            body = await self._json_body(request)
            model = self._model(body)
            prefix = ""
            if chat:
                messages = body.get("messages")
                if not isinstance(messages, list) or not messages:
                    raise RequestError(400, "messages must be a non-empty list", param="messages")
                try:
                    prompt_tokens, prefix = chat_prompt_tokens(messages)
                except ValueError as exc:
                    raise RequestError(400, str(exc), param="messages") from None
                max_tokens = _int_param(body, "max_completion_tokens", "max_tokens")
            else:
                prompt = body.get("prompt")
                if isinstance(prompt, list) and len(prompt) == 1 and isinstance(prompt[0], str):
                    prompt = prompt[0]
                if not isinstance(prompt, str):
                    raise RequestError(400, "prompt must be a string", param="prompt")
                prompt_tokens = max(1, count_tokens(prompt))
                max_tokens = _int_param(body, "max_tokens", default=16)
            stream = body.get("stream") is True
            opts = body.get("stream_options") or {}
            include_usage = stream and isinstance(opts, dict) and opts.get("include_usage") is True
            self._faults()
            req = self._new_request(request, body, model, prompt_tokens, max_tokens, prefix)
        except RequestError as exc:
            return openai_error(exc)
        if stream:
            gen = self._openai_stream(req, model, chat, include_usage)
            return SSEResponse(gen)
        await self._wait_done(req)
        return self._openai_full(req, model, chat)

    def _usage(self, req: SimRequest) -> dict[str, int]:
        return {
            "prompt_tokens": req.prompt_tokens,
            "total_tokens": req.prompt_tokens + req.generated,
            "completion_tokens": req.generated,
        }

    def _openai_full(self, req: SimRequest, model: str, chat: bool) -> Response:
        text = full_text(req.generated, req.engine_index)
        created = int(time.time())
        finish = req.finish_reason or "stop"
        if chat:
            choice: dict[str, Any] = {
                "index": 0,
                "message": {"role": "assistant", "content": text, "tool_calls": []},
                "logprobs": None,
                "finish_reason": finish,
                "stop_reason": None,
            }
            obj, prefix = "chat.completion", "chatcmpl-"
        else:
            choice = {"index": 0, "text": text, "logprobs": None, "finish_reason": finish, "stop_reason": None}
            obj, prefix = "text_completion", "cmpl-"
        body = {
            "id": prefix + req.request_id,
            "object": obj,
            "created": created,
            "model": model,
            "choices": [choice],
            "usage": self._usage(req),
        }
        return JSONResponse(body)

    async def _openai_stream(self, req: SimRequest, model: str, chat: bool, include_usage: bool) -> AsyncIterator[str]:
        created = int(time.time())
        usage_only = "stream_usage_only" in self.runtime.scenarios
        if chat:
            head = f'data: {{"id":"chatcmpl-{req.request_id}","object":"chat.completion.chunk","created":{created},"model":{dumps(model)},"choices":[{{"index":0,'  # noqa: E501
            open_, close = '"delta":{"content":"', '"},"logprobs":null,"finish_reason":null}]'
        else:
            head = f'data: {{"id":"cmpl-{req.request_id}","object":"text_completion","created":{created},"model":{dumps(model)},"choices":[{{"index":0,'  # noqa: E501
            open_, close = '"text":"', '","logprobs":null,"finish_reason":null,"stop_reason":null}]'
        tail = ',"usage":null}\n\n' if include_usage else "}\n\n"
        offset = req.engine_index
        if chat:
            yield head + '"delta":{"role":"assistant","content":""},"logprobs":null,"finish_reason":null}]' + tail
        async for first, end in self._tokens(req):
            if usage_only:
                parts = []
                for i in range(first, end):
                    usage = dumps({"prompt_tokens": req.prompt_tokens, "total_tokens": req.prompt_tokens + i + 1,
                                   "completion_tokens": i + 1})  # fmt: skip
                    parts.append(f'{head}{open_}{close},"usage":{usage}}}\n\n')
                yield "".join(parts)
            else:
                yield "".join(f"{head}{open_}{token_text(i, offset)}{close}{tail}" for i in range(first, end))
        finish = dumps(req.finish_reason or "stop")
        if chat:
            last = f'{head}"delta":{{}},"logprobs":null,"finish_reason":{finish},"stop_reason":null}}]{tail}'
        else:
            last = f'{head}"text":"","logprobs":null,"finish_reason":{finish},"stop_reason":null}}]{tail}'
        if include_usage:
            obj = "chat.completion.chunk" if chat else "text_completion"
            pid = ("chatcmpl-" if chat else "cmpl-") + req.request_id
            usage = dumps(self._usage(req))
            last += (
                f'data: {{"id":"{pid}","object":"{obj}","created":{created},"model":{dumps(model)},"choices":[],'
                f'"usage":{usage}}}\n\n'
            )
        yield last + "data: [DONE]\n\n"

    # -- Anthropic -------------------------------------------------------------------------------
    async def messages(self, request: Request) -> ASGIApp:
        try:
            body = await self._json_body(request)
            model = self._model(body)
            messages = body.get("messages")
            if not isinstance(messages, list) or not messages:
                raise RequestError(400, "messages: field required (non-empty list)", param="messages")
            max_tokens = _int_param(body, "max_tokens")
            if max_tokens is None:
                raise RequestError(400, "max_tokens: field required", param="max_tokens")
            try:
                prompt_tokens, prefix = chat_prompt_tokens(messages, body.get("system"))
            except ValueError as exc:
                raise RequestError(400, str(exc), param="messages") from None
            self._faults()
            req = self._new_request(request, body, model, prompt_tokens, max_tokens, prefix)
        except RequestError as exc:
            return anthropic_error(exc)
        if body.get("stream") is True:
            return SSEResponse(self._anthropic_stream(req, model))
        await self._wait_done(req)
        return JSONResponse(
            {
                "id": "msg_" + req.request_id,
                "type": "message",
                "role": "assistant",
                "model": model,
                "content": [{"type": "text", "text": full_text(req.generated, req.engine_index)}],
                "stop_reason": _stop_reason(req),
                "stop_sequence": None,
                "usage": {"input_tokens": req.prompt_tokens, "output_tokens": req.generated},
            }
        )

    async def _anthropic_stream(self, req: SimRequest, model: str) -> AsyncIterator[str]:
        usage_only = "stream_usage_only" in self.runtime.scenarios
        offset = req.engine_index
        started = False
        pre = 'event: content_block_delta\ndata: {"type":"content_block_delta","index":0,"delta":{"type":"text_delta","text":"'  # noqa: E501
        async for first, end in self._tokens(req):
            out = []
            if not started:
                started = True
                message: dict[str, Any] = {
                    "id": "msg_" + req.request_id,
                    "type": "message",
                    "role": "assistant",
                    "model": model,
                    "content": [],
                    "stop_reason": None,
                    "stop_sequence": None,
                    "usage": {"input_tokens": req.prompt_tokens, "output_tokens": 1},
                }
                out.append(f"event: message_start\ndata: {dumps({'type': 'message_start', 'message': message})}\n\n")
                out.append(
                    'event: content_block_start\ndata: {"type":"content_block_start","index":0,'
                    '"content_block":{"type":"text","text":""}}\n\n'
                )
            for i in range(first, end):
                if usage_only:
                    out.append(f'{pre}"}},"usage":{{"output_tokens":{i + 1}}}}}\n\n')
                else:
                    out.append(f'{pre}{token_text(i, offset)}"}}}}\n\n')
            yield "".join(out)
        if not started:  # finished without a token (aborted): still a well-formed stream
            message = {"id": "msg_" + req.request_id, "type": "message", "role": "assistant", "model": model,
                       "content": [], "stop_reason": None, "stop_sequence": None,
                       "usage": {"input_tokens": req.prompt_tokens, "output_tokens": 0}}  # fmt: skip
            yield (
                f"event: message_start\ndata: {dumps({'type': 'message_start', 'message': message})}\n\n"
                'event: content_block_start\ndata: {"type":"content_block_start","index":0,'
                '"content_block":{"type":"text","text":""}}\n\n'
            )
        delta = {
            "type": "message_delta",
            "delta": {"stop_reason": _stop_reason(req), "stop_sequence": None},
            "usage": {"output_tokens": req.generated},
        }
        yield (
            'event: content_block_stop\ndata: {"type":"content_block_stop","index":0}\n\n'
            f"event: message_delta\ndata: {dumps(delta)}\n\n"
            'event: message_stop\ndata: {"type":"message_stop"}\n\n'
        )

    # -- the rest --------------------------------------------------------------------------------
    async def models(self, request: Request) -> Response:
        created = int(self.runtime.started_at)
        data = [
            {
                "id": name,
                "object": "model",
                "created": created,
                "owned_by": "vllm",
                "root": name,
                "parent": None,
                "max_model_len": server.deployment.size.max_model_len,
            }
            for name, server in self.runtime.models.items()
        ]
        return JSONResponse({"object": "list", "data": data})

    async def health(self, request: Request) -> Response:
        return Response(status_code=200)

    async def version(self, request: Request) -> Response:
        return JSONResponse({"version": ENGINE_VERSION})

    async def metrics(self, request: Request) -> Response:
        """vLLM's /metrics is prometheus_client's ``make_asgi_app``: a ``name[]=`` query gets those samples only."""
        registry: Any = self.runtime.metrics.registry
        names = request.query_params.getlist("name[]")
        if names:
            registry = registry.restricted_registry(names)
        return Response(generate_latest(registry), media_type=CONTENT_TYPE_LATEST)

    async def debug_profile(self, request: Request) -> Response:
        name, value = self._debug_header
        if (
            not self.config.debug_profile
            or "debug_disabled" in self.runtime.scenarios
            or request.headers.get(name, "").strip() != value
        ):
            return JSONResponse({})
        model = request.query_params.get("model") or next(iter(self.runtime.models))
        dep = self.runtime.deployments.get(model)
        if dep is None:
            return openai_error(RequestError(404, f"The model `{model}` does not exist.", "NotFoundError", "model"))
        return JSONResponse(runtime_profile(self.config, dep, self.runtime.scenarios, self.runtime.started_at))

    async def stats(self, request: Request) -> Response:
        """The simulator's own health: event-loop lag and engine steps (``?reset=1`` clears the lag window)."""
        lag = self.runtime.lag.stats()
        if request.query_params.get("reset") == "1":
            self.runtime.lag.samples.clear()
        steps = {f"{m}/{lp.core.index}": lp.steps for m, s in self.runtime.models.items() for lp in s.loops}
        return JSONResponse(
            {
                "loop_lag": lag,
                "engine_steps": steps,
                "scenarios": self.runtime.scenarios.to_json(),
                "server": self.server_impl,
            }
        )

    async def control(self, request: Request) -> Response:
        token = self.config.token()
        if not token:
            return JSONResponse(
                {"error": "control endpoint disabled: start with --control-token or INFERWATCH_SIM_CONTROL_TOKEN"},
                status_code=403,
            )
        given = request.headers.get("authorization", "")
        if not hmac.compare_digest(given.encode(), f"Bearer {token}".encode()):
            return JSONResponse({"error": "missing or wrong bearer token"}, status_code=401)
        active = self.runtime.scenarios
        if request.method == "POST":
            try:
                body = await self._json_body(request)
                if "scenarios" in body:
                    items = body["scenarios"]
                    if not isinstance(items, list):
                        raise sc.ScenarioError("scenarios must be a list")
                    active.replace([_scenario(x) for x in items])
                elif "enable" in body:
                    active.enable(_scenario(body["enable"]))
                elif "disable" in body:
                    active.disable(str(body["disable"]))
                else:
                    raise sc.ScenarioError("body must hold 'scenarios' (list), 'enable' or 'disable'")
            except (sc.ScenarioError, RequestError) as exc:
                return JSONResponse({"error": str(exc)}, status_code=400)
            log.info("scenarios now: %s", [s["name"] for s in active.to_json()] or "none")
        return JSONResponse({"scenarios": active.to_json()})


def _stop_reason(req: SimRequest) -> str:
    return "max_tokens" if req.finish_reason == "length" else "end_turn"


def _scenario(item: Any) -> sc.Scenario:
    if isinstance(item, str):
        return sc.parse(item)
    if isinstance(item, dict) and isinstance(item.get("name"), str):
        params = item.get("params") or {}
        if not isinstance(params, dict):
            raise sc.ScenarioError("params must be an object")
        return sc.make(item["name"], params)
    raise sc.ScenarioError(f"a scenario is a name or {{'name': ..., 'params': {{...}}}}, got {item!r}")


class HttpMetrics:
    """Outermost ASGI layer: counts requests like prometheus_fastapi_instrumentator (vLLM's HTTP metrics)
    and sends the inference POSTs straight to their handlers (the hot path skips Starlette's stack)."""

    def __init__(
        self,
        app: ASGIApp,
        record: Callable[[str, str, int, float], None],
        handlers: set[str],
        fast: Mapping[str, Callable[[Request], Awaitable[ASGIApp]]],
    ) -> None:
        self.app = app
        self.record = record
        self.handlers = handlers
        self.fast = fast

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] != "http" or scope["path"] in EXCLUDED_HANDLERS:
            await self.app(scope, receive, send)
            return
        start = time.perf_counter()
        status = 500

        async def wrapped(message: Message) -> None:
            nonlocal status
            if message["type"] == "http.response.start":
                status = message["status"]
            await send(message)

        try:
            fast = self.fast.get(scope["path"]) if scope["method"] == "POST" else None
            if fast is not None:
                response = await fast(Request(scope, receive))
                await response(scope, receive, wrapped)
            else:
                await self.app(scope, receive, wrapped)
        finally:
            handler = scope["path"] if scope["path"] in self.handlers else "none"
            self.record(handler, scope["method"], status, time.perf_counter() - start)


def create_app(config: SimConfig) -> tuple[ASGIApp, SimulatorApp]:
    sim = SimulatorApp(config)
    routes = [
        Route("/v1/chat/completions", sim.chat, methods=["POST"]),
        Route("/v1/completions", sim.completions, methods=["POST"]),
        Route("/v1/messages", sim.messages, methods=["POST"]),
        Route("/v1/models", sim.models, methods=["GET"]),
        Route("/health", sim.health, methods=["GET"]),
        Route("/version", sim.version, methods=["GET"]),
        Route("/metrics", sim.metrics, methods=["GET"]),
        Route("/debug/runtime_profile", sim.debug_profile, methods=["GET"]),
        Route("/control/scenario", sim.control, methods=["GET", "POST"]),
        Route("/sim/stats", sim.stats, methods=["GET"]),
    ]

    @contextlib.asynccontextmanager
    async def lifespan(app: Starlette) -> AsyncIterator[None]:
        sim.runtime.start()
        try:
            yield
        finally:
            await sim.runtime.stop()

    app = Starlette(routes=routes, lifespan=lifespan)
    fast = {"/v1/chat/completions": sim.chat, "/v1/completions": sim.completions, "/v1/messages": sim.messages}
    wrapped = HttpMetrics(app, sim.runtime.metrics.http, {r.path for r in routes}, fast)
    return wrapped, sim
