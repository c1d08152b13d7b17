"""Fakes of NVML at its two levels, for tests without a GPU.

- :class:`FakeNVML` is an :class:`inferwatch.agent.node.host.nvml.NVMLClient`: devices as plain values
(:class:`FakeGPU`, a Hopper
  GPU serving by default), errors on demand, XID events pushed by the test. The gpu collector, doctor, the
  evidence bundle and tests/node_agent.py (the dashboards' data test) run on it.
- :class:`FakePynvml` stands in for the ``pynvml`` module under :class:`inferwatch.agent.node.host.nvml.PynvmlClient`:
the real
  module's error classes, constants and ctypes structs, answered from the same :class:`FakeGPU` values, so the
  client's translation is tested against the shapes the driver really returns.

Where each shape comes from (nvidia-ml-py 13.615.71, ``pynvml.py``; NVML API reference for the semantics):

- ``nvmlDeviceGetUtilizationRates``: ``c_nvmlUtilization_t`` (``gpu``, ``memory``: percent of the sample period).
- ``nvmlDeviceGetMemoryInfo``: ``c_nvmlMemory_t`` (``total``, ``free``, ``used``: bytes).
- ``nvmlDeviceGetComputeRunningProcesses``: ``nvmlFriendlyObject`` built from ``c_nvmlProcessInfo_v3_t``
  (``pid``; ``usedGpuMemory`` None when N/A; ``gpuInstanceId``/``computeInstanceId`` 0xFFFFFFFF outside MIG).
- ``nvmlDeviceGetProcessUtilization(h, ts)``: a list of ``c_nvmlProcessUtilizationSample_t`` (``pid``,
  ``timeStamp`` µs, ``smUtil``, ``memUtil``); ``NVMLError(ret)`` for any first-call return but
  INSUFFICIENT_SIZE, NOT_FOUND when no sample is newer than ``ts``.
- ``nvmlDeviceGetMigMode``: ``[current, pending]`` (``NVML_DEVICE_MIG_ENABLE`` = 1); NOT_SUPPORTED without MIG.
- ``nvmlDeviceGetMigDeviceHandleByIndex``: a device handle; NOT_FOUND for an empty slot.
- ``nvmlGpmQueryDeviceSupport``: ``c_nvmlGpmSupport_t`` (``isSupportedDevice`` 0 before Hopper);
  FUNCTION_NOT_FOUND on a driver without GPM.
- ``nvmlGpmSampleAlloc`` / ``SampleGet`` / ``MigSampleGet`` / ``SampleFree``: an opaque ``c_nvmlGpmSample_t``
  pointer, filled in place.
- ``nvmlGpmMetricsGet(c_nvmlGpmMetricsGet_t)``: the struct back, each ``metrics[i]`` with its own ``nvmlReturn``
  and ``value`` (percent, MiB/s).
- ``nvmlDeviceGetTotalEccErrors(h, type, counter)``: an int; NOT_SUPPORTED without ECC.
- ``nvmlDeviceGetRemappedRows``: ``(corrRows, uncRows, isPending, failureOccurred)``; NOT_SUPPORTED before Ampere.
- ``nvmlDeviceGetRetiredPagesPendingStatus``: 1 (``NVML_FEATURE_ENABLED``) / 0; NOT_SUPPORTED on Ampere+.
- ``nvmlEventSetWait(set, ms)``: ``c_nvmlEventData_t`` (``device``, ``eventType``, ``eventData`` = the XID,
  ``gpuInstanceId``); ``NVMLError_Timeout`` when nothing came.
- any call on a GPU that fell off the bus: ``NVMLError_GpuIsLost`` (code 15).
- ``nvmlInit`` without a driver: ``NVMLError_LibraryNotFound`` (12; verified on this GPU-less host).
"""

from __future__ import annotations

import ctypes
import queue
import threading
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

from inferwatch.agent.node.host.nvml import (
    EccCounts,
    GpmSample,
    GpuProcess,
    MigDevice,
    NVMLUnsupported,
    ProcessUtilization,
    RemappedRows,
    XidEvent,
    XidEventSet,
)

