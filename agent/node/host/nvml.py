"""The NVML boundary: a small client protocol, its implementation over nvidia-ml-py (``pynvml``), and the XID
event watcher that runs beside the collector.

The ``gpu`` collector and ``doctor`` only talk to :class:`NVMLClient` (taken from ``ctx.nvml``, which a test
replaces with a fake), so they are tested without a GPU. Units are NVML's own here (percent, MHz, mW, °C, bytes,
GPM rates in MiB/s); the collector converts to base units. Shapes and constants follow nvidia-ml-py 13.615.71
(``pynvml.py``: ``c_nvmlGpmMetricsGet_t``, ``c_nvmlEventData_t``, ``c_nvmlProcessUtilizationSample_t``,
``nvmlDeviceGetRemappedRows`` → 4-tuple, ``nvmlDeviceGetMigMode`` → [current, pending]).

Errors: a host without the NVML library, driver or any GPU raises NoDataError with a hint (expected absence); a
value a device does not give us raises :class:`NVMLUnsupported` with its reason (skip that metric, say why); a
GPU that fell off the bus or needs a reset raises :class:`NVMLDeviceLost` (that device is reported lost, the
others still are); any other NVML error (driver/library mismatch, unknown) raises CollectorError.

XID events (``nvmlEventSetWait``) block, so they are read by :class:`XidWatcher` in its own thread, never on the
collection path: the collector only reads the watcher's counts. The watcher holds its own NVML reference
(``nvmlInit``/``nvmlShutdown`` are refcounted by NVML), so a ``shutdown`` elsewhere does not pull the library
from under its event set.
"""

from __future__ import annotations

import contextlib
import ctypes
import logging
import threading
import time
from collections import deque
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any, Protocol

from inferwatch.agent.errors import CollectorError, NoDataError

log = logging.getLogger(__name__)

# Clock-event (throttle) reason bits, nvml.h nvmlClocksEventReason* / nvmlClocksThrottleReason*.
CLOCK_EVENT_REASONS: dict[str, int] = {
    "gpu_idle": 0x1,
    "applications_clocks_setting": 0x2,
    "sw_power_cap": 0x4,
    "hw_slowdown": 0x8,
    "sync_boost": 0x10,
    "sw_thermal_slowdown": 0x20,
    "hw_thermal_slowdown": 0x40,
    "hw_power_brake_slowdown": 0x80,
    "display_clock_setting": 0x100,
}
# Reasons that mean the GPU runs slower than it should (the rest are benign or configuration).
SLOWDOWN_REASONS = (
    "sw_power_cap",
    "hw_slowdown",
    "sw_thermal_slowdown",
    "hw_thermal_slowdown",
    "hw_power_brake_slowdown",
)
# GPM metric ids (pynvml NVML_GPM_METRIC_*; percentages 0..100, throughputs in MiB/s), by the agent's name.
GPM_METRIC_IDS: dict[str, int] = {
    "sm_activity": 2,  # NVML_GPM_METRIC_SM_UTIL: share of SMs busy
    "sm_occupancy": 3,  # NVML_GPM_METRIC_SM_OCCUPANCY: resident warps / theoretical maximum
    "tensor_activity": 5,  # NVML_GPM_METRIC_ANY_TENSOR_UTIL: time SMs issue any tensor instruction
    "dram_bandwidth": 10,  # NVML_GPM_METRIC_DRAM_BW_UTIL: DRAM bandwidth used / theoretical maximum
    "pcie_transmit": 20,  # NVML_GPM_METRIC_PCIE_TX_PER_SEC
    "pcie_receive": 21,  # NVML_GPM_METRIC_PCIE_RX_PER_SEC
    "nvlink_receive": 60,  # NVML_GPM_METRIC_NVLINK_TOTAL_RX_PER_SEC
    "nvlink_transmit": 61,  # NVML_GPM_METRIC_NVLINK_TOTAL_TX_PER_SEC
}
# What a MIG GPU instance can be sampled for (nvmlGpmMigSampleGet): its own SMs and memory, not the links.
GPM_INSTANCE_METRICS = ("sm_activity", "sm_occupancy", "tensor_activity", "dram_bandwidth")
XID_CRITICAL_EVENT = 0x8  # pynvml nvmlEventTypeXidCriticalError; the event's eventData is the XID
NOT_AN_INSTANCE = 0xFFFFFFFF  # NVML_VALUE_NOT_AVAILABLE_uint: gpuInstanceId of a process/event outside MIG
ECC_CORRECTED, ECC_UNCORRECTED = 0, 1  # NVML_MEMORY_ERROR_TYPE_*
ECC_VOLATILE, ECC_AGGREGATE = 0, 1  # NVML_VOLATILE_ECC (since the driver loaded), NVML_AGGREGATE_ECC (lifetime)

