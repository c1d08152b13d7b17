"""The span path's cost, counted rather than timed (issue 38: a regression check beside tests/test_cost_counts.py).

- **intake per span**: Python calls (``sys.setprofile``, Python and C) of one ``SpanIntake.handle`` of a batch of
  vLLM ``llm_request`` spans (benchmarks/span_intake.py's payload: 6 latencies, tokens, sampling parameters) into
  the span analytics and the tail explainer, as the agent wires them; at 50, 100 and 200 spans a batch the calls
  must grow linearly and stay under ``INTAKE_CALLS_PER_SPAN`` per added span;
- **bimodality fits per cycle**: one model at 100 req/s with the analytics computed every 5 s (the runner's
  cycle), fake clock: once the 5 m window is full, the EM fits of the 14 series (7 quantities × 2 windows) stay
  under ``FITS_PER_CYCLE`` (a fit per series and sub-window, the rule before, made 7 a cycle);
- **OTLP export**: one collection of the metric reader reads the agent state once, whatever the number of
  instruments (each observable callback read all of it before: ~150 reads a collection); encoding a collection
  (exporters/otlp_encode.py) makes at most ``ENCODE_CALLS_PER_POINT`` calls per added data point and under half the
  SDK encoder's.

benchmarks/cost_profile.py measures the same path as CPU in a live agent (the span-rate axis).
"""

from __future__ import annotations

from functools import partial
from typing import Any

from opentelemetry.exporter.otlp.proto.common.metrics_encoder import encode_metrics
from opentelemetry.metrics import CallbackOptions, Observation
from opentelemetry.sdk.metrics import MeterProvider
from opentelemetry.sdk.metrics.export import InMemoryMetricReader
from opentelemetry.sdk.resources import Resource

from benchmarks.span_intake import payload
from inferwatch.agent.common.samples import AnySample, Collection, Sample, attrs
from inferwatch.agent.node.analytics.explain import RecordingSink, TailExplainer
from inferwatch.agent.node.analytics.latency import LatencyAnalytics
from inferwatch.agent.node.receiver.intake import SpanIntake
from inferwatch.agent.node.state import AgentState, CollectorHealth
from inferwatch.exporters.otlp import OTLPExporter
from inferwatch.exporters.otlp_encode import MetricsEncoder
from tests.test_cost_counts import SUPERLINEAR, calls

BATCHES = (50, 100, 200)  # spans per export request
INTAKE_CALLS_PER_SPAN = 130.0  # 87.7 calls per added span on 2026-12-07 (163.7 before issue 38's span-path cuts)
ENCODE_CALLS_PER_POINT = 10.0  # 8.0 on 2026-12-07 with MetricsEncoder (the SDK's encode_metrics: 20.0)
FITS_PER_CYCLE = 1.0  # 0.70 fits per 5 s cycle at 100 req/s on 2026-12-07 (7.0 with a fit per series and sub-window)


def test_span_intake_calls_grow_linearly_with_spans() -> None:
    clock = [1000.0]
    analytics = LatencyAnalytics(clock=lambda: clock[0])
    intake = SpanIntake(RecordingSink(analytics, TailExplainer(clock=lambda: clock[0])))
    intake.handle(payload(100, seed=99), "http")  # warm: the model and its sketches exist, as in a running agent
    points = []
    for batch in BATCHES:
        body = payload(batch, seed=batch)
        points.append((batch, calls(partial(intake.handle, body, "http"))))
    (s0, c0), (s1, c1), (s2, c2) = points
    first, second = (c1 - c0) / (s1 - s0), (c2 - c1) / (s2 - s1)
    print(f"intake: (spans, calls) {points}; calls per added span {first:.1f}, {second:.1f}")
    assert analytics.window_stats("Qwen/Qwen3-8B", "ttft", "1m") is not None  # the spans were recorded
    assert second <= SUPERLINEAR * first, points
    assert second <= INTAKE_CALLS_PER_SPAN, f"{second:.1f} calls per span, bound {INTAKE_CALLS_PER_SPAN}"