# What an H100 serving a model reads over a collection interval (percent; MiB/s for the links).
HOPPER_GPM: dict[str, float] = {
    "sm_activity": 62.0,
    "sm_occupancy": 31.0,
    "tensor_activity": 18.0,
    "dram_bandwidth": 55.0,
    "pcie_transmit": 120.0,
    "pcie_receive": 340.0,
    "nvlink_receive": 2048.0,
    "nvlink_transmit": 2048.0,
}
GPM_IDS = {"sm_activity": 2, "sm_occupancy": 3, "tensor_activity": 5, "dram_bandwidth": 10}
GPM_IDS |= {"pcie_transmit": 20, "pcie_receive": 21, "nvlink_receive": 60, "nvlink_transmit": 61}


@dataclass
class FakeGPU:
    name: str = "NVIDIA H100 80GB HBM3"
    uuid: str = "GPU-00000000-0000-0000-0000-000000000000"
    utilization_percent: float = 87.0
    memory_controller_percent: float = 41.0
    used_bytes: int = 70 * 2**30
    total_bytes: int = 80 * 2**30
    sm_clock_mhz: float = 1980.0
    power_mw: float = 612_345.0
    temperature_c: float = 71.0
    reasons: int = 0
    processes: list[GpuProcess] = field(default_factory=list)
    process_samples: list[ProcessUtilization] = field(default_factory=list)
    gpm: dict[str, float] | None = field(default_factory=lambda: dict(HOPPER_GPM))  # None: a GPU without GPM
    mig: list[MigDevice] = field(default_factory=list)  # non-empty: MIG mode enabled with these devices
    mig_gpm: dict[int, dict[str, float]] = field(default_factory=dict)  # GPU instance id → GPM values
    ecc: EccCounts | None = field(default_factory=lambda: EccCounts(0, 0, 0, 0))  # None: no ECC
    rows: RemappedRows | None = field(default_factory=lambda: RemappedRows(0, 0, False, False))  # None: pre-Ampere
    retired_pending: bool | None = None  # page retirement: GPUs before Ampere
    xid_events: bool = True  # reports critical-XID events
    unsupported: set[str] = field(default_factory=set)  # method names that raise NVMLUnsupported (not_supported)
    no_permission: set[str] = field(default_factory=set)  # method names that raise NVMLUnsupported (no_permission)
    broken: Exception | None = None  # raised by every call on this device (GPU lost)


def ampere(**kw: Any) -> FakeGPU:
    """An A100: no GPM (NVML answers isSupportedDevice 0), row remapping, MIG-capable."""
    return FakeGPU(**{"name": "NVIDIA A100-SXM4-80GB", "gpm": None, **kw})


def volta(**kw: Any) -> FakeGPU:
    """A V100: no GPM, page retirement instead of row remapping."""
    return FakeGPU(**{"name": "Tesla V100-SXM2-32GB", "gpm": None, "rows": None, "retired_pending": False, **kw})


