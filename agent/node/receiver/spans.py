"""From OTLP spans to per-request timings.

Reads an ``ExportTraceServiceRequest`` (opentelemetry-proto). Every span that carries at least one
``gen_ai.latency.*`` attribute (vLLM's ``llm_request`` span, emitted once per finished request, see
vllm/v1/engine/output_processor.py ``do_tracing``) becomes one :class:`RequestTiming`:

=========================================  =========  =====================================
attribute (seconds, double)                quantity   interval (vLLM v1)
=========================================  =========  =====================================
gen_ai.latency.time_to_first_token         ttft       frontend arrival → first token
gen_ai.latency.e2e                         e2e        frontend arrival → last token
gen_ai.latency.time_in_queue               queue      queued → scheduled (engine core)
gen_ai.latency.time_in_model_prefill       prefill    scheduled → first token
gen_ai.latency.time_in_model_decode        decode     first → last token
gen_ai.latency.time_in_model_inference     inference  scheduled → last token
(derived) decode / (completion_tokens − 1) itl        per-request mean inter-token latency
=========================================  =========  =====================================

V0-only keys (``time_in_scheduler``, ``time_in_model_forward``, ``time_in_model_execute``) are not
quantities of the catalog and are ignored. Tokens come from ``gen_ai.usage.prompt_tokens`` /
``completion_tokens`` (the old GenAI keys vLLM uses) or ``input_tokens`` / ``output_tokens`` (current).
The engine is the resource's ``k8s.namespace.name`` / ``k8s.pod.name`` / ``k8s.container.name`` where set
(``RequestTiming.resource``: the span analytics keep each discovered engine's requests apart by it).
The model is the span's ``gen_ai.request.model``, else its ``gen_ai.response.model`` (other emitters),
else the same keys on the resource (``OTEL_RESOURCE_ATTRIBUTES=gen_ai.request.model=NAME`` tags every
span of a process), else ``unknown``. vLLM v1 puts no model on its spans (engines.md §2: one process,
one model), so with a stock vLLM every span is ``unknown`` here and
:class:`~inferwatch.agent.node.analytics.latency.LatencyAnalytics` attributes it to the one model the engine collector
sees.

A value that is not a finite number in [0, :data:`MAX_LATENCY_S`] is left out and counted.

**Timestamps.** The analytics use the spans' latency attributes (durations the engine measured) and window them by
the time the agent *received* them, never by the span's own start and end: a client whose clock is minutes or
centuries off (a skewed clock, a container without NTP) still reports valid durations, and they are used. A span's
start and end are checked for consistency only, both in nanoseconds (``fixed64``, so never negative): a span whose
end precedes its start (``end_before_start``), or that lasts more than :data:`MAX_LATENCY_S` (``too_long``: a day,
the bound of any latency; 1970 to 2500 is not a request), contradicts its own attributes and is left out and
counted in ``inferwatch.receiver.values.rejected{reason}``. A start or end of 0 means "unknown" in OTLP; such a span
is used (its attributes carry the latencies) and its evidence shows no start or end.

For the tail explainer (:mod:`inferwatch.agent.node.analytics.explain`) a timing also carries the span's trace id (hex),
its ``gen_ai.request.id`` and, when the span has them, the attributes that can separate a tail (:data:`LABEL_KEYS`:
data-parallel rank, LoRA adapter, tenant) and the request's preemption count (:data:`PREEMPTION_KEYS`). Stock vLLM
v1 sets none of these optional keys; the simulator sets them, and a deployment can add them (a tenant as
``enduser.id`` from a proxy's span processor, say). Label values are cut to :data:`MAX_LABEL_CHARS`.

Each timing keeps the span it came from (``Extracted.sources``, same order); :func:`span_ref` reads its trace and
span ids (hex), its ``gen_ai.request.id`` (vLLM's request id, ``cmpl-…``) and its start and end (Unix seconds), so
that the last finished requests can be named in an evidence bundle and looked up in a trace backend. Only the
intake's last few are read that way: the per-span cost of extraction stays what it was.

A span of kind CLIENT without latency attributes but with :data:`CLIENT_TTFT_KEY` (a client's own TTFT: the load
generator's, :mod:`inferwatch.agent.clienttrace`'s) gives ``(trace id, seconds)`` in ``Extracted.client``, which the
explainer sets beside the engine span of the same trace (client TTFT − engine TTFT).
"""

