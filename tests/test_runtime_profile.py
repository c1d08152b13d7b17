"""runtime_profile snapshots against a real HTTP runtime: states, findings, bad input, the ring."""

from __future__ import annotations

import json
import re

import httpx
import pytest
from prometheus_client.parser import text_string_to_metric_families

from inferwatch.agent.config import ProfilingSettings, SnapshotSettings, load_settings
from inferwatch.agent.errors import StorageError
from inferwatch.agent.node.actions.ring import FileRing
from inferwatch.agent.node.actions.snapshots import SnapshotStore
from inferwatch.agent.node.collectors.runtime_profile import RuntimeProfileCollector
from inferwatch.agent.node.runner import validate
from inferwatch.agent.node.wiring import collect_context
from tests.conftest import PYTHON, ROOT, free_port
from tests.fake_runtime import fake_runtime
from tests.procs import running, wait_http


@pytest.fixture(scope="module")
def rt():
    with fake_runtime() as runtime:
        yield runtime


def collector(rt, tmp_path, **extra):
    overrides = {
        "runtime_profile": {"url": f"{rt.url}/debug/runtime_profile", "timeout_s": 1.0, "max_bytes": 1 << 20},
        "snapshots": {"dir": str(tmp_path / "snap"), "max_count": 3},
        **extra,
    }
    settings = load_settings(overrides=overrides)
    return RuntimeProfileCollector(collect_context(settings), settings.runtime_profile)


def values(collection):
    return {(s.name, s.attributes): s.value for s in collection.samples}


def test_available_profile_is_redacted_stored_and_gauged(rt, tmp_path) -> None:
    rt.profile_mode = "debug"
    c = collector(rt, tmp_path)
    col = validate(c.collect())
    snapshots = SnapshotSettings(dir=tmp_path / "snap", max_count=3)
    store = SnapshotStore(snapshots, c.ctx.profile_reader, ProfilingSettings(), dump_interval_s=60.0)
    store.on_record(c.name, col)  # the agent's state listener
    v = values(col)
    assert v[("inferwatch.runtime.profile.available", ())] == 1
    assert v[("inferwatch.runtime.profile.value", (("field", "gpu_memory_used_bytes"),))] == 123456789
    assert v[("inferwatch.runtime.profile.value", (("field", "num_running_requests"),))] == 3
    assert [f.id for f in col.findings] == ["runtime_profile.available"]
    assert col.findings[0].runbook == ""  # nothing to do: no runbook link on the status page
    (entry,) = FileRing(tmp_path / "snap", 3, 1 << 20).entries()
    snap = json.loads(entry.path.read_text())
    assert snap["profile"]["engine"] == "fake"
    assert snap["profile"]["cpu_affinity_mask"].startswith("[REDACTED hmac:")
    assert "0-63" not in entry.path.read_text()
    assert snap["meta"]["redacted_paths"] == ["cpu_affinity_mask"]
    assert snap["enrichment"]["runtime_process"]["absent"].startswith("no runtime process configured")


def test_debug_disabled_gives_empty_profile_finding_saying_how_to_enable(rt, tmp_path) -> None:
    rt.profile_mode = "disabled"
    col = validate(collector(rt, tmp_path).collect())
    assert values(col)[("inferwatch.runtime.profile.available", ())] == 0
    (f,) = col.findings
    assert f.id == "runtime_profile.empty" and f.status == "warn"
    assert "at start" in f.summary and "--debug-profile" in f.summary


def test_debug_answering_in_production_is_a_finding(rt, tmp_path) -> None:
    rt.profile_mode = "debug"
    col = validate(collector(rt, tmp_path, node={"environment": "production"}).collect())
    ids = {f.id: f.status for f in col.findings}
    assert ids == {"runtime_profile.available": "ok", "runtime_profile.debug_in_production": "fail"}
    rt.profile_mode = "disabled"
    col = validate(collector(rt, tmp_path, node={"environment": "production"}).collect())
    assert "runtime_profile.debug_in_production" not in {f.id for f in col.findings}


def test_header_is_required_by_the_runtime(rt, tmp_path) -> None:
    rt.profile_mode = "debug"
    c = collector(rt, tmp_path, runtime_profile={"url": f"{rt.url}/debug/runtime_profile", "header": "X-Other: 1"})
    assert values(validate(c.collect()))[("inferwatch.runtime.profile.available", ())] == 0


@pytest.mark.parametrize(
    ("mode", "reason"), [("oversized", "oversized"), ("not_json", "not_json"), ("hang", "timeout")]
)
def test_bad_profiles_are_counted_errors(rt, tmp_path, mode, reason) -> None:
    rt.profile_mode = mode
    c = collector(rt, tmp_path)
    for _ in range(2):
        col = validate(c.collect())
    v = values(col)
    assert v[("inferwatch.runtime.profile.fetch.errors", (("reason", reason),))] == 2
    assert ("inferwatch.runtime.profile.available", ()) not in v
    (f,) = col.findings
    assert f.id == "runtime_profile.fetch" and f.status == "fail" and f.evidence["reason"] == reason
    assert f.runbook == "RuntimeProfileUnavailable"  # a served runbook: the status page links runbooks/<name>