class FakeNVML:
    def __init__(
        self,
        gpus: list[FakeGPU],
        init_error: Exception | None = None,
        clock: Callable[[], float] = time.monotonic,
    ) -> None:
        self.gpus = gpus
        self.init_error = init_error
        self.clock = clock
        self.inits = 0
        self.shutdowns = 0
        self.gpm_live: set[int] = set()  # allocated GPM samples not yet freed
        self._gpm_next = 0
        self.xid_opens = 0
        self.xid_closes = 0
        self.xid_open_error: Exception | None = None
        self.xid_wait_error: Exception | None = None
        self._xids: queue.Queue[XidEvent] = queue.Queue()
        self._lock = threading.Lock()

    # --- lifecycle and plain values ---

    def init(self) -> None:
        self.inits += 1
        if self.init_error is not None:
            raise self.init_error

    def shutdown(self) -> None:
        self.shutdowns += 1

    def device_count(self) -> int:
        return len(self.gpus)

    def _gpu(self, index: int, what: str) -> FakeGPU:
        gpu = self.gpus[index]
        if gpu.broken is not None:
            raise gpu.broken
        if what in gpu.unsupported:
            raise NVMLUnsupported(what, "not_supported")
        if what in gpu.no_permission:
            raise NVMLUnsupported(what, "no_permission")
        return gpu

    def name(self, index: int) -> str:
        return self._gpu(index, "name").name

    def uuid(self, index: int) -> str:
        return self._gpu(index, "uuid").uuid

    def utilization_percent(self, index: int) -> float:
        gpu = self._gpu(index, "utilization_percent")
        if gpu.mig:  # NVML: utilisation is not reported for a GPU in MIG mode
            raise NVMLUnsupported("utilization in MIG mode", "not_supported")
        return gpu.utilization_percent

    def memory_controller_percent(self, index: int) -> float:
        gpu = self._gpu(index, "memory_controller_percent")
        if gpu.mig:
            raise NVMLUnsupported("utilization in MIG mode", "not_supported")
        return gpu.memory_controller_percent

    def memory_bytes(self, index: int) -> tuple[int, int]:
        g = self._gpu(index, "memory_bytes")
        return g.used_bytes, g.total_bytes

    def sm_clock_mhz(self, index: int) -> float:
        return self._gpu(index, "sm_clock_mhz").sm_clock_mhz

    def power_milliwatts(self, index: int) -> float:
        return self._gpu(index, "power_milliwatts").power_mw

    def temperature_celsius(self, index: int) -> float:
        return self._gpu(index, "temperature_celsius").temperature_c

    def clock_event_reasons(self, index: int) -> int:
        return self._gpu(index, "clock_event_reasons").reasons

    def compute_processes(self, index: int) -> list[GpuProcess]:
        return list(self._gpu(index, "compute_processes").processes)

    def process_utilization(self, index: int, since_us: int) -> list[ProcessUtilization]:
        gpu = self._gpu(index, "process_utilization")
        if gpu.mig:
            raise NVMLUnsupported("process utilization in MIG mode", "not_supported")
        return [s for s in gpu.process_samples if s.timestamp_us > since_us]

    def mig_enabled(self, index: int) -> bool:
        return bool(self._gpu(index, "mig_enabled").mig)

    def mig_devices(self, index: int) -> list[MigDevice]:
        return list(self._gpu(index, "mig_devices").mig)

    # --- GPM ---

    def gpm_supported(self, index: int) -> bool:
        return self._gpu(index, "gpm_supported").gpm is not None

    def gpm_sample(self, index: int, gpu_instance_id: int | None = None) -> GpmSample:
        self._gpu(index, "gpm_sample")
        with self._lock:
            self._gpm_next += 1
            self.gpm_live.add(self._gpm_next)
            return GpmSample((self._gpm_next, index, gpu_instance_id), self.clock(), gpu_instance_id)

    def gpm_metrics(self, first: GpmSample, second: GpmSample, metric_ids: list[int] | Any) -> dict[int, float]:
        _, index, gi = second.handle
        assert first.handle[1:] == second.handle[1:], "GPM samples of two different devices"
        assert {first.handle[0], second.handle[0]} <= self.gpm_live, "a freed GPM sample was used"
        gpu = self._gpu(index, "gpm_metrics")
        values = (gpu.gpm or {}) if gi is None else gpu.mig_gpm.get(gi, {})
        return {GPM_IDS[k]: v for k, v in values.items() if GPM_IDS[k] in metric_ids}

    def gpm_free(self, sample: GpmSample) -> None:
        with self._lock:
            self.gpm_live.discard(sample.handle[0])

    # --- errors ---

    def ecc_errors(self, index: int) -> EccCounts:
        ecc = self._gpu(index, "ecc_errors").ecc
        if ecc is None:
            raise NVMLUnsupported("no ECC", "not_supported")
        return ecc

    def retired_pages_pending(self, index: int) -> bool:
        pending = self._gpu(index, "retired_pages_pending").retired_pending
        if pending is None:
            raise NVMLUnsupported("page retirement", "not_supported")
        return pending

    def remapped_rows(self, index: int) -> RemappedRows:
        rows = self._gpu(index, "remapped_rows").rows
        if rows is None:
            raise NVMLUnsupported("row remapping", "not_supported")
        return rows

    # --- XID events ---

    def push_xid(self, uuid: str | None, xid: int, gpu_instance_id: int | None = None) -> None:
        """What the driver would deliver to the event set (the test plays the driver)."""
        self._xids.put(XidEvent(uuid, xid, gpu_instance_id))

    def open_xid_events(self) -> XidEventSet:
        self.xid_opens += 1
        if self.init_error is not None:
            raise self.init_error
        if self.xid_open_error is not None:
            raise self.xid_open_error
        devices = {i: g.uuid for i, g in enumerate(self.gpus) if g.xid_events and g.broken is None}
        skipped = {g.uuid: "not_supported" for g in self.gpus if not g.xid_events}
        if not devices:
            raise NVMLUnsupported("no GPU reports critical XID events", "not_supported")
        return XidEventSet(object(), devices, skipped)

    def wait_xid_event(self, events: XidEventSet, timeout_ms: int) -> XidEvent | None:
        if self.xid_wait_error is not None:
            raise self.xid_wait_error
        try:
            return self._xids.get(timeout=timeout_ms / 1000.0)
        except queue.Empty:
            return None

    def close_xid_events(self, events: XidEventSet) -> None:
        self.xid_closes += 1


