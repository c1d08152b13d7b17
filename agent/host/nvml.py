"""The NVML boundary: a small client protocol, and its implementation over nvidia-ml-py (``pynvml``).

The ``gpu`` collector and ``doctor`` only talk to :class:`NVMLClient` (taken from
``ctx.nvml``, which a test replaces with a fake), so they are tested without a GPU.
Units are NVML's own here (percent, MHz, mW, °C, bytes); the collector converts to base units.

Errors: a host without the NVML library, driver or any GPU raises NoDataError with a hint (expected
absence); a value a device does not support raises :class:`NVMLUnsupported` (skip that metric); any
other NVML error (GPU lost, driver/library mismatch) raises CollectorError.
"""

from __future__ import annotations

import contextlib
import threading
import time
from dataclasses import dataclass
from typing import Any, Protocol

from agent.errors import CollectorError, NoDataError

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


class NVMLUnsupported(Exception):
    """The device does not report this value to us (NOT_SUPPORTED, FUNCTION_NOT_FOUND, NO_PERMISSION)."""


@dataclass(frozen=True, slots=True)
class GpuProcess:
    pid: int  # host-namespace pid (the driver ignores pid namespaces)
    used_memory_bytes: int | None  # None when the driver cannot attribute memory (e.g. under MIG/WDDM)


class NVMLClient(Protocol):
    def init(self) -> None: ...
    def shutdown(self) -> None: ...
    def device_count(self) -> int: ...
    def name(self, index: int) -> str: ...
    def uuid(self, index: int) -> str: ...
    def utilization_percent(self, index: int) -> float: ...
    def memory_bytes(self, index: int) -> tuple[int, int]: ...  # (used, total)
    def sm_clock_mhz(self, index: int) -> float: ...
    def power_milliwatts(self, index: int) -> float: ...
    def temperature_celsius(self, index: int) -> float: ...
    def clock_event_reasons(self, index: int) -> int: ...
    def compute_processes(self, index: int) -> list[GpuProcess]: ...


NVML_ABSENT_RETRY_S = 60.0
NO_NVML_HINT = (
    "install the NVIDIA driver (libnvidia-ml.so.1); in a container run with the NVIDIA container toolkit "
    "(--gpus all / runtime: nvidia); on a host without a GPU disable the collector with --no-collector.gpu"
)


class PynvmlClient:
    """:class:`NVMLClient` over nvidia-ml-py. Thread-safe; ``init``/``shutdown`` are refcounted by NVML."""

    def __init__(self) -> None:
        import pynvml

        self._nvml: Any = pynvml
        self._lock = threading.Lock()
        self._handles: dict[int, Any] = {}
        self._initialised = False
        self._absent: tuple[float, NoDataError] | None = None

    def _call(self, fn: str, *args: Any) -> Any:
        nv = self._nvml
        try:
            return getattr(nv, fn)(*args)
        except (nv.NVMLError_NotSupported, nv.NVMLError_FunctionNotFound, nv.NVMLError_NoPermission) as exc:
            raise NVMLUnsupported(f"{fn}: {exc}") from None
        except nv.NVMLError as exc:
            raise CollectorError(f"NVML {fn} failed: {exc}") from None

    def init(self) -> None:
        nv = self._nvml
        with self._lock:
            if self._initialised:
                return
            # A host without a driver stays without one: retry the (dlopen-heavy) init once a minute, not
            # on every cycle; in between, report the same absence. (The gpu collector's registry entry
            # also tells the runner not to call sooner: absent_retry_s.)
            if self._absent is not None and (self.retry_in() or 0.0) > 0:
                raise self._absent[1]
            try:
                nv.nvmlInit()
            except nv.NVMLError_LibraryNotFound:
                raise self._remember_absent(
                    NoDataError(
                        "NVML library not found: no NVIDIA driver on this host",
                        hint=NO_NVML_HINT,
                    )
                ) from None
            except nv.NVMLError_DriverNotLoaded:
                raise self._remember_absent(
                    NoDataError(
                        "NVIDIA kernel driver not loaded",
                        hint="load the nvidia kernel module (modprobe nvidia)",
                    )
                ) from None
            except nv.NVMLError as exc:
                raise CollectorError(f"nvmlInit failed: {exc}") from None
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
        n = self._call("nvmlDeviceGetName", self._h(index))
        return n.decode() if isinstance(n, bytes) else str(n)

    def uuid(self, index: int) -> str:
        u = self._call("nvmlDeviceGetUUID", self._h(index))
        return u.decode() if isinstance(u, bytes) else str(u)

    def utilization_percent(self, index: int) -> float:
        return float(self._call("nvmlDeviceGetUtilizationRates", self._h(index)).gpu)

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
        return [GpuProcess(int(p.pid), None if p.usedGpuMemory is None else int(p.usedGpuMemory)) for p in procs]
