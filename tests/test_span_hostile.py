"""Spans with any timestamps and attributes: used or rejected and counted, never able to break another model's series.

Issue 31: one OTLP export of three spans with absurd timestamps (start = end = 0, end before start, 1970 against
2500) was accepted, then the span analytics failed on every cycle (the explainer's median band of exactly three
records was empty) and every model's span series left ``/metrics``, a healthy model's included.
"""

from __future__ import annotations

import time

import httpx
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st
from opentelemetry.proto.collector.trace.v1.trace_service_pb2 import ExportTraceServiceRequest
from opentelemetry.proto.common.v1.common_pb2 import AnyValue, ArrayValue, KeyValue, KeyValueList
from opentelemetry.proto.resource.v1.resource_pb2 import Resource
from opentelemetry.proto.trace.v1.trace_pb2 import ResourceSpans, ScopeSpans, Span
from prometheus_client.parser import text_string_to_metric_families

from inferwatch.agent.catalog.engine import MODEL
from inferwatch.agent.common.samples import RequestTiming
from inferwatch.agent.node.analytics.explain import RecordingSink, TailExplainer, explain
from inferwatch.agent.node.analytics.latency import LatencyAnalytics
from inferwatch.agent.node.analytics.processor import SpanAnalytics
from inferwatch.agent.node.analytics.tailrecords import RequestRecords
from inferwatch.agent.node.analytics.tailstats import bands_by_value
from inferwatch.agent.node.receiver.intake import SpanIntake
from inferwatch.agent.node.receiver.spans import LATENCY_KEYS
from inferwatch.agent.node.runner import validate
from inferwatch.agent.node.state import AgentState
from tests.conftest import PYTHON, ROOT, free_port
from tests.procs import running, wait_http

HEALTHY = "healthy/model"
SKEWED = "skewed-clock"
NS = 10**9
YEAR_2500_NS = 16_725_225_600 * NS
NOW_NS = 1_765_000_000 * NS  # December 2025


def kv(key: str, value: AnyValue) -> KeyValue:
    return KeyValue(key=key, value=value)


def d(x: float) -> AnyValue:
    return AnyValue(double_value=x)


def vllm_span(i: int, model: str, start: int, end: int, scale: float = 1.0) -> Span:
    """A vLLM-style llm_request span; ``scale`` spreads the latencies so that no two requests tie."""
    ttft = 0.2 * scale
    return Span(
        trace_id=i.to_bytes(16, "big"),
        span_id=(i + 1).to_bytes(8, "big"),
        name="llm_request",
        kind=Span.SPAN_KIND_SERVER,
        start_time_unix_nano=start,
        end_time_unix_nano=end,
        attributes=[
            kv("gen_ai.response.model", AnyValue(string_value=model)),
            kv("gen_ai.request.id", AnyValue(string_value=f"cmpl-{i}")),
            kv("gen_ai.usage.prompt_tokens", AnyValue(int_value=512)),
            kv("gen_ai.usage.completion_tokens", AnyValue(int_value=64)),
            kv("gen_ai.latency.time_in_queue", d(0.01 * scale)),
            kv("gen_ai.latency.time_in_model_prefill", d(0.15 * scale)),
            kv("gen_ai.latency.time_to_first_token", d(ttft)),
            kv("gen_ai.latency.time_in_model_decode", d(1.0 * scale)),
            kv("gen_ai.latency.e2e", d(ttft + 1.0 * scale)),
        ],
    )


def export(spans: list[Span]) -> bytes:
    req = ExportTraceServiceRequest(resource_spans=[ResourceSpans(scope_spans=[ScopeSpans(spans=spans)])])
    return req.SerializeToString()


def healthy_spans(n: int, first: int = 1000) -> list[Span]:
    return [
        vllm_span(first + i, HEALTHY, NOW_NS + i * NS, NOW_NS + i * NS + 3 * NS, 1 + (i % 7) / 10) for i in range(n)
    ]


def issue_spans() -> list[Span]:
    """The three spans of issue 31: start = end = 0, end before start, 1970 against 2500."""
    return [
        vllm_span(1, SKEWED, 0, 0, 1.0),
        vllm_span(2, SKEWED, NOW_NS, NOW_NS - 5 * NS, 2.0),
        vllm_span(3, SKEWED, 1, YEAR_2500_NS, 3.0),
    ]


def test_explainer_takes_three_distinct_records() -> None:
    """The root cause: with exactly three records int(0.4 m) = int(0.6 m) = 1 and the median band was empty."""
    records = RequestRecords()
    records.add(
        [
            RequestTiming("m", {"ttft": 0.1 * k, "e2e": k, "queue": 0.01, "prefill": 0.05, "decode": 0.9 * k}, 8, 20)
            for k in (1, 2, 3)
        ],
        100.0,
    )
    report = explain(records, "m", 300.0, 101.0)
    assert report is not None
    assert report["quantities"]["ttft"]["median_band_requests"] == 1
    assert report["quantities"]["ttft"]["p50_s"] == pytest.approx(0.2)


