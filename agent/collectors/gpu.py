"""GPU collector: per-device utilisation, memory, SM clock, power, temperature, throttle reasons, and the
GPU memory of the runtime's processes, through NVML.

The NVML client is ``ctx.nvml`` (:class:`agent.host.nvml.PynvmlClient`, or a fake in tests).
No driver / no GPU is expected absence (NoDataError with a hint),
retried once a minute (the runner is told not to call sooner), so a driver loaded later is picked up.
Units: utilisation 0..1 (NVML percent / 100), SM clock Hz (MHz × 1e6), power W (mW / 1000), temperature °C.
Process memory covers the runtime's process tree when a runtime is configured (``runtime.*``), every
compute process otherwise; NVML pids are host pids, so the agent must share the host PID namespace for
the match.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import ClassVar, TypeVar

from agent.collectors.base import BaseCollector, CollectContext, Collection
from agent.errors import NoDataError
from agent.host.nvml import CLOCK_EVENT_REASONS, SLOWDOWN_REASONS, NVMLUnsupported
from agent.host.runtime import RuntimeLocator
from agent.samples import AnySample, Finding, Sample, attrs

T = TypeVar("T")
RUNBOOK = "GPUThrottling"


def _opt(fn: Callable[[int], T], index: int, unsupported: list[str], what: str) -> T | None:
    try:
        return fn(index)
    except NVMLUnsupported:
        unsupported.append(what)
        return None


class GPUCollector(BaseCollector):
    name: ClassVar[str] = "gpu"
    description: ClassVar[str] = "NVIDIA GPUs through NVML (nvidia-ml-py)"

    def __init__(self, ctx: CollectContext) -> None:
        super().__init__(ctx)
        self.nvml = ctx.nvml
        self.locator: RuntimeLocator = ctx.locator
        self._devices: dict[int, tuple[str, str]] = {}  # index -> (uuid, name): static while NVML is up

    def _device(self, index: int) -> tuple[str, str]:
        dev = self._devices.get(index)
        if dev is None:
            dev = self._devices[index] = (self.nvml.uuid(index), self.nvml.name(index))
        return dev

    def collect(self) -> Collection:
        nv = self.nvml
        nv.init()
        count = nv.device_count()
        if count == 0:
            raise NoDataError(
                "NVML found no GPU", hint="check nvidia-smi; in a container pass the devices (--gpus all)"
            )
        runtime_pids = self.locator.pids() if self.locator.configured else None
        samples: list[AnySample] = []
        findings: list[Finding] = []
        details: dict[str, object] = {}
        for index in range(count):
            uuid, model = self._device(index)
            dev = {"hw.id": uuid, "hw.model": model}
            a = attrs(dev)
            unsupported: list[str] = []
            util = _opt(nv.utilization_percent, index, unsupported, "utilization")
            if util is not None:
                samples.append(Sample("hw.gpu.utilization", util / 100.0, a))
            mem = _opt(nv.memory_bytes, index, unsupported, "memory")
            if mem is not None:
                samples.append(Sample("hw.gpu.memory.usage", mem[0], a))
                samples.append(Sample("hw.gpu.memory.limit", mem[1], a))
            clock = _opt(nv.sm_clock_mhz, index, unsupported, "sm_clock")
            if clock is not None:
                samples.append(Sample("inferwatch.gpu.clock.sm", clock * 1e6, a))
            power = _opt(nv.power_milliwatts, index, unsupported, "power")
            if power is not None:
                samples.append(Sample("inferwatch.gpu.power", power / 1000.0, a))
            temp = _opt(nv.temperature_celsius, index, unsupported, "temperature")
            if temp is not None:
                samples.append(Sample("inferwatch.gpu.temperature", temp, a))
            reasons = _opt(nv.clock_event_reasons, index, unsupported, "throttle_reasons")
            if reasons is not None:
                active = [r for r, bit in CLOCK_EVENT_REASONS.items() if reasons & bit]
                for reason, bit in CLOCK_EVENT_REASONS.items():
                    samples.append(
                        Sample("inferwatch.gpu.throttle", int(bool(reasons & bit)), attrs(dev, reason=reason))
                    )
                findings.append(throttle_finding(index, uuid, model, active))
            procs = _opt(nv.compute_processes, index, unsupported, "processes") or []
            for p in procs:
                if p.used_memory_bytes is None or (runtime_pids is not None and p.pid not in runtime_pids):
                    continue
                samples.append(
                    Sample("inferwatch.gpu.process.memory.usage", p.used_memory_bytes, attrs(dev, pid=p.pid))
                )
            if unsupported:
                details[f"gpu{index}.unsupported"] = unsupported
        details["devices"] = count
        return Collection(samples=samples, findings=findings, details=details)

    def close(self) -> None:
        self.nvml.shutdown()


def throttle_finding(index: int, uuid: str, model: str, active: list[str]) -> Finding:
    slow = [r for r in active if r in SLOWDOWN_REASONS]
    ev = {"index": index, "uuid": uuid, "model": model, "active_reasons": active}
    if slow:
        return Finding(
            f"gpu{index}.throttle", "fail", f"GPU {index} ({model}) clocks held down by {', '.join(slow)}", ev, RUNBOOK
        )
    return Finding(f"gpu{index}.throttle", "ok", f"GPU {index} ({model}) not throttled", ev, RUNBOOK)
