"""The gen_ai.server.* histograms against the OpenTelemetry GenAI semantic conventions' own text.

The expected name, unit, instrument, attributes and bucket edges are read from the conventions' files copied into
tests/fixtures/semconv-genai/ (semantic-conventions v1.41.1, see the SOURCE notes there), never typed here. What is
compared: the catalog declaration; the OTLP export (exporters/otlp.py through the SDK's in-memory reader) of
requests sent as real OTLP/HTTP spans to a real receiver on 127.0.0.1; and the Prometheus exposition rendered from
the same state, with the names the catalog derives.
"""

from __future__ import annotations

import re
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
import yaml
from opentelemetry.exporter.otlp.proto.http.trace_exporter import OTLPSpanExporter as HttpSpanExporter
from opentelemetry.sdk.metrics.export import HistogramDataPoint
from opentelemetry.sdk.resources import Resource
from opentelemetry.sdk.trace import TracerProvider
from opentelemetry.sdk.trace.export import SimpleSpanProcessor
from opentelemetry.trace import SpanKind, Status, StatusCode
from prometheus_client.parser import text_string_to_metric_families

from inferwatch.agent import catalog
from inferwatch.agent.catalog import genai
from inferwatch.agent.catalog.spec import Kind
from inferwatch.agent.config import ReceiverSettings
from inferwatch.agent.config.convert import convert
from inferwatch.agent.errors import ConfigError
from inferwatch.agent.node.analytics.genai import GenAIOptions
from inferwatch.agent.node.analytics.latency import LatencyAnalytics
from inferwatch.agent.node.state import AgentState
from inferwatch.exporters.otlp import OTLPExporter
from inferwatch.exporters.prometheus import render
from tests.conftest import ROOT
from tests.spanintake import received

FIXTURES = ROOT / "tests" / "fixtures" / "semconv-genai"
SERVER_METRICS = (
    "gen_ai.server.request.duration",
    "gen_ai.server.time_per_output_token",
    "gen_ai.server.time_to_first_token",
)
INSTRUMENTS = {"histogram": Kind.HISTOGRAM}
EXTRA_TTFT = (20.0, 40.0, 80.0)


def _conventions() -> dict[str, dict[str, Any]]:
    """{metric: {unit, instrument, attributes: {key: requirement level}, buckets}} from the fixture files."""
    groups = {g["id"]: g for g in yaml.safe_load((FIXTURES / "metrics.yaml").read_text())["groups"]}

    def attributes(group_id: str) -> dict[str, Any]:
        g = groups[group_id]
        out = attributes(g["extends"]) if "extends" in g else {}
        out.update({a["ref"]: a["requirement_level"] for a in g.get("attributes", [])})
        return out

    text = (FIXTURES / "gen-ai-metrics.md").read_text()
    out = {}
    for name in SERVER_METRICS:
        g = groups[f"metric.{name}"]
        section = text.split(f"### Metric: `{name}`", 1)[1].split("### Metric:", 1)[0]
        advice = re.search(r"\[ExplicitBucketBoundaries\] of\s*\[([^\]]+)\]", section)
        assert advice is not None, f"no bucket advice for {name} in the fixture"
        out[name] = {
            "unit": g["unit"],
            "instrument": g["instrument"],
            "attributes": attributes(g["extends"]),
            "buckets": tuple(float(x) for x in advice.group(1).split(",")),
        }
    return out


CONVENTIONS = _conventions()


def _emitted(levels: dict[str, Any]) -> set[str]:
    """The attributes the agent must set: required and conditionally required ones. server.port is conditional on
    server.address, a recommended attribute a server-side agent does not set (it is the server)."""
    assert "server.address" in str(levels["server.port"]) and levels["server.address"] == "recommended"
    return {k for k, v in levels.items() if v == "required" or (isinstance(v, dict) and k != "server.port")}