# NVML return codes read here (pynvml NVML_ERROR_*), so the translation does not depend on the module's classes.
_NOT_SUPPORTED, _NO_PERMISSION, _NOT_FOUND, _TIMEOUT, _FUNCTION_NOT_FOUND = 3, 4, 6, 10, 13
_GPU_IS_LOST, _RESET_REQUIRED = 15, 16
UNSUPPORTED_REASONS = {_NOT_SUPPORTED: "not_supported", _NO_PERMISSION: "no_permission"}
UNSUPPORTED_REASONS[_FUNCTION_NOT_FOUND] = "driver_too_old"  # the library lacks the symbol (older driver)
LOST_REASONS = {_GPU_IS_LOST: "gpu_is_lost", _RESET_REQUIRED: "reset_required"}


class NVMLUnsupported(Exception):
    """The device does not give us this value: ``reason`` is ``not_supported`` (this GPU or mode has no such
    counter), ``no_permission`` (needs root or a capability) or ``driver_too_old`` (function not found)."""

    def __init__(self, message: str, reason: str = "not_supported") -> None:
        super().__init__(message)
        self.reason = reason


class NVMLNotFound(Exception):
    """NVML_ERROR_NOT_FOUND: no such object (an empty MIG slot, no process sample since the timestamp)."""


class NVMLDeviceLost(CollectorError):
    """GPU_IS_LOST (fallen off the bus, XID 79) or RESET_REQUIRED: this GPU answers nothing until it is reset.
    ``reason`` is ``gpu_is_lost`` or ``reset_required``."""

    def __init__(self, message: str, reason: str = "gpu_is_lost") -> None:
        super().__init__(message)
        self.reason = reason


@dataclass(frozen=True, slots=True)
class GpuProcess:
    pid: int  # host-namespace pid (the driver ignores pid namespaces)
    used_memory_bytes: int | None  # None when the driver cannot attribute memory (e.g. under MIG/WDDM)
    gpu_instance_id: int | None = None  # the MIG GPU instance the process runs in; None outside MIG


@dataclass(frozen=True, slots=True)
class MigDevice:
    """One MIG device (GPU instance + compute instance) of a MIG-enabled GPU."""

    slot: int  # index under the parent (nvmlDeviceGetMigDeviceHandleByIndex)
    uuid: str  # MIG-...
    name: str  # e.g. "NVIDIA H100 80GB HBM3 MIG 1g.10gb"
    gpu_instance_id: int
    used_bytes: int
    total_bytes: int


@dataclass(frozen=True, slots=True)
class GpmSample:
    """An allocated GPM sample buffer, filled at ``taken_s`` (monotonic seconds); free it with ``gpm_free``."""

    handle: Any
    taken_s: float
    gpu_instance_id: int | None = None


@dataclass(frozen=True, slots=True)
class EccCounts:
    """nvmlDeviceGetTotalEccErrors: volatile counts since the driver loaded, aggregate over the GPU's life."""

    corrected_volatile: int
    uncorrected_volatile: int
    corrected_aggregate: int
    uncorrected_aggregate: int


@dataclass(frozen=True, slots=True)
class RemappedRows:
    """nvmlDeviceGetRemappedRows (Ampere and later): rows remapped for correctable / uncorrectable errors, a
    remapping waiting for a GPU reset, and a remapping that failed (spare rows exhausted)."""

    correctable: int
    uncorrectable: int
    pending: bool
    failed: bool


@dataclass(frozen=True, slots=True)
class ProcessUtilization:
    """One nvmlDeviceGetProcessUtilization sample (c_nvmlProcessUtilizationSample_t): percent of the driver's
    sample period in which a kernel of ``pid`` ran on the SMs / read or wrote memory."""

    pid: int
    timestamp_us: int
    sm_percent: float
    memory_percent: float