def test_steady_traffic_refits_the_bimodality_test_rarely() -> None:
    clock = [1000.0]
    analytics = LatencyAnalytics(clock=lambda: clock[0])
    intake = SpanIntake(analytics)
    bodies = [payload(100, seed=s) for s in range(20)]  # a second's requests each, drawn afresh
    warm, steady = 400, 300  # seconds: the 5 m window full, then five minutes counted
    fits = cycles = 0
    for second in range(warm + steady):
        clock[0] += 1.0
        intake.handle(bodies[second % len(bodies)], "http")
        if second % 5 == 4:
            before = analytics.bimodality_fits
            samples = analytics.compute()
            if second >= warm:
                fits += analytics.bimodality_fits - before
                cycles += 1
    assert any(s.name == "inferwatch.engine.latency.bimodality" for s in samples)  # verdicts are published
    print(f"bimodality fits: {fits} in {cycles} cycles ({fits / cycles:.2f} a cycle)")
    assert fits / cycles <= FITS_PER_CYCLE, f"{fits / cycles:.2f} fits a cycle, bound {FITS_PER_CYCLE}"


def test_an_otlp_collection_reads_the_state_once() -> None:
    state = AgentState()
    state.register(CollectorHealth("c", 5.0, 5.0))
    reads = []

    def source() -> list[AnySample]:
        reads.append(1)
        return [Sample("inferwatch.receiver.up", 1.0, attrs(transport="http"))]

    state.add_source("receiver", source)
    samples = [
        Sample("inferwatch.analytics.errors", 3.0, attrs(stage="latency")),
        Sample("inferwatch.analytics.errors", 9.0, attrs(stage="latency")),  # a repeated series: the first wins
        Sample("inferwatch.analytics.errors", 1.0, attrs(stage="explain")),
    ]
    state.record("c", CollectorHealth("c", 5.0, 5.0, runs=1, state="ok"), Collection(samples=samples))
    otlp = OTLPExporter(state, Resource.create({}))
    try:
        for collection in (1, 2):
            data = otlp.collect()
            assert data is not None
            metrics = {m.name: m for rm in data.resource_metrics for sm in rm.scope_metrics for m in sm.metrics}
            points: list[Any] = list(metrics["inferwatch.analytics.errors"].data.data_points)
            assert {p.attributes["stage"]: p.value for p in points} == {"latency": 3.0, "explain": 1.0}
            (up,) = list[Any](metrics["inferwatch.receiver.up"].data.data_points)
            assert up.value == 1.0 and dict(up.attributes) == {"transport": "http"}
            assert otlp.state_reads == collection and len(reads) == collection
    finally:
        otlp.shutdown()


def test_otlp_encoding_calls_grow_linearly_with_points() -> None:
    points = []
    for n in (200, 400, 800):  # series per instrument: a gauge and a counter with four attributes each
        reader = InMemoryMetricReader()
        provider = MeterProvider(metric_readers=[reader])
        meter = provider.get_meter("inferwatch.test")

        def observe(_options: CallbackOptions, n: int = n) -> list[Observation]:
            return [
                Observation(i / 7, {"model": f"m{i % 10}", "quantity": "ttft", "window": "1m", "i": str(i)})
                for i in range(n)
            ]

        meter.create_observable_gauge("g", callbacks=[observe])
        meter.create_observable_counter("c", callbacks=[observe])
        try:
            data = reader.get_metrics_data()
        finally:
            provider.shutdown()
        assert data is not None
        encode = MetricsEncoder()
        assert encode(data) == encode_metrics(data)  # the first encoding keeps each series' attribute bytes
        points.append((2 * n, calls(partial(encode, data)), calls(partial(encode_metrics, data))))
    (p0, c0, _), (p1, c1, s1), (p2, c2, s2) = points
    first, second, sdk = (c1 - c0) / (p1 - p0), (c2 - c1) / (p2 - p1), (s2 - s1) / (p2 - p1)
    print(f"OTLP encoding: (points, calls, SDK calls) {points}; calls per added point {first:.1f}, {second:.1f}")
    assert second <= SUPERLINEAR * first, points
    assert second <= ENCODE_CALLS_PER_POINT, f"{second:.1f} calls per point, bound {ENCODE_CALLS_PER_POINT}"
    assert second <= sdk / 2, f"{second:.1f} calls per point against the SDK encoder's {sdk:.1f}"