from __future__ import annotations

from collections import Counter
from dataclasses import dataclass, field
from typing import Any

from google.protobuf.message import DecodeError
from opentelemetry.proto.collector.trace.v1.trace_service_pb2 import ExportTraceServiceRequest

from inferwatch.agent.common.samples import UNKNOWN_MODEL, RequestTiming

MAX_LATENCY_S = 86_400.0  # a day: anything longer is not a request latency
MAX_SPAN_NS = int(MAX_LATENCY_S) * 10**9  # a span lasting longer than the longest latency is not a request's
MAX_MODEL_NAME_CHARS = 256

LATENCY_KEYS: dict[str, str] = {
    "gen_ai.latency.time_to_first_token": "ttft",
    "gen_ai.latency.e2e": "e2e",
    "gen_ai.latency.time_in_queue": "queue",
    "gen_ai.latency.time_in_model_prefill": "prefill",
    "gen_ai.latency.time_in_model_decode": "decode",
    "gen_ai.latency.time_in_model_inference": "inference",
}
_PROMPT_KEYS = frozenset({"gen_ai.usage.prompt_tokens", "gen_ai.usage.input_tokens"})
_COMPLETION_KEYS = frozenset({"gen_ai.usage.completion_tokens", "gen_ai.usage.output_tokens"})
_REQUEST_MODEL = "gen_ai.request.model"
_REQUEST_ID = "gen_ai.request.id"
MAX_REQUEST_ID_CHARS = 128
_RESPONSE_MODEL = "gen_ai.response.model"
# GenAI semconv attributes for the gen_ai.server.* histograms (agent/catalog/genai.py); gen_ai.system is the provider's
# name before semconv 1.37. A span with status ERROR (code 2) and no error.type failed with error.type "_OTHER".
_OPERATION = "gen_ai.operation.name"
_PROVIDER = "gen_ai.provider.name"
_PROVIDER_OLD = "gen_ai.system"
_ERROR_TYPE = "error.type"
_STATUS_CODE_ERROR = 2
_ERROR_OTHER = "_OTHER"
# Optional span attributes the tail explainer groups requests by (span key -> label), and preemption counts.
LABEL_KEYS: dict[str, str] = {
    "vllm.dp_rank": "dp_rank",
    "dp_rank": "dp_rank",
    "vllm.lora_name": "lora",
    "lora_name": "lora",
    "enduser.id": "tenant",
    "tenant.id": "tenant",
}
PREEMPTION_KEYS = frozenset({"vllm.num_preemptions", "num_preemptions"})
MAX_LABEL_CHARS = 64
# A client's (or gateway's) own TTFT: the GenAI conventions' attribute on an inference span of kind CLIENT
# (the load generator's and inferwatch.agent.clienttrace's spans); joined with the engine span of the same trace by the
# explainer.
CLIENT_TTFT_KEY = "gen_ai.response.time_to_first_chunk"
_SPAN_KIND_CLIENT = 3


class PayloadError(ValueError):
    """The payload is not a valid ExportTraceServiceRequest."""


@dataclass(frozen=True, slots=True)
class SpanRef:
    """Which span a timing came from: trace and span id (hex), the request id, start and end (Unix s; None if 0)."""

    trace_id: str
    span_id: str
    request_id: str | None = None
    start_unix_s: float | None = None
    end_unix_s: float | None = None


@dataclass(slots=True)
class Extracted:
    """What one export request held."""

    spans: int = 0
    timings: list[RequestTiming] = field(default_factory=list)
    invalid: Counter[str] = field(default_factory=Counter)  # reason → values left out
    sources: list[Any] = field(default_factory=list)  # the protobuf Span of each timing, same order
    client: list[tuple[str, float]] = field(default_factory=list)  # (trace id hex, client TTFT s) of client spans


def decode(payload: bytes) -> ExportTraceServiceRequest:
    req = ExportTraceServiceRequest()
    try:
        req.ParseFromString(payload)
    except (DecodeError, RuntimeError, ValueError) as exc:
        raise PayloadError(f"not an OTLP ExportTraceServiceRequest: {exc}") from None
    return req


