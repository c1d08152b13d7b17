"""The streaming probe against a real HTTP runtime on 127.0.0.1 reproducing each stream pitfall."""

from __future__ import annotations

import json
import subprocess

import pytest

from inferwatch.agent.config import load_settings
from inferwatch.agent.node.collectors.probe import ProbeCollector
from inferwatch.agent.node.probe import run_probe
from inferwatch.agent.node.probe.schema import validate_payload
from inferwatch.agent.node.runner import validate
from inferwatch.agent.node.wiring import collect_context
from tests.conftest import PYTHON, ROOT
from tests.fake_runtime import fake_runtime, openai_chunk

PROTOCOLS = ("openai", "anthropic")


@pytest.fixture(scope="module")
def rt():
    with fake_runtime() as runtime:
        yield runtime


@pytest.mark.parametrize("protocol", PROTOCOLS)
def test_clean_stream_has_no_violations_and_timings(rt, protocol) -> None:
    rt.stream_mode = "ok"
    r = run_probe(rt.url, protocol, timeout_s=10)
    assert r.ok, r.as_dict()
    assert r.text == "OK"
    assert r.ttft_s is not None and 0 < r.ttft_s <= r.duration_s
    assert r.violations == []


@pytest.mark.parametrize("protocol", PROTOCOLS)
@pytest.mark.parametrize(
    ("mode", "kind"),
    [
        ("usage_only", "empty_delta_with_usage"),
        ("crlf", "crlf_framing"),
        ("non_utf8", "non_utf8"),
        ("malformed_json", "malformed_json"),
        ("cut", "missing_terminator"),
        ("wrong_order", "wrong_event_order"),
    ],
)
def test_each_pitfall_is_counted_as_its_kind(rt, protocol, mode, kind) -> None:
    rt.stream_mode = mode
    r = run_probe(rt.url, protocol, timeout_s=10)
    counts = r.violation_counts()
    assert not r.ok
    assert set(counts) == {kind}, r.as_dict()
    assert r.status_code == 200 and r.error_type is None


@pytest.mark.parametrize("protocol", PROTOCOLS)
def test_hardware_mismatch_is_its_own_error_type(rt, protocol) -> None:
    rt.stream_mode = "hardware_mismatch"
    r = run_probe(rt.url, protocol, timeout_s=10)
    assert (r.status_code, r.error_type) == (400, "hardware_mismatch")
    assert "sm_90" in (r.error_message or "")


def test_runtime_that_never_answers_is_a_timeout(rt) -> None:
    rt.stream_mode = "hang"
    r = run_probe(rt.url, "openai", timeout_s=0.5)
    assert r.error_type == "timeout" and not r.ok


def test_unreachable_runtime_is_a_connect_error() -> None:
    from tests.conftest import free_port

    r = run_probe(f"http://127.0.0.1:{free_port()}", "anthropic", timeout_s=2)
    assert r.error_type == "connect" and r.status_code is None


def test_schema_paths_name_the_rule() -> None:
    bad = openai_chunk("", usage={"prompt_tokens": 1, "completion_tokens": 1, "total_tokens": 2})
    (v,) = validate_payload("openai", bad, 3)
    assert v.kind == "empty_delta_with_usage"
    assert v.schema_path == "openai_chat_chunk.json#/allOf/0/then/properties/usage/type"
    assert v.instance_path == "$.usage"
    (s,) = validate_payload("openai", {**openai_chunk("x"), "object": "chat.completion"}, 0)
    assert s.kind == "schema" and s.schema_path.endswith("properties/object/const")
    assert validate_payload("openai", openai_chunk("fine"), 0) == []
    (a,) = validate_payload(
        "anthropic", {"type": "content_block_delta", "index": "0", "delta": {"type": "text_delta"}}, 1
    )
    assert a.schema_path == "anthropic_event.json#/$defs/content_block_delta/properties/index/type"


