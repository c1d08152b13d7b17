"""Phase child spans for an engine's one-span-per-request trace (vLLM's ``llm_request``).

vLLM sends one span per finished request with the phase durations as attributes, so a trace view shows one
bar. :func:`phase_request` turns each such span into child spans, timed from the span's own attributes, in a
new ``ExportTraceServiceRequest`` that the forwarder sends *after* the original request, which goes on byte for
byte as it came (nothing in it is rewritten).

Timeline (vLLM v1 ``do_tracing``; arrival = the span's start, a first token at arrival + TTFT)::

    arrival ── frontend ──► queued ── queue ──► scheduled ── prefill ──► first token ── decode ──► last token

=================  ============================================  ============================================
child span name    interval                                      from the attributes
=================  ============================================  ============================================
``frontend``       arrival → queued (API server, tokenisation)   TTFT − queue − prefill (only when > 0)
``queue``          queued → scheduled                            ``gen_ai.latency.time_in_queue``
``prefill``        scheduled → first token                       ``gen_ai.latency.time_in_model_prefill``
``kv_transfer``    first token → + transfer (P/D disaggregated)  :data:`KV_TRANSFER_KEYS` (not a vLLM key)
``decode``         first token → last token                      ``gen_ai.latency.time_in_model_decode``
=================  ============================================  ============================================

**Names.** The OpenTelemetry GenAI conventions name no span inside a model server (only the
``gen_ai.server.*`` metrics), so the names are inferwatch's: the phase alone, as above, with the attributes
``inferwatch.phase`` (the same name), ``gen_ai.request.id`` copied from the parent, and, on ``decode``,
``vllm.num_preemptions`` copied when the parent has it (vLLM v1 reports no preemption *durations*, so no gap
span is made). Kind INTERNAL, parent = the original span, same trace id, new random span ids.

A child needs the span's start (else its end minus e2e), TTFT, and its own duration; a span missing them gets no
children. Children are clamped to the parent's interval: vLLM measures the phases on the engine core's clock and
TTFT on the frontend's, so they can disagree by a few milliseconds.
"""

from __future__ import annotations

import math
import os
from typing import Any

from opentelemetry.proto.collector.trace.v1.trace_service_pb2 import ExportTraceServiceRequest
from opentelemetry.proto.common.v1.common_pb2 import AnyValue, InstrumentationScope, KeyValue
from opentelemetry.proto.trace.v1.trace_pb2 import ResourceSpans, ScopeSpans, Span

from inferwatch.agent.node.receiver.spans import MAX_LATENCY_S

SCOPE_NAME = "inferwatch.receiver.phases"
PHASE_ATTRIBUTE = "inferwatch.phase"
TTFT_KEY = "gen_ai.latency.time_to_first_token"
E2E_KEY = "gen_ai.latency.e2e"
QUEUE_KEY = "gen_ai.latency.time_in_queue"
PREFILL_KEY = "gen_ai.latency.time_in_model_prefill"
DECODE_KEY = "gen_ai.latency.time_in_model_decode"
# No vLLM release sets a KV-transfer duration on its span; a disaggregated deployment (or the simulator's P/D pair)
# can, under one of these keys (seconds).
KV_TRANSFER_KEYS = frozenset({"vllm.kv_transfer_time", "inferwatch.latency.kv_transfer"})
_COPIED = frozenset({"gen_ai.request.id"})
_PREEMPTIONS = frozenset({"vllm.num_preemptions", "num_preemptions"})
_WANTED = frozenset({TTFT_KEY, E2E_KEY, QUEUE_KEY, PREFILL_KEY, DECODE_KEY, *KV_TRANSFER_KEYS})
_INTERNAL = Span.SpanKind.SPAN_KIND_INTERNAL
_NS = 1_000_000_000


def _seconds(v: AnyValue) -> float | None:
    which = v.WhichOneof("value")
    x = float(v.double_value) if which == "double_value" else float(v.int_value) if which == "int_value" else None
    if x is None or not math.isfinite(x) or not 0.0 <= x <= MAX_LATENCY_S:
        return None
    return x


def _span_id() -> bytes:
    while True:
        sid = os.urandom(8)
        if sid != b"\0" * 8:
            return sid


def phase_spans(span: Span) -> list[Span]:
    """The phase children of one engine span, in time order; [] when it lacks what they are timed from."""
    if len(span.trace_id) != 16 or len(span.span_id) != 8:
        return []
    d: dict[str, float] = {}
    copied: list[KeyValue] = []
    preemptions: KeyValue | None = None
    for kv in span.attributes:
        if kv.key in _WANTED:
            x = _seconds(kv.value)
            if x is not None:
                d["kv_transfer" if kv.key in KV_TRANSFER_KEYS else kv.key] = x
        elif kv.key in _COPIED:
            copied.append(kv)
        elif kv.key in _PREEMPTIONS:
            preemptions = kv
    ttft = d.get(TTFT_KEY)
    start, end = span.start_time_unix_nano, span.end_time_unix_nano
    if ttft is None or not (QUEUE_KEY in d or PREFILL_KEY in d or DECODE_KEY in d):
        return []
    if not start:
        if not end or E2E_KEY not in d:
            return []
        start = end - int(d[E2E_KEY] * _NS)
    if not end:
        end = start + int(d.get(E2E_KEY, ttft + d.get(DECODE_KEY, 0.0)) * _NS)
    if end < start or start <= 0:
        return []
    first = start + int(ttft * _NS)
    scheduled = first - int(d.get(PREFILL_KEY, 0.0) * _NS)
    queued = scheduled - int(d.get(QUEUE_KEY, 0.0) * _NS)
    intervals: list[tuple[str, int, int]] = []
    if queued > start:
        intervals.append(("frontend", start, queued))
    if QUEUE_KEY in d:
        intervals.append(("queue", queued, scheduled))
    if PREFILL_KEY in d:
        intervals.append(("prefill", scheduled, first))
    if "kv_transfer" in d:
        intervals.append(("kv_transfer", first, first + int(d["kv_transfer"] * _NS)))
    if DECODE_KEY in d:
        intervals.append(("decode", first, first + int(d[DECODE_KEY] * _NS)))
    out: list[Span] = []
    for name, lo, hi in intervals:
        lo, hi = min(max(lo, start), end), min(max(hi, start), end)
        attributes = [KeyValue(key=PHASE_ATTRIBUTE, value=AnyValue(string_value=name)), *copied]
        if name == "decode" and preemptions is not None:
            attributes.append(preemptions)
        out.append(
            Span(
                trace_id=span.trace_id,
                span_id=_span_id(),
                parent_span_id=span.span_id,
                name=name,
                kind=_INTERNAL,
                start_time_unix_nano=lo,
                end_time_unix_nano=hi,
                attributes=attributes,
            )
        )
    return out


def phase_request(req: ExportTraceServiceRequest, scope_version: str = "") -> bytes | None:
    """A serialized export request holding the phase children of every span in ``req`` that has them, each
    resource's children under that resource (same ``service.name``); None when there are none."""
    out = ExportTraceServiceRequest()
    scope = InstrumentationScope(name=SCOPE_NAME, version=scope_version)
    for rs in req.resource_spans:
        children: list[Any] = []
        for ss in rs.scope_spans:
            for span in ss.spans:
                children.extend(phase_spans(span))
        if children:
            out.resource_spans.append(
                ResourceSpans(resource=rs.resource, scope_spans=[ScopeSpans(scope=scope, spans=children)])
            )
    return out.SerializeToString() if out.resource_spans else None
