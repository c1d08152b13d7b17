"""GPU collector through the NVML client boundary: a fake client for values, the real pynvml for absence.

The fake devices (tests/fake_nvml.py) answer as NVML does: a Hopper GPU with GPM by default, an A100 without GPM
(``ampere``), a V100 with page retirement instead of row remapping (``volta``), MIG devices, NOT_SUPPORTED /
NO_PERMISSION per call, a GPU lost.
"""

from __future__ import annotations

import dataclasses
import json
import subprocess
import time
import uuid
from collections.abc import Iterator
from pathlib import Path

import pytest

from inferwatch.agent.common.samples import Collection, attrs
from inferwatch.agent.config import load_settings
from inferwatch.agent.doctor.checks import check_collector
from inferwatch.agent.errors import CollectorError, NoDataError
from inferwatch.agent.node.collectors.gpu import DRAIN_XIDS, MAX_PROCESSES_PER_DEVICE, GPUCollector, kubernetes_ids
from inferwatch.agent.node.host.nvml import (
    EccCounts,
    GpuProcess,
    MigDevice,
    NVMLDeviceLost,
    ProcessUtilization,
    PynvmlClient,
    RemappedRows,
)
from inferwatch.agent.node.runner import validate
from inferwatch.agent.node.wiring import build_deps, collect_context
from tests.conftest import PYTHON, ROOT
from tests.fake_nvml import FakeGPU, FakeNVML, ampere, volta
from tests.procs import running

H100 = "NVIDIA H100 80GB HBM3"
_OPEN: list[GPUCollector] = []


@pytest.fixture(autouse=True)
def _close_collectors() -> Iterator[None]:
    yield
    while _OPEN:
        _OPEN.pop().close()  # stops each XID watcher thread


def _collector(nvml: object, procfs: Path | None = None, **runtime: object) -> GPUCollector:
    settings = load_settings(overrides={"runtime": runtime} if runtime else None)
    ctx = collect_context(settings, nvml=nvml)  # type: ignore[arg-type]
    if procfs is not None:
        ctx = dataclasses.replace(ctx, procfs=procfs)
    c = GPUCollector(ctx)
    _OPEN.append(c)
    return c


def _values(result: Collection) -> dict[tuple[str, tuple[tuple[str, str], ...]], float]:
    return {(s.name, s.attributes): s.value for s in result.samples}  # type: ignore[union-attr]


def _dev(uuid: str = "GPU-a", model: str = H100, parent: str | None = None, **extra: str) -> tuple:
    d = {"hw.id": uuid, "hw.model": model, **extra}
    if parent is not None:
        d["hw.parent"] = parent
    return tuple(sorted(d.items()))


def _by_name(result: Collection, name: str) -> dict[tuple, float]:
    return {s.attributes: s.value for s in result.samples if s.name == name}  # type: ignore[union-attr]


def _until(predicate, timeout_s: float = 30.0) -> None:  # type: ignore[no-untyped-def]
    """Wait for the watcher's thread; the bound is for a hang (CI's load 10-17 on 2 cores), not for its speed."""
    deadline = time.monotonic() + timeout_s
    while not predicate():
        assert time.monotonic() < deadline, "condition not reached"
        time.sleep(0.01)


def test_values_are_converted_to_base_units_per_device() -> None:
    gpus = [
        FakeGPU(uuid="GPU-a", reasons=0x1 | 0x4, processes=[GpuProcess(4242, 60 * 2**30), GpuProcess(7, None)]),
        FakeGPU(uuid="GPU-b", name="NVIDIA L4", unsupported={"power_milliwatts", "temperature_celsius"}),
    ]
    result = validate(_collector(FakeNVML(gpus)).collect())
    v = _values(result)
    a, b = _dev("GPU-a"), _dev("GPU-b", "NVIDIA L4")
    assert v[("hw.gpu.utilization", a)] == pytest.approx(0.87)
    assert v[("inferwatch.gpu.memory_controller.utilization", a)] == pytest.approx(0.41)
    assert v[("hw.gpu.memory.usage", _dev("GPU-a", parent=""))] == 70 * 2**30
    assert v[("hw.gpu.memory.limit", _dev("GPU-a", parent=""))] == 80 * 2**30
    assert v[("inferwatch.gpu.clock.sm", a)] == pytest.approx(1.98e9)
    assert v[("inferwatch.gpu.power", a)] == pytest.approx(612.345)
    assert v[("inferwatch.gpu.temperature", a)] == 71.0
    assert v[("inferwatch.gpu.throttle", attrs(dict(a), reason="sw_power_cap"))] == 1
    assert v[("inferwatch.gpu.throttle", attrs(dict(a), reason="hw_slowdown"))] == 0
    assert v[("inferwatch.gpu.lost", a)] == 0
    # No runtime configured: every compute process with attributable memory is reported.
    procs = _by_name(result, "inferwatch.gpu.process.memory.usage")
    assert {dict(k)["pid"]: val for k, val in procs.items()} == {"4242": 60 * 2**30}
    # An unsupported value is skipped, not an error; the rest of the device still reports.
    assert ("inferwatch.gpu.power", b) not in v and ("hw.gpu.utilization", b) in v
    assert result.details["gpu1.unsupported"] == ["power", "temperature"]
    assert result.details["gpu1.absent"] == {"power": "not_supported", "temperature": "not_supported"}
    findings = {f.id: f.status for f in result.findings}
    assert findings == {
        "gpu0.throttle": "fail",
        "gpu0.errors": "ok",
        "gpu0.gpm": "ok",
        "gpu1.throttle": "ok",
        "gpu1.errors": "ok",
        "gpu1.gpm": "ok",
    }


