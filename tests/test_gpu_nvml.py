"""The NVML boundary itself: PynvmlClient over a stand-in pynvml module that returns the real module's structs and
raises its real error classes (tests/fake_nvml.py, FakePynvml, says where each shape comes from), and the XID
watcher's thread: bounded, stoppable, safe without a driver."""

from __future__ import annotations

import time

import pytest

from inferwatch.agent.errors import CollectorError, NoDataError
from inferwatch.agent.node.host.nvml import (
    GPM_INSTANCE_METRICS,
    GPM_METRIC_IDS,
    EccCounts,
    GpuProcess,
    MigDevice,
    NVMLDeviceLost,
    NVMLUnsupported,
    ProcessUtilization,
    PynvmlClient,
    RemappedRows,
    XidEvent,
    XidWatcher,
)
from tests.fake_nvml import HOPPER_GPM, FakeGPU, FakeNVML, FakePynvml, ampere, volta

MIG = [
    MigDevice(
        0, "MIG-aaaaaaaa-0000-0000-0000-000000000001", "NVIDIA H100 80GB HBM3 MIG 3g.40gb", 1, 9 * 2**30, 40 * 2**30
    ),
    MigDevice(
        3, "MIG-aaaaaaaa-0000-0000-0000-000000000002", "NVIDIA H100 80GB HBM3 MIG 3g.40gb", 2, 1 * 2**30, 40 * 2**30
    ),
]


def _client(gpus: list[FakeGPU], **kw: object) -> tuple[PynvmlClient, FakePynvml]:
    module = FakePynvml(gpus, **kw)  # type: ignore[arg-type]
    client = PynvmlClient()
    client._nvml = module
    return client, module


def test_plain_values_come_through_the_real_structs() -> None:
    gpu = FakeGPU(
        uuid="GPU-h",
        utilization_percent=100,
        memory_controller_percent=83,
        processes=[GpuProcess(4242, 60 * 2**30), GpuProcess(77, None)],
        process_samples=[ProcessUtilization(4242, 1_000, 97, 40), ProcessUtilization(4242, 2_000, 99, 41)],
        ecc=EccCounts(5, 1, 12, 2),
        rows=RemappedRows(3, 1, True, False),
    )
    client, module = _client([gpu])
    client.init()
    assert module.refs == 1
    assert (client.utilization_percent(0), client.memory_controller_percent(0)) == (100.0, 83.0)
    assert client.memory_bytes(0) == (70 * 2**30, 80 * 2**30)
    # gpuInstanceId 0xFFFFFFFF (NVML_VALUE_NOT_AVAILABLE_uint) outside MIG becomes None; usedGpuMemory None stays None
    assert client.compute_processes(0) == [GpuProcess(4242, 60 * 2**30, None), GpuProcess(77, None, None)]
    assert client.process_utilization(0, 1_500) == [ProcessUtilization(4242, 2_000, 99.0, 41.0)]
    assert client.process_utilization(0, 2_000) == []  # NVML_ERROR_NOT_FOUND: no sample newer than the timestamp
    assert client.ecc_errors(0) == EccCounts(5, 1, 12, 2)
    assert client.remapped_rows(0) == RemappedRows(3, 1, True, False)
    with pytest.raises(NVMLUnsupported) as exc:
        client.retired_pages_pending(0)  # Ampere and later: row remapping replaced page retirement
    assert exc.value.reason == "not_supported"
    assert client.mig_enabled(0) is False
    client.shutdown()
    assert module.refs == 0


def test_gpm_metrics_between_two_samples_in_the_real_struct() -> None:
    client, module = _client([FakeGPU(gpm={**HOPPER_GPM, "nvlink_receive": 0.0})])
    del module.gpus[0].gpm["nvlink_transmit"]  # type: ignore[union-attr]
    client.init()
    assert client.gpm_supported(0)
    first = client.gpm_sample(0)
    second = client.gpm_sample(0)
    assert second.taken_s >= first.taken_s
    got = client.gpm_metrics(first, second, list(GPM_METRIC_IDS.values()))
    # a metric whose own nvmlReturn is not SUCCESS is left out, not reported as 0
    assert got == {GPM_METRIC_IDS[k]: v for k, v in module.gpus[0].gpm.items()}  # type: ignore[union-attr]
    assert GPM_METRIC_IDS["nvlink_transmit"] not in got and got[GPM_METRIC_IDS["nvlink_receive"]] == 0.0
    client.gpm_free(first)
    with pytest.raises(CollectorError, match="nvmlGpmMetricsGet"):  # a freed sample is refused (INVALID_ARGUMENT)
        client.gpm_metrics(first, second, [2])