@dataclass(frozen=True, slots=True)
class XidEvent:
    uuid: str | None  # the GPU the event names; None if its handle is not one we registered
    xid: int
    gpu_instance_id: int | None = None


@dataclass(frozen=True, slots=True)
class XidEventSet:
    """An NVML event set with every GPU that reports critical XIDs registered on it."""

    handle: Any
    devices: Mapping[int, str]  # device handle address → GPU UUID
    skipped: Mapping[str, str] = field(default_factory=dict)  # GPU UUID (or "index N") → why not registered


class NVMLClient(Protocol):
    def init(self) -> None: ...
    def shutdown(self) -> None: ...
    def device_count(self) -> int: ...
    def name(self, index: int) -> str: ...
    def uuid(self, index: int) -> str: ...
    def utilization_percent(self, index: int) -> float: ...
    def memory_controller_percent(self, index: int) -> float: ...
    def memory_bytes(self, index: int) -> tuple[int, int]: ...  # (used, total)
    def sm_clock_mhz(self, index: int) -> float: ...
    def power_milliwatts(self, index: int) -> float: ...
    def temperature_celsius(self, index: int) -> float: ...
    def clock_event_reasons(self, index: int) -> int: ...
    def compute_processes(self, index: int) -> list[GpuProcess]: ...
    def process_utilization(self, index: int, since_us: int) -> list[ProcessUtilization]: ...
    def mig_enabled(self, index: int) -> bool: ...
    def mig_devices(self, index: int) -> list[MigDevice]: ...
    def gpm_supported(self, index: int) -> bool: ...
    def gpm_sample(self, index: int, gpu_instance_id: int | None = None) -> GpmSample: ...
    def gpm_metrics(self, first: GpmSample, second: GpmSample, metric_ids: Sequence[int]) -> dict[int, float]: ...
    def gpm_free(self, sample: GpmSample) -> None: ...
    def ecc_errors(self, index: int) -> EccCounts: ...
    def retired_pages_pending(self, index: int) -> bool: ...
    def remapped_rows(self, index: int) -> RemappedRows: ...
    def open_xid_events(self) -> XidEventSet: ...
    def wait_xid_event(self, events: XidEventSet, timeout_ms: int) -> XidEvent | None: ...
    def close_xid_events(self, events: XidEventSet) -> None: ...


NVML_ABSENT_RETRY_S = 60.0
NO_NVML_HINT = (
    "install the NVIDIA driver (libnvidia-ml.so.1); in a container run with the NVIDIA container toolkit "
    "(--gpus all / runtime: nvidia); on a host without a GPU disable the collector with --no-collector.gpu"
)


def _text(value: object) -> str:
    return value.decode() if isinstance(value, bytes) else str(value)


def _address(handle: object) -> int:
    """A device handle's pointer value: the key that maps an event's ``device`` back to a registered GPU."""
    try:
        return int(ctypes.cast(handle, ctypes.c_void_p).value or 0)  # type: ignore[arg-type]
    except (TypeError, ctypes.ArgumentError):
        return id(handle)


NVML_LIBRARY = "libnvidia-ml.so.1"  # what pynvml's nvmlInit loads on Linux