def test_gpm_is_sampled_over_the_interval_and_primes_first() -> None:
    clock = {"now": 100.0}
    fake = FakeNVML([FakeGPU(uuid="GPU-a")], clock=lambda: clock["now"])
    c = _collector(fake)
    first = validate(c.collect())
    assert not _by_name(first, "inferwatch.gpu.sm.activity")  # one sample: nothing to say yet, absent not 0
    assert first.details["gpu0.gpm"] == "warming up (GPM needs two samples)"
    clock["now"] += 15.0
    second = validate(c.collect())
    v = _values(second)
    part = _dev("GPU-a", parent="")
    assert v[("inferwatch.gpu.sm.activity", part)] == pytest.approx(0.62)
    assert v[("inferwatch.gpu.sm.occupancy", part)] == pytest.approx(0.31)
    assert v[("inferwatch.gpu.tensor.activity", part)] == pytest.approx(0.18)
    assert v[("inferwatch.gpu.dram.bandwidth.utilization", part)] == pytest.approx(0.55)
    io = {(dict(k)["link"], dict(k)["network.io.direction"]): val for k, val in _by_name(second, "hw.gpu.io").items()}
    # GPM rates (MiB/s) × the 15 s between the two samples
    assert io[("pcie", "receive")] == pytest.approx(340 * 2**20 * 15)
    assert io[("nvlink", "transmit")] == pytest.approx(2048 * 2**20 * 15)
    clock["now"] += 5.0
    third = validate(c.collect())
    io3 = {(dict(k)["link"], dict(k)["network.io.direction"]): val for k, val in _by_name(third, "hw.gpu.io").items()}
    assert io3[("pcie", "receive")] == pytest.approx(340 * 2**20 * 20)  # a counter: it accumulates
    assert second.details["gpu0.gpm"] == "sampling"
    assert len(fake.gpm_live) == 1  # only the latest sample is kept; every earlier one was freed
    c.close()
    assert not fake.gpm_live


@pytest.mark.parametrize(
    ("gpu", "reason"),
    [
        (ampere(uuid="GPU-a"), "not_supported"),  # isSupportedDevice 0: an A100
        (FakeGPU(uuid="GPU-a", unsupported={"gpm_supported"}), "not_supported"),
        (FakeGPU(uuid="GPU-a", no_permission={"gpm_sample"}), "no_permission"),
    ],
)
def test_without_gpm_the_series_are_absent_with_a_reason(gpu: FakeGPU, reason: str) -> None:
    c = _collector(FakeNVML([gpu]))
    for _ in range(2):
        result = validate(c.collect())
    names = {s.name for s in result.samples}
    assert not names & {"inferwatch.gpu.sm.activity", "inferwatch.gpu.tensor.activity", "hw.gpu.io"}
    assert "inferwatch.gpu.memory_controller.utilization" in names  # what NVML does give on older GPUs
    assert result.details["gpu0.gpm"] == f"absent: {reason}"
    gpm = next(f for f in result.findings if f.id == "gpu0.gpm")
    assert gpm.status == "skip" and reason in gpm.summary and "memory-controller" in gpm.summary