def test_fixture_is_the_conventions_text() -> None:
    assert set(CONVENTIONS) == set(SERVER_METRICS)
    assert genai.SEMCONV_VERSION in (FIXTURES / "metrics.yaml").read_text().splitlines()[0]
    assert _emitted(CONVENTIONS["gen_ai.server.request.duration"]["attributes"]) == {
        "gen_ai.operation.name",
        "gen_ai.provider.name",
        "gen_ai.request.model",
        "error.type",
    }


@pytest.mark.parametrize("name", SERVER_METRICS)
def test_catalog_declares_what_the_conventions_say(name: str) -> None:
    want, spec = CONVENTIONS[name], catalog.get(name)
    assert spec.kind is INSTRUMENTS[want["instrument"]] and spec.unit == want["unit"]
    assert set(spec.attributes) == _emitted(want["attributes"])
    assert spec.buckets == want["buckets"] == genai.buckets(name)
    assert spec.prometheus == name.replace(".", "_") + "_seconds"


def _spans(port: int) -> None:
    """Three OK requests (chat, one without an operation, text_completion) and two failed ones, as OTLP/HTTP spans."""
    provider = TracerProvider(resource=Resource.create({"service.name": "vllm"}))
    provider.add_span_processor(SimpleSpanProcessor(HttpSpanExporter(endpoint=f"http://127.0.0.1:{port}/v1/traces")))
    tracer = provider.get_tracer("vllm.tracing")
    base = {"gen_ai.response.model": "m", "gen_ai.usage.completion_tokens": 11}
    requests = [
        ({"gen_ai.operation.name": "chat", "gen_ai.latency.time_to_first_token": 0.3, "gen_ai.latency.e2e": 1.3}, None),
        ({"gen_ai.latency.time_to_first_token": 15.0, "gen_ai.latency.e2e": 16.0}, None),  # default operation
        (
            {
                "gen_ai.operation.name": "text_completion",
                "gen_ai.provider.name": "llama.cpp",
                "gen_ai.latency.time_to_first_token": 0.05,
                "gen_ai.latency.e2e": 0.55,
            },
            None,
        ),
        ({"gen_ai.operation.name": "chat", "gen_ai.latency.e2e": 0.07, "error.type": "timeout"}, None),
        ({"gen_ai.operation.name": "chat", "gen_ai.latency.e2e": 3.0, "gen_ai.latency.time_to_first_token": 1.0}, "x"),
    ]
    for extra, error in requests:
        with tracer.start_as_current_span("llm_request", kind=SpanKind.SERVER) as span:
            span.set_attributes({**base, **extra})
            if error:
                span.set_status(Status(StatusCode.ERROR, "engine error"))
    assert provider.force_flush(10_000)
    provider.shutdown()


@pytest.fixture(scope="module", params=[(), EXTRA_TTFT], ids=["semconv", "ttft-extended"])
def exported(request: pytest.FixtureRequest) -> Iterator[tuple[tuple[float, ...], Any, str]]:
    """(extra TTFT edges, the OTLP metrics data, the Prometheus text) after the requests above."""
    extra: tuple[float, ...] = request.param
    settings = ReceiverSettings(
        enabled=True, grpc_endpoint=None, http_endpoint="127.0.0.1:0", emit_histograms=True, ttft_extra_buckets_s=extra
    )
    analytics = LatencyAnalytics(
        histograms=True, genai_options=GenAIOptions("chat", "vllm", tuple(settings.ttft_extra_buckets_s))
    )
    state = AgentState()
    otlp = OTLPExporter(state, Resource.create({}), ttft_extra_buckets_s=extra)
    analytics.set_observer(otlp.record_genai)
    try:
        with received(settings, analytics, _spans, state):
            yield extra, otlp.collect(), render(state).decode()
    finally:
        otlp.shutdown()


def _otlp(data: Any) -> dict[str, Any]:
    return {m.name: m for rm in data.resource_metrics for sm in rm.scope_metrics for m in sm.metrics}


