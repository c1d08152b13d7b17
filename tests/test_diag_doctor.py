"""``inferwatch doctor --engine-url --profile-url`` against a real HTTP runtime."""

from __future__ import annotations

import json
import os
import subprocess

from tests.conftest import PYTHON, ROOT
from tests.fake_runtime import fake_runtime


def doctor(*args: str) -> dict[str, dict]:
    out = subprocess.run(
        [PYTHON, "-m", "agent", "doctor", "--json", *args], cwd=ROOT, capture_output=True, text=True, timeout=120
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
            [PYTHON, "-m", "agent", "engine", "inspect", "--metrics-url", srv.url("/metrics")],
            cwd=ROOT,
            capture_output=True,
            text=True,
            timeout=120,
        )
    assert kind["status"] == "warn"
    assert kind["summary"].startswith("no known engine families; prefixes seen: my_, other:"), kind
    assert kind["summary"] in inspect.stderr and kind["evidence"]["reason"] == "unknown_engine"