def test_mig_instances_are_devices_with_their_parent_named() -> None:
    migs = [
        MigDevice(0, "MIG-1", "NVIDIA H100 80GB HBM3 MIG 3g.40gb", 1, 30 * 2**30, 40 * 2**30),
        MigDevice(1, "MIG-2", "NVIDIA H100 80GB HBM3 MIG 3g.40gb", 2, 2 * 2**30, 40 * 2**30),
    ]
    gpu = FakeGPU(
        uuid="GPU-p",
        mig=migs,
        mig_gpm={1: {"sm_activity": 40.0, "tensor_activity": 5.0}, 2: {"sm_activity": 0.0}},
        processes=[GpuProcess(10, 29 * 2**30, 1), GpuProcess(11, 1 * 2**30, 2), GpuProcess(12, 2**20, 2)],
    )
    c = _collector(FakeNVML([gpu]))
    c.collect()
    result = validate(c.collect())
    v = _values(result)
    model = "NVIDIA H100 80GB HBM3 MIG 3g.40gb"
    mig1, mig2 = _dev("MIG-1", model, parent="GPU-p"), _dev("MIG-2", model, parent="GPU-p")
    assert v[("hw.gpu.memory.usage", mig1)] == 30 * 2**30 and v[("hw.gpu.memory.limit", mig2)] == 40 * 2**30
    assert v[("inferwatch.gpu.sm.activity", mig1)] == pytest.approx(0.40)
    assert v[("inferwatch.gpu.tensor.activity", mig1)] == pytest.approx(0.05)
    assert ("hw.gpu.utilization", _dev("GPU-p")) not in v  # NVML has no utilisation in MIG mode
    assert not _by_name(result, "hw.gpu.io")  # links belong to the GPU, not to an instance
    procs = _by_name(result, "inferwatch.gpu.process.memory.usage")
    where = {dict(k)["pid"]: (dict(k)["hw.id"], dict(k)["hw.parent"]) for k in procs}
    assert where == {"10": ("MIG-1", "GPU-p"), "11": ("MIG-2", "GPU-p"), "12": ("MIG-2", "GPU-p")}
    # the instance's GPM SM activity goes to its only process; MIG-2 has two, so nobody gets it
    activity = {dict(k)["pid"]: val for k, val in _by_name(result, "inferwatch.gpu.process.sm.activity").items()}
    assert activity == {"10": pytest.approx(0.40)}
    assert not _by_name(result, "inferwatch.gpu.process.sm.utilization")  # no process samples under MIG


def test_process_sm_use_from_nvml_process_samples() -> None:
    samples = [ProcessUtilization(4242, 1_000, 90, 30), ProcessUtilization(4242, 2_000, 100, 30)]
    gpu = FakeGPU(processes=[GpuProcess(4242, 2**30), GpuProcess(99, 2**30)], process_samples=samples)
    c = _collector(FakeNVML([gpu]))
    first = validate(c.collect())
    sm = {dict(k)["pid"]: val for k, val in _by_name(first, "inferwatch.gpu.process.sm.utilization").items()}
    assert sm == {"4242": pytest.approx(0.95), "99": 0.0}  # the mean of its samples; no sample: no kernel ran
    gpu.process_samples.append(ProcessUtilization(4242, 3_000, 20, 5))
    second = validate(c.collect())
    sm = {dict(k)["pid"]: val for k, val in _by_name(second, "inferwatch.gpu.process.sm.utilization").items()}
    assert sm["4242"] == pytest.approx(0.20)  # only the samples since the last collection
    assert not _by_name(second, "inferwatch.gpu.process.sm.activity")  # two processes share the GPU


def test_process_memory_is_limited_to_the_runtime_process_tree(tmp_path: Path) -> None:
    marker = uuid.uuid4().hex
    cmd = [PYTHON, "-c", "import time; time.sleep(60)", f"fake-runtime-{marker}"]
    with running(cmd, tmp_path / "rt.log") as proc:
        import psutil

        deadline = time.monotonic() + 10
        while time.monotonic() < deadline and cmd[-1] not in psutil.Process(proc.pid).cmdline():
            time.sleep(0.01)
        gpus = [FakeGPU(processes=[GpuProcess(proc.pid, 2**30), GpuProcess(1, 5 * 2**30)])]
        result = validate(_collector(FakeNVML(gpus), cmdline_pattern=f"fake-runtime-{marker}").collect())
    pids = {dict(s.attributes)["pid"] for s in result.samples if s.name == "inferwatch.gpu.process.memory.usage"}
    assert pids == {str(proc.pid)}


