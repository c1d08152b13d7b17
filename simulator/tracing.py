"""OTLP traces as vLLM emits them: one ``llm_request`` span (kind SERVER) per finished request.

Start = frontend arrival, end = finish; attributes are the ones vLLM v1's ``do_tracing`` sets (old GenAI
keys: ``gen_ai.usage.prompt_tokens``, ``gen_ai.latency.time_to_first_token``, ...; see
vLLM's ``vllm/v1/engine/output_processor.py``). Like vLLM v1, a span names **no model**: one vLLM process serves
one model, and a deployer tells processes apart by the resource (``OTEL_SERVICE_NAME``,
``OTEL_RESOURCE_ATTRIBUTES``). A simulator serving several models stands for several such processes, so
it exports each model's spans from its own tracer provider whose resource carries
``gen_ai.request.model`` (what ``OTEL_RESOURCE_ATTRIBUTES=gen_ai.request.model=NAME`` would give). An incoming
``traceparent`` becomes the parent, as vLLM carries ``trace_headers`` through the engine. Exported by
the OpenTelemetry SDK's ``BatchSpanProcessor`` over OTLP: gRPC, or HTTP/protobuf when the URL path
ends in ``/v1/traces`` or ``OTEL_EXPORTER_OTLP_TRACES_PROTOCOL=http/protobuf``.
"""

from __future__ import annotations

import os
import time
from collections.abc import Mapping
from typing import Any
from urllib.parse import urlparse

from opentelemetry.context import Context
from opentelemetry.sdk.resources import Resource
from opentelemetry.sdk.trace import TracerProvider
from opentelemetry.sdk.trace.export import BatchSpanProcessor, SpanExporter
from opentelemetry.trace import SpanKind
from opentelemetry.trace.propagation.tracecontext import TraceContextTextMapPropagator

from inferwatch.simulator.engine import SimRequest

SPAN_NAME = "llm_request"
DEFAULT_SERVICE_NAME = "vllm"
RESOURCE_MODEL_KEY = "gen_ai.request.model"  # only when one process simulates several models
SHUTDOWN_TIMEOUT_MS = 3000
_PROPAGATOR = TraceContextTextMapPropagator()


def make_exporter(endpoint: str) -> SpanExporter:
    protocol = os.environ.get("OTEL_EXPORTER_OTLP_TRACES_PROTOCOL", "")
    if not protocol:
        protocol = "http/protobuf" if urlparse(endpoint).path.rstrip("/").endswith("/v1/traces") else "grpc"
    if protocol == "grpc":
        from opentelemetry.exporter.otlp.proto.grpc.trace_exporter import OTLPSpanExporter as GrpcExporter

        return GrpcExporter(endpoint=endpoint, insecure=not endpoint.startswith("https://"))
    if protocol == "http/protobuf":
        from opentelemetry.exporter.otlp.proto.http.trace_exporter import OTLPSpanExporter as HttpExporter

        return HttpExporter(endpoint=endpoint)
    raise ValueError(f"unsupported OTLP traces protocol {protocol!r} (grpc or http/protobuf)")


def parent_context(headers: Mapping[str, str]) -> Context | None:
    if "traceparent" not in headers:
        return None
    return _PROPAGATOR.extract({k: headers[k] for k in ("traceparent", "tracestate") if k in headers})


class SpanEmitter:
    """Turns finished :class:`SimRequest` objects into ``llm_request`` spans."""

    def __init__(
        self,
        endpoint: str,
        exporter: SpanExporter | None = None,
        resource_model: str | None = None,
        stock: bool = False,
    ) -> None:
        """``stock``: the span as stock vLLM v1 sends it, without ``vllm.dp_rank`` and ``vllm.num_preemptions``."""
        self.stock = stock
        service = os.environ.get("OTEL_SERVICE_NAME", DEFAULT_SERVICE_NAME)
        resource: dict[str, str] = {"service.name": service}
        if resource_model is not None:
            resource[RESOURCE_MODEL_KEY] = resource_model
        self.provider = TracerProvider(resource=Resource.create(resource))
        self.provider.add_span_processor(BatchSpanProcessor(exporter or make_exporter(endpoint)))
        self.tracer = self.provider.get_tracer("vllm.llm_engine")
        # engine clock (monotonic seconds) -> wall clock nanoseconds
        self._offset_ns = time.time_ns() - int(time.monotonic() * 1e9)
        self._closed = False

    def _ns(self, t: float) -> int:
        return self._offset_ns + int(t * 1e9)

    def emit(self, req: SimRequest) -> None:
        attrs: dict[str, Any] = {
            "gen_ai.request.id": req.request_id,
            "gen_ai.usage.prompt_tokens": req.prompt_tokens,
            "gen_ai.usage.completion_tokens": req.generated,
            "gen_ai.request.n": 1,
            # not set by vLLM v1's llm_request span: what the agent's tail explainer reads when an engine adds them
            "vllm.dp_rank": req.engine_index,
            "vllm.num_preemptions": req.preemptions,
        }
        if self.stock:
            del attrs["vllm.dp_rank"], attrs["vllm.num_preemptions"]
        if req.max_tokens_param:
            attrs["gen_ai.request.max_tokens"] = req.max_tokens_param
        for key in ("temperature", "top_p"):
            if req.params.get(key):  # vLLM sets them only when truthy (temperature 0 is left out)
                attrs[f"gen_ai.request.{key}"] = float(req.params[key])
        end = req.finished_at if req.finished_at is not None else req.arrival
        attrs["gen_ai.latency.e2e"] = end - req.arrival
        if req.first_scheduled is not None:
            attrs["gen_ai.latency.time_in_queue"] = req.first_scheduled - req.queued
        if req.first_token is not None and req.first_scheduled is not None and req.last_token is not None:
            attrs["gen_ai.latency.time_to_first_token"] = req.first_token - req.arrival
            attrs["gen_ai.latency.time_in_model_prefill"] = req.first_token - req.first_scheduled
            attrs["gen_ai.latency.time_in_model_decode"] = req.last_token - req.first_token
            attrs["gen_ai.latency.time_in_model_inference"] = req.last_token - req.first_scheduled
        span = self.tracer.start_span(
            SPAN_NAME,
            context=req.params.get("trace_context"),
            kind=SpanKind.SERVER,
            attributes=attrs,
            start_time=self._ns(req.arrival),
        )
        span.end(end_time=self._ns(end))

    def shutdown(self) -> None:
        if self._closed:
            return
        self._closed = True
        self.provider.force_flush(SHUTDOWN_TIMEOUT_MS)
        self.provider.shutdown()
