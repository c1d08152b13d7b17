from __future__ import annotations

import re

import pytest

from inferwatch.agent.catalog import CATALOG, Kind, prometheus_name


@pytest.mark.parametrize(
    ("name", "kind", "unit", "expected"),
    [
        # Examples from the OpenTelemetry Collector's translation (prometheus/otlptranslator).
        ("gen_ai.server.time_to_first_token", Kind.HISTOGRAM, "s", "gen_ai_server_time_to_first_token_seconds"),
        ("system.cpu.time", Kind.COUNTER, "s", "system_cpu_time_seconds_total"),
        ("hw.gpu.utilization", Kind.GAUGE, "1", "hw_gpu_utilization_ratio"),
        ("hw.gpu.memory.usage", Kind.UPDOWNCOUNTER, "By", "hw_gpu_memory_usage_bytes"),
        ("llm.requests", Kind.COUNTER, "{request}", "llm_requests_total"),
        ("x.duration_seconds", Kind.GAUGE, "s", "x_duration_seconds"),
        ("net.rate", Kind.GAUGE, "By/s", "net_rate_bytes_per_second"),
        ("9lives", Kind.GAUGE, "", "_9lives"),
    ],
)
def test_translation_matches_collector(name: str, kind: Kind, unit: str, expected: str) -> None:
    assert prometheus_name(name, kind, unit) == expected


def test_every_catalog_name_is_valid_and_colon_free() -> None:
    for spec in CATALOG.values():
        assert re.fullmatch(r"[a-zA-Z_][a-zA-Z0-9_]*", spec.prometheus), spec.name
        assert ":" not in spec.prometheus
        assert spec.description.strip(), spec.name
        for label in spec.prometheus_labels:
            assert re.fullmatch(r"[a-zA-Z_][a-zA-Z0-9_]*", label)
        if spec.kind is Kind.HISTOGRAM:
            assert spec.buckets == tuple(sorted(spec.buckets)), spec.name


def test_units_are_base_units() -> None:
    allowed = {"s", "By", "1", "", "Hz", "W", "Cel"}
    for spec in CATALOG.values():
        assert spec.unit in allowed or spec.unit.startswith("{"), f"{spec.name}: {spec.unit}"