# --- the pynvml module, faked at the library boundary --------------------------------------------------------


class FakePynvml:
    """A stand-in for the ``pynvml`` module: its error classes, constants and structs are the real ones; device
    calls are answered from :class:`FakeGPU` values with the shapes listed in the module docstring.

    ``lost`` (a set of indices) makes every call on those devices raise ``NVMLError_GpuIsLost``; ``no_driver``
    makes ``nvmlInit`` raise ``NVMLError_LibraryNotFound``; ``missing`` names functions the "driver" lacks
    (FUNCTION_NOT_FOUND, as an old driver answers for a newer symbol).
    """

    def __init__(self, gpus: list[FakeGPU], *, no_driver: bool = False) -> None:
        import pynvml as real

        self.real = real
        for name in dir(real):
            if name.startswith(("NVMLError", "NVML_", "c_nvml", "struct_c_nvml", "nvmlEventType")):
                setattr(self, name, getattr(real, name))
        self.NVMLError = real.NVMLError
        self.gpus = gpus
        self.no_driver = no_driver
        self.lost: set[int] = set()
        self.missing: set[str] = set()
        self.refs = 0  # nvmlInit - nvmlShutdown: NVML's own refcount
        self._structs: list[Any] = []  # keeps what the handles point to alive
        self.handles = [self._pointer(real.struct_c_nvmlDevice_t) for _ in gpus]
        self.mig_handles: dict[int, tuple[int, MigDevice]] = {}
        for i, g in enumerate(gpus):
            for m in g.mig:
                self.mig_handles[self._address(self._mig_handle(i, m))] = (i, m)
        self._samples: dict[int, tuple[int, int | None]] = {}  # GPM sample address → (device, GPU instance)
        self.freed_samples: set[int] = set()
        self.registered: set[int] = set()  # device indices registered on an event set
        self.pending_events: list[tuple[int, int]] = []  # (device index, XID) the next waits deliver
        self.event_sets_freed = 0

    def _pointer(self, struct_type: Any) -> Any:
        obj = struct_type()
        self._structs.append(obj)
        return ctypes.pointer(obj)

    def _mig_handle(self, index: int, m: MigDevice) -> Any:
        h = self._pointer(self.real.struct_c_nvmlDevice_t)
        setattr(self, f"_mig_{index}_{m.slot}", h)
        return h

    @staticmethod
    def _address(p: Any) -> int:
        return int(ctypes.cast(p, ctypes.c_void_p).value or 0)

    def _raise(self, code: int) -> None:
        raise self.real.NVMLError(code)

    def _device(self, handle: Any, fn: str) -> FakeGPU:
        if fn in self.missing:
            self._raise(self.real.NVML_ERROR_FUNCTION_NOT_FOUND)
        addr = self._address(handle)
        for i, h in enumerate(self.handles):
            if self._address(h) == addr:
                if i in self.lost:
                    self._raise(self.real.NVML_ERROR_GPU_IS_LOST)
                gpu = self.gpus[i]
                if fn in gpu.unsupported:
                    self._raise(self.real.NVML_ERROR_NOT_SUPPORTED)
                if fn in gpu.no_permission:
                    self._raise(self.real.NVML_ERROR_NO_PERMISSION)
                return gpu
        self._raise(self.real.NVML_ERROR_INVALID_ARGUMENT)
        raise AssertionError  # unreachable

    def _mig(self, handle: Any) -> MigDevice | None:
        got = self.mig_handles.get(self._address(handle))
        return got[1] if got else None

    # lifecycle
    def nvmlInit(self) -> None:
        if self.no_driver:
            raise self.real.NVMLError_LibraryNotFound()
        self.refs += 1

    def nvmlShutdown(self) -> None:
        if self.refs <= 0:
            self._raise(self.real.NVML_ERROR_UNINITIALIZED)
        self.refs -= 1

    def nvmlDeviceGetCount(self) -> int:
        return len(self.gpus)

    def nvmlDeviceGetHandleByIndex(self, index: int) -> Any:
        if index in self.lost:
            self._raise(self.real.NVML_ERROR_GPU_IS_LOST)
        return self.handles[index]

    # identity and plain values
    def nvmlDeviceGetName(self, h: Any) -> str:
        mig = self._mig(h)
        return mig.name if mig else self._device(h, "nvmlDeviceGetName").name

    def nvmlDeviceGetUUID(self, h: Any) -> str:
        mig = self._mig(h)
        return mig.uuid if mig else self._device(h, "nvmlDeviceGetUUID").uuid

    def nvmlDeviceGetUtilizationRates(self, h: Any) -> Any:
        g = self._device(h, "nvmlDeviceGetUtilizationRates")
        if g.mig:
            self._raise(self.real.NVML_ERROR_NOT_SUPPORTED)
        return self.real.c_nvmlUtilization_t(int(g.utilization_percent), int(g.memory_controller_percent))

    def nvmlDeviceGetMemoryInfo(self, h: Any) -> Any:
        mig = self._mig(h)
        if mig:
            return self.real.c_nvmlMemory_t(mig.total_bytes, mig.total_bytes - mig.used_bytes, mig.used_bytes)
        g = self._device(h, "nvmlDeviceGetMemoryInfo")
        return self.real.c_nvmlMemory_t(g.total_bytes, g.total_bytes - g.used_bytes, g.used_bytes)

    def nvmlDeviceGetClockInfo(self, h: Any, clock: int) -> int:
        return int(self._device(h, "nvmlDeviceGetClockInfo").sm_clock_mhz) if clock == self.real.NVML_CLOCK_SM else 0

    def nvmlDeviceGetPowerUsage(self, h: Any) -> int:
        return int(self._device(h, "nvmlDeviceGetPowerUsage").power_mw)

    def nvmlDeviceGetTemperature(self, h: Any, sensor: int) -> int:
        return int(self._device(h, "nvmlDeviceGetTemperature").temperature_c)

    def nvmlDeviceGetCurrentClocksEventReasons(self, h: Any) -> int:
        return self._device(h, "nvmlDeviceGetCurrentClocksEventReasons").reasons

    # processes
    def nvmlDeviceGetComputeRunningProcesses(self, h: Any) -> list[Any]:
        g = self._device(h, "nvmlDeviceGetComputeRunningProcesses")
        na = self.real.NVML_VALUE_NOT_AVAILABLE_uint.value
        return [
            self.real.nvmlFriendlyObject(
                {
                    "pid": p.pid,
                    "usedGpuMemory": p.used_memory_bytes,  # pynvml turns NVML_VALUE_NOT_AVAILABLE into None
                    "gpuInstanceId": na if p.gpu_instance_id is None else p.gpu_instance_id,
                    "computeInstanceId": na if p.gpu_instance_id is None else 0,
                }
            )
            for p in g.processes
        ]

    def nvmlDeviceGetProcessUtilization(self, h: Any, timestamp: int) -> list[Any]:
        g = self._device(h, "nvmlDeviceGetProcessUtilization")
        if g.mig:
            self._raise(self.real.NVML_ERROR_NOT_SUPPORTED)
        fresh = [s for s in g.process_samples if s.timestamp_us > timestamp]
        if not fresh:
            self._raise(self.real.NVML_ERROR_NOT_FOUND)
        out = []
        for s in fresh:
            c = self.real.c_nvmlProcessUtilizationSample_t()
            c.pid, c.timeStamp, c.smUtil, c.memUtil = s.pid, s.timestamp_us, int(s.sm_percent), int(s.memory_percent)
            out.append(c)
        return out

    # MIG
    def nvmlDeviceGetMigMode(self, h: Any) -> list[int]:
        g = self._device(h, "nvmlDeviceGetMigMode")
        if g.gpm is None and "A100" not in g.name and not g.mig:
            self._raise(self.real.NVML_ERROR_NOT_SUPPORTED)  # only A100/A30/H100-class GPUs have MIG
        mode = self.real.NVML_DEVICE_MIG_ENABLE if g.mig else self.real.NVML_DEVICE_MIG_DISABLE
        return [mode, mode]

    def nvmlDeviceGetMaxMigDeviceCount(self, h: Any) -> int:
        self._device(h, "nvmlDeviceGetMaxMigDeviceCount")
        return 7

    def nvmlDeviceGetMigDeviceHandleByIndex(self, h: Any, slot: int) -> Any:
        g = self._device(h, "nvmlDeviceGetMigDeviceHandleByIndex")
        index = self.gpus.index(g)
        for m in g.mig:
            if m.slot == slot:
                return getattr(self, f"_mig_{index}_{slot}")
        self._raise(self.real.NVML_ERROR_NOT_FOUND)

    def nvmlDeviceGetGpuInstanceId(self, h: Any) -> int:
        mig = self._mig(h)
        if mig is None:
            self._raise(self.real.NVML_ERROR_INVALID_ARGUMENT)
        return mig.gpu_instance_id  # type: ignore[union-attr]

    # GPM
    def nvmlGpmQueryDeviceSupport(self, h: Any) -> Any:
        g = self._device(h, "nvmlGpmQueryDeviceSupport")
        support = self.real.c_nvmlGpmSupport_t()
        support.version = self.real.NVML_GPM_SUPPORT_VERSION
        support.isSupportedDevice = int(g.gpm is not None)
        return support

    def nvmlGpmSampleAlloc(self) -> Any:
        if "nvmlGpmSampleAlloc" in self.missing:
            self._raise(self.real.NVML_ERROR_FUNCTION_NOT_FOUND)
        return self._pointer(self.real.struct_c_nvmlGpmSample_t)

    def nvmlGpmSampleGet(self, h: Any, sample: Any) -> Any:
        g = self._device(h, "nvmlGpmSampleGet")
        if g.gpm is None:
            self._raise(self.real.NVML_ERROR_NOT_SUPPORTED)
        self._samples[self._address(sample)] = (self.gpus.index(g), None)
        return sample

    def nvmlGpmMigSampleGet(self, h: Any, gpu_instance_id: int, sample: Any) -> Any:
        g = self._device(h, "nvmlGpmMigSampleGet")
        if gpu_instance_id not in {m.gpu_instance_id for m in g.mig}:
            self._raise(self.real.NVML_ERROR_INVALID_ARGUMENT)
        self._samples[self._address(sample)] = (self.gpus.index(g), gpu_instance_id)
        return sample

    def nvmlGpmMetricsGet(self, request: Any) -> Any:
        first, second = self._address(request.sample1), self._address(request.sample2)
        if request.version != self.real.NVML_GPM_METRICS_GET_VERSION or first in self.freed_samples:
            self._raise(self.real.NVML_ERROR_INVALID_ARGUMENT)
        if first not in self._samples or self._samples[first] != self._samples.get(second):
            self._raise(self.real.NVML_ERROR_INVALID_ARGUMENT)
        index, gi = self._samples[second]
        g = self.gpus[index]
        values = (g.gpm or {}) if gi is None else g.mig_gpm.get(gi, {})
        by_id = {GPM_IDS[k]: v for k, v in values.items()}
        for i in range(request.numMetrics):
            metric = request.metrics[i]
            if metric.metricId in by_id:
                metric.nvmlReturn, metric.value = self.real.NVML_SUCCESS, by_id[metric.metricId]
            else:
                metric.nvmlReturn = self.real.NVML_ERROR_NOT_SUPPORTED
        return request

    def nvmlGpmSampleFree(self, sample: Any) -> None:
        self.freed_samples.add(self._address(sample))

    # errors
    def nvmlDeviceGetTotalEccErrors(self, h: Any, error_type: int, counter: int) -> int:
        ecc = self._device(h, "nvmlDeviceGetTotalEccErrors").ecc
        if ecc is None:
            self._raise(self.real.NVML_ERROR_NOT_SUPPORTED)
        corrected = error_type == self.real.NVML_MEMORY_ERROR_TYPE_CORRECTED
        volatile = counter == self.real.NVML_VOLATILE_ECC
        return {
            (True, True): ecc.corrected_volatile,  # type: ignore[union-attr]
            (False, True): ecc.uncorrected_volatile,  # type: ignore[union-attr]
            (True, False): ecc.corrected_aggregate,  # type: ignore[union-attr]
            (False, False): ecc.uncorrected_aggregate,  # type: ignore[union-attr]
        }[(corrected, volatile)]

    def nvmlDeviceGetRemappedRows(self, h: Any) -> tuple[int, int, int, int]:
        rows = self._device(h, "nvmlDeviceGetRemappedRows").rows
        if rows is None:
            self._raise(self.real.NVML_ERROR_NOT_SUPPORTED)
        return (rows.correctable, rows.uncorrectable, int(rows.pending), int(rows.failed))  # type: ignore[union-attr]

    def nvmlDeviceGetRetiredPagesPendingStatus(self, h: Any) -> int:
        pending = self._device(h, "nvmlDeviceGetRetiredPagesPendingStatus").retired_pending
        if pending is None:
            self._raise(self.real.NVML_ERROR_NOT_SUPPORTED)
        return int(bool(pending))

    # events
    def nvmlEventSetCreate(self) -> Any:
        return self._pointer(self.real.struct_c_nvmlEventSet_t)

    def nvmlDeviceGetSupportedEventTypes(self, h: Any) -> int:
        g = self._device(h, "nvmlDeviceGetSupportedEventTypes")
        xid = self.real.nvmlEventTypeXidCriticalError if g.xid_events else 0
        return int(self.real.nvmlEventTypeSingleBitEccError | self.real.nvmlEventTypePState | xid)

    def nvmlDeviceRegisterEvents(self, h: Any, types: int, event_set: Any) -> None:
        g = self._device(h, "nvmlDeviceRegisterEvents")
        if not g.xid_events and types & self.real.nvmlEventTypeXidCriticalError:
            self._raise(self.real.NVML_ERROR_NOT_SUPPORTED)
        self.registered.add(self.gpus.index(g))

    def nvmlEventSetWait(self, event_set: Any, timeout_ms: int) -> Any:
        if not self.pending_events:
            time.sleep(min(timeout_ms, 20) / 1000.0)
            self._raise(self.real.NVML_ERROR_TIMEOUT)
        index, xid = self.pending_events.pop(0)
        data = self.real.c_nvmlEventData_t()
        data.device = self.handles[index]
        data.eventType = self.real.nvmlEventTypeXidCriticalError
        data.eventData = xid
        data.gpuInstanceId = self.real.NVML_VALUE_NOT_AVAILABLE_uint.value
        data.computeInstanceId = self.real.NVML_VALUE_NOT_AVAILABLE_uint.value
        return data

    def nvmlEventSetFree(self, event_set: Any) -> None:
        self.event_sets_freed += 1