def test_ring_is_bounded_by_count_and_bytes(tmp_path) -> None:
    ring = FileRing(tmp_path / "r", max_count=3, max_bytes=250)
    ids = [ring.put(b"x" * 60, ".json").id for _ in range(5)]
    assert [e.id for e in ring.entries()] == ids[-3:]
    ring.put(b"y" * 200, ".json")
    assert sum(e.size_bytes for e in ring.entries()) <= 250
    with pytest.raises(StorageError, match="budget"):
        ring.put(b"z" * 251, ".json")
    assert ring.get("../../etc/passwd") is None


def test_agent_keeps_serving_with_bad_profile_and_cut_stream(rt, tmp_path) -> None:
    rt.profile_mode = "not_json"
    rt.stream_mode = "cut"
    port = free_port()
    env = {
        "INFERWATCH_RUNTIME_PROFILE__URL": f"{rt.url}/debug/runtime_profile",
        "INFERWATCH_RUNTIME_PROFILE__INTERVAL_S": "0.5",
        "INFERWATCH_PROBE__URL": rt.url,
        "INFERWATCH_PROBE__INTERVAL_S": "0.5",
        "INFERWATCH_PROBE__PROTOCOLS": '["openai","anthropic"]',
        "INFERWATCH_SNAPSHOTS__DIR": str(tmp_path / "snap"),
    }
    cmd = [PYTHON, "-m", "inferwatch.agent", "run", "--port", str(port), "--interval", "0.5"]
    with running(cmd, tmp_path / "agent.log", cwd=ROOT, env=env) as proc:
        base = f"http://127.0.0.1:{port}"
        wait_http(f"{base}/readyz", ok=lambda r: r.status_code == 200, proc=proc)

        def scrape() -> dict:
            text = httpx.get(f"{base}/metrics").text
            return {
                (s.name, tuple(sorted(s.labels.items()))): s.value
                for f in text_string_to_metric_families(text)
                for s in f.samples
            }

        def not_json_errors(r: httpx.Response) -> float:
            found = re.search(
                r'^inferwatch_runtime_profile_fetch_errors_total\{reason="not_json"\} (\S+)$', r.text, re.M
            )
            return float(found.group(1)) if found else 0.0

        # at least two reads failed (not exactly two: on a busy machine a scrape can come after the third)
        wait_http(f"{base}/metrics", ok=lambda r: not_json_errors(r) >= 2, proc=proc)
        m = scrape()
        for p in ("openai", "anthropic"):
            assert (
                m[("inferwatch_probe_schema_violations_total", (("kind", "missing_terminator"), ("protocol", p)))] >= 1
            )
        status = httpx.get(f"{base}/api/v1/status").json()
        states = {c["name"]: c["state"] for c in status["collectors"]}
        assert states["runtime_profile"] == "ok" and states["probe"] == "ok"
        assert {"runtime_profile.fetch", "probe.openai.stream_schema"} <= {f["id"] for f in status["findings"]}
        rt.profile_mode = "debug"  # recovers without a restart
        wait_http(f"{base}/metrics", ok=lambda r: "inferwatch_runtime_profile_available 1.0" in r.text, proc=proc)
        assert httpx.get(f"{base}/healthz").status_code == 200
        # no token configured (loopback): anonymous read only; snapshots and profiles need a token
        assert httpx.get(f"{base}/api/v1/snapshots").status_code == 401
        assert httpx.post(f"{base}/api/v1/profiles", json={"duration_s": 1}).status_code == 401


@pytest.mark.parametrize(
    ("profile", "expected"),
    [
        (
            {"simd_features_compiled": ["avx2", "avx512f"], "simd_features_active": ["avx2"]},
            {"avx2": 0.0, "avx512f": 1.0},
        ),
        ({"simd_features_compiled": ["sve"], "simd_features_active": ["sve", "asimd"]}, {"sve": 0.0}),
        ({"simd_features_compiled": ["avx2"]}, {}),  # no active list: no verdict
        ({"simd_features_compiled": "avx2", "simd_features_active": []}, {}),  # not a list
        ({"simd_features_compiled": ["avx2", 3], "simd_features_active": []}, {}),  # not strings
        ({"simd_features_compiled": ["[REDACTED hmac:0123456789abcdef]"], "simd_features_active": []}, {}),  # too long
        ([], {}),
        (None, {}),
    ],
)
def test_simd_inactive_reads_only_the_documented_shape(profile: object, expected: dict) -> None:
    from inferwatch.agent.node.collectors.runtime_profile import simd_inactive

    assert simd_inactive(profile) == expected