class PynvmlClient:
    """:class:`NVMLClient` over nvidia-ml-py. Thread-safe; ``init``/``shutdown`` are refcounted by NVML."""

    def __init__(self) -> None:
        self._nvml: Any = None  # pynvml, imported once the driver's library is found (~1.1 MB of objects)
        self._lock = threading.Lock()
        self._handles: dict[int, Any] = {}
        self._initialised = False
        self._absent: tuple[float, NoDataError] | None = None

    def _translate(self, fn: str, exc: Any) -> Exception:
        code = getattr(exc, "value", None)
        if code in UNSUPPORTED_REASONS:
            return NVMLUnsupported(f"{fn}: {exc}", UNSUPPORTED_REASONS[code])
        if code in LOST_REASONS:
            return NVMLDeviceLost(f"NVML {fn} failed: {exc}", LOST_REASONS[code])
        if code == _NOT_FOUND:
            return NVMLNotFound(f"{fn}: {exc}")
        return CollectorError(f"NVML {fn} failed: {exc}")

    def _call(self, fn: str, *args: Any) -> Any:
        nv = self._nvml
        try:
            return getattr(nv, fn)(*args)
        except nv.NVMLError as exc:
            raise self._translate(fn, exc) from None

    def _library_init(self) -> None:
        """nvmlInit, with the host's absence of a driver as NoDataError (told before pynvml is imported: the library
        pynvml loads, ``libnvidia-ml.so.1``, cannot be loaded)."""
        if self._nvml is None:
            try:
                ctypes.CDLL(NVML_LIBRARY)
            except OSError:
                raise NoDataError("NVML library not found: no NVIDIA driver on this host", hint=NO_NVML_HINT) from None
            import pynvml

            self._nvml = pynvml
        nv = self._nvml
        try:
            nv.nvmlInit()
        except nv.NVMLError_LibraryNotFound:
            raise NoDataError("NVML library not found: no NVIDIA driver on this host", hint=NO_NVML_HINT) from None
        except nv.NVMLError_DriverNotLoaded:
            raise NoDataError(
                "NVIDIA kernel driver not loaded", hint="load the nvidia kernel module (modprobe nvidia)"
            ) from None
        except nv.NVMLError as exc:
            raise CollectorError(f"nvmlInit failed: {exc}") from None

    def init(self) -> None:
        with self._lock:
            if self._initialised:
                return
            # A host without a driver stays without one: retry the (dlopen-heavy) init once a minute, not
            # on every cycle; in between, report the same absence. (The gpu collector's registry entry
            # also tells the runner not to call sooner: absent_retry_s.)
            if self._absent is not None and (self.retry_in() or 0.0) > 0:
                raise self._absent[1]
            try:
                self._library_init()
            except NoDataError as exc:
                raise self._remember_absent(exc) from None
            self._initialised = True
            self._absent = None
            self._handles = {}

    def retry_in(self) -> float | None:
        """Seconds until init tries the library again after an absence (None: no absence remembered)."""
        if self._absent is None:
            return None
        return max(0.0, NVML_ABSENT_RETRY_S - (time.monotonic() - self._absent[0]))

    def _remember_absent(self, exc: NoDataError) -> NoDataError:
        self._absent = (time.monotonic(), exc)
        return exc

    def shutdown(self) -> None:
        with self._lock:
            if self._initialised:
                self._initialised = False
                with contextlib.suppress(self._nvml.NVMLError):
                    self._nvml.nvmlShutdown()

    def _h(self, index: int) -> Any:
        h = self._handles.get(index)
        if h is None:
            h = self._handles[index] = self._call("nvmlDeviceGetHandleByIndex", index)
        return h

    def device_count(self) -> int:
        return int(self._call("nvmlDeviceGetCount"))

    def name(self, index: int) -> str:
        return _text(self._call("nvmlDeviceGetName", self._h(index)))

    def uuid(self, index: int) -> str:
        return _text(self._call("nvmlDeviceGetUUID", self._h(index)))

    def utilization_percent(self, index: int) -> float:
        return float(self._call("nvmlDeviceGetUtilizationRates", self._h(index)).gpu)

    def memory_controller_percent(self, index: int) -> float:
        return float(self._call("nvmlDeviceGetUtilizationRates", self._h(index)).memory)

    def memory_bytes(self, index: int) -> tuple[int, int]:
        m = self._call("nvmlDeviceGetMemoryInfo", self._h(index))
        return int(m.used), int(m.total)

    def sm_clock_mhz(self, index: int) -> float:
        return float(self._call("nvmlDeviceGetClockInfo", self._h(index), self._nvml.NVML_CLOCK_SM))

    def power_milliwatts(self, index: int) -> float:
        return float(self._call("nvmlDeviceGetPowerUsage", self._h(index)))

    def temperature_celsius(self, index: int) -> float:
        return float(self._call("nvmlDeviceGetTemperature", self._h(index), self._nvml.NVML_TEMPERATURE_GPU))

    def clock_event_reasons(self, index: int) -> int:
        fn = "nvmlDeviceGetCurrentClocksEventReasons"
        if not hasattr(self._nvml, fn):
            fn = "nvmlDeviceGetCurrentClocksThrottleReasons"
        return int(self._call(fn, self._h(index)))

    def compute_processes(self, index: int) -> list[GpuProcess]:
        procs = self._call("nvmlDeviceGetComputeRunningProcesses", self._h(index))
        out = []
        for p in procs:
            gi = getattr(p, "gpuInstanceId", None)
            used = None if p.usedGpuMemory is None else int(p.usedGpuMemory)
            out.append(GpuProcess(int(p.pid), used, None if gi is None or gi == NOT_AN_INSTANCE else int(gi)))
        return out

    def process_utilization(self, index: int, since_us: int) -> list[ProcessUtilization]:
        nv = self._nvml
        fn = "nvmlDeviceGetProcessUtilization"
        try:
            samples = getattr(nv, fn)(self._h(index), since_us)
        except nv.NVMLError as exc:
            # pynvml raises NVMLError(ret) for any first-call return but INSUFFICIENT_SIZE: SUCCESS (0 samples)
            # and NOT_FOUND (no sample newer than since_us) both mean "nothing ran since then".
            if getattr(exc, "value", None) in (nv.NVML_SUCCESS, _NOT_FOUND):
                return []
            raise self._translate(fn, exc) from None
        return [ProcessUtilization(int(s.pid), int(s.timeStamp), float(s.smUtil), float(s.memUtil)) for s in samples]

    def mig_enabled(self, index: int) -> bool:
        current, _pending = self._call("nvmlDeviceGetMigMode", self._h(index))
        return int(current) == int(self._nvml.NVML_DEVICE_MIG_ENABLE)

    def mig_devices(self, index: int) -> list[MigDevice]:
        parent = self._h(index)
        out: list[MigDevice] = []
        for slot in range(int(self._call("nvmlDeviceGetMaxMigDeviceCount", parent))):
            try:
                h = self._call("nvmlDeviceGetMigDeviceHandleByIndex", parent, slot)
            except NVMLNotFound:
                continue  # an empty slot
            mem = self._call("nvmlDeviceGetMemoryInfo", h)
            out.append(
                MigDevice(
                    slot,
                    _text(self._call("nvmlDeviceGetUUID", h)),
                    _text(self._call("nvmlDeviceGetName", h)),
                    int(self._call("nvmlDeviceGetGpuInstanceId", h)),
                    int(mem.used),
                    int(mem.total),
                )
            )
        return out

    def gpm_supported(self, index: int) -> bool:
        return bool(self._call("nvmlGpmQueryDeviceSupport", self._h(index)).isSupportedDevice)

    def gpm_sample(self, index: int, gpu_instance_id: int | None = None) -> GpmSample:
        handle = self._call("nvmlGpmSampleAlloc")
        try:
            if gpu_instance_id is None:
                self._call("nvmlGpmSampleGet", self._h(index), handle)
            else:
                self._call("nvmlGpmMigSampleGet", self._h(index), gpu_instance_id, handle)
        except BaseException:
            with contextlib.suppress(self._nvml.NVMLError):
                self._nvml.nvmlGpmSampleFree(handle)
            raise
        return GpmSample(handle, time.monotonic(), gpu_instance_id)

    def gpm_metrics(self, first: GpmSample, second: GpmSample, metric_ids: Sequence[int]) -> dict[int, float]:
        """The metrics between two samples; a metric whose own nvmlReturn is not SUCCESS is left out."""
        nv = self._nvml
        request = nv.c_nvmlGpmMetricsGet_t()
        request.version = nv.NVML_GPM_METRICS_GET_VERSION
        request.numMetrics = len(metric_ids)
        request.sample1 = first.handle
        request.sample2 = second.handle
        for i, metric in enumerate(metric_ids):
            request.metrics[i].metricId = metric
        self._call("nvmlGpmMetricsGet", request)
        return {
            int(request.metrics[i].metricId): float(request.metrics[i].value)
            for i in range(len(metric_ids))
            if int(request.metrics[i].nvmlReturn) == nv.NVML_SUCCESS
        }

    def gpm_free(self, sample: GpmSample) -> None:
        with contextlib.suppress(self._nvml.NVMLError):
            self._nvml.nvmlGpmSampleFree(sample.handle)

    def ecc_errors(self, index: int) -> EccCounts:
        h = self._h(index)

        def count(error_type: int, counter: int) -> int:
            return int(self._call("nvmlDeviceGetTotalEccErrors", h, error_type, counter))

        return EccCounts(
            count(ECC_CORRECTED, ECC_VOLATILE),
            count(ECC_UNCORRECTED, ECC_VOLATILE),
            count(ECC_CORRECTED, ECC_AGGREGATE),
            count(ECC_UNCORRECTED, ECC_AGGREGATE),
        )

    def retired_pages_pending(self, index: int) -> bool:
        return int(self._call("nvmlDeviceGetRetiredPagesPendingStatus", self._h(index))) == 1  # NVML_FEATURE_ENABLED

    def remapped_rows(self, index: int) -> RemappedRows:
        corr, unc, pending, failed = self._call("nvmlDeviceGetRemappedRows", self._h(index))
        return RemappedRows(int(corr), int(unc), bool(pending), bool(failed))

    def open_xid_events(self) -> XidEventSet:
        """An event set with every GPU that supports critical-XID events registered; its own NVML reference."""
        self._library_init()
        nv = self._nvml
        handle = None
        try:
            handle = self._call("nvmlEventSetCreate")
            devices: dict[int, str] = {}
            skipped: dict[str, str] = {}
            for i in range(int(self._call("nvmlDeviceGetCount"))):
                name = f"index {i}"
                try:
                    h = self._call("nvmlDeviceGetHandleByIndex", i)
                    name = _text(self._call("nvmlDeviceGetUUID", h))
                    if not int(self._call("nvmlDeviceGetSupportedEventTypes", h)) & XID_CRITICAL_EVENT:
                        skipped[name] = "not_supported"
                        continue
                    self._call("nvmlDeviceRegisterEvents", h, XID_CRITICAL_EVENT, handle)
                except NVMLUnsupported as exc:
                    skipped[name] = exc.reason
                    continue
                except NVMLDeviceLost as exc:
                    skipped[name] = exc.reason
                    continue
                devices[_address(h)] = name
            if not devices:
                reasons = sorted(set(skipped.values())) or ["no GPU"]
                raise NVMLUnsupported("no GPU reports critical XID events", reasons[0])
        except BaseException:
            if handle is not None:
                with contextlib.suppress(nv.NVMLError):
                    nv.nvmlEventSetFree(handle)
            with contextlib.suppress(nv.NVMLError):
                nv.nvmlShutdown()
            raise
        return XidEventSet(handle, devices, skipped)

    def wait_xid_event(self, events: XidEventSet, timeout_ms: int) -> XidEvent | None:
        """Block up to ``timeout_ms`` for one event; None on timeout or an event that is not an XID."""
        nv = self._nvml
        try:
            data = nv.nvmlEventSetWait(events.handle, timeout_ms)
        except nv.NVMLError as exc:
            if getattr(exc, "value", None) == _TIMEOUT:
                return None
            raise self._translate("nvmlEventSetWait", exc) from None
        if not int(data.eventType) & XID_CRITICAL_EVENT:
            return None
        gi = int(data.gpuInstanceId)
        return XidEvent(
            events.devices.get(_address(data.device)), int(data.eventData), None if gi == NOT_AN_INSTANCE else gi
        )

    def close_xid_events(self, events: XidEventSet) -> None:
        nv = self._nvml
        with contextlib.suppress(nv.NVMLError):
            nv.nvmlEventSetFree(events.handle)
        with contextlib.suppress(nv.NVMLError):
            nv.nvmlShutdown()