# Real kubelet cgroup paths (k8s.io/kubernetes pkg/kubelet/cm: the systemd driver writes the pod UID with '_').
POD = "3f1a0c2e-7b1d-4e59-9a51-0d1e2f3a4b5c"
CID = "8d2f3c4b5a69788796a5b4c3d2e1f00112233445566778899aabbccddeeff001"
SYSTEMD = (
    "/kubepods.slice/kubepods-burstable.slice/"
    f"kubepods-burstable-pod{POD.replace('-', '_')}.slice/cri-containerd-{CID}.scope"
)


@pytest.mark.parametrize(
    ("path", "expected"),
    [
        (SYSTEMD, (POD, CID)),
        (f"/kubepods/burstable/pod{POD}/{CID}", (POD, CID)),  # cgroupfs driver
        (
            f"/kubepods.slice/kubepods-pod{POD.replace('-', '_')}.slice/crio-{CID}.scope",
            (POD, CID),
        ),  # guaranteed, CRI-O
        (f"/kubepods/besteffort/pod{POD}/docker-{CID}.scope", (POD, CID)),
        (f"/kubepods/pod{POD}", (POD, "")),  # the pod's own cgroup
        ("/system.slice/vllm.service", ("", "")),
        ("/", ("", "")),
    ],
)
def test_kubernetes_ids_from_the_cgroup_path(path: str, expected: tuple[str, str]) -> None:
    assert kubernetes_ids(path) == expected


def test_pod_and_container_of_each_process(tmp_path: Path) -> None:
    (tmp_path / "4242").mkdir()
    (tmp_path / "4242" / "cgroup").write_text(f"0::{SYSTEMD}\n")
    (tmp_path / "5151").mkdir()  # a cgroup v1 host: any hierarchy's line names the pod
    (tmp_path / "5151" / "cgroup").write_text(f"12:memory:/kubepods/burstable/pod{POD}/{CID}\n1:name=systemd:/\n")
    gpu = FakeGPU(processes=[GpuProcess(4242, 2**30), GpuProcess(5151, 2**30), GpuProcess(6000, 2**30)])
    result = validate(_collector(FakeNVML([gpu]), procfs=tmp_path).collect())
    got = {
        dict(k)["pid"]: (dict(k)["k8s.pod.uid"], dict(k)["container.id"])
        for k in _by_name(result, "inferwatch.gpu.process.memory.usage")
    }
    assert got == {"4242": (POD, CID), "5151": (POD, CID), "6000": ("", "")}  # 6000: no /proc entry


def test_process_series_are_bounded_per_device() -> None:
    procs = [GpuProcess(1000 + i, (i + 1) * 2**20) for i in range(MAX_PROCESSES_PER_DEVICE + 5)]
    result = validate(_collector(FakeNVML([FakeGPU(processes=procs)])).collect())
    pids = {int(dict(k)["pid"]) for k in _by_name(result, "inferwatch.gpu.process.memory.usage")}
    assert len(pids) == MAX_PROCESSES_PER_DEVICE and min(pids) == 1005  # the largest users are kept
    assert result.details["gpu0.absent"]["processes_over_limit"] == "5 not reported"


def test_xid_events_are_counted_off_the_collection_path() -> None:
    fake = FakeNVML([FakeGPU(uuid="GPU-a"), FakeGPU(uuid="GPU-b")])
    c = _collector(fake)
    c.collect()  # starts the watcher
    _until(lambda: c.xid.state().status == "watching")
    quiet = validate(c.collect())
    xids = _by_name(quiet, "inferwatch.gpu.xid.events")
    # every drain XID of every GPU is there at 0 before anything happens, so the first event is an increase
    assert len(xids) == 2 * len(DRAIN_XIDS) and set(xids.values()) == {0}
    assert {f.id: f.status for f in quiet.findings if f.id.endswith(".errors")} == {
        "gpu0.errors": "ok",
        "gpu1.errors": "ok",
    }
    fake.push_xid("GPU-b", 94)
    fake.push_xid("GPU-b", 13)  # an application XID: counted, not a drain
    _until(lambda: sum(c.xid.state().counts.values()) == 2)
    result = validate(c.collect())
    xids = {(dict(k)["hw.id"], dict(k)["xid"]): val for k, val in _by_name(result, "inferwatch.gpu.xid.events").items()}
    assert xids[("GPU-b", "94")] == 1 and xids[("GPU-b", "13")] == 1 and xids[("GPU-a", "94")] == 0
    errors = next(f for f in result.findings if f.id == "gpu1.errors")
    assert errors.status == "fail" and "XID 94" in errors.summary and errors.runbook == "GPUErrorNeedsDrain"
    assert next(f for f in result.findings if f.id == "gpu0.errors").status == "ok"
    assert result.details["xid"]["recent"][0]["xid"] == 94
    began = time.monotonic()
    c.close()
    # "stopped" is set by the watcher's thread as it ends: it ended within the join; the time only bounds a hang
    assert time.monotonic() - began < 10.0 and c.xid.state().status == "stopped"


