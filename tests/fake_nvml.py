"""A fake :class:`agent.host.nvml.NVMLClient` for tests: devices as plain values, errors on demand."""

from __future__ import annotations

from dataclasses import dataclass, field

from agent.host.nvml import GpuProcess, NVMLUnsupported


@dataclass
class FakeGPU:
    name: str = "NVIDIA H100 80GB HBM3"
    uuid: str = "GPU-00000000-0000-0000-0000-000000000000"
    utilization_percent: float = 87.0
    used_bytes: int = 70 * 2**30
    total_bytes: int = 80 * 2**30
    sm_clock_mhz: float = 1980.0
    power_mw: float = 612_345.0
    temperature_c: float = 71.0
    reasons: int = 0
    processes: list[GpuProcess] = field(default_factory=list)
    unsupported: set[str] = field(default_factory=set)  # method names that raise NVMLUnsupported
    broken: Exception | None = None  # raised by every call on this device (GPU lost)


class FakeNVML:
    def __init__(self, gpus: list[FakeGPU], init_error: Exception | None = None) -> None:
        self.gpus = gpus
        self.init_error = init_error
        self.inits = 0
        self.shutdowns = 0

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
            raise NVMLUnsupported(what)
        return gpu

    def name(self, index: int) -> str:
        return self._gpu(index, "name").name

    def uuid(self, index: int) -> str:
        return self._gpu(index, "uuid").uuid

    def utilization_percent(self, index: int) -> float:
        return self._gpu(index, "utilization_percent").utilization_percent

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
