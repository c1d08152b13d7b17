"""OTLP export of the agent, run as a real process, against real OTLP receivers (gRPC and HTTP/protobuf)
decoded with opentelemetry-proto: names, units, kinds, attributes and resource as the catalog says; a
receiver that is down at start is logged once and recovered from; shutdown is bounded."""

from __future__ import annotations

import os
import signal
import socket
import time
import uuid
from pathlib import Path
from typing import Any

import httpx
import pytest

from inferwatch.agent import catalog
from inferwatch.agent.catalog.spec import Kind
from tests.conftest import PYTHON, ROOT, free_port
from tests.otlp_receiver import Received, grpc_receiver, http_receiver
from tests.procs import running, wait_http

pytestmark = pytest.mark.integration

FAILING = "OTLP metric export failing"
RECOVERED = "OTLP metric export recovered"


def _value(v: Any) -> Any:
    return getattr(v, v.WhichOneof("value"))


def decode(requests: list[Any]) -> tuple[dict[str, Any], dict[str, dict[str, Any]]]:
    """(resource attributes of the last request, {metric name: {unit, kind, monotonic, attr_keys, values}})."""
    resource: dict[str, Any] = {}
    metrics: dict[str, dict[str, Any]] = {}
    for req in requests:
        for rm in req.resource_metrics:
            resource = {kv.key: _value(kv.value) for kv in rm.resource.attributes}
            for sm in rm.scope_metrics:
                for m in sm.metrics:
                    kind = m.WhichOneof("data")
                    points = getattr(m, kind).data_points
                    entry = metrics.setdefault(
                        m.name, {"unit": m.unit, "kind": kind, "attr_keys": set(), "values": {}, "monotonic": None}
                    )
                    if kind == "sum":
                        entry["monotonic"] = m.sum.is_monotonic
                    for p in points:
                        attrs = tuple(sorted((kv.key, str(_value(kv.value))) for kv in p.attributes))
                        entry["attr_keys"].add(tuple(k for k, _ in attrs))
                        entry["values"][attrs] = p.as_double if p.HasField("as_double") else p.as_int
    return resource, metrics


def _has(*names: str):
    return lambda reqs: set(names) <= set(decode(reqs)[1])


def _agent_env(endpoint: str, protocol: str, marker: str) -> dict[str, str]:
    return {
        "OTEL_EXPORTER_OTLP_ENDPOINT": endpoint,
        "OTEL_EXPORTER_OTLP_PROTOCOL": protocol,
        "OTEL_METRIC_EXPORT_INTERVAL": "500",
        "OTEL_METRIC_EXPORT_TIMEOUT": "2000",
        "OTEL_EXPORTER_OTLP_TIMEOUT": "2",  # seconds in opentelemetry-python; bounds the gRPC retries
        "OTEL_RESOURCE_ATTRIBUTES": "deployment.region=test-1",
        "INFERWATCH_RUNTIME__CMDLINE_PATTERN": f"fake-runtime-{marker}",
        "INFERWATCH_RUNTIME__NAME": "vllm",
    }


def _check_against_catalog(received: Received) -> None:
    reqs = received.wait(
        _has("system.memory.limit", "inferwatch.cpu.feature.present", "process.memory.usage", "inferwatch.node.info")
    )
    resource, metrics = decode(reqs)
    assert resource["service.name"] == "inferwatch-agent"
    assert resource["host.name"] == socket.gethostname()
    assert resource["os.type"] == "linux" and resource["host.cpu.model.name"]
    assert resource["host.arch"] in ("amd64", "arm64") and resource["deployment.region"] == "test-1"
    for name, got in metrics.items():
        spec = catalog.get(name)  # every exported name is declared
        assert got["unit"] == spec.unit, name
        expected_kind = {Kind.GAUGE: "gauge", Kind.COUNTER: "sum", Kind.UPDOWNCOUNTER: "sum"}[spec.kind]
        assert got["kind"] == expected_kind, name
        if spec.kind is Kind.COUNTER:
            assert got["monotonic"] is True, name
        if spec.kind is Kind.UPDOWNCOUNTER:
            assert got["monotonic"] is False, name
        assert got["attr_keys"] == {tuple(sorted(spec.attributes))}, name
    assert metrics["system.memory.limit"]["unit"] == "By"
    assert metrics["process.cpu.time"]["unit"] == "s"
    rss = metrics["process.memory.usage"]["values"][(("runtime", "vllm"),)]
    assert rss > 1_000_000
    assert any(v == 1 for v in metrics["inferwatch.runtime.up"]["values"].values())


