"""Which model a span's timings are reported under (vLLM v1 spans name none: vllm/v1/engine/output_processor.py)."""

from __future__ import annotations

from opentelemetry.proto.collector.trace.v1.trace_service_pb2 import ExportTraceServiceRequest
from opentelemetry.proto.common.v1.common_pb2 import AnyValue, KeyValue
from opentelemetry.proto.resource.v1.resource_pb2 import Resource
from opentelemetry.proto.trace.v1.trace_pb2 import ResourceSpans, ScopeSpans, Span

from inferwatch.agent.node.analytics.latency import UNKNOWN_MODEL, EngineSeries, LatencyAnalytics, RequestTiming
from inferwatch.agent.node.receiver.spans import extract


def _kv(key: str, value: str | float) -> KeyValue:
    v = AnyValue(string_value=value) if isinstance(value, str) else AnyValue(double_value=value)
    return KeyValue(key=key, value=v)


def _request(resource: dict[str, str], spans: list[dict[str, str | float]]) -> ExportTraceServiceRequest:
    rs = ResourceSpans(
        resource=Resource(attributes=[_kv(k, v) for k, v in resource.items()]),
        scope_spans=[
            ScopeSpans(spans=[Span(name="llm_request", attributes=[_kv(k, v) for k, v in s.items()]) for s in spans])
        ],
    )
    return ExportTraceServiceRequest(resource_spans=[rs])


def test_model_from_span_then_resource_then_unknown() -> None:
    ttft = {"gen_ai.latency.time_to_first_token": 0.1}
    req = _request({"service.name": "vllm", "gen_ai.request.model": "from-resource"}, [
        ttft,  # vLLM v1: no model on the span
        {**ttft, "gen_ai.response.model": "from-span"},
        {**ttft, "gen_ai.request.model": "requested", "gen_ai.response.model": "from-span"},
    ])  # fmt: skip
    assert [t.model for t in extract(req).timings] == ["from-resource", "from-span", "requested"]
    bare = _request({"service.name": "vllm"}, [ttft])
    assert [t.model for t in extract(bare).timings] == [UNKNOWN_MODEL]


def _labels(analytics: LatencyAnalytics, engine: EngineSeries | None = None) -> set[str]:
    return {
        dict(s.attributes)["gen_ai.request.model"]
        for s in analytics.compute(engine)
        if s.name == "inferwatch.engine.latency"
    }


def test_model_less_spans_go_to_the_engines_only_model() -> None:
    analytics = LatencyAnalytics(clock=lambda: 100.0)
    analytics.record([RequestTiming(UNKNOWN_MODEL, {"ttft": 0.02 + i * 1e-4}) for i in range(60)])
    assert _labels(analytics) == {UNKNOWN_MODEL}  # the engine collector has not said yet
    engine = EngineSeries(models=("meta-llama/Llama-3.1-8B-Instruct",))  # its collection in the state
    analytics = LatencyAnalytics(clock=lambda: 200.0)
    analytics.record([RequestTiming(UNKNOWN_MODEL, {"ttft": 0.02 + i * 1e-4}) for i in range(60)])
    assert _labels(analytics, engine) == {"meta-llama/Llama-3.1-8B-Instruct"}
    stats = analytics.published.get(("meta-llama/Llama-3.1-8B-Instruct", "ttft", "1m"))
    assert stats is not None and stats.count == 60


def test_model_less_spans_stay_unknown_when_ambiguous() -> None:
    two = EngineSeries(models=("a", "b"))  # two models: nothing says which one a bare span is from
    analytics = LatencyAnalytics(clock=lambda: 100.0)
    analytics.record([RequestTiming(UNKNOWN_MODEL, {"ttft": 0.02})])
    assert _labels(analytics, two) == {UNKNOWN_MODEL}
    analytics = LatencyAnalytics(clock=lambda: 200.0)
    # spans that do name "a" keep their own series; bare ones are not merged into it
    analytics.record([RequestTiming("a", {"ttft": 0.02}), RequestTiming(UNKNOWN_MODEL, {"ttft": 0.5})])
    assert _labels(analytics, EngineSeries(models=("a",))) == {"a", UNKNOWN_MODEL}