def test_ecc_and_memory_repairs_pending() -> None:
    gpus = [
        FakeGPU(uuid="GPU-a", ecc=EccCounts(12, 2, 40, 3), rows=RemappedRows(1, 2, True, False)),
        volta(uuid="GPU-v", retired_pending=True),
        FakeGPU(uuid="GPU-c", rows=RemappedRows(0, 512, False, True)),
        FakeGPU(uuid="GPU-d", ecc=None, no_permission={"remapped_rows"}),
    ]
    result = validate(_collector(FakeNVML(gpus)).collect())
    v = _values(result)
    a = _dev("GPU-a")
    ecc = {
        (dict(k)["error.type"], dict(k)["ecc.counter"]): val
        for k, val in _by_name(result, "inferwatch.gpu.ecc.errors").items()
        if ("hw.id", "GPU-a") in k
    }
    assert ecc == {
        ("corrected", "volatile"): 12,
        ("uncorrected", "volatile"): 2,
        ("corrected", "aggregate"): 40,
        ("uncorrected", "aggregate"): 3,
    }
    assert v[("inferwatch.gpu.memory.remapped_rows", attrs(dict(a), cause="uncorrectable"))] == 2
    assert v[("inferwatch.gpu.memory.repair.pending", attrs(dict(a), mechanism="row_remapping"))] == 1
    v_volta = dict(_dev("GPU-v", "Tesla V100-SXM2-32GB"))
    assert v[("inferwatch.gpu.memory.repair.pending", attrs(v_volta, mechanism="page_retirement"))] == 1
    assert v[("inferwatch.gpu.memory.repair.failed", attrs(dict(_dev("GPU-c")), mechanism="row_remapping"))] == 1
    status = {f.id: (f.status, f.summary) for f in result.findings if f.id.endswith(".errors")}
    assert status["gpu0.errors"][0] == "fail" and "row remapping waits for a GPU reset" in status["gpu0.errors"][1]
    assert status["gpu1.errors"][0] == "fail" and "page retirement" in status["gpu1.errors"][1]
    assert status["gpu2.errors"][0] == "fail" and "no spare rows" in status["gpu2.errors"][1]
    assert status["gpu3.errors"][0] == "ok"
    # row remapping refused, and page retirement (the older mechanism, tried next) is not on this GPU
    assert result.details["gpu3.absent"] == {
        "ecc": "not_supported",
        "page_retirement": "not_supported",
        "row_remapping": "no_permission",
    }
    assert not [k for k in v if k[0].startswith("inferwatch.gpu.memory.repair") and ("hw.id", "GPU-d") in k[1]]


def test_a_lost_gpu_is_a_metric_and_a_finding_not_a_crash() -> None:
    gpus = [FakeGPU(uuid="GPU-a"), FakeGPU(uuid="GPU-b")]
    fake = FakeNVML(gpus)
    c = _collector(fake)
    c.collect()
    c.collect()
    gpus[0].broken = NVMLDeviceLost("NVML nvmlDeviceGetUtilizationRates failed: GPU is lost", "gpu_is_lost")
    result = validate(c.collect())
    v = _values(result)
    assert v[("inferwatch.gpu.lost", _dev("GPU-a"))] == 1  # named by the UUID read while it still answered
    assert [k for k in v if ("hw.id", "GPU-a") in k[1] and k[0] != "inferwatch.gpu.xid.events"] == [
        ("inferwatch.gpu.lost", _dev("GPU-a"))
    ]
    assert v[("inferwatch.gpu.lost", _dev("GPU-b"))] == 0 and ("hw.gpu.utilization", _dev("GPU-b")) in v
    lost = next(f for f in result.findings if f.id == "gpu0.errors")
    assert lost.status == "fail" and "lost" in lost.summary and lost.runbook == "GPUErrorNeedsDrain"
    assert result.details["gpu0.gpm"] == "lost"
    assert len(fake.gpm_live) == 1  # the lost GPU's GPM sample was freed, GPU-b's kept
    # lost before the agent ever read it: named by its index
    fresh = FakeNVML([FakeGPU(broken=NVMLDeviceLost("GPU is lost"))])
    v = _values(validate(_collector(fresh).collect()))
    assert v[("inferwatch.gpu.lost", _dev("nvml-index-0", "unknown"))] == 1


