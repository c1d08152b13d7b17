"""GPU collector through the NVML client boundary: a fake client for values, the real pynvml for absence."""

from __future__ import annotations

import json
import subprocess
import uuid
from pathlib import Path

import pytest

from agent.collectors.gpu import GPUCollector
from agent.config import load_settings
from agent.doctor import check_collector
from agent.errors import CollectorError, NoDataError
from agent.host.nvml import GpuProcess, PynvmlClient
from agent.runner import validate
from agent.wiring import build_deps, collect_context
from tests.conftest import PYTHON, ROOT
from tests.fake_nvml import FakeGPU, FakeNVML
from tests.procs import running


def _collector(nvml: object, **runtime: object) -> GPUCollector:
    settings = load_settings(overrides={"runtime": runtime} if runtime else None)
    return GPUCollector(collect_context(settings, nvml=nvml))


def test_values_are_converted_to_base_units_per_device() -> None:
    gpus = [
        FakeGPU(uuid="GPU-a", reasons=0x1 | 0x4, processes=[GpuProcess(4242, 60 * 2**30), GpuProcess(7, None)]),
        FakeGPU(uuid="GPU-b", name="NVIDIA L4", unsupported={"power_milliwatts", "temperature_celsius"}),
    ]
    result = validate(_collector(FakeNVML(gpus)).collect())
    v = {(s.name, s.attributes): s.value for s in result.samples}
    a = (("hw.id", "GPU-a"), ("hw.model", "NVIDIA H100 80GB HBM3"))
    b = (("hw.id", "GPU-b"), ("hw.model", "NVIDIA L4"))
    assert v[("hw.gpu.utilization", a)] == pytest.approx(0.87)
    assert v[("hw.gpu.memory.usage", a)] == 70 * 2**30 and v[("hw.gpu.memory.limit", a)] == 80 * 2**30
    assert v[("inferwatch.gpu.clock.sm", a)] == pytest.approx(1.98e9)
    assert v[("inferwatch.gpu.power", a)] == pytest.approx(612.345)
    assert v[("inferwatch.gpu.temperature", a)] == 71.0
    assert v[("inferwatch.gpu.throttle", (*a, ("reason", "sw_power_cap")))] == 1
    assert v[("inferwatch.gpu.throttle", (*a, ("reason", "hw_slowdown")))] == 0
    # No runtime configured: every compute process with attributable memory is reported.
    assert v[("inferwatch.gpu.process.memory.usage", (*a, ("pid", "4242")))] == 60 * 2**30
    assert not [k for k in v if k[0] == "inferwatch.gpu.process.memory.usage" and ("pid", "7") in k[1]]
    # An unsupported value is skipped, not an error; the rest of the device still reports.
    assert ("inferwatch.gpu.power", b) not in v and ("hw.gpu.utilization", b) in v
    assert result.details["gpu1.unsupported"] == ["power", "temperature"]
    findings = {f.id: f.status for f in result.findings}
    assert findings == {"gpu0.throttle": "fail", "gpu1.throttle": "ok"}


def test_process_memory_is_limited_to_the_runtime_process_tree(tmp_path: Path) -> None:
    marker = uuid.uuid4().hex
    cmd = [PYTHON, "-c", "import time; time.sleep(60)", f"fake-runtime-{marker}"]
    with running(cmd, tmp_path / "rt.log") as proc:
        import time

        import psutil

        deadline = time.monotonic() + 10
        while time.monotonic() < deadline and cmd[-1] not in psutil.Process(proc.pid).cmdline():
            time.sleep(0.01)
        gpus = [FakeGPU(processes=[GpuProcess(proc.pid, 2**30), GpuProcess(1, 5 * 2**30)])]
        result = validate(_collector(FakeNVML(gpus), cmdline_pattern=f"fake-runtime-{marker}").collect())
    pids = {dict(s.attributes)["pid"] for s in result.samples if s.name == "inferwatch.gpu.process.memory.usage"}
    assert pids == {str(proc.pid)}


def test_no_gpu_and_no_driver_are_expected_absence() -> None:
    with pytest.raises(NoDataError, match="no GPU"):
        _collector(FakeNVML([])).collect()
    # The real nvidia-ml-py on this GPU-less host: NVMLError_LibraryNotFound becomes absence with a hint.
    # nvidia-ml-py is a dependency of the package: PynvmlClient imports it, and a missing one fails here.
    real = PynvmlClient()
    try:
        real.init()
    except NoDataError as exc:
        assert "libnvidia-ml.so.1" in exc.hint
    else:  # pragma: no cover - a host with a driver
        real.shutdown()
        pytest.skip("this host has an NVIDIA driver")


def test_lost_gpu_is_a_failure_not_absence() -> None:
    with pytest.raises(CollectorError):
        _collector(FakeNVML([FakeGPU(broken=CollectorError("NVML nvmlDeviceGetName failed: GPU is lost"))])).collect()


def test_close_shuts_nvml_down() -> None:
    fake = FakeNVML([FakeGPU()])
    c = _collector(fake)
    c.collect()
    c.collect()
    c.close()
    assert fake.inits == 2 and fake.shutdowns == 1


