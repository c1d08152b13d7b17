"""OTLP trace intake (``agent/node/receiver/``): export requests accepted and rejected, spans, forwarding.

``transport`` is ``grpc`` or ``http``. Rejection ``reason`` is one of ``too_large``, ``bad_content_type``,
``bad_encoding``, ``bad_protobuf``, ``bad_gzip``, ``timeout`` (body not received in time),
``bad_method``, ``not_found``. Value ``reason`` (per-request values that were not usable) is one of
``not_a_number``, ``out_of_range``, ``too_many_models``, and for a whole span whose timestamps contradict it
``end_before_start`` or ``too_long`` (lasting more than a day; agent/node/receiver/spans.py).
"""

from inferwatch.agent.catalog.spec import Kind, MetricSpec

_T = ("transport",)

METRICS = (
    MetricSpec(
        "inferwatch.receiver.up",
        Kind.GAUGE,
        "",
        "1 while the OTLP trace receiver listens on the transport, else 0.",
        _T,
    ),
    MetricSpec(
        "inferwatch.receiver.exports.accepted",
        Kind.COUNTER,
        "{request}",
        "OTLP trace export requests decoded and accepted.",
        _T,
    ),
    MetricSpec(
        "inferwatch.receiver.exports.rejected",
        Kind.COUNTER,
        "{request}",
        "OTLP trace export requests rejected, by reason (HTTP 400/404/405/408/413/415; gRPC INVALID_ARGUMENT, "
        "RESOURCE_EXHAUSTED).",
        (*_T, "reason"),
    ),
    MetricSpec(
        "inferwatch.receiver.spans",
        Kind.COUNTER,
        "{span}",
        "Spans received in accepted export requests (any name).",
        _T,
    ),
    MetricSpec(
        "inferwatch.receiver.requests",
        Kind.COUNTER,
        "{request}",
        "Per-request samples taken from spans carrying gen_ai.latency.* attributes (vLLM's llm_request).",
        _T,
    ),
    MetricSpec(
        "inferwatch.receiver.values.rejected",
        Kind.COUNTER,
        "{value}",
        "Span attribute values or requests left out of the analytics, by reason.",
        ("reason",),
    ),
    MetricSpec(
        "inferwatch.receiver.forward",
        Kind.COUNTER,
        "{request}",
        "Export requests forwarded untouched downstream, by outcome (sent, dropped: queue full or shutdown, "
        "failed: downstream error).",
        ("outcome",),
    ),
    MetricSpec(
        "inferwatch.receiver.forward.queued",
        Kind.UPDOWNCOUNTER,
        "{request}",
        "Export requests waiting in the bounded forward queue.",
        (),
    ),
)
