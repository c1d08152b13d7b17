"""SIMD utilisation on real llama-server builds: the native (AVX-512) build is "used", the AVX2-only build
"unused", told apart while both serve, with and without glibc's own AVX-512 masked."""

from __future__ import annotations

import contextlib
import time
from pathlib import Path

import pytest

from inferwatch.agent.config import Settings
from inferwatch.agent.node.collectors.simd import SimdCollector
from inferwatch.agent.node.runner import run_collection
from inferwatch.agent.node.simd.analysis import FeatureReport, SimdAnalyzer
from inferwatch.agent.node.wiring import collect_context
from tests.llamacpp_server import GLIBC_NO_AVX512, LlamaServer, find_avx2_binary, llama_server, serving

pytestmark = [
    pytest.mark.integration,
    pytest.mark.skipif("avx512f" not in Path("/proc/cpuinfo").read_text(), reason="needs an AVX-512 x86 CPU"),
]
WINDOW_S = 2.0


def observe(*servers: LlamaServer) -> list[FeatureReport]:
    """Observe every server over the same window while each serves."""
    analyzers = [SimdAnalyzer(Path("/proc"), s.pid, busy_cpu=0.02) for s in servers]
    with contextlib.ExitStack() as stack:
        for s in servers:
            stack.enter_context(serving(s, n_predict=48))
        time.sleep(0.5)
        for a in analyzers:
            a.observe()
        time.sleep(WINDOW_S)
        reports = [a.observe()[0] for a in analyzers]
    return reports


def _env(masked: bool) -> dict[str, str]:
    return {"GLIBC_TUNABLES": GLIBC_NO_AVX512 if masked else ""}


@pytest.mark.parametrize("masked", [True, False], ids=["glibc-avx512-masked", "glibc-default"])
def test_native_build_uses_avx512_while_serving(
    llama_bin: Path, llama_models: dict[str, Path], tmp_path: Path, masked: bool
) -> None:
    with llama_server(llama_bin, llama_models["small"], tmp_path / "s.log", env=_env(masked)) as server:
        (r,) = observe(server)
    assert r.serving, r
    assert (r.verdict, r.used) == ("used", True), r.summary
    assert r.code_instructions > 10_000
    assert any("libggml-cpu" in p for p in r.evidence["code_by_file"])
    assert r.threads_active and r.threads_active >= 1
    assert r.attributable is masked
    if masked:  # only compute threads show AVX-512: the HTTP and log threads stay at -1
        assert r.threads_active < r.threads_total


def test_collector_reports_used_on_the_native_build(
    llama_bin: Path, llama_models: dict[str, Path], tmp_path: Path
) -> None:
    with llama_server(llama_bin, llama_models["small"], tmp_path / "s.log", env=_env(True)) as server:
        settings = Settings.from_values(dict(runtime={"pid": server.pid}, simd={"busy_cpu_cores": 0.02}))
        collector = SimdCollector(collect_context(settings), settings.simd)
        try:
            with serving(server, n_predict=48):
                time.sleep(0.5)
                run_collection(collector)
                time.sleep(WINDOW_S)
                result = run_collection(collector)  # validated against the catalog
        finally:
            collector.close()
    values = {s.name: s.value for s in result.samples}
    assert values["inferwatch.runtime.simd.used"] == 1
    assert values["inferwatch.runtime.simd.code_present"] == 1
    assert values["inferwatch.runtime.simd.attributable"] == 1
    assert result.findings[0].status == "ok"


@pytest.fixture(scope="module")
def avx2_bin() -> Path:
    binary = find_avx2_binary()
    if binary is None:
        # On an AVX-512 CPU (this module's marker) the test command builds it: absence is a failure.
        pytest.fail(
            "AVX2-only llama-server not built: scripts/test.sh builds it on AVX-512 CPUs"
            " (scripts/build-llama-server.sh --avx2-only ~/.cache/inferwatch/llama-avx2)",
            pytrace=False,
        )
    return binary


@pytest.mark.parametrize("masked", [True, False], ids=["glibc-avx512-masked", "glibc-default"])
def test_native_and_avx2_builds_told_apart_while_serving(
    llama_bin: Path, avx2_bin: Path, llama_models: dict[str, Path], tmp_path: Path, masked: bool
) -> None:
    model = llama_models["small"]
    with (
        llama_server(llama_bin, model, tmp_path / "native.log", env=_env(masked), threads=1, parallel=1) as native,
        llama_server(avx2_bin, model, tmp_path / "avx2.log", env=_env(masked), threads=1, parallel=1) as avx2,
    ):
        r_native, r_avx2 = observe(native, avx2)
    assert r_native.serving and r_avx2.serving
    assert (r_native.verdict, r_native.used) == ("used", True), r_native.summary
    assert (r_avx2.verdict, r_avx2.used) == ("unused", False), r_avx2.summary
    assert r_avx2.code_instructions == 0 < r_native.code_instructions
    if masked:  # with glibc's AVX-512 masked no thread of the AVX2 build ever touches AVX-512 state
        assert r_avx2.threads_active == 0