@pytest.mark.parametrize("protocol", ["grpc", "http/protobuf"])
def test_otlp_export_matches_the_catalog(tmp_path: Path, protocol: str) -> None:
    otlp_port, api_port, marker = free_port(), free_port(), uuid.uuid4().hex
    receiver = grpc_receiver if protocol == "grpc" else http_receiver
    # the fake runtime outlives any test run (stopped on exit): a loaded run past its sleep would lose the runtime
    runtime = [PYTHON, "-c", "import time; time.sleep(900)", f"fake-runtime-{marker}"]
    agent = [PYTHON, "-m", "inferwatch.agent", "run", "--port", str(api_port), "--interval", "0.5"]
    env = _agent_env(f"http://127.0.0.1:{otlp_port}", protocol, marker)
    with (
        receiver(otlp_port) as received,
        running(runtime, tmp_path / "runtime.log"),
        running(agent, tmp_path / "agent.log", cwd=ROOT, env=env) as proc,
    ):
        wait_http(f"http://127.0.0.1:{api_port}/readyz", ok=lambda r: r.status_code == 200, proc=proc)
        _check_against_catalog(received)
    assert FAILING not in (tmp_path / "agent.log").read_text()


def test_receiver_down_at_start_then_up_and_bounded_shutdown(tmp_path: Path) -> None:
    otlp_port, api_port, marker = free_port(), free_port(), uuid.uuid4().hex
    agent = [PYTHON, "-m", "inferwatch.agent", "run", "--port", str(api_port), "--interval", "0.5"]
    env = _agent_env(f"http://127.0.0.1:{otlp_port}", "grpc", marker)
    log = tmp_path / "agent.log"
    runtime = [PYTHON, "-c", "import time; time.sleep(900)", f"fake-runtime-{marker}"]  # outlives the test
    with running(runtime, tmp_path / "runtime.log"), running(agent, log, cwd=ROOT, env=env) as proc:
        base = f"http://127.0.0.1:{api_port}"
        wait_http(f"{base}/readyz", ok=lambda r: r.status_code == 200, proc=proc)
        deadline = time.monotonic() + 120  # bounds a hang: an export period at CI's load can take tens of seconds
        while FAILING not in log.read_text() and time.monotonic() < deadline:
            time.sleep(0.2)
        assert FAILING in log.read_text()
        time.sleep(2.0)  # several more failed export periods: still logged once
        assert log.read_text().count(FAILING) == 1
        r = httpx.get(f"{base}/metrics", timeout=5)
        assert r.status_code == 200 and "system_memory_limit_bytes" in r.text
        with grpc_receiver(otlp_port) as received:
            _check_against_catalog(received)
            deadline = time.monotonic() + 120  # bounds a hang
            while RECOVERED not in log.read_text() and time.monotonic() < deadline:
                time.sleep(0.2)
            assert RECOVERED in log.read_text()
        # Receiver gone again; a SIGTERM must still end the agent within its bounded shutdown.
        time.sleep(1.0)
        os.killpg(proc.pid, signal.SIGTERM)
        proc.wait(timeout=30)  # raises (and the test fails) if shutdown hangs; SHUTDOWN_TIMEOUT_MS is 5 s
        assert proc.returncode is not None
    text = log.read_text()
    assert "received SIGTERM" in text and "agent stopped" in text  # agent.stop() ran: OTLP shut down
    assert text.index(RECOVERED) > text.index(FAILING)
