"""The TTFT a client saw, as an OTLP client span whose child is the engine's span: client-side TTFT reconciled.

A client of an OpenAI-compatible server (vLLM, SGLang, the simulator) reports each request as one span of kind
CLIENT, named after the OpenTelemetry GenAI conventions (``{gen_ai.operation.name} {gen_ai.request.model}``, e.g.
``chat Qwen/Qwen3-8B``), with ``gen_ai.response.time_to_first_chunk`` (seconds, the conventions' streaming TTFT),
``gen_ai.request.model``, ``gen_ai.request.stream``, ``gen_ai.provider.name``, ``server.address``/``server.port``
and, on failure, ``error.type``. Its context goes to the server in the W3C ``traceparent`` header, so the engine's
span (vLLM's ``llm_request``, which takes its parent from ``traceparent``) is the client span's child in the same
trace. Sent to the agent's receiver, the two are joined by trace id: the explainer shows client TTFT − engine TTFT
per request and names the part that holds the tail (``docs/explain.md``, "Client TTFT").

Two ways in:

- :class:`ClientSpans` directly: ``span = spans.start("chat", model, url)``, send ``span.headers`` with the
  request, ``span.first_token()`` when the first token arrives, ``span.end()`` (``inferwatch loadgen
  --otlp-traces-endpoint`` does this with the TTFT it measures: the first non-empty token).
- :func:`httpx_event_hooks` / :func:`async_httpx_event_hooks` for any httpx-based client, the ``openai`` package
  included::

      spans = ClientSpans("http://127.0.0.1:4318/v1/traces", service_name="my-app")
      client = openai.OpenAI(base_url=..., http_client=httpx.Client(event_hooks=httpx_event_hooks(spans)))

  There the TTFT is the first event of an SSE stream that carries output text (OpenAI ``choices[0].delta.content``
  or ``.text``, Anthropic ``content_block_delta``; a server's role-only first event, sent before any token, does
  not count), for a response that is not a stream the first body chunk; the span ends when the body is closed.
  A request that gets no response at all (connection refused, a timeout before the headers) is not reported: its
  span is never ended.

Exported with the OpenTelemetry SDK's batch processor over OTLP (gRPC, or HTTP/protobuf when the URL ends in
``/v1/traces``); :meth:`ClientSpans.shutdown` flushes.
"""

from __future__ import annotations

import json
import time
from collections.abc import AsyncIterator, Callable, Iterator, Mapping
from typing import Any
from urllib.parse import urlsplit

import httpx
from opentelemetry.sdk.resources import Resource
from opentelemetry.sdk.trace import TracerProvider
from opentelemetry.sdk.trace.export import BatchSpanProcessor, SpanExporter
from opentelemetry.trace import SpanKind, Status, StatusCode, set_span_in_context
from opentelemetry.trace.propagation.tracecontext import TraceContextTextMapPropagator

TTFT_KEY = "gen_ai.response.time_to_first_chunk"
SCOPE = "inferwatch.clienttrace"
SHUTDOWN_TIMEOUT_MS = 5000
OPERATIONS = {"/chat/completions": "chat", "/completions": "text_completion", "/messages": "chat"}
_PROPAGATOR = TraceContextTextMapPropagator()
_EXTENSION = "inferwatch_client_span"


def make_exporter(endpoint: str) -> SpanExporter:
    """OTLP/HTTP protobuf for a URL ending in ``/v1/traces``, else OTLP/gRPC (insecure unless ``https://``)."""
    if urlsplit(endpoint).path.rstrip("/").endswith("/v1/traces"):
        from opentelemetry.exporter.otlp.proto.http.trace_exporter import OTLPSpanExporter as HttpExporter

        return HttpExporter(endpoint=endpoint)
    from opentelemetry.exporter.otlp.proto.grpc.trace_exporter import OTLPSpanExporter as GrpcExporter

    return GrpcExporter(endpoint=endpoint, insecure=not endpoint.startswith("https://"))


class RequestSpan:
    """One request's client span: started at construction, ``headers`` to send, TTFT, end."""

    def __init__(self, span: Any, clock: Callable[[], float] = time.perf_counter) -> None:
        self.span = span
        self._clock = clock
        self._start = clock()
        self.ttft_s: float | None = None
        self.headers: dict[str, str] = {}
        _PROPAGATOR.inject(self.headers, context=set_span_in_context(span))
        self._ended = False

    def first_token(self, ttft_s: float | None = None) -> None:
        """The first token arrived now (or ``ttft_s`` after the start, as the caller measured it); once."""
        if self.ttft_s is None:
            self.ttft_s = ttft_s if ttft_s is not None else self._clock() - self._start
            self.span.set_attribute(TTFT_KEY, self.ttft_s)

    def end(self, error_type: str | None = None) -> None:
        if self._ended:
            return
        self._ended = True
        if error_type:
            self.span.set_attribute("error.type", error_type)
            self.span.set_status(Status(StatusCode.ERROR))
        self.span.end()


