"""Acceptance against the real simulator (``inferwatch simulate``): each scenario gives exactly its finding.

stream_usage_only → empty_delta_with_usage counted in both protocols; hardware_mismatch → counted as
its own error type; debug_disabled → the empty-profile finding; debug answering with environment
production → its finding; a healthy simulator → none.
"""

from __future__ import annotations

import json
import os
import subprocess

import httpx
import pytest

from inferwatch.agent.config import ProfilingSettings, load_settings
from inferwatch.agent.node.actions.snapshots import SnapshotStore
from inferwatch.agent.node.collectors.probe import ProbeCollector
from inferwatch.agent.node.collectors.runtime_profile import RuntimeProfileCollector
from inferwatch.agent.node.runner import validate
from inferwatch.agent.node.wiring import collect_context
from tests.conftest import PYTHON, ROOT, free_port
from tests.procs import running, wait_http

CONTROL_TOKEN = "diag-sim-control-token-0123456789"
FAKE_HF_TOKEN = "hf_SIMULATEDsecretNOTREAL"


@pytest.fixture(scope="module")
def sim(tmp_path_factory):
    port = free_port()
    log = tmp_path_factory.mktemp("sim") / "sim.log"
    cmd = [
        PYTHON,
        "-m",
        "inferwatch.agent",
        "simulate",
        "--host",
        "127.0.0.1",
        "--port",
        str(port),
        "--hardware",
        "h100",
    ]
    cmd += ["--debug-profile", "--control-token", CONTROL_TOKEN, "--seed", "1"]
    with running(cmd, log, cwd=ROOT) as proc:
        base = f"http://127.0.0.1:{port}"
        wait_http(f"{base}/health", proc=proc, timeout_s=60)
        yield base


def scenarios(base: str, *names: str) -> None:
    r = httpx.post(
        f"{base}/control/scenario",
        json={"scenarios": list(names)},
        headers={"Authorization": f"Bearer {CONTROL_TOKEN}"},
        timeout=10,
    )
    assert r.status_code == 200, r.text


def settings(base: str, tmp_path, **extra):
    return load_settings(
        overrides={
            "probe": {"url": base, "protocols": ["openai", "anthropic"], "timeout_s": 20},
            "runtime_profile": {"url": f"{base}/debug/runtime_profile"},
            "snapshots": {"dir": str(tmp_path / "snap")},
            **extra,
        }
    )


def samples(collection) -> dict:
    return {(s.name, s.attributes): s.value for s in collection.samples}


def test_stream_usage_only_is_counted_in_both_protocols(sim, tmp_path) -> None:
    scenarios(sim, "stream_usage_only")
    s = settings(sim, tmp_path)
    col = validate(ProbeCollector(collect_context(s), s.probe).collect())
    v = samples(col)
    for p in ("openai", "anthropic"):
        counts = {
            a[0][1]: n for (name, a), n in v.items() if name.endswith("schema_violations") and ("protocol", p) in a
        }
        assert counts["empty_delta_with_usage"] >= 1, counts
        assert {k for k, n in counts.items() if n} == {"empty_delta_with_usage"}, counts
        assert v[("inferwatch.probe.success", (("protocol", p),))] == 0
    assert {f.id for f in col.findings} == {"probe.openai.stream_schema", "probe.anthropic.stream_schema"}


def test_hardware_mismatch_is_counted_as_such(sim, tmp_path) -> None:
    scenarios(sim, "hardware_mismatch")
    s = settings(sim, tmp_path)
    col = validate(ProbeCollector(collect_context(s), s.probe).collect())
    v = samples(col)
    for p in ("openai", "anthropic"):
        assert v[("inferwatch.probe.http_errors", (("error_type", "hardware_mismatch"), ("protocol", p)))] == 1
    assert [f.id for f in col.findings] == ["runtime.hardware_mismatch", "runtime.hardware_mismatch"]


def test_debug_disabled_gives_the_empty_profile_finding(sim, tmp_path) -> None:
    scenarios(sim, "debug_disabled")
    s = settings(sim, tmp_path)
    col = validate(RuntimeProfileCollector(collect_context(s), s.runtime_profile).collect())
    assert samples(col)[("inferwatch.runtime.profile.available", ())] == 0
    assert [(f.id, f.status) for f in col.findings] == [("runtime_profile.empty", "warn")]


def test_debug_in_production_gives_its_finding_and_redacts(sim, tmp_path) -> None:
    scenarios(sim)
    s = settings(sim, tmp_path, node={"environment": "production"})
    ctx = collect_context(s)
    col = validate(RuntimeProfileCollector(ctx, s.runtime_profile).collect())
    store = SnapshotStore(s.snapshots, ctx.profile_reader, ProfilingSettings(), dump_interval_s=60.0)
    store.on_record("runtime_profile", col)  # the agent's state listener
    assert ("runtime_profile.debug_in_production", "fail") in [(f.id, f.status) for f in col.findings]
    (snap,) = (tmp_path / "snap").glob("*.json")
    text = snap.read_text()
    assert FAKE_HF_TOKEN not in text and '"gpu_memory_used_bytes"' in text
    profile = json.loads(text)["profile"]
    assert profile["cpu_affinity_mask"].startswith("[REDACTED hmac:")
    assert profile["environment"].startswith("[REDACTED hmac:")


def test_healthy_simulator_gives_no_finding(sim, tmp_path) -> None:
    scenarios(sim)
    out = subprocess.run(
        [
            PYTHON,
            "-m",
            "inferwatch.agent",
            "doctor",
            "--json",
            "--engine-url",
            sim,
            "--profile-url",
            f"{sim}/debug/runtime_profile",
        ],
        cwd=ROOT,
        capture_output=True,
        text=True,
        timeout=120,
        env={**os.environ, "INFERWATCH_SNAPSHOTS__DIR": str(tmp_path / "snap")},
    )
    checks = json.loads(out.stdout)["checks"]
    runtime = {c["id"]: c["status"] for c in checks if c["id"].startswith(("probe", "runtime"))}
    assert runtime == {
        "probe.openai": "ok",
        "probe.anthropic": "ok",
        "runtime_profile.available": "ok",
        "runtime.binary": "ok",  # the simulator found by --engine-url's port (its Python resolves every library)
    }, checks


def test_agent_against_the_simulator_counts_and_keeps_serving(sim, tmp_path) -> None:
    scenarios(sim, "stream_usage_only")
    port = free_port()
    env = {
        "INFERWATCH_PROBE__URL": sim,
        "INFERWATCH_PROBE__PROTOCOLS": '["openai","anthropic"]',
        "INFERWATCH_PROBE__INTERVAL_S": "1",
        "INFERWATCH_RUNTIME_PROFILE__URL": f"{sim}/debug/runtime_profile",
        "INFERWATCH_SNAPSHOTS__DIR": str(tmp_path / "snap"),
    }
    cmd = [PYTHON, "-m", "inferwatch.agent", "run", "--port", str(port), "--interval", "1"]
    with running(cmd, tmp_path / "agent.log", cwd=ROOT, env=env) as proc:
        base = f"http://127.0.0.1:{port}"
        want = 'inferwatch_probe_schema_violations_total{kind="empty_delta_with_usage",protocol="anthropic"}'
        r = wait_http(f"{base}/metrics", ok=lambda r: want in r.text and f"{want} 0.0" not in r.text, proc=proc)
        assert "inferwatch_runtime_profile_available 1.0" in r.text
        scenarios(sim)
