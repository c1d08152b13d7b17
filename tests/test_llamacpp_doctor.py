"""``inferwatch doctor --engine-url`` on real llama-server builds: engine checks and the SIMD verdict."""

from __future__ import annotations

import json
import subprocess
from pathlib import Path

import pytest

from tests.conftest import PYTHON, ROOT
from tests.llamacpp_server import find_avx2_binary, llama_server

pytestmark = pytest.mark.integration


def doctor(url: str) -> dict[str, dict[str, object]]:
    proc = subprocess.run(
        [PYTHON, "-m", "inferwatch.agent", "doctor", "--engine-url", url, "--json"],
        cwd=ROOT,
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert proc.returncode in (0, 1), proc.stderr
    return {c["id"]: c for c in json.loads(proc.stdout)["checks"]}


def test_doctor_engine_checks_on_the_native_build(
    llama_bin: Path, llama_models: dict[str, Path], tmp_path: Path
) -> None:
    with llama_server(llama_bin, llama_models["small"], tmp_path / "s.log") as server:
        checks = doctor(server.url)
    assert checks["engine.reachable"]["status"] == "ok"
    assert checks["engine.kind"]["evidence"] == {"kind": "llamacpp"}
    assert checks["engine.metrics"]["status"] == "ok"
    assert set(checks["engine.quantities"]["evidence"]["absent"]) == {"ttft", "itl", "e2e", "queue"}  # type: ignore[index]
    if "avx512f" in Path("/proc/cpuinfo").read_text():
        assert checks["simd.avx512"]["status"] == "ok", checks["simd.avx512"]
        assert checks["simd.avx512"]["evidence"]["verdict"] == "used"  # type: ignore[index]


def test_doctor_fails_metrics_without_the_flag_and_unreachable(
    llama_bin: Path, llama_models: dict[str, Path], tmp_path: Path
) -> None:
    with llama_server(llama_bin, llama_models["tiny"], tmp_path / "s.log", metrics=False) as server:
        checks = doctor(server.url)
        url = server.url
    assert checks["engine.metrics"]["status"] == "fail"
    assert "--metrics" in str(checks["engine.metrics"]["evidence"])
    gone = doctor(url)  # the server is stopped now
    assert gone["engine.reachable"]["status"] == "fail"


def test_doctor_flags_the_avx2_build(llama_models: dict[str, Path], tmp_path: Path) -> None:
    if "avx512f" not in Path("/proc/cpuinfo").read_text():
        pytest.skip("needs an AVX-512 x86 CPU (the AVX2-only build is the contrast)")
    avx2 = find_avx2_binary()
    if avx2 is None:  # the test command builds it on AVX-512 CPUs
        pytest.fail("AVX2-only llama-server not built: scripts/test.sh builds it on AVX-512 CPUs", pytrace=False)
    with llama_server(avx2, llama_models["small"], tmp_path / "s.log") as server:
        checks = doctor(server.url)
    simd = checks["simd.avx512"]
    assert simd["status"] == "warn" and simd["runbook"] == "SIMDUnusedWhileServing", simd
    assert simd["evidence"]["code_instructions"] == 0  # type: ignore[index]