def _points(metric: Any) -> dict[tuple[tuple[str, str], ...], HistogramDataPoint]:
    return {tuple(sorted(p.attributes.items())): p for p in metric.data.data_points}


def test_otlp_export_matches_the_conventions(exported: tuple[tuple[float, ...], Any, str]) -> None:
    extra, data, _ = exported
    metrics = _otlp(data)
    for name in SERVER_METRICS:
        want, m = CONVENTIONS[name], metrics[name]
        assert m.unit == want["unit"] and type(m.data).__name__ == "Histogram"
        bounds = want["buckets"] + (extra if name == genai.TTFT else ())
        emitted = _emitted(want["attributes"])
        for attrs, p in _points(m).items():
            assert tuple(p.explicit_bounds) == bounds
            keys = {k for k, _ in attrs}
            assert keys == (emitted if dict(attrs).get("error.type") else emitted - {"error.type"}), (name, attrs)
    ok = (("gen_ai.operation.name", "chat"), ("gen_ai.provider.name", "vllm"), ("gen_ai.request.model", "m"))
    ttft = _points(metrics[genai.TTFT])
    # successful responses only: the failed chat request (TTFT 1.0 s) is not in it
    assert ttft[ok].count == 2 and ttft[ok].sum == pytest.approx(15.3)
    assert ttft[ok].bucket_counts[-1] == (0 if extra else 1)  # 15 s: past 10 s only without the extension
    llama = (("gen_ai.operation.name", "text_completion"), ("gen_ai.provider.name", "llama.cpp"))
    assert ttft[(*llama, ("gen_ai.request.model", "m"))].sum == pytest.approx(0.05)
    # (e2e − ttft) / (output tokens − 1): 1.0 / 10 and 0.5 / 10
    tpot = _points(metrics[genai.TPOT])
    assert tpot[ok].sum == pytest.approx(0.2) and tpot[ok].count == 2
    duration = _points(metrics[genai.DURATION])
    failed = {dict(a)["error.type"]: p for a, p in duration.items() if "error.type" in dict(a)}
    assert set(failed) == {"timeout", genai.ERROR_OTHER} and failed["timeout"].sum == pytest.approx(0.07)
    assert duration[ok].count == 2 and sum(p.count for p in duration.values()) == 5


def test_prometheus_names_and_buckets_follow_the_catalog(exported: tuple[tuple[float, ...], Any, str]) -> None:
    extra, _, text = exported
    families = {f.name: f for f in text_string_to_metric_families(text)}
    for name in SERVER_METRICS:
        spec = catalog.get(name)
        family = families[spec.prometheus]
        assert family.type == "histogram"
        buckets = [s for s in family.samples if s.name.endswith("_bucket")]
        assert buckets
        les = sorted({float(s.labels["le"]) for s in buckets})
        assert tuple(les[:-1]) == CONVENTIONS[name]["buckets"] + (extra if name == genai.TTFT else ())
        for s in buckets:
            assert set(s.labels) - {"le"} <= set(spec.prometheus_labels)
            assert {"gen_ai_operation_name", "gen_ai_provider_name", "gen_ai_request_model"} <= set(s.labels)
    errors = {s.labels.get("error_type") for s in families["gen_ai_server_request_duration_seconds"].samples}
    # on success the label is empty, which Prometheus stores as no label at all; the failure class otherwise
    assert errors == {"", "timeout", "_OTHER"}


@pytest.mark.parametrize("edges", [[5.0], [20.0, 15.0], [20.0, float("inf")], [float(x) for x in range(11, 28)]])
def test_ttft_extension_rejects_edges_that_are_not_above_the_conventions(edges: list[float]) -> None:
    with pytest.raises(ConfigError, match="ttft_extra_buckets_s"):
        convert({"ttft_extra_buckets_s": edges}, ReceiverSettings)


def test_fixture_paths_are_in_the_repository() -> None:
    assert all(Path(FIXTURES / f).is_file() for f in ("metrics.yaml", "gen-ai-metrics.md"))