# --- XID events, off the collection path ------------------------------------------------------------------

XID_WAIT_MS = 500  # one nvmlEventSetWait blocks at most this long: it bounds how long stop() waits
XID_RETRY_S = 60.0  # after an absence (no driver, no XID support) or a failure, open the event set again this often
XID_RECENT_MAX = 32  # the last events kept for findings and the status API


@dataclass(frozen=True, slots=True)
class XidRecord:
    uuid: str
    xid: int
    gpu_instance_id: int | None
    at_unix_s: float


@dataclass(frozen=True, slots=True)
class XidState:
    """What the watcher knows: ``status`` is ``stopped``, ``starting``, ``watching``, ``absent`` (no driver or no
    GPU reports XIDs; ``reason`` says which) or ``failed`` (``reason`` is the error; it retries)."""

    status: str
    reason: str = ""
    devices: tuple[str, ...] = ()  # UUIDs whose XIDs are counted
    skipped: Mapping[str, str] = field(default_factory=dict)
    counts: Mapping[tuple[str, int], int] = field(default_factory=dict)  # (UUID, XID) → events since start
    recent: tuple[XidRecord, ...] = ()
    unattributed: int = 0  # events whose device handle matched no registered GPU


class XidWatcher:
    """Counts critical XID events per GPU in a daemon thread; bounded (one wait at a time, counts keyed by GPU and
    XID, the last :data:`XID_RECENT_MAX` events) and stoppable within :data:`XID_WAIT_MS`. Without a driver it
    reports ``absent`` and looks again every :data:`XID_RETRY_S`."""

    def __init__(
        self,
        client: NVMLClient,
        *,
        wait_ms: int = XID_WAIT_MS,
        retry_s: float = XID_RETRY_S,
        wall: Callable[[], float] = time.time,
    ) -> None:
        self.client = client
        self.wait_ms = wait_ms
        self.retry_s = retry_s
        self._wall = wall
        self._lock = threading.Lock()
        self._stop = threading.Event()
        self._thread: threading.Thread | None = None
        self._status = "stopped"
        self._reason = ""
        self._devices: tuple[str, ...] = ()
        self._skipped: dict[str, str] = {}
        self._counts: dict[tuple[str, int], int] = {}
        self._recent: deque[XidRecord] = deque(maxlen=XID_RECENT_MAX)
        self._unattributed = 0

    def start(self) -> None:
        """Start the thread once; later calls do nothing (also after stop: a stopped watcher stays stopped)."""
        with self._lock:
            if self._thread is not None:
                return
            self._status = "starting"
            self._thread = threading.Thread(target=self._run, name="nvml-xid-events", daemon=True)
            self._thread.start()

    def stop(self, timeout_s: float | None = None) -> None:
        """Ask the thread to end and wait for it (one event wait plus a margin by default). Safe to call twice."""
        self._stop.set()
        thread = self._thread
        if thread is not None and thread is not threading.current_thread():
            thread.join(self.wait_ms / 1000.0 + 2.0 if timeout_s is None else timeout_s)

    def state(self) -> XidState:
        with self._lock:
            return XidState(
                self._status,
                self._reason,
                self._devices,
                dict(self._skipped),
                dict(self._counts),
                tuple(self._recent),
                self._unattributed,
            )

    def _set(self, status: str, reason: str = "", events: XidEventSet | None = None) -> None:
        with self._lock:
            changed = (status, reason) != (self._status, self._reason)
            self._status, self._reason = status, reason
            if events is not None:
                self._devices = tuple(sorted(set(events.devices.values())))
                self._skipped = dict(events.skipped)
        if changed and status == "failed":
            log.warning("NVML XID events: %s; retrying every %.0f s", reason, self.retry_s)
        elif changed and status == "watching":
            log.info("NVML XID events: watching %d GPU(s)", len(self._devices))

    def _record(self, event: XidEvent) -> None:
        with self._lock:
            if event.uuid is None:
                self._unattributed += 1
                return
            key = (event.uuid, event.xid)
            self._counts[key] = self._counts.get(key, 0) + 1
            self._recent.append(XidRecord(event.uuid, event.xid, event.gpu_instance_id, self._wall()))

    def _run(self) -> None:
        events: XidEventSet | None = None
        try:
            while not self._stop.is_set():
                if events is None:
                    try:
                        events = self.client.open_xid_events()
                    except NoDataError as exc:
                        self._set("absent", str(exc))
                    except NVMLUnsupported as exc:
                        self._set("absent", f"{exc.reason}: {exc}")
                    except Exception as exc:  # any NVML failure: report it, try again later
                        self._set("failed", str(exc) or type(exc).__name__)
                    else:
                        self._set("watching", "", events)
                        continue
                    self._stop.wait(self.retry_s)
                    continue
                try:
                    event = self.client.wait_xid_event(events, self.wait_ms)
                except Exception as exc:
                    self._set("failed", str(exc) or type(exc).__name__)
                    self._close(events)
                    events = None
                    self._stop.wait(self.retry_s)
                    continue
                if event is not None:
                    self._record(event)
        finally:
            if events is not None:
                self._close(events)
            with self._lock:
                self._status = "stopped"

    def _close(self, events: XidEventSet) -> None:
        try:
            self.client.close_xid_events(events)
        except Exception:
            log.debug("closing the NVML event set failed", exc_info=True)