def test_doctor_gpu_check_with_fake_and_real_nvml() -> None:
    settings = load_settings()
    fake = FakeNVML([FakeGPU(reasons=0x40), FakeGPU(uuid="GPU-ok")])
    findings = check_collector(build_deps(settings, nvml=fake), "gpu")
    assert [(f.id, f.status) for f in findings] == [("gpu0.throttle", "fail"), ("gpu1.throttle", "ok")]
    assert "hw_thermal_slowdown" in findings[0].summary and fake.shutdowns == 1
    r = subprocess.run(
        [PYTHON, "-m", "agent", "doctor", "--json"], cwd=ROOT, capture_output=True, text=True, timeout=60
    )
    gpu = next(c for c in json.loads(r.stdout)["checks"] if c["id"].startswith("gpu"))
    if gpu["id"] == "gpu":  # no driver here: skipped with the hint, never failed
        assert gpu["status"] == "skip" and "hint" in gpu["evidence"]


def test_pynvml_client_translates_calls_units_and_errors() -> None:
    """The real PynvmlClient over a stand-in module that raises pynvml's own error classes."""
    import types

    import pynvml

    def not_supported(*_a: object) -> None:
        raise pynvml.NVMLError_NotSupported()

    def lost(*_a: object) -> None:
        raise pynvml.NVMLError(pynvml.NVML_ERROR_GPU_IS_LOST)

    module = types.SimpleNamespace(
        **{n: getattr(pynvml, n) for n in dir(pynvml) if n.startswith("NVMLError") or n.startswith("NVML_")},
        nvmlInit=lambda: None,
        nvmlShutdown=lambda: None,
        nvmlDeviceGetCount=lambda: 1,
        nvmlDeviceGetHandleByIndex=lambda i: f"h{i}",
        nvmlDeviceGetName=lambda h: b"NVIDIA H200",
        nvmlDeviceGetUUID=lambda h: "GPU-x",
        nvmlDeviceGetUtilizationRates=lambda h: types.SimpleNamespace(gpu=55, memory=10),
        nvmlDeviceGetMemoryInfo=lambda h: types.SimpleNamespace(used=3, total=9, free=6),
        nvmlDeviceGetClockInfo=lambda h, clock: 1755 if clock == pynvml.NVML_CLOCK_SM else 0,
        nvmlDeviceGetPowerUsage=not_supported,
        nvmlDeviceGetTemperature=lost,
        nvmlDeviceGetCurrentClocksEventReasons=lambda h: 0x8,
        nvmlDeviceGetComputeRunningProcesses=lambda h: [types.SimpleNamespace(pid=9, usedGpuMemory=None)],
    )
    client = PynvmlClient()
    client._nvml = module
    client.init()
    assert (client.name(0), client.uuid(0), client.utilization_percent(0)) == ("NVIDIA H200", "GPU-x", 55.0)
    assert client.memory_bytes(0) == (3, 9) and client.sm_clock_mhz(0) == 1755.0
    assert client.clock_event_reasons(0) == 0x8
    assert client.compute_processes(0) == [GpuProcess(9, None)]
    from agent.host.nvml import NVMLUnsupported

    with pytest.raises(NVMLUnsupported):
        client.power_milliwatts(0)
    with pytest.raises(CollectorError, match="nvmlDeviceGetTemperature"):
        client.temperature_celsius(0)


def test_gpu_collector_fails_on_a_lost_gpu_through_pynvml_errors() -> None:
    import pynvml

    fake = FakeNVML([FakeGPU(broken=CollectorError(str(pynvml.NVMLError(pynvml.NVML_ERROR_GPU_IS_LOST))))])
    with pytest.raises(CollectorError, match="GPU is lost"):
        _collector(fake).collect()


def test_absent_driver_is_retried_once_a_minute_not_every_cycle(monkeypatch) -> None:
    """nvmlInit (a dlopen search) runs again only after NVML_ABSENT_RETRY_S; a driver installed later is found."""
    import types

    import pynvml

    from agent.host import nvml as nvml_mod

    calls = []
    state = {"installed": False}

    def init() -> None:
        calls.append(1)
        if not state["installed"]:
            raise pynvml.NVMLError_LibraryNotFound()

    module = types.SimpleNamespace(
        **{n: getattr(pynvml, n) for n in dir(pynvml) if n.startswith("NVMLError") or n.startswith("NVML_")},
        nvmlInit=init,
        nvmlShutdown=lambda: None,
    )
    clock = {"now": 1000.0}
    monkeypatch.setattr(nvml_mod.time, "monotonic", lambda: clock["now"])
    client = PynvmlClient()
    client._nvml = module
    for _ in range(5):
        with pytest.raises(NoDataError, match="NVML library not found"):
            client.init()
        # the client says when its retry is due (the gpu entry's absent_retry_s keeps the runner away till then)
        retry = client.retry_in()
        assert retry is not None and 0 < retry <= nvml_mod.NVML_ABSENT_RETRY_S
        clock["now"] += 1.0
    assert len(calls) == 1
    clock["now"] -= 1.0  # where the last absence above was raised
    assert client.retry_in() == pytest.approx(nvml_mod.NVML_ABSENT_RETRY_S - 4.0)
    clock["now"] += 1.0
    clock["now"] += nvml_mod.NVML_ABSENT_RETRY_S + 1
    state["installed"] = True
    client.init()
    assert len(calls) == 2