class ClientSpans:
    """A tracer provider for client spans (its own, so a host application's global provider is left alone)."""

    def __init__(
        self,
        endpoint: str | None = None,
        service_name: str = "inferwatch-client",
        exporter: SpanExporter | None = None,
        provider_name: str = "openai",
    ) -> None:
        if exporter is None and not endpoint:
            raise ValueError("ClientSpans needs an OTLP endpoint or an exporter")
        self.provider = TracerProvider(resource=Resource.create({"service.name": service_name}))
        self.provider.add_span_processor(BatchSpanProcessor(exporter or make_exporter(str(endpoint))))
        self.tracer = self.provider.get_tracer(SCOPE)
        self.provider_name = provider_name
        self._closed = False

    def start(self, operation: str, model: str | None, url: str, stream: bool = True) -> RequestSpan:
        parts = urlsplit(url)
        attributes: dict[str, Any] = {
            "gen_ai.operation.name": operation,
            "gen_ai.provider.name": self.provider_name,
            "gen_ai.request.stream": stream,
        }
        if model:
            attributes["gen_ai.request.model"] = model
        if parts.hostname:
            attributes["server.address"] = parts.hostname
        if parts.port:
            attributes["server.port"] = parts.port
        name = f"{operation} {model}" if model else operation
        return RequestSpan(self.tracer.start_span(name, kind=SpanKind.CLIENT, attributes=attributes))

    def shutdown(self) -> None:
        if self._closed:
            return
        self._closed = True
        self.provider.force_flush(SHUTDOWN_TIMEOUT_MS)
        self.provider.shutdown()


def _describe(request: Any) -> tuple[str, str | None, bool]:
    path = request.url.path
    operation = next((op for suffix, op in OPERATIONS.items() if path.endswith(suffix)), "chat")
    model, stream = None, False
    try:
        body = json.loads(request.content or b"{}")
        if isinstance(body, Mapping):
            model = str(body["model"]) if body.get("model") else None
            stream = bool(body.get("stream"))
    except (ValueError, UnicodeDecodeError, httpx.RequestNotRead):  # a streamed body (an upload) is not read here
        pass
    return operation, model, stream


def _start(spans: ClientSpans, request: Any) -> None:
    operation, model, stream = _describe(request)
    span = spans.start(operation, model, str(request.url), stream)
    request.headers.update(span.headers)
    request.extensions[_EXTENSION] = span


def _has_text(data: Any) -> bool:
    if not isinstance(data, Mapping):
        return False
    if data.get("type") == "content_block_delta":
        return bool((data.get("delta") or {}).get("text"))
    choices = data.get("choices") or []
    c = choices[0] if choices and isinstance(choices[0], Mapping) else {}
    return bool((c.get("delta") or {}).get("content") or c.get("text"))


class _FirstToken:
    """Watches the body until the first output text: SSE events parsed line by line (a line may span chunks)."""

    def __init__(self, span: RequestSpan, sse: bool) -> None:
        self.span, self.sse, self.done, self._buf = span, sse, False, b""

    def feed(self, chunk: bytes) -> None:
        if self.done or not chunk:
            return
        if not self.sse:
            self._hit()
            return
        *lines, self._buf = (self._buf + chunk).split(b"\n")
        for line in lines:
            if line.startswith(b"data:"):
                try:
                    data = json.loads(line[5:].strip() or b"null")
                except ValueError:
                    continue
                if _has_text(data):
                    self._hit()
                    return

    def _hit(self) -> None:
        self.done, self._buf = True, b""
        self.span.first_token()


class _SyncStream(httpx.SyncByteStream):
    def __init__(self, inner: Any, span: RequestSpan, sse: bool) -> None:
        self.inner, self.span, self.watch = inner, span, _FirstToken(span, sse)

    def __iter__(self) -> Iterator[bytes]:
        for chunk in self.inner:
            self.watch.feed(chunk)
            yield chunk

    def close(self) -> None:
        try:
            self.inner.close()
        finally:
            self.span.end()


class _AsyncStream(httpx.AsyncByteStream):
    def __init__(self, inner: Any, span: RequestSpan, sse: bool) -> None:
        self.inner, self.span, self.watch = inner, span, _FirstToken(span, sse)

    async def __aiter__(self) -> AsyncIterator[bytes]:
        async for chunk in self.inner:
            self.watch.feed(chunk)
            yield chunk

    async def aclose(self) -> None:
        try:
            await self.inner.aclose()
        finally:
            self.span.end()


def _wrap(response: Any, wrapper: Callable[[Any, RequestSpan, bool], Any]) -> None:
    span = response.request.extensions.get(_EXTENSION)
    if span is None:
        return
    if response.status_code >= 400:
        span.span.set_attribute("error.type", str(response.status_code))
        span.span.set_status(Status(StatusCode.ERROR))
    sse = response.headers.get("content-type", "").startswith("text/event-stream")
    response.stream = wrapper(response.stream, span, sse)


def httpx_event_hooks(spans: ClientSpans) -> dict[str, list[Callable[[Any], None]]]:
    """``event_hooks`` for an ``httpx.Client``: a client span per request, TTFT at the body's first chunk."""

    def on_request(request: Any) -> None:
        _start(spans, request)

    def on_response(response: Any) -> None:
        _wrap(response, _SyncStream)

    return {"request": [on_request], "response": [on_response]}


def async_httpx_event_hooks(spans: ClientSpans) -> dict[str, list[Callable[[Any], Any]]]:
    """The same for an ``httpx.AsyncClient`` (``openai.AsyncOpenAI(http_client=...)``)."""

    async def on_request(request: Any) -> None:
        _start(spans, request)

    async def on_response(response: Any) -> None:
        _wrap(response, _AsyncStream)

    return {"request": [on_request], "response": [on_response]}