@pytest.mark.parametrize("n", range(1, 40))
def test_median_band_is_never_empty(n: int) -> None:
    values = [float(j) for j in range(n)]
    tail, mid, p50, p99 = bands_by_value(list(range(n)), values)
    assert tail and mid and p50 <= p99


def _cycle(intake: SpanIntake, analytics: LatencyAnalytics, explainer: TailExplainer) -> list:
    """One analytics cycle as the runner runs it: collect, then the catalog check."""
    return list(validate(SpanAnalytics(analytics, AgentState(), explainer).collect()).samples)


def _models_with_latency(samples: list) -> set[str]:
    return {
        dict(s.attributes).get(MODEL, "")
        for s in samples
        if s.name == "inferwatch.engine.latency" and dict(s.attributes).get("source") == "spans"
    }


def _drivers(samples: list) -> set[str]:
    return {dict(s.attributes)[MODEL] for s in samples if s.name == "inferwatch.engine.tail.driver"}


def test_issue_case_in_process_keeps_the_healthy_model_and_counts_the_rejected() -> None:
    t = [1000.0]
    analytics = LatencyAnalytics(clock=lambda: t[0])
    explainer = TailExplainer(clock=lambda: t[0])
    intake = SpanIntake(RecordingSink(analytics, explainer))
    intake.handle(export(healthy_spans(60)), "http")
    intake.handle(export(issue_spans()), "http")
    # three more of one model with sane timestamps and distinct values: the explainer's old failure, on its own
    intake.handle(export([vllm_span(10 + k, "three", NOW_NS, NOW_NS + NS, k) for k in (1, 2, 3)]), "http")
    t[0] += 1.0
    samples = _cycle(intake, analytics, explainer)
    assert {HEALTHY, SKEWED, "three"} <= _models_with_latency(samples)
    assert {HEALTHY, "three"} <= _drivers(samples)
    assert intake.invalid["end_before_start"] == 1 and intake.invalid["too_long"] == 1
    assert analytics.window_stats(SKEWED, "ttft", "1m").count == 1  # the zero-timestamp span is used
    errors = {dict(s.attributes)["stage"]: s.value for s in samples if s.name == "inferwatch.analytics.errors"}
    assert errors == {"latency": 0.0, "explain": 0.0}


def test_one_failing_model_costs_only_its_own_series(caplog: pytest.LogCaptureFixture) -> None:
    """Isolation, whatever the bug: a model whose step raises is left out and counted, logged once."""
    t = [1000.0]
    analytics = LatencyAnalytics(clock=lambda: t[0])
    explainer = TailExplainer(clock=lambda: t[0])
    intake = SpanIntake(RecordingSink(analytics, explainer))
    intake.handle(export([*healthy_spans(60), vllm_span(5, "broken", NOW_NS, NOW_NS + NS)]), "http")
    real = analytics.window_stats

    def flaky(model: str, quantity: str, window: str):  # a bug that only this model's records trigger
        if model == "broken":
            raise ZeroDivisionError("float division by zero")
        return real(model, quantity, window)

    analytics.window_stats = flaky  # type: ignore[method-assign]
    for _ in range(3):
        t[0] += 11.0  # a new explainer sub-window each cycle
        samples = _cycle(intake, analytics, explainer)
        assert _models_with_latency(samples) == {HEALTHY}
    errors = {dict(s.attributes)["stage"]: s.value for s in samples if s.name == "inferwatch.analytics.errors"}
    assert errors["latency"] == 3
    starts = [r for r in caplog.records if "failed for model 'broken'" in r.getMessage()]
    assert len(starts) == 1
    analytics.window_stats = real  # type: ignore[method-assign]
    t[0] += 11.0
    samples = _cycle(intake, analytics, explainer)
    assert _models_with_latency(samples) == {HEALTHY, "broken"}
    assert analytics.failures.failing() == []


# --- property: any timestamps, any attributes --------------------------------------------------------------------