def test_collector_counts_cumulatively_by_protocol_and_kind(rt) -> None:
    settings = load_settings(overrides={"probe": {"url": rt.url, "protocols": ["openai", "anthropic"], "timeout_s": 5}})
    collector = ProbeCollector(collect_context(settings), settings.probe)
    rt.stream_mode = "usage_only"
    validate(collector.collect())
    rt.stream_mode = "hardware_mismatch"
    collection = validate(collector.collect())
    values = {(s.name, s.attributes): s.value for s in collection.samples}
    for p in PROTOCOLS:
        key = (("kind", "empty_delta_with_usage"), ("protocol", p))
        assert values[("inferwatch.probe.schema_violations", key)] >= 1
        assert values[("inferwatch.probe.http_errors", (("error_type", "hardware_mismatch"), ("protocol", p)))] == 1
        assert values[("inferwatch.probe.success", (("protocol", p),))] == 0
    assert any(f.id == "runtime.hardware_mismatch" and f.status == "fail" for f in collection.findings)
    rt.stream_mode = "ok"
    collection = validate(collector.collect())
    assert all(f.status == "ok" for f in collection.findings)
    ok = {(s.name, s.attributes): s.value for s in collection.samples}
    assert ok[("inferwatch.probe.success", (("protocol", "openai"),))] == 1


def test_cli_prints_what_it_saw_with_schema_paths(rt) -> None:
    rt.stream_mode = "usage_only"
    cmd = [PYTHON, "-m", "inferwatch.agent", "probe", "--url", rt.url, "--protocol", "anthropic"]
    out = subprocess.run(cmd, cwd=ROOT, capture_output=True, text=True, timeout=60)
    assert out.returncode == 1, out.stderr
    assert "empty_delta_with_usage" in out.stdout
    assert "schema path: anthropic_event.json#/$defs/content_block_delta/properties/usage/not" in out.stdout
    rt.stream_mode = "ok"
    out = subprocess.run([*cmd[:-1], "openai", "--json"], cwd=ROOT, capture_output=True, text=True, timeout=60)
    assert out.returncode == 0, out.stdout + out.stderr
    assert json.loads(out.stdout)["ok"] is True
    bad = subprocess.run([*cmd[:-1], "grpc"], cwd=ROOT, capture_output=True, text=True, timeout=60)
    assert bad.returncode == 2 and "--protocol" in bad.stderr


def test_sse_framing_details() -> None:
    from inferwatch.agent.node.probe.sse import SSEParser

    p = SSEParser()
    evs = p.feed(b': keep-alive\n\nevent: ping\ndata: {"type"', 1.0)
    assert evs == [] and not p.crlf
    evs = p.feed(b': "ping"}\n\ndata: a\ndata: b\n\nretry: 5\n\n', 2.0)
    assert [(e.event, e.data, e.arrived_s) for e in evs] == [("ping", '{"type": "ping"}', 2.0), (None, "a\nb", 2.0)]
    assert p.feed(b"data: x\r\n\r\n", 3.0)[0].data == "x" and p.crlf
    assert p.feed(b"data: \xff\n\n", 4.0)[0].data is None  # non-UTF-8 event kept, flagged by the probe
    p.feed(b"data: half", 5.0)
    assert p.rest() == b"data: half"


@pytest.mark.integration
def test_simulator_hang_is_a_timeout_never_a_schema_violation(tmp_path) -> None:
    """Issue 15: during a hang the probe's timeouts were counted as missing_terminator, and a
    StreamSchemaViolation ticket came 6 min before the hang page. A stream the probe stopped reading at its
    deadline says nothing about its terminator."""
    from tests.conftest import free_port
    from tests.procs import running, wait_http

    port = free_port()
    url = f"http://127.0.0.1:{port}"
    cmd = [PYTHON, "-m", "inferwatch.agent", "simulate", "--port", str(port), "--scenario", "hang", "--seed", "3"]
    with running(cmd, tmp_path / "sim.log", cwd=ROOT) as proc:
        wait_http(url + "/health", proc=proc)
        settings = load_settings(overrides={"probe": {"url": url, "protocols": list(PROTOCOLS), "timeout_s": 1.0}})
        collector = ProbeCollector(collect_context(settings), settings.probe)
        for _ in range(2):
            collection = validate(collector.collect())
        values = {(s.name, s.attributes): s.value for s in collection.samples}
        for p in PROTOCOLS:
            assert values[("inferwatch.probe.http_errors", (("error_type", "timeout"), ("protocol", p)))] == 2
            assert values[("inferwatch.probe.success", (("protocol", p),))] == 0
            violations = {
                k: v
                for k, v in values.items()
                if k[0] == "inferwatch.probe.schema_violations" and ("protocol", p) in k[1]
            }
            assert violations and set(violations.values()) == {0}, violations
        ids = {f.id for f in collection.findings}
        assert {"probe.openai.error", "probe.anthropic.error"} <= ids
        assert not any(i.endswith(".stream_schema") for i in ids), ids
