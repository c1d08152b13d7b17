"""``inferwatch doctor --engine-url --profile-url`` against a real HTTP runtime."""

from __future__ import annotations

import json
import os
import subprocess

import pytest

from inferwatch.agent.common.samples import Finding
from inferwatch.agent.config import load_settings
from inferwatch.agent.doctor.checks import DoctorRequest, check_id, doctor_overrides, exit_code, run_checks
from inferwatch.agent.node.collectors import REGISTRY
from inferwatch.agent.node.wiring import build_deps
from tests import engine_server as es
from tests.conftest import PYTHON, ROOT, free_port
from tests.fake_runtime import fake_runtime

FIXTURES = ROOT / "tests" / "fixtures" / "engines"


def doctor(*args: str) -> dict[str, dict]:
    out = subprocess.run(
        [PYTHON, "-m", "inferwatch.agent", "doctor", "--json", *args],
        cwd=ROOT,
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert out.returncode in (0, 1), out.stderr
    return {c["id"]: c for c in json.loads(out.stdout)["checks"]}


def test_doctor_runtime_checks() -> None:
    with fake_runtime() as rt:
        profile_url = f"{rt.url}/debug/runtime_profile"
        healthy = doctor("--engine-url", rt.url, "--profile-url", profile_url)
        assert healthy["probe.openai"]["status"] == "ok" and healthy["probe.anthropic"]["status"] == "ok"
        assert healthy["runtime_profile.available"]["status"] == "ok"
        # No runtime.* configured: the binary check finds the runtime as the SIMD check does, by the engine
        # URL's port; the fake runtime listens in this test process (a Python interpreter, every library there).
        binary = healthy["runtime.binary"]
        assert binary["status"] == "ok" and binary["evidence"]["pid"] == os.getpid(), binary

        rt.stream_mode, rt.profile_mode = "usage_only", "disabled"
        bad = doctor("--engine-url", rt.url, "--profile-url", profile_url)
        for p in ("openai", "anthropic"):
            f = bad[f"probe.{p}.stream_schema"]
            assert f["status"] == "fail" and f["evidence"]["violations"] == {
                "empty_delta_with_usage": f["evidence"]["violations"]["empty_delta_with_usage"]
            }
            assert ".json#/" in f["summary"]  # names the schema path
        assert bad["runtime_profile.empty"]["status"] == "warn"
        assert "--debug-profile" in bad["runtime_profile.empty"]["evidence"]["hint"]

        rt.stream_mode = "hardware_mismatch"
        hw = doctor("--engine-url", rt.url)
        assert hw["runtime.hardware_mismatch"]["status"] == "fail"
        assert hw["runtime.profile"]["status"] == "skip"


def test_doctor_names_the_prefixes_of_an_unknown_engine_as_engine_inspect_does() -> None:
    """issue 14: a valid exposition of no known engine is "no known engine families; prefixes seen: …"."""
    from tests import engine_server as es

    text = "# TYPE my_server_requests counter\nmy_server_requests 3\nother:queue_depth 1\n"
    with es.EngineServer({"/metrics": es.body(text)}) as srv:
        kind = doctor("--engine-url", srv.url("/metrics"))["engine.kind"]
        inspect = subprocess.run(
            [PYTHON, "-m", "inferwatch.agent", "engine", "inspect", "--metrics-url", srv.url("/metrics")],
            cwd=ROOT,
            capture_output=True,
            text=True,
            timeout=120,
        )
    assert kind["status"] == "warn"
    assert kind["summary"].startswith("no known engine families; prefixes seen: my_, other:"), kind
    assert kind["summary"] in inspect.stderr and kind["evidence"]["reason"] == "unknown_engine"


def _run_doctor(url: str | None = None, **collectors: dict) -> dict[str, Finding]:
    """The doctor in-process, as the CLI builds it; ``collectors``: ``collectors.NAME`` settings."""
    overrides = {**doctor_overrides(url, None), "collectors": collectors}
    deps = build_deps(load_settings(overrides=overrides, collectors=REGISTRY), persist_key=False)
    return {f.id: f for f in run_checks(deps, DoctorRequest((), url))}


def test_doctor_runs_every_registered_collector_and_skips_the_disabled() -> None:
    """issue 13: the registry decides what the doctor runs; a disabled collector is a skip, never run."""
    checks = _run_doctor(gpu={"enabled": False})
    for name in REGISTRY:
        cid = check_id(name)
        assert cid in checks or any(i.startswith(f"{name}.") or i.startswith(f"{cid}.") for i in checks), name
    assert checks["gpu"].status == "skip" and checks["gpu"].summary == "collector gpu is disabled"
    assert checks["gpu"].evidence["hint"] == "collectors.gpu.enabled: true"
    assert checks["process"].status == "skip" and "runtime.pid" in checks["process"].evidence["hint"]
    assert checks["engine"].status == "skip" and "--engine-url" in checks["engine"].evidence["hint"]
    profile = checks["runtime.profile"]
    assert profile.summary == "runtime_profile.url is not set: collector runtime_profile is off"
    assert profile.evidence["hint"] == "pass --profile-url URL (or set runtime_profile.url)"


@pytest.mark.parametrize(
    ("fixture", "status", "missing", "absent"),
    [
        ("llamacpp-synthetic-a.prom", "ok", [], ["ttft", "itl", "e2e", "queue"]),
        ("vllm-v1-dp2-synthetic.prom", "ok", [], []),
        (
            "sglang-0.5.10.post1.prom",
            "warn",
            [
                "sglang:num_aborted_requests_total",
                "sglang:num_retracted_requests_total",
                "sglang:per_stage_req_latency_seconds",
            ],
            None,
        ),
    ],
)
def test_doctor_engine_checks_read_the_engine_collectors_one_scrape(
    fixture: str, status: str, missing: list[str], absent: list[str] | None
) -> None:
    """The engine rows come from the engine collector's run: /metrics is fetched once, by the collector, and the
    families a quantity misses are the adapter's own."""
    text = (FIXTURES / fixture).read_text()
    with es.EngineServer({"/metrics": es.body(text)}) as srv:
        checks = _run_doctor(srv.url(""), probe={"enabled": False}, simd={"enabled": False})
        fetched = [path for _, path in srv.requests]
    assert fetched.count("/metrics") == 1, fetched  # the collector's scrape; the doctor fetches nothing itself
    kind = fixture.split("-")[0]
    assert checks["engine.reachable"].status == "ok" and checks["engine.kind"].evidence == {"kind": kind}
    metrics = checks["engine.metrics"]
    assert metrics.status == status, metrics
    assert metrics.evidence["missing"] == missing
    if absent is not None:
        assert checks["engine.quantities"].evidence["absent"] == absent
    assert checks["runtime.probe"].summary == "collector probe is disabled"


def test_doctor_engine_failures_come_from_the_collector() -> None:
    with es.EngineServer({"/metrics": es.status(501)}) as srv:
        checks = _run_doctor(srv.url(""), probe={"enabled": False}, simd={"enabled": False})
    assert checks["engine.reachable"].status == "ok"
    metrics = checks["engine.metrics"]
    assert metrics.status == "fail" and metrics.evidence["reason"] == "http_status" and "HTTP 501" in metrics.summary
    assert "--metrics" in metrics.evidence["hint"]
    gone = _run_doctor(f"http://127.0.0.1:{free_port()}", probe={"enabled": False}, simd={"enabled": False})
    reachable = gone["engine.reachable"]
    assert reachable.status == "fail" and reachable.evidence["reason"] == "connect", reachable
    assert exit_code(list(gone.values())) == 1