def test_gpm_absence_has_a_reason() -> None:
    client, module = _client([ampere(), FakeGPU()])
    client.init()
    assert client.gpm_supported(0) is False  # isSupportedDevice 0 before Hopper
    with pytest.raises(NVMLUnsupported):
        client.gpm_sample(0)  # NVML_ERROR_NOT_SUPPORTED
    module.missing = {"nvmlGpmQueryDeviceSupport"}  # a driver older than GPM (FUNCTION_NOT_FOUND)
    with pytest.raises(NVMLUnsupported) as exc:
        client.gpm_supported(1)
    assert exc.value.reason == "driver_too_old"
    module.missing = set()
    module.gpus[1].no_permission.add("nvmlGpmSampleGet")
    with pytest.raises(NVMLUnsupported) as exc:
        client.gpm_sample(1)
    assert exc.value.reason == "no_permission"
    assert module.freed_samples  # the sample allocated for the failed read was freed


def test_mig_devices_their_processes_and_their_gpm() -> None:
    gpu = FakeGPU(
        uuid="GPU-p",
        mig=MIG,
        mig_gpm={1: {"sm_activity": 40.0, "dram_bandwidth": 70.0}},
        processes=[GpuProcess(10, 8 * 2**30, 1)],
    )
    client, _ = _client([gpu])
    client.init()
    assert client.mig_enabled(0)
    assert client.mig_devices(0) == MIG  # slots 1, 2, 4, 5, 6 are empty (NOT_FOUND) and skipped
    assert client.compute_processes(0) == [GpuProcess(10, 8 * 2**30, 1)]
    with pytest.raises(NVMLUnsupported):
        client.utilization_percent(0)  # NVML reports no utilisation for a GPU in MIG mode
    first, second = client.gpm_sample(0, 1), client.gpm_sample(0, 1)
    ids = [GPM_METRIC_IDS[n] for n in GPM_INSTANCE_METRICS]
    assert client.gpm_metrics(first, second, ids) == {2: 40.0, 10: 70.0}


def test_lost_gpu_no_permission_and_other_errors_are_told_apart() -> None:
    client, module = _client([FakeGPU(), FakeGPU(uuid="GPU-2")])
    client.init()
    module.lost = {0}
    with pytest.raises(NVMLDeviceLost, match="GPU is lost") as lost:
        client.name(0)
    assert lost.value.reason == "gpu_is_lost" and isinstance(lost.value, CollectorError)
    module.gpus[1].no_permission.add("nvmlDeviceGetTotalEccErrors")
    with pytest.raises(NVMLUnsupported) as denied:
        client.ecc_errors(1)
    assert denied.value.reason == "no_permission"
    assert client.uuid(1) == "GPU-2"  # the other GPU still answers


def test_xid_events_through_the_event_set() -> None:
    client, module = _client([FakeGPU(uuid="GPU-a"), volta(uuid="GPU-v", xid_events=False), FakeGPU(uuid="GPU-c")])
    events = client.open_xid_events()
    assert module.refs == 1  # the event set holds its own NVML reference
    assert sorted(events.devices.values()) == ["GPU-a", "GPU-c"] and events.skipped == {"GPU-v": "not_supported"}
    assert module.registered == {0, 2}
    assert client.wait_xid_event(events, 10) is None  # NVML_ERROR_TIMEOUT
    module.pending_events = [(2, 79), (0, 13)]
    assert client.wait_xid_event(events, 10) == XidEvent("GPU-c", 79, None)  # the event's handle names the GPU
    assert client.wait_xid_event(events, 10) == XidEvent("GPU-a", 13, None)
    client.close_xid_events(events)
    assert module.refs == 0 and module.event_sets_freed == 1