def _number(v: object) -> float | None:
    which = v.WhichOneof("value")  # type: ignore[attr-defined]
    if which == "double_value":
        return float(v.double_value)  # type: ignore[attr-defined]
    if which == "int_value":
        return float(v.int_value)  # type: ignore[attr-defined]
    return None


def _label_text(v: Any) -> str:
    """A label attribute's value as text: strings as they are, integers without a decimal point."""
    which = v.WhichOneof("value")
    if which == "string_value":
        return str(v.string_value)[:MAX_LABEL_CHARS]
    if which == "int_value":
        return str(v.int_value)
    if which == "bool_value":
        return "true" if v.bool_value else "false"
    x = _number(v)
    return "" if x is None else repr(x)[:MAX_LABEL_CHARS]


def _resource_model(attributes: object) -> str | None:
    request = response = None
    for kv in attributes:  # type: ignore[attr-defined]
        if kv.key == _REQUEST_MODEL:
            request = kv.value.string_value
        elif kv.key == _RESPONSE_MODEL:
            response = kv.value.string_value
    return request or response or None


RESOURCE_IDENTITY_KEYS = frozenset({"k8s.namespace.name", "k8s.pod.name", "k8s.container.name"})


def _resource_identity(attributes: object) -> tuple[tuple[str, str], ...]:
    """The engine's identity from its resource (``OTEL_RESOURCE_ATTRIBUTES=k8s.pod.name=...`` from the Downward
    API), sorted pairs; empty where the resource names none."""
    return tuple(
        sorted(
            (kv.key, kv.value.string_value[:MAX_LABEL_CHARS])
            for kv in attributes  # type: ignore[attr-defined]
            if kv.key in RESOURCE_IDENTITY_KEYS and kv.value.string_value
        )
    )


# What each attribute key read by :func:`extract` is, in one lookup per attribute (the keys of no interest, e.g. the
# sampling parameters, cost one dict miss). A ``gen_ai.*`` key is only ever a GenAI attribute, any other only a
# label, preemption count or error.type.
_LATENCY, _MODEL_REQ, _MODEL_RESP, _COMPLETION, _PROMPT, _REQ_ID, _OP, _PROV, _PROV_OLD, _CLIENT_TTFT = range(10)
_ERROR, _LABEL, _PREEMPTIONS = range(10, 13)
_KEY_KIND: dict[str, int] = {  # later entries win where sets overlap, as the earlier tests of the old if-chain did
    CLIENT_TTFT_KEY: _CLIENT_TTFT,
    _PROVIDER_OLD: _PROV_OLD,
    _PROVIDER: _PROV,
    _OPERATION: _OP,
    _REQUEST_ID: _REQ_ID,
    **{k: _PROMPT for k in _PROMPT_KEYS},
    **{k: _COMPLETION for k in _COMPLETION_KEYS},
    _RESPONSE_MODEL: _MODEL_RESP,
    _REQUEST_MODEL: _MODEL_REQ,
    **{k: _LATENCY for k in LATENCY_KEYS},
    **{k: _PREEMPTIONS for k in PREEMPTION_KEYS if not k.startswith("gen_ai.")},
    **{k: _LABEL for k in LABEL_KEYS if not k.startswith("gen_ai.")},
    _ERROR_TYPE: _ERROR,
}


