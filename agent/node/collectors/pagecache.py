"""Page-cache pressure collector: /proc/meminfo, /proc/pressure/memory and /proc/vmstat.

Reads ``<procfs>/meminfo`` (kB → bytes), ``<procfs>/pressure/memory`` (PSI; absent on kernels without
CONFIG_PSI, which is reported as such and does not fail the collector) and ``<procfs>/vmstat``.
"""

from __future__ import annotations

import time
from typing import ClassVar

from inferwatch.agent.common.samples import AnySample, Sample, attrs
from inferwatch.agent.config import PageCacheSettings
from inferwatch.agent.errors import NoDataError
from inferwatch.agent.node.collectors.base import BaseCollector, CollectContext, Collection
from inferwatch.agent.node.collectors.registry import Entry
from inferwatch.agent.node.host.meminfo import mem_available, read_meminfo
from inferwatch.agent.node.host.pagecache import pagecache_verdict
from inferwatch.agent.node.host.pressure import PressureLine, read_pressure
from inferwatch.agent.node.host.vmstat import read_vmstat


class PageCacheCollector(BaseCollector):
    name: ClassVar[str] = "pagecache"
    description: ClassVar[str] = "Page cache and memory pressure (/proc/meminfo, PSI, /proc/vmstat)"
    reads: ClassVar[str] = "`/proc/meminfo`, `/proc/pressure/memory`, `/proc/vmstat`"

    def __init__(self, ctx: CollectContext, cfg: PageCacheSettings) -> None:
        super().__init__(ctx)
        self.cfg = cfg
        self._last_refaults: tuple[float, int] | None = None

    def collect(self) -> Collection:
        procfs = self.ctx.procfs
        limits = self.ctx.read_limits
        info = read_meminfo(procfs, limits)
        threshold = self.cfg.inactive_file_threshold_bytes
        samples: list[AnySample] = [
            Sample("system.memory.limit", info["MemTotal"]),
            Sample("system.memory.linux.available", mem_available(info)),
            Sample("inferwatch.memory.inactive_file.threshold", threshold),
        ]
        states: dict[str, int | None] = {
            "used": info["MemTotal"] - mem_available(info),
            "free": info.get("MemFree"),
            "cached": info.get("Cached"),
            "buffers": info.get("Buffers"),
        }
        for state, value in states.items():
            if value is not None:
                samples.append(Sample("system.memory.usage", value, attrs({"system.memory.state": state})))
        for lst, key in (("active", "Active(file)"), ("inactive", "Inactive(file)")):
            if key in info:
                samples.append(Sample("inferwatch.memory.file_lru", info[key], attrs(list=lst)))
        for state, key in (("dirty", "Dirty"), ("writeback", "Writeback"), ("shmem", "Shmem")):
            if key in info:
                samples.append(Sample("inferwatch.memory.writeback", info[key], attrs(state=state)))

        details: dict[str, object] = {}
        pressure: dict[str, PressureLine] | None = None
        try:
            pressure = read_pressure(procfs / "pressure" / "memory", limits)
        except NoDataError as exc:
            details["psi"] = str(exc)
        if pressure:
            for kind, line in pressure.items():
                for window, avg in (("10s", line.avg10), ("60s", line.avg60), ("300s", line.avg300)):
                    samples.append(Sample("inferwatch.pressure.memory.avg", avg, attrs(kind=kind, window=window)))
                samples.append(Sample("inferwatch.pressure.memory.stalled", line.total_seconds, attrs(kind=kind)))

        refault_rate: float | None = None
        try:
            vm = read_vmstat(procfs, limits)
        except NoDataError as exc:
            details["vmstat"] = str(exc)
        else:
            for event, value in vm.items():
                samples.append(Sample("inferwatch.memory.vmstat", value, attrs(event=event)))
            now = time.monotonic()
            refaults = vm.get("workingset_refault_file")
            if refaults is not None:
                if self._last_refaults is not None and now > self._last_refaults[0]:
                    delta = refaults - self._last_refaults[1]
                    refault_rate = max(delta, 0) / (now - self._last_refaults[0])
                self._last_refaults = (now, refaults)

        finding = pagecache_verdict(info, threshold, pressure, refault_rate)
        return Collection(samples=samples, findings=[finding], details=details)


ENTRY = Entry(PageCacheCollector, order=10, sections=lambda s: (s.pagecache,))