def test_xid_events_without_support_or_driver_are_absence() -> None:
    client, module = _client([volta(xid_events=False)])
    with pytest.raises(NVMLUnsupported):
        client.open_xid_events()
    assert module.refs == 0 and module.event_sets_freed == 1  # nothing left behind
    client, module = _client([FakeGPU(uuid="GPU-a"), FakeGPU(uuid="GPU-b")])
    module.lost = {0}
    events = client.open_xid_events()  # a lost GPU is skipped, the others are watched
    assert list(events.devices.values()) == ["GPU-b"] and events.skipped == {"index 0": "gpu_is_lost"}
    client, _ = _client([FakeGPU()], no_driver=True)
    with pytest.raises(NoDataError, match="NVML library not found"):
        client.open_xid_events()


def _until(predicate, timeout_s: float = 30.0) -> None:  # type: ignore[no-untyped-def]
    """Wait for the watcher's thread; the bound is for a hang (CI's load 10-17 on 2 cores), not for its speed."""
    deadline = time.monotonic() + timeout_s
    while not predicate():
        assert time.monotonic() < deadline, "condition not reached"
        time.sleep(0.01)


def test_watcher_counts_events_per_gpu_and_xid_and_stops_quickly() -> None:
    fake = FakeNVML([FakeGPU(uuid="GPU-a"), FakeGPU(uuid="GPU-b")])
    watcher = XidWatcher(fake, wait_ms=50, wall=lambda: 1234.0)
    watcher.start()
    watcher.start()  # idempotent: one thread
    _until(lambda: watcher.state().status == "watching")
    for uuid, xid in (("GPU-a", 79), ("GPU-a", 79), ("GPU-b", 48), (None, 94)):
        fake.push_xid(uuid, xid)
    _until(lambda: sum(watcher.state().counts.values()) == 3 and watcher.state().unattributed == 1)
    state = watcher.state()
    assert state.counts == {("GPU-a", 79): 2, ("GPU-b", 48): 1}
    assert state.devices == ("GPU-a", "GPU-b") and state.recent[-1].at_unix_s == 1234.0
    began = time.monotonic()
    watcher.stop()
    # "stopped" is set by the thread as it ends, so it ended within stop()'s own join (one 50 ms wait plus 2 s);
    # the wall-clock bound only catches a hang: at CI's load a thread can wait a second for a core
    assert time.monotonic() - began < 10.0
    assert watcher.state().status == "stopped" and fake.xid_closes == fake.xid_opens == 1
    watcher.stop()  # twice is fine


def test_watcher_reports_absence_and_failure_and_recovers() -> None:
    fake = FakeNVML([FakeGPU()], init_error=NoDataError("NVML library not found"))
    watcher = XidWatcher(fake, wait_ms=20, retry_s=60.0)
    watcher.start()
    _until(lambda: watcher.state().status == "absent")
    assert "NVML library not found" in watcher.state().reason
    began = time.monotonic()
    watcher.stop()  # it sleeps 60 s between tries, yet stops at once: ended within stop()'s join (~2 s), not 60 s
    assert time.monotonic() - began < 10.0 and watcher.state().status == "stopped"
    fake = FakeNVML([FakeGPU(uuid="GPU-a")])
    fake.xid_wait_error = CollectorError("NVML nvmlEventSetWait failed: Unknown Error")
    watcher = XidWatcher(fake, wait_ms=20, retry_s=0.05)
    watcher.start()
    _until(lambda: watcher.state().status == "failed")
    assert "Unknown Error" in watcher.state().reason and fake.xid_closes >= 1  # the broken set was closed
    fake.xid_wait_error = None
    _until(lambda: watcher.state().status == "watching")
    fake.push_xid("GPU-a", 74)
    _until(lambda: watcher.state().counts.get(("GPU-a", 74)) == 1)
    watcher.stop()


def test_watcher_on_this_gpu_less_host_is_absent_not_crashed() -> None:
    """The real nvidia-ml-py without a driver: the thread reports absence and stops when asked."""
    real = PynvmlClient()
    watcher = XidWatcher(real, wait_ms=20, retry_s=60.0)
    watcher.start()
    _until(lambda: watcher.state().status in ("absent", "watching"))
    if watcher.state().status == "watching":  # pragma: no cover - a host with a driver
        watcher.stop()
        pytest.skip("this host has an NVIDIA driver")
    assert "NVML library not found" in watcher.state().reason
    watcher.stop()
    assert watcher.state().status == "stopped"