def extract(req: ExportTraceServiceRequest) -> Extracted:
    """Per-request timings from every span with ``gen_ai.latency.*`` attributes."""
    out = Extracted()
    timings = out.timings
    invalid = out.invalid
    latency_keys = LATENCY_KEYS
    label_keys = LABEL_KEYS
    key_kind = _KEY_KIND.get
    for rs in req.resource_spans:
        resource_model = _resource_model(rs.resource.attributes)
        resource = _resource_identity(rs.resource.attributes)
        for ss in rs.scope_spans:
            spans = ss.spans
            out.spans += len(spans)
            for span in spans:
                seconds: dict[str, float] = {}
                model = response_model = request_id = None
                operation = provider = provider_old = error_type = None
                prompt = completion = preemptions = client_ttft = None
                labels: list[tuple[str, str]] = []
                for kv in span.attributes:
                    key = kv.key
                    kind = key_kind(key)
                    if kind is None:
                        continue
                    if kind == _LATENCY:  # _number, inlined: six of these a span
                        v = kv.value
                        which = v.WhichOneof("value")
                        x = v.double_value if which == "double_value" else None
                        if x is None and which == "int_value":
                            x = float(v.int_value)
                        if x is None or x != x:  # x != x: NaN
                            invalid["not_a_number"] += 1
                        elif not 0.0 <= x <= MAX_LATENCY_S:
                            invalid["out_of_range"] += 1
                        else:
                            seconds[latency_keys[key]] = x
                    elif kind == _MODEL_REQ:
                        model = kv.value.string_value
                    elif kind == _MODEL_RESP:
                        response_model = kv.value.string_value
                    elif kind == _COMPLETION:
                        n = _number(kv.value)
                        completion = int(n) if n is not None and 0 <= n < 2**53 else None
                    elif kind == _PROMPT:
                        n = _number(kv.value)
                        prompt = int(n) if n is not None and 0 <= n < 2**53 else None
                    elif kind == _REQ_ID:
                        request_id = kv.value.string_value[:MAX_REQUEST_ID_CHARS] or None
                    elif kind == _OP:
                        operation = kv.value.string_value[:MAX_LABEL_CHARS] or None
                    elif kind == _PROV:
                        provider = kv.value.string_value[:MAX_LABEL_CHARS] or None
                    elif kind == _PROV_OLD:
                        provider_old = kv.value.string_value[:MAX_LABEL_CHARS] or None
                    elif kind == _CLIENT_TTFT:
                        client_ttft = _number(kv.value)
                    elif kind == _ERROR:
                        error_type = kv.value.string_value[:MAX_LABEL_CHARS] or None
                    elif kind == _LABEL:
                        labels.append((label_keys[key], _label_text(kv.value)))
                    else:  # _PREEMPTIONS
                        n = _number(kv.value)
                        preemptions = int(n) if n is not None and 0 <= n < 2**31 else None
                if not seconds:
                    if (
                        client_ttft is not None
                        and 0.0 <= client_ttft <= MAX_LATENCY_S
                        and span.kind == _SPAN_KIND_CLIENT
                        and len(span.trace_id) == 16
                    ):
                        out.client.append((span.trace_id.hex(), client_ttft))
                    continue
                start, end = span.start_time_unix_nano, span.end_time_unix_nano
                if start and end:  # 0 is "unknown": nothing to check
                    if end < start:
                        invalid["end_before_start"] += 1
                        continue
                    if end - start > MAX_SPAN_NS:
                        invalid["too_long"] += 1
                        continue
                decode_s = seconds.get("decode")
                if decode_s is not None and completion is not None and completion > 1:
                    seconds["itl"] = decode_s / (completion - 1)
                name = (model or response_model or resource_model or UNKNOWN_MODEL)[:MAX_MODEL_NAME_CHARS]
                timings.append(
                    RequestTiming(
                        name,
                        seconds,
                        prompt,
                        completion,
                        span.trace_id.hex() or None,
                        request_id,
                        preemptions,
                        tuple(sorted(set(labels))) if labels else (),
                        operation,
                        provider or provider_old,
                        error_type or (_ERROR_OTHER if span.status.code == _STATUS_CODE_ERROR else None),
                        resource,
                    )
                )
                out.sources.append(span)
    return out


def span_ref(span: Any, timing: RequestTiming | None = None) -> SpanRef:
    """Which span a timing came from: ids (hex), ``gen_ai.request.id``, start and end (Unix s).

    ``timing``: what :func:`extract` read from ``span``; its trace and request ids are taken as read, so the span's
    attributes are not read a second time (and the evidence names the request id the analytics recorded).
    """
    if timing is not None:
        trace_id, request_id = timing.trace_id or "", timing.request_id
    else:
        trace_id = span.trace_id.hex()
        first = next((kv.value.string_value for kv in span.attributes if kv.key == _REQUEST_ID), "")
        request_id = first[:MAX_REQUEST_ID_CHARS] or None
    start, end = span.start_time_unix_nano, span.end_time_unix_nano
    return SpanRef(trace_id, span.span_id.hex(), request_id, start / 1e9 or None, end / 1e9 or None)