_KEYS = [
    *LATENCY_KEYS,
    "gen_ai.request.model",
    "gen_ai.response.model",
    "gen_ai.usage.prompt_tokens",
    "gen_ai.usage.completion_tokens",
    "gen_ai.usage.input_tokens",
    "gen_ai.usage.output_tokens",
    "gen_ai.request.id",
    "gen_ai.operation.name",
    "gen_ai.provider.name",
    "gen_ai.system",
    "error.type",
    "vllm.dp_rank",
    "vllm.lora_name",
    "enduser.id",
    "vllm.num_preemptions",
    "other.key",
]
_MODELS = ["a", "b", "c", HEALTHY, "", "x" * 5000]
_scalar = st.one_of(
    st.builds(AnyValue),  # no value set
    st.builds(lambda s: AnyValue(string_value=s), st.one_of(st.sampled_from(_MODELS), st.text(max_size=50))),
    st.builds(lambda n: AnyValue(string_value="y" * n), st.integers(0, 100_000)),
    st.builds(lambda x: AnyValue(int_value=x), st.integers(-(2**63), 2**63 - 1)),
    st.builds(lambda x: AnyValue(double_value=x), st.floats(allow_nan=True, allow_infinity=True)),
    st.builds(lambda x: AnyValue(double_value=x), st.floats(0.0, 20.0)),
    st.builds(lambda x: AnyValue(bool_value=x), st.booleans()),
    st.builds(lambda b: AnyValue(bytes_value=b), st.binary(max_size=64)),
)
_value = st.recursive(
    _scalar,
    lambda inner: st.one_of(
        st.builds(lambda vs: AnyValue(array_value=ArrayValue(values=vs)), st.lists(inner, max_size=3)),
        st.builds(
            lambda kvs: AnyValue(kvlist_value=KeyValueList(values=[kv(k, v) for k, v in kvs])),
            st.lists(st.tuples(st.sampled_from(_KEYS), inner), max_size=3),
        ),
    ),
    max_leaves=6,
)
_attr = st.tuples(st.one_of(st.sampled_from(_KEYS), st.text(max_size=20)), _value)
_ts = st.one_of(
    st.just(0), st.integers(0, 2**64 - 1), st.integers(NOW_NS - 10**15, NOW_NS + 10**15), st.just(2**64 - 1)
)


@st.composite
def _span(draw: st.DrawFn) -> Span:
    attrs = draw(st.lists(_attr, max_size=12))
    # most spans carry a latency so that they reach the analytics
    if draw(st.booleans()):
        attrs.append(("gen_ai.latency.time_to_first_token", AnyValue(double_value=draw(st.floats(0.0, 30.0)))))
        attrs.append(("gen_ai.response.model", AnyValue(string_value=draw(st.sampled_from(_MODELS)))))
    return Span(
        trace_id=draw(st.binary(max_size=20)),
        span_id=draw(st.binary(max_size=10)),
        name="llm_request",
        start_time_unix_nano=draw(_ts),
        end_time_unix_nano=draw(_ts),
        status={"code": draw(st.integers(0, 2))},
        attributes=[kv(k, v) for k, v in attrs],
    )


@settings(max_examples=60, deadline=None, suppress_health_check=[HealthCheck.too_slow, HealthCheck.data_too_large])
@given(
    batches=st.lists(st.lists(_span(), min_size=1, max_size=8), min_size=1, max_size=3),
    resource=st.lists(_attr, max_size=4),
    steps=st.lists(st.floats(0.0, 400.0), min_size=1, max_size=2),
)
def test_any_timestamps_and_attributes_never_break_a_cycle_or_another_model(batches, resource, steps) -> None:
    t = [10_000.0]
    analytics = LatencyAnalytics(clock=lambda: t[0], max_models=8, histograms=True, prompt_bands=True)
    explainer = TailExplainer(clock=lambda: t[0])
    intake = SpanIntake(RecordingSink(analytics, explainer))
    for batch in batches:
        healthy = healthy_spans(20, first=len(batch) * 1000)
        req = ExportTraceServiceRequest(
            resource_spans=[
                ResourceSpans(scope_spans=[ScopeSpans(spans=healthy)]),
                ResourceSpans(
                    resource=Resource(attributes=[kv(k, v) for k, v in resource]),
                    scope_spans=[ScopeSpans(spans=batch)],
                ),
            ]
        )
        intake.handle(req.SerializeToString(), "http")
        sent = t[0]
        for step in steps:
            t[0] += step
            samples = _cycle(intake, analytics, explainer)  # never raises, and passes the catalog check
            if t[0] - sent < 60.0:  # the healthy model's records are still in its 1m window
                assert HEALTHY in _models_with_latency(samples)
        errors = {dict(s.attributes)["stage"]: s.value for s in samples if s.name == "inferwatch.analytics.errors"}
        assert errors == {"latency": 0.0, "explain": 0.0}  # nothing needed the isolation: no step raised
    rejected = intake.invalid["end_before_start"] + intake.invalid["too_long"]
    assert rejected <= sum(len(b) for b in batches)


# --- the issue's case end to end: a real agent, its receiver over HTTP, its /metrics -----------------------------