def test_another_nvml_failure_still_fails_the_collector() -> None:
    with pytest.raises(CollectorError, match="Unknown Error"):
        _collector(FakeNVML([FakeGPU(broken=CollectorError("NVML nvmlDeviceGetName failed: Unknown Error"))])).collect()


def test_no_gpu_and_no_driver_are_expected_absence() -> None:
    with pytest.raises(NoDataError, match="no GPU"):
        _collector(FakeNVML([])).collect()
    # The real client on this GPU-less host: the driver's library cannot be loaded, which is absence with a hint,
    # told before pynvml is imported (a CPU node never pays for it); nvidia-ml-py is a dependency of the package
    # all the same (the import below fails without it).
    import pynvml  # noqa: F401

    code = (
        "import sys\nfrom inferwatch.agent.errors import NoDataError\n"
        "from inferwatch.agent.node.host.nvml import PynvmlClient\n"
        "try:\n    PynvmlClient().init()\nexcept NoDataError as exc:\n"
        "    print('absent', 'libnvidia-ml.so.1' in exc.hint, 'pynvml' in sys.modules)\nelse:\n    print('driver')"
    )
    out = subprocess.run([PYTHON, "-c", code], cwd=ROOT, capture_output=True, text=True, timeout=60)
    if out.stdout.strip() == "driver":  # pragma: no cover - a host with a driver
        pytest.skip("this host has an NVIDIA driver")
    assert out.stdout.split() == ["absent", "True", "False"], out.stderr


def test_close_shuts_nvml_down() -> None:
    fake = FakeNVML([FakeGPU()])
    c = _collector(fake)
    c.collect()
    c.collect()
    c.close()
    assert fake.inits == 2 and fake.shutdowns == 1 and not fake.gpm_live


def test_doctor_gpu_check_with_fake_and_real_nvml() -> None:
    settings = load_settings()
    fake = FakeNVML([FakeGPU(reasons=0x40), ampere(uuid="GPU-ok")])
    findings = check_collector(build_deps(settings, nvml=fake), "gpu")
    assert [(f.id, f.status) for f in findings] == [
        ("gpu0.throttle", "fail"),
        ("gpu0.errors", "ok"),
        ("gpu0.gpm", "ok"),
        ("gpu1.throttle", "ok"),
        ("gpu1.errors", "ok"),
        ("gpu1.gpm", "skip"),
    ]
    assert "hw_thermal_slowdown" in findings[0].summary and fake.shutdowns == 1
    r = subprocess.run(
        [PYTHON, "-m", "inferwatch.agent", "doctor", "--json"], cwd=ROOT, capture_output=True, text=True, timeout=60
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
    assert client.memory_controller_percent(0) == 10.0
    assert client.clock_event_reasons(0) == 0x8
    assert client.compute_processes(0) == [GpuProcess(9, None)]
    from inferwatch.agent.node.host.nvml import NVMLUnsupported

    with pytest.raises(NVMLUnsupported):
        client.power_milliwatts(0)
    with pytest.raises(NVMLDeviceLost, match="nvmlDeviceGetTemperature"):
        client.temperature_celsius(0)


def test_absent_driver_is_retried_once_a_minute_not_every_cycle(monkeypatch) -> None:
    """nvmlInit (a dlopen search) runs again only after NVML_ABSENT_RETRY_S; a driver installed later is found."""
    import types

    import pynvml

    from inferwatch.agent.node.host import nvml as nvml_mod

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


def test_drain_xids_are_one_list_in_the_collector_the_rule_and_the_catalog() -> None:
    """The XIDs exported at 0 are the ones the rule pages on and the catalog documents (no drift)."""
    import re

    import yaml

    from inferwatch.agent.catalog import gpu as catalog_gpu

    rules = yaml.safe_load((ROOT / "alerts" / "gpu.rules.yml").read_text())["groups"][0]["rules"]
    expr = next(r["expr"] for r in rules if r["alert"] == "GPUErrorNeedsDrain")
    in_rule = re.search(r'xid=~"([0-9|]+)"', expr).group(1)  # type: ignore[union-attr]
    assert [int(x) for x in in_rule.split("|")] == sorted(DRAIN_XIDS)
    assert ", ".join(str(x) for x in sorted(DRAIN_XIDS)) in (catalog_gpu.__doc__ or "").replace("\n", " ")
