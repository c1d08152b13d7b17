"""TTFT and time per output token split by prompt-length band (receiver.prompt_band_histograms, issue 21).

Requests are sent as real OTLP/HTTP spans to a real receiver on 127.0.0.1; the state the span analytics compute is
rendered as the agent's /metrics and parsed back with prometheus_client's parser. The bands are the tail
explainer's (one definition), the unsplit gen_ai.server.* histograms are unchanged by the split, and the split
histograms' series are bounded by the fixed bands.
"""

from __future__ import annotations

from collections.abc import Iterator
from typing import Any

import pytest
from opentelemetry.exporter.otlp.proto.http.trace_exporter import OTLPSpanExporter as HttpSpanExporter
from opentelemetry.sdk.resources import Resource
from opentelemetry.sdk.trace import TracerProvider
from opentelemetry.sdk.trace.export import SimpleSpanProcessor
from opentelemetry.trace import SpanKind, Status, StatusCode
from prometheus_client.parser import text_string_to_metric_families

from inferwatch.agent import catalog
from inferwatch.agent.catalog import engine
from inferwatch.agent.common.samples import Collection, RequestTiming
from inferwatch.agent.config import ReceiverSettings
from inferwatch.agent.node.analytics import promptband, tailrecords
from inferwatch.agent.node.analytics.genai import GenAIOptions
from inferwatch.agent.node.analytics.latency import LatencyAnalytics
from inferwatch.agent.node.state import AgentState, CollectorHealth
from inferwatch.exporters.prometheus import render
from tests.spanintake import received

TTFT = "inferwatch_engine_time_to_first_token_seconds"
TPOT = "inferwatch_engine_time_per_output_token_seconds"
# (prompt tokens, TTFT s, e2e s, output tokens, failed): every band, a band edge on each side, a span without a
# prompt count and a failed request (neither is in the split histograms).
REQUESTS: list[tuple[int | None, float, float, int, bool]] = [
    (200, 0.05, 1.05, 11, False),
    (1024, 0.08, 1.08, 11, False),  # the edge belongs to the band below: <=1k
    (1025, 0.2, 1.2, 11, False),
    (4096, 0.3, 2.3, 11, False),
    (8000, 0.9, 2.9, 11, False),
    (16385, 4.0, 7.0, 11, False),
    (40000, 12.0, 17.0, 11, False),
    (None, 0.1, 1.1, 11, False),
    (9000, 0.5, 0.6, 11, True),
]


def _spans(port: int) -> None:
    provider = TracerProvider(resource=Resource.create({"service.name": "vllm"}))
    provider.add_span_processor(SimpleSpanProcessor(HttpSpanExporter(endpoint=f"http://127.0.0.1:{port}/v1/traces")))
    tracer = provider.get_tracer("vllm.tracing")
    for prompt, ttft, e2e, out, failed in REQUESTS:
        a: dict[str, Any] = {
            "gen_ai.response.model": "m",
            "gen_ai.usage.completion_tokens": out,
            "gen_ai.latency.time_to_first_token": ttft,
            "gen_ai.latency.e2e": e2e,
        }
        if prompt is not None:
            a["gen_ai.usage.prompt_tokens"] = prompt
        with tracer.start_as_current_span("llm_request", kind=SpanKind.SERVER) as span:
            span.set_attributes(a)
            if failed:
                span.set_status(Status(StatusCode.ERROR, "engine error"))
    assert provider.force_flush(10_000)
    provider.shutdown()


def _exposition(banded: bool, histograms: bool) -> dict[str, Any]:
    settings = ReceiverSettings(enabled=True, grpc_endpoint=None, http_endpoint="127.0.0.1:0")
    analytics = LatencyAnalytics(
        histograms=histograms, prompt_bands=banded, genai_options=GenAIOptions(ttft_extra_buckets_s=(20.0, 40.0))
    )
    with received(settings, analytics, _spans) as state:
        text = render(state).decode()
    return {f.name: f for f in text_string_to_metric_families(text)}


@pytest.fixture(scope="module")
def exposition() -> Iterator[dict[str, Any]]:
    yield _exposition(banded=True, histograms=True)


def _by_band(family: Any) -> dict[str, dict[str, float]]:
    """{band: {le or _count/_sum: value}}"""
    out: dict[str, dict[str, float]] = {}
    for s in family.samples:
        assert s.labels["gen_ai_request_model"] == "m"
        key = s.labels.get("le", s.name.rsplit("_", 1)[-1])
        out.setdefault(s.labels["prompt_band"], {})[key] = s.value
    return out