def _families(text: str) -> dict:
    return {f.name: f for f in text_string_to_metric_families(text)}


def _healthy_series(fams: dict) -> list:
    lat = fams.get("inferwatch_engine_latency_seconds")
    return [
        s
        for s in (lat.samples if lat else [])
        if s.labels.get("gen_ai_request_model") == HEALTHY and s.labels.get("source") == "spans"
    ]


@pytest.mark.integration
def test_issue_case_over_http_keeps_every_models_series_on_metrics(tmp_path) -> None:
    port, http_port = free_port(), free_port()
    env = {
        "INFERWATCH_RECEIVER__ENABLED": "true",
        "INFERWATCH_RECEIVER__GRPC_ENDPOINT": "",
        "INFERWATCH_RECEIVER__HTTP_ENDPOINT": f"127.0.0.1:{http_port}",
        "INFERWATCH_LOG_LEVEL": "info",
    }
    cmd = [PYTHON, "-m", "inferwatch.agent", "run", "--port", str(port), "--interval", "0.5"]
    with running(cmd, tmp_path / "agent.log", cwd=ROOT, env=env) as proc:
        base, traces = f"http://127.0.0.1:{port}", f"http://127.0.0.1:{http_port}/v1/traces"
        wait_http(f"{base}/readyz", ok=lambda r: r.status_code == 200, proc=proc, timeout_s=60)
        headers = {"Content-Type": "application/x-protobuf"}
        assert httpx.post(traces, content=export(healthy_spans(60)), headers=headers, timeout=10).status_code == 200
        wait_http(f"{base}/metrics", ok=lambda r: bool(_healthy_series(_families(r.text))), proc=proc, timeout_s=60)
        # the issue's export, and three sane spans of a third model with distinct values (the explainer's failure)
        assert httpx.post(traces, content=export(issue_spans()), headers=headers, timeout=10).status_code == 200
        three = [vllm_span(20 + k, "three", NOW_NS, NOW_NS + NS, k) for k in (1, 2, 3)]
        assert httpx.post(traces, content=export(three), headers=headers, timeout=10).status_code == 200

        def settled(r: httpx.Response) -> bool:
            fams = _families(r.text)
            rejected = {s.labels["reason"]: s.value for s in fams["inferwatch_receiver_values_rejected"].samples}
            drivers = fams.get("inferwatch_engine_tail_driver_ratio")
            models = {s.labels.get("gen_ai_request_model") for s in (drivers.samples if drivers else [])}
            return rejected.get("too_long") == 1 and {HEALTHY, "three"} <= models

        wait_http(f"{base}/metrics", ok=settled, proc=proc, timeout_s=60)
        # several more cycles (interval 0.5 s): the series stay, the spans processor keeps succeeding
        deadline = time.monotonic() + 5.0
        while time.monotonic() < deadline:
            fams = _families(httpx.get(f"{base}/metrics", timeout=10).text)
            assert _healthy_series(fams), "the healthy model's span series left /metrics"
            success = {s.labels["collector"]: s.value for s in fams["inferwatch_collector_success"].samples}
            assert success["spans"] == 1.0
            time.sleep(0.5)
        rejected = {s.labels["reason"]: s.value for s in fams["inferwatch_receiver_values_rejected"].samples}
        assert rejected["end_before_start"] == 1 and rejected["too_long"] == 1
        models = {s.labels.get("gen_ai_request_model") for s in fams["inferwatch_engine_latency_seconds"].samples}
        assert {HEALTHY, SKEWED, "three"} <= models  # the zero-timestamp span is used
        errors = {s.labels["stage"]: s.value for s in fams["inferwatch_analytics_errors"].samples}
        assert errors == {"latency": 0.0, "explain": 0.0}
    assert b"Traceback" not in (tmp_path / "agent.log").read_bytes()


def test_records_past_the_horizon_let_go_of_their_request_ids() -> None:
    """The soak's slope (issue 31): at a low rate the ring was overwritten only after hours, holding every request
    id string until then; now what is older than the 5-minute horizon is let go when the next requests arrive, and
    the ids live in one column of the ring's size (tailrecords.RequestIds): their memory does not grow with age."""
    records = RequestRecords()
    sizes = []
    for step in range(40):  # 20 minutes at one request every 30 s
        records.add([RequestTiming("m", {"ttft": 0.1, "e2e": 1.0}, request_id=f"cmpl-{step:064d}")], 30.0 * step)
        sizes.append(records.memory_bytes())
    assert records._size == 11  # 300 s of records at one per 30 s, both ends in
    assert len(set(sizes)) == 1  # the first columns, never grown: nothing held per request past them
    assert records.models() == ["m"]
    report = explain(records, "m", 300.0, 30.0 * 39)
    assert report is not None and report["requests"] == 11
