"""benchmarks/gpu_real.py without a GPU: it says why it cannot run and exits 2 at once (no torch import), and its
orchestration (phases, nvidia-smi comparison, attribution, the separation figures) runs on the fake NVML with a
fake torch worker, so the script is ready for the day a GPU is lent."""

from __future__ import annotations

import importlib.util
import json
import subprocess
import time
from pathlib import Path
from types import ModuleType
from typing import Any

import pytest

from inferwatch.agent.node.host.nvml import GpuProcess, ProcessUtilization
from tests.conftest import PYTHON, ROOT
from tests.fake_nvml import FakeGPU, FakeNVML

SCRIPT = ROOT / "benchmarks" / "gpu_real.py"
# nvidia-smi --query-gpu=index,uuid,utilization.gpu,utilization.memory,memory.used,memory.total,clocks.sm,power.draw,
# temperature.gpu --format=csv,noheader,nounits, in the shape the driver prints it (one GPU, one field not available)
SMI_LINE = "0, GPU-00000000-0000-0000-0000-000000000000, 100, 41, 71680, 81559, 1980, 612.34, [N/A]"


def _load() -> ModuleType:
    spec = importlib.util.spec_from_file_location("gpu_real", SCRIPT)
    assert spec is not None and spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def test_without_a_driver_it_says_why_and_exits_2_fast() -> None:
    began = time.monotonic()
    r = subprocess.run([PYTHON, str(SCRIPT)], cwd=ROOT, capture_output=True, text=True, timeout=60)
    if r.returncode == 0:  # pragma: no cover - a host with a GPU ran it
        pytest.skip("this host has a GPU: the benchmark ran")
    assert r.returncode == 2, r.stderr
    assert "cannot run here: no NVIDIA driver on this host" in r.stderr and "Nothing measured" in r.stderr
    assert time.monotonic() - began < 20


def test_nvidia_smi_rows_and_the_comparison() -> None:
    g = _load()
    rows = g.parse_smi_csv(SMI_LINE + "\n")
    assert rows == [
        {
            "index": 0.0,
            "uuid": "GPU-00000000-0000-0000-0000-000000000000",
            "utilization.gpu": 100.0,
            "utilization.memory": 41.0,
            "memory.used": 71680.0,
            "memory.total": 81559.0,
            "clocks.sm": 1980.0,
            "power.draw": 612.34,
        }
    ]
    cmp = g.compare({"utilization.gpu": 87.0, "power.draw": 612.345, "temperature.gpu": 71.0}, rows[0])
    assert cmp["utilization.gpu"] == {"agent": 87.0, "nvidia_smi": 100.0, "diff": -13.0}
    assert "temperature.gpu" not in cmp  # nvidia-smi had no value: nothing to compare


def test_separation_figures() -> None:
    g = _load()
    phases = {
        "matmul": {"utilization.gpu": 100.0, "sm_activity": 95.0, "tensor_activity": 70.0, "dram_bandwidth": 30.0},
        "copy": {"utilization.gpu": 100.0, "sm_activity": 40.0, "tensor_activity": 0.0, "dram_bandwidth": 90.0},
    }
    s = g.separation(phases)
    assert s["busy_flag_alike"] and s["tensor_tells_matmul"] and s["dram_tells_copy"]
    phases["copy"]["tensor_activity"] = 60.0
    assert not g.separation(phases)["tensor_tells_matmul"]


class FakeWorker:
    """The torch worker's protocol (idle | matmul | copy | report | quit) without torch."""

    pid = 31337
    memory_reserved = 3 * 2**30

    def __init__(self) -> None:
        self.mode = "idle"
        self.sent: list[str] = []

    def send(self, cmd: str) -> None:
        self.sent.append(cmd)
        if cmd in ("idle", "matmul", "copy"):
            self.mode = cmd

    def report(self) -> dict[str, Any]:
        rate = {"matmul": 700.0, "copy": 3900.0}.get(self.mode, 0.0)
        return {"mode": self.mode, "iters": 10, "seconds": 0.1, "rate": rate}

    def close(self) -> None:
        self.sent.append("quit")


def test_the_whole_run_on_fakes(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    g = _load()
    import inferwatch.agent.node.wiring as wiring

    gpu = FakeGPU(
        processes=[GpuProcess(FakeWorker.pid, 4 * 2**30)],
        process_samples=[ProcessUtilization(FakeWorker.pid, 10**18, 99, 20)],
    )
    fake = FakeNVML([gpu])
    real_context = wiring.collect_context
    monkeypatch.setattr(wiring, "collect_context", lambda settings: real_context(settings, nvml=fake))
    monkeypatch.setattr(g, "preflight", lambda: None)
    monkeypatch.setattr(g, "Worker", FakeWorker)
    monkeypatch.setattr(g, "smi", lambda: g.parse_smi_csv(SMI_LINE))
    monkeypatch.setattr(g, "smi_apps", lambda: [{"pid": "31337", "gpu_uuid": gpu.uuid, "used_memory_mib": "4096"}])
    monkeypatch.setattr(g, "WARMUP_S", 0.0)
    monkeypatch.setattr(g, "SAMPLE_EVERY_S", 0.05)
    out = tmp_path / "gpu_real.json"
    assert g.main(["--out", str(out), "--phase-s", "0.2", "--rounds", "0"]) == 0
    result = json.loads(out.read_text())
    assert [p["phase"] for p in result["phases"]] == ["idle", "matmul", "copy"]
    matmul = result["phases"][1]
    assert matmul["agent"]["tensor_activity"] == pytest.approx(18.0)  # the fake Hopper's GPM, in percent
    assert matmul["agent_vs_nvidia_smi"]["power.draw"]["diff"] == pytest.approx(0.0, abs=0.01)
    assert matmul["gpm_status"] == "sampling" and matmul["throughput"]["rate"] == 700.0
    attributed = {p["metric"] for p in matmul["worker_process_series"]}
    assert {"inferwatch.gpu.process.memory.usage", "inferwatch.gpu.process.sm.activity"} <= attributed
    assert result["nvidia_smi_compute_apps"][0]["pid"] == "31337"
    assert result["overhead"]["with_over_without"] is None  # --rounds 0: no agent started
    assert not fake.gpm_live  # the collector was closed