def test_bands_are_the_tail_explainers() -> None:
    """One definition: the split's bands are the tail explainer's, and the catalog names the same ones."""
    assert promptband.BANDS == ("<=1k", "1k-4k", "4k-16k", ">16k")
    edges = [*tailrecords.PROMPT_BANDS, tailrecords.PROMPT_BANDS[-1] + 1]
    assert tuple(tailrecords.prompt_band(e) for e in edges) == promptband.BANDS
    assert f"{', '.join(promptband.BANDS)} prompt tokens" == engine.PROMPT_BAND_NAMES
    for name in (promptband.TTFT, promptband.TPOT):
        spec = catalog.get(name)
        assert spec.attributes == (engine.MODEL, engine.PROMPT_BAND)
        assert engine.PROMPT_BAND_NAMES in spec.description
    assert engine.PROMPT_BAND_ALL not in promptband.BANDS  # the rules' value for unsplit histograms


def test_ttft_is_counted_in_its_prompt_band(exposition: dict[str, Any]) -> None:
    bands = _by_band(exposition[TTFT])
    assert set(bands) == set(promptband.BANDS)
    counts = {b: v["count"] for b, v in bands.items()}
    # no prompt count and the failed request are left out; 1024 is <=1k, 4096 is 1k-4k, 16385 is >16k
    assert counts == {"<=1k": 2, "1k-4k": 2, "4k-16k": 1, ">16k": 2}
    assert bands["<=1k"]["sum"] == pytest.approx(0.13) and bands[">16k"]["sum"] == pytest.approx(16.0)
    # the conventions' edges plus the configured extra TTFT edges; 12 s falls in (10, 20]
    assert bands[">16k"]["10.0"] == 1 and bands[">16k"]["20.0"] == 2 and bands[">16k"]["+Inf"] == 2
    assert bands["4k-16k"]["0.75"] == 0 and bands["4k-16k"]["1.0"] == 1


def test_time_per_output_token_is_per_request_in_its_band(exposition: dict[str, Any]) -> None:
    bands = _by_band(exposition[TPOT])
    # (e2e - ttft) / (11 - 1): 0.1 s for every request but the >16k ones (0.3 s and 0.5 s)
    assert bands[">16k"]["count"] == 2 and bands[">16k"]["sum"] == pytest.approx(0.8)
    assert bands["1k-4k"]["sum"] == pytest.approx(0.3) and bands["1k-4k"]["0.1"] == 1  # 0.1 and 0.2 s
    assert bands["<=1k"]["0.1"] == bands["<=1k"]["count"] == 2


def test_unsplit_histograms_are_unchanged_by_the_split(exposition: dict[str, Any]) -> None:
    """gen_ai.server.* count every successful request, with or without a prompt count, as without the split."""
    alone = _exposition(banded=False, histograms=True)
    assert TTFT not in alone and TPOT not in alone
    for name in ("gen_ai_server_time_to_first_token_seconds", "gen_ai_server_time_per_output_token_seconds"):
        assert [(s.name, s.labels, s.value) for s in exposition[name].samples] == [
            (s.name, s.labels, s.value) for s in alone[name].samples
        ]
    ttft = {s.labels.get("le"): s.value for s in exposition["gen_ai_server_time_to_first_token_seconds"].samples}
    assert ttft["+Inf"] == 8  # the 7 banded requests and the one without a prompt count


def test_split_without_the_semconv_histograms() -> None:
    """receiver.prompt_band_histograms does not need receiver.emit_histograms (an engine with its own)."""
    families = _exposition(banded=True, histograms=False)
    assert "gen_ai_server_time_to_first_token_seconds" not in families
    assert sum(s.value for s in families[TTFT].samples if s.name.endswith("_count")) == 7


def test_series_are_bounded_by_the_bands() -> None:
    """Thousands of requests over every prompt length: 2 metrics x 4 bands per model, whatever the lengths."""
    analytics = LatencyAnalytics(prompt_bands=True)
    analytics.record(
        RequestTiming("m", {"ttft": 0.01 * (i % 50), "e2e": 1.0}, prompt_tokens=i * 37, completion_tokens=5)
        for i in range(5000)
    )
    hists = [s for s in analytics.compute() if s.name in (promptband.TTFT, promptband.TPOT)]
    assert len(hists) == 2 * len(promptband.BANDS)
    assert {dict(s.attributes)[engine.PROMPT_BAND] for s in hists} == set(promptband.BANDS)
    state = AgentState()  # docs/cardinality.md: 35 series per band (TTFT 16 + 3, TPOT 13 + 3), 140 in all
    state.register(CollectorHealth("spans", 15.0, 5.0))
    state.record("spans", CollectorHealth("spans", 15.0, 5.0), Collection(samples=hists))
    lines = [x for x in render(state).decode().splitlines() if x.startswith((TTFT, TPOT))]
    assert len(lines) == 140
