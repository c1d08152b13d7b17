"""Runtime process collector: CPU time, memory, threads, context switches, faults, uptime, restarts.

The runtime is found by :class:`inferwatch.agent.node.host.runtime.RuntimeLocator` (pid, pidfile or command-line
pattern; re-discovered after a restart). Values come from psutil (which reads ``psutil.PROCFS_PATH``,
set from ``--path.procfs``) and page faults from ``<procfs>/<pid>/stat`` fields 10 and 12 (minflt,
majflt), which psutil does not expose. The runtime's cgroup v2 ``memory.stat`` and ``memory.pressure``
(under ``<sysfs>/fs/cgroup``) are reported when present; their absence is noted in the details, not
an error. A runtime that is not running is expected absence: ``inferwatch.runtime.up`` is 0 and the
status API carries the hint.
"""

from __future__ import annotations

import time
from dataclasses import replace
from typing import ClassVar

from inferwatch.agent.common.samples import AnySample, Finding, Sample, attrs
from inferwatch.agent.config import PageCacheSettings
from inferwatch.agent.errors import NoDataError, ReadLimitError
from inferwatch.agent.node.collectors.base import BaseCollector, CollectContext, Collection
from inferwatch.agent.node.collectors.registry import Entry, runtime_configured
from inferwatch.agent.node.host.cgroup import EVENT_FIELDS, SIZE_FIELDS, CgroupMemory, read_cgroup_memory
from inferwatch.agent.node.host.pagecache import pagecache_verdict
from inferwatch.agent.node.host.runtime import RuntimeLocator


def _faults(procfs_stat: str) -> tuple[int, int] | None:
    """(minor, major) from a /proc/<pid>/stat line; the comm field may hold spaces and parentheses."""
    _, sep, rest = procfs_stat.rpartition(")")
    fields = rest.split()
    if not sep or len(fields) < 10:
        return None
    # rest starts at field 3 (state): minflt is field 10 → index 7, majflt field 12 → index 9
    try:
        return int(fields[7]), int(fields[9])
    except ValueError:
        return None


class ProcessCollector(BaseCollector):
    name: ClassVar[str] = "process"
    description: ClassVar[str] = "The inference runtime process (psutil) and its cgroup v2 memory"
    reads: ClassVar[str] = (
        "psutil on `--path.procfs`, `/proc/<pid>/stat`, `/proc/<pid>/cgroup`, "
        "`/sys/fs/cgroup/<cgroup>/memory.{stat,pressure}`"
    )

    def __init__(self, ctx: CollectContext, pagecache: PageCacheSettings) -> None:
        """``pagecache``: the inactive-file threshold of the runtime cgroup's page-cache verdict."""
        super().__init__(ctx)
        self.pagecache = pagecache
        self.locator: RuntimeLocator = ctx.locator
        self._last_refaults: tuple[str, float, int] | None = None  # (cgroup, monotonic time, count)

    def collect(self) -> Collection:
        loc = self.locator
        r = attrs(runtime=loc.name)
        try:
            proc = loc.find()
        except NoDataError as exc:
            absent = [Sample("inferwatch.runtime.up", 0, r)] if loc.configured else []
            if loc.configured:
                absent.append(Sample("inferwatch.runtime.restarts", loc.restarts, r))
            raise NoDataError(str(exc.args[0]), exc.hint, samples=absent) from None
        import psutil  # loaded by the locator that found proc: an agent without a runtime never loads it

        try:
            with proc.oneshot():
                cpu = proc.cpu_times()
                mem = proc.memory_info()
                threads = proc.num_threads()
                ctx_sw = proc.num_ctx_switches()
                created = proc.create_time()
        except psutil.NoSuchProcess:
            raise NoDataError(
                f"runtime {loc.name} exited while being read", hint="it will be re-discovered on the next run"
            ) from None
        samples: list[AnySample] = [
            Sample("inferwatch.runtime.up", 1, r),
            Sample("process.cpu.time", cpu.user, attrs({"runtime": loc.name, "cpu.mode": "user"})),
            Sample("process.cpu.time", cpu.system, attrs({"runtime": loc.name, "cpu.mode": "system"})),
            Sample("process.cpu.time", getattr(cpu, "iowait", 0.0), attrs({"runtime": loc.name, "cpu.mode": "wait"})),
            Sample("process.memory.usage", mem.rss, r),
            Sample("process.memory.virtual", mem.vms, r),
            Sample("process.thread.count", threads, r),
            Sample("process.uptime", max(0.0, time.time() - created), r),
            Sample("inferwatch.runtime.restarts", loc.restarts, r),
        ]
        for kind, value in (("voluntary", ctx_sw.voluntary), ("involuntary", ctx_sw.involuntary)):
            samples.append(
                Sample(
                    "process.context_switches",
                    value,
                    attrs({"runtime": loc.name, "process.context_switch_type": kind}),
                )
            )
        details: dict[str, object] = {"pid": proc.pid, "restarts": loc.restarts}
        try:
            faults = _faults(self.ctx.read_limits.text(self.ctx.procfs / str(proc.pid) / "stat", "pid/stat"))
        except (OSError, ReadLimitError):
            faults = None
        if faults is not None:
            for kind, value in (("minor", faults[0]), ("major", faults[1])):
                samples.append(
                    Sample(
                        "process.paging.faults",
                        value,
                        attrs({"runtime": loc.name, "process.paging.fault_type": kind}),
                    )
                )
        try:
            cg = read_cgroup_memory(self.ctx.procfs, self.ctx.sysfs, proc.pid, self.ctx.read_limits)
        except NoDataError as exc:
            details["cgroup"] = str(exc)
        else:
            details["cgroup"] = cg.path
            for field in SIZE_FIELDS:
                if field in cg.stat:
                    samples.append(Sample("inferwatch.runtime.cgroup.memory.stat", cg.stat[field], attrs(field=field)))
            for event in EVENT_FIELDS:
                if event in cg.stat:
                    samples.append(
                        Sample("inferwatch.runtime.cgroup.memory.events", cg.stat[event], attrs(event=event))
                    )
            for kind, line in (cg.pressure or {}).items():
                for window, avg in (("10s", line.avg10), ("60s", line.avg60), ("300s", line.avg300)):
                    samples.append(
                        Sample("inferwatch.runtime.cgroup.pressure.memory.avg", avg, attrs(kind=kind, window=window))
                    )
            findings = [self._cgroup_pagecache(cg)] if "inactive_file" in cg.stat else []
            return Collection(samples=samples, findings=findings, details=details)
        return Collection(samples=samples, details=details)

    def _cgroup_pagecache(self, cg: CgroupMemory) -> Finding:
        """The page-cache verdict on the runtime's own cgroup: its inactive_file, its PSI, its refaults."""
        now = time.monotonic()
        refaults = cg.stat.get("workingset_refault_file")
        rate: float | None = None
        last = self._last_refaults
        if refaults is not None:
            if last is not None and last[0] == cg.path and now > last[1]:
                rate = max(refaults - last[2], 0) / (now - last[1])
            self._last_refaults = (cg.path, now, refaults)
        threshold = self.pagecache.inactive_file_threshold_bytes
        f = pagecache_verdict({"Inactive(file)": cg.stat["inactive_file"]}, threshold, cg.pressure, rate)
        return replace(f, id="pagecache.runtime_cgroup", summary=f"runtime cgroup {cg.path}: {f.summary}")


ENTRY = Entry(
    ProcessCollector,
    order=30,
    sections=lambda s: (s.pagecache,),
    configured=runtime_configured,
    needs="absent until `runtime.*` is set",
)
