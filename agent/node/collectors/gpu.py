"""GPU collector: per device what NVML says of utilisation, memory, clocks, power, temperature and throttling; what
the GPU really does (GPM on Hopper+: SM activity and occupancy, tensor activity, DRAM bandwidth, PCIe/NVLink bytes);
the errors that precede a dead GPU (XIDs, ECC, memory repairs pending, a GPU lost); and which process, pod and MIG
instance uses it.

The NVML client is ``ctx.nvml`` (:class:`inferwatch.agent.node.host.nvml.PynvmlClient`, or a fake in tests). No driver /
no GPU is expected absence (NoDataError with a hint), retried once a minute (the runner is told not to call sooner), so
a driver loaded later is picked up. Units: ratios 0..1 (NVML percent / 100), SM clock Hz (MHz × 1e6), power W
(mW / 1000), temperature °C, bytes (GPM MiB/s × 2**20 × the seconds between two samples).

GPM needs two samples: each collection takes one per device (per MIG GPU instance on a MIG GPU) and reports the
metrics between it and the previous one, so the first collection only primes; without GPM (pre-Hopper GPU, old
driver, no permission) the series are absent and ``details["gpuN.gpm"]`` says why. XIDs are read by
:class:`inferwatch.agent.node.host.nvml.XidWatcher` in its own thread, started on the first collection and stopped by
``close``; this collector only reads its counts. A GPU that fell off the bus (NVML GPU_IS_LOST / RESET_REQUIRED) becomes
``inferwatch.gpu.lost 1`` and a failed finding, and the other GPUs are still reported.

Process series cover the runtime's process tree when a runtime is configured (``runtime.*``), every compute
process otherwise; NVML pids are host pids, so the agent must share the host PID namespace for the match. A
process's Kubernetes pod UID and container ID come from its cgroup path (``/proc/<pid>/cgroup``), at most
:data:`MAX_PROCESSES_PER_DEVICE` per device.
"""

from __future__ import annotations

import re
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field
from typing import ClassVar, TypeVar

from inferwatch.agent.common.samples import AnySample, Attributes, Finding, Sample, attrs
from inferwatch.agent.errors import CollectorError, NoDataError
from inferwatch.agent.node.collectors.base import BaseCollector, CollectContext, Collection
from inferwatch.agent.node.collectors.registry import Entry
from inferwatch.agent.node.host.cgroup import cgroup_v2_path
from inferwatch.agent.node.host.nvml import (
    CLOCK_EVENT_REASONS,
    GPM_INSTANCE_METRICS,
    GPM_METRIC_IDS,
    NVML_ABSENT_RETRY_S,
    SLOWDOWN_REASONS,
    EccCounts,
    GpmSample,
    GpuProcess,
    MigDevice,
    NVMLDeviceLost,
    NVMLUnsupported,
    RemappedRows,
    XidState,
    XidWatcher,
)
from inferwatch.agent.node.host.runtime import RuntimeLocator

T = TypeVar("T")
RUNBOOK = "GPUThrottling"
RUNBOOK_DRAIN = "GPUErrorNeedsDrain"
# XIDs after which the GPU should be drained (NVIDIA's Xid catalog, docs/gpu.md cites each): exported at 0 from
# the start, so the first event is an increase the alert sees. Application XIDs (13, 31, 43, 45, 68) are not here.
DRAIN_XIDS: dict[int, str] = {
    48: "double-bit (uncorrectable) ECC error",
    63: "ECC page retirement / row remapping recorded: pending until a GPU reset",
    64: "ECC page retirement / row remapping failed to record",
    74: "NVLink error",
    79: "GPU has fallen off the bus",
    92: "high single-bit ECC error rate",
    94: "contained uncorrectable ECC error",
    95: "uncontained uncorrectable ECC error",
    119: "GSP RPC timeout",
    120: "GSP error",
}
MAX_PROCESSES_PER_DEVICE = 16  # bounds the per-process series of one device (largest GPU memory first)
MIB = 2**20
# GPM throughputs integrated into hw.gpu.io: (GPM metric, link, network.io.direction)
_IO = (
    ("pcie_receive", "pcie", "receive"),
    ("pcie_transmit", "pcie", "transmit"),
    ("nvlink_receive", "nvlink", "receive"),
    ("nvlink_transmit", "nvlink", "transmit"),
)
_GPM_GAUGES = (
    ("sm_activity", "inferwatch.gpu.sm.activity"),
    ("sm_occupancy", "inferwatch.gpu.sm.occupancy"),
    ("tensor_activity", "inferwatch.gpu.tensor.activity"),
    ("dram_bandwidth", "inferwatch.gpu.dram.bandwidth.utilization"),
)
_POD_RE = re.compile(r"pod([0-9a-f]{8}[-_][0-9a-f]{4}[-_][0-9a-f]{4}[-_][0-9a-f]{4}[-_][0-9a-f]{12}|[0-9a-f]{32})")
_CONTAINER_RE = re.compile(r"(?:^|[-:])([0-9a-f]{64})(?:\.scope)?$")


def kubernetes_ids(cgroup_path: str) -> tuple[str, str]:
    """(pod UID, container ID) from a kubelet cgroup path, ("", "") outside Kubernetes.

    Both cgroup drivers: systemd ``/kubepods.slice/kubepods-burstable.slice/kubepods-burstable-pod<uid with _>.slice/
    cri-containerd-<id>.scope`` and cgroupfs ``/kubepods/burstable/pod<uid>/<id>``.
    """
    if "kubepods" not in cgroup_path:
        return "", ""
    pod = _POD_RE.search(cgroup_path)
    last = cgroup_path.rstrip("/").rsplit("/", 1)[-1]
    container = _CONTAINER_RE.search(last)
    return (pod.group(1).replace("_", "-") if pod else "", container.group(1) if container else "")


def _opt(fn: Callable[[int], T], index: int, absent: dict[str, str], what: str) -> T | None:
    try:
        return fn(index)
    except NVMLUnsupported as exc:
        absent[what] = exc.reason
        return None


@dataclass
class _Device:
    """What one collection learned of one GPU, for its findings."""

    index: int
    uuid: str
    model: str
    absent: dict[str, str] = field(default_factory=dict)  # signal → why it is not reported
    lost: str = ""  # NVMLDeviceLost reason
    gpm: dict[str, dict[str, float]] = field(default_factory=dict)  # hw.id → GPM values (0..1 ratios)
    ecc: EccCounts | None = None
    rows: RemappedRows | None = None
    retired_pending: bool | None = None


class GPUCollector(BaseCollector):
    name: ClassVar[str] = "gpu"
    description: ClassVar[str] = "NVIDIA GPUs through NVML (nvidia-ml-py): activity, errors, attribution"
    reads: ClassVar[str] = "NVML through nvidia-ml-py"

    def __init__(self, ctx: CollectContext) -> None:
        super().__init__(ctx)
        self.nvml = ctx.nvml
        self.locator: RuntimeLocator = ctx.locator
        self.xid = XidWatcher(ctx.nvml)
        self._devices: dict[int, tuple[str, str]] = {}  # index -> (uuid, name): static while NVML is up
        self._gpm_prev: dict[str, GpmSample] = {}  # hw.id (GPU or MIG device) -> the previous GPM sample
        self._gpm_absent: dict[str, str] = {}  # GPU UUID -> why it has no GPM (static per GPU and driver)
        self._io_bytes: dict[tuple[str, str, str], float] = {}  # (GPU UUID, link, direction) -> bytes counted
        self._util_since: dict[str, int] = {}  # GPU UUID -> last process-utilisation sample seen (µs)
        self._k8s: dict[int, tuple[str, str]] = {}  # pid -> (pod UID, container ID)

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
        self.xid.start()
        runtime_pids = self.locator.pids() if self.locator.configured else None
        samples: list[AnySample] = []
        findings: list[Finding] = []
        details: dict[str, object] = {}
        seen_gpm: set[str] = set()
        seen_pids: set[int] = set()
        for index in range(count):
            dev_samples: list[AnySample] = []
            dev_findings: list[Finding] = []
            try:
                dev = self._collect_device(index, runtime_pids, dev_samples, dev_findings, seen_gpm, seen_pids)
            except NVMLDeviceLost as exc:  # what was read of it before is dropped: it is lost, nothing else
                dev_samples, dev_findings = [], []
                dev = self._lost(index, exc, dev_samples)
            samples += dev_samples
            findings += dev_findings
            findings.append(error_finding(dev, self.xid.state()))
            if dev.absent:
                details[f"gpu{index}.unsupported"] = sorted(dev.absent)
                details[f"gpu{index}.absent"] = dict(sorted(dev.absent.items()))
            details[f"gpu{index}.gpm"] = self._gpm_status(dev)
            if not dev.lost:
                findings.append(gpm_finding(dev, details[f"gpu{index}.gpm"]))
        xid = self.xid.state()
        samples += xid_samples(xid, {uuid: model for uuid, model in self._devices.values()})
        watch: dict[str, object] = {"status": xid.status, "reason": xid.reason, "skipped": dict(xid.skipped)}
        if xid.recent:
            watch["recent"] = [{"uuid": r.uuid, "xid": r.xid, "at": r.at_unix_s} for r in xid.recent]
        details["xid"] = watch
        for key in set(self._gpm_prev) - seen_gpm:  # a MIG device gone, a GPU lost: free its sample
            nv.gpm_free(self._gpm_prev.pop(key))
        for pid in set(self._k8s) - seen_pids:
            del self._k8s[pid]
        details["devices"] = count
        return Collection(samples=samples, findings=findings, details=details)

    # --- one device ---------------------------------------------------------------------------------------

    def _collect_device(
        self,
        index: int,
        runtime_pids: set[int] | None,
        samples: list[AnySample],
        findings: list[Finding],
        seen_gpm: set[str],
        seen_pids: set[int],
    ) -> _Device:
        nv = self.nvml
        uuid, model = self._device(index)
        d = _Device(index, uuid, model)
        dev = {"hw.id": uuid, "hw.model": model}
        part = {**dev, "hw.parent": ""}
        a = attrs(dev)
        samples.append(Sample("inferwatch.gpu.lost", 0, a))
        util = _opt(nv.utilization_percent, index, d.absent, "utilization")
        if util is not None:
            samples.append(Sample("hw.gpu.utilization", util / 100.0, a))
        mc = _opt(nv.memory_controller_percent, index, d.absent, "memory_controller")
        if mc is not None:
            samples.append(Sample("inferwatch.gpu.memory_controller.utilization", mc / 100.0, a))
        mem = _opt(nv.memory_bytes, index, d.absent, "memory")
        if mem is not None:
            samples.append(Sample("hw.gpu.memory.usage", mem[0], attrs(part)))
            samples.append(Sample("hw.gpu.memory.limit", mem[1], attrs(part)))
        clock = _opt(nv.sm_clock_mhz, index, d.absent, "sm_clock")
        if clock is not None:
            samples.append(Sample("inferwatch.gpu.clock.sm", clock * 1e6, a))
        power = _opt(nv.power_milliwatts, index, d.absent, "power")
        if power is not None:
            samples.append(Sample("inferwatch.gpu.power", power / 1000.0, a))
        temp = _opt(nv.temperature_celsius, index, d.absent, "temperature")
        if temp is not None:
            samples.append(Sample("inferwatch.gpu.temperature", temp, a))
        reasons = _opt(nv.clock_event_reasons, index, d.absent, "throttle_reasons")
        if reasons is not None:
            active = [r for r, bit in CLOCK_EVENT_REASONS.items() if reasons & bit]
            for reason, bit in CLOCK_EVENT_REASONS.items():
                samples.append(Sample("inferwatch.gpu.throttle", int(bool(reasons & bit)), attrs(dev, reason=reason)))
            findings.append(throttle_finding(index, uuid, model, active))
        migs: list[MigDevice] = []
        if _opt(nv.mig_enabled, index, {}, "mig"):  # most GPUs have no MIG: not worth listing as absent
            migs = _opt(nv.mig_devices, index, d.absent, "mig_devices") or []
            for m in migs:
                ma = attrs({"hw.id": m.uuid, "hw.model": m.name, "hw.parent": uuid})
                samples.append(Sample("hw.gpu.memory.usage", m.used_bytes, ma))
                samples.append(Sample("hw.gpu.memory.limit", m.total_bytes, ma))
        samples += self._gpm(d, migs, seen_gpm)
        samples += self._errors(d)
        samples += self._processes(d, migs, runtime_pids, seen_pids)
        return d

    def _lost(self, index: int, exc: NVMLDeviceLost, samples: list[AnySample]) -> _Device:
        uuid, model = self._devices.get(index) or (f"nvml-index-{index}", "unknown")
        samples.append(Sample("inferwatch.gpu.lost", 1, attrs({"hw.id": uuid, "hw.model": model})))
        return _Device(index, uuid, model, lost=f"{exc.reason}: {exc}")

    # --- GPM ----------------------------------------------------------------------------------------------

    def _gpm(self, d: _Device, migs: list[MigDevice], seen: set[str]) -> list[AnySample]:
        nv = self.nvml
        if d.uuid in self._gpm_absent:
            d.absent["gpm"] = self._gpm_absent[d.uuid]
            return []
        try:
            if not nv.gpm_supported(d.index):
                raise NVMLUnsupported("GPM is not supported on this GPU (Hopper or later needed)")
        except NVMLUnsupported as exc:
            d.absent["gpm"] = self._gpm_absent[d.uuid] = exc.reason
            return []
        out: list[AnySample] = []
        targets: list[tuple[str, str, str, int | None, tuple[str, ...]]] = (
            [(m.uuid, m.name, d.uuid, m.gpu_instance_id, GPM_INSTANCE_METRICS) for m in migs]
            if migs
            else [(d.uuid, d.model, "", None, tuple(GPM_METRIC_IDS))]
        )
        for hw_id, model, parent, gi, names in targets:
            seen.add(hw_id)
            try:
                got = self._gpm_interval(d.index, hw_id, gi, names)
            except NVMLDeviceLost:
                raise
            except NVMLUnsupported as exc:
                d.absent["gpm"] = exc.reason
                continue
            except CollectorError as exc:  # keep the device's other signals; prime again next time
                d.absent["gpm"] = f"error: {exc}"
                self._drop_gpm(hw_id)
                continue
            if got is None:
                continue
            values, seconds = got
            a = attrs({"hw.id": hw_id, "hw.model": model, "hw.parent": parent})
            d.gpm[hw_id] = {k: v / 100.0 for k, v in values.items() if k in dict(_GPM_GAUGES)}
            for key, metric in _GPM_GAUGES:
                if key in values:
                    out.append(Sample(metric, values[key] / 100.0, a))
            for key, link, direction in _IO:
                if key in values:
                    total = self._io_bytes.get((d.uuid, link, direction), 0.0) + values[key] * MIB * seconds
                    self._io_bytes[(d.uuid, link, direction)] = total
                    io = {"hw.id": d.uuid, "hw.model": d.model, "network.io.direction": direction, "link": link}
                    out.append(Sample("hw.gpu.io", total, attrs(io)))
        return out

    def _gpm_interval(
        self, index: int, hw_id: str, gi: int | None, names: tuple[str, ...]
    ) -> tuple[dict[str, float], float] | None:
        """GPM values (percent, MiB/s) between the previous sample of ``hw_id`` and a new one, and the seconds
        between them; None when there was no previous sample (the first collection primes)."""
        nv = self.nvml
        current = nv.gpm_sample(index, gi)
        previous = self._gpm_prev.pop(hw_id, None)
        self._gpm_prev[hw_id] = current
        if previous is None:
            return None
        try:
            by_id = nv.gpm_metrics(previous, current, [GPM_METRIC_IDS[n] for n in names])
        finally:
            nv.gpm_free(previous)
        return {n: by_id[GPM_METRIC_IDS[n]] for n in names if GPM_METRIC_IDS[n] in by_id}, max(
            current.taken_s - previous.taken_s, 0.0
        )

    def _drop_gpm(self, hw_id: str) -> None:
        sample = self._gpm_prev.pop(hw_id, None)
        if sample is not None:
            self.nvml.gpm_free(sample)

    def _gpm_status(self, d: _Device) -> str:
        if d.lost:
            return "lost"
        if "gpm" in d.absent:
            return f"absent: {d.absent['gpm']}"
        return "sampling" if d.gpm else "warming up (GPM needs two samples)"

    # --- errors -------------------------------------------------------------------------------------------

    def _errors(self, d: _Device) -> list[AnySample]:
        nv = self.nvml
        a = {"hw.id": d.uuid, "hw.model": d.model}
        out: list[AnySample] = []
        d.ecc = _opt(nv.ecc_errors, d.index, d.absent, "ecc")
        if d.ecc is not None:
            for error_type, counter, value in (
                ("corrected", "volatile", d.ecc.corrected_volatile),
                ("uncorrected", "volatile", d.ecc.uncorrected_volatile),
                ("corrected", "aggregate", d.ecc.corrected_aggregate),
                ("uncorrected", "aggregate", d.ecc.uncorrected_aggregate),
            ):
                e = attrs(a, **{"error.type": error_type, "ecc.counter": counter})
                out.append(Sample("inferwatch.gpu.ecc.errors", value, e))
        d.rows = _opt(nv.remapped_rows, d.index, d.absent, "row_remapping")
        if d.rows is not None:
            out.append(Sample("inferwatch.gpu.memory.remapped_rows", d.rows.correctable, attrs(a, cause="correctable")))
            out.append(
                Sample("inferwatch.gpu.memory.remapped_rows", d.rows.uncorrectable, attrs(a, cause="uncorrectable"))
            )
            row = attrs(a, mechanism="row_remapping")
            out.append(Sample("inferwatch.gpu.memory.repair.pending", int(d.rows.pending), row))
            out.append(Sample("inferwatch.gpu.memory.repair.failed", int(d.rows.failed), row))
        else:  # page retirement is what GPUs before Ampere have instead
            d.retired_pending = _opt(nv.retired_pages_pending, d.index, d.absent, "page_retirement")
            if d.retired_pending is not None:
                page = attrs(a, mechanism="page_retirement")
                out.append(Sample("inferwatch.gpu.memory.repair.pending", int(d.retired_pending), page))
        return out

    # --- processes ----------------------------------------------------------------------------------------

    def _processes(
        self, d: _Device, migs: list[MigDevice], runtime_pids: set[int] | None, seen_pids: set[int]
    ) -> list[AnySample]:
        nv = self.nvml
        procs = _opt(nv.compute_processes, d.index, d.absent, "processes") or []
        sm = self._process_sm(d)
        by_instance = {m.gpu_instance_id: m for m in migs}
        per_target: dict[str, int] = {}
        rows: list[tuple[GpuProcess, dict[str, str]]] = []
        for p in procs:
            mig = by_instance.get(p.gpu_instance_id) if p.gpu_instance_id is not None else None
            target = (
                {"hw.id": mig.uuid, "hw.model": mig.name, "hw.parent": d.uuid}
                if mig
                else {"hw.id": d.uuid, "hw.model": d.model, "hw.parent": ""}
            )
            per_target[target["hw.id"]] = per_target.get(target["hw.id"], 0) + 1
            if runtime_pids is None or p.pid in runtime_pids:
                rows.append((p, target))
        rows.sort(key=lambda r: -(r[0].used_memory_bytes or 0))
        if len(rows) > MAX_PROCESSES_PER_DEVICE:
            d.absent["processes_over_limit"] = f"{len(rows) - MAX_PROCESSES_PER_DEVICE} not reported"
            rows = rows[:MAX_PROCESSES_PER_DEVICE]
        out: list[AnySample] = []
        for p, target in rows:
            seen_pids.add(p.pid)
            pod, container = self._kubernetes(p.pid)
            a = attrs(target, pid=p.pid, **{"k8s.pod.uid": pod, "container.id": container})
            if p.used_memory_bytes is not None:
                out.append(Sample("inferwatch.gpu.process.memory.usage", p.used_memory_bytes, a))
            if sm is not None and target["hw.id"] == d.uuid:  # NVML has no process samples under MIG
                out.append(Sample("inferwatch.gpu.process.sm.utilization", sm.get(p.pid, 0.0) / 100.0, a))
            activity = d.gpm.get(target["hw.id"], {}).get("sm_activity")
            if activity is not None and per_target[target["hw.id"]] == 1:
                out.append(Sample("inferwatch.gpu.process.sm.activity", activity, a))
        return out

    def _process_sm(self, d: _Device) -> dict[int, float] | None:
        """Mean SM busy percent per pid over the samples since the last collection; None when NVML has none."""
        try:
            got = self.nvml.process_utilization(d.index, self._util_since.get(d.uuid, 0))
        except NVMLUnsupported as exc:
            d.absent["process_utilization"] = exc.reason
            return None
        since = self._util_since.get(d.uuid, 0)
        fresh = [s for s in got if s.timestamp_us > since]
        if fresh:
            self._util_since[d.uuid] = max(s.timestamp_us for s in fresh)
        per_pid: dict[int, list[float]] = {}
        for s in fresh:
            per_pid.setdefault(s.pid, []).append(s.sm_percent)
        return {pid: sum(v) / len(v) for pid, v in per_pid.items()}

    def _kubernetes(self, pid: int) -> tuple[str, str]:
        cached = self._k8s.get(pid)
        if cached is None:
            cached = self._k8s[pid] = self._read_kubernetes(pid)
        return cached

    def _read_kubernetes(self, pid: int) -> tuple[str, str]:
        limits = self.ctx.read_limits
        try:
            return kubernetes_ids(cgroup_v2_path(self.ctx.procfs, pid, limits))
        except NoDataError:
            pass  # cgroup v1 (or unreadable): any hierarchy's line names the same pod
        try:
            text = limits.text(self.ctx.procfs / str(pid) / "cgroup", "cgroup")
        except (OSError, CollectorError):
            return "", ""
        for line in text.splitlines():
            ids = kubernetes_ids(line.split(":", 2)[-1])
            if ids != ("", ""):
                return ids
        return "", ""

    def close(self) -> None:
        self.xid.stop()
        for key in list(self._gpm_prev):
            self._drop_gpm(key)
        self.nvml.shutdown()


def xid_samples(state: XidState, models: Mapping[str, str]) -> list[AnySample]:
    """Per watched GPU: the drain XIDs at their count (0 until one happens), and any other XID seen."""
    if state.status != "watching" and not state.counts:
        return []
    out: list[AnySample] = []
    for uuid in sorted(set(state.devices) | {u for u, _ in state.counts}):
        dev: Attributes = attrs({"hw.id": uuid, "hw.model": models.get(uuid, "unknown")})
        xids = set(DRAIN_XIDS) | {x for u, x in state.counts if u == uuid}
        for xid in sorted(xids):
            out.append(Sample("inferwatch.gpu.xid.events", state.counts.get((uuid, xid), 0), attrs(dict(dev), xid=xid)))
    return out


def throttle_finding(index: int, uuid: str, model: str, active: list[str]) -> Finding:
    slow = [r for r in active if r in SLOWDOWN_REASONS]
    ev = {"index": index, "uuid": uuid, "model": model, "active_reasons": active}
    if slow:
        return Finding(
            f"gpu{index}.throttle", "fail", f"GPU {index} ({model}) clocks held down by {', '.join(slow)}", ev, RUNBOOK
        )
    return Finding(f"gpu{index}.throttle", "ok", f"GPU {index} ({model}) not throttled", ev, RUNBOOK)


def error_finding(d: _Device, xid: XidState) -> Finding:
    """Fail when the GPU should be drained: lost, a memory repair pending or failed, or a drain XID seen."""
    seen = {x: n for (u, x), n in xid.counts.items() if u == d.uuid and x in DRAIN_XIDS and n}
    ev: dict[str, object] = {"index": d.index, "uuid": d.uuid, "model": d.model, "xid_watch": xid.status}
    why: list[str] = []
    if d.lost:
        why.append(f"NVML reports it lost ({d.lost})")
    if d.rows is not None:
        ev["remapped_rows"] = {"correctable": d.rows.correctable, "uncorrectable": d.rows.uncorrectable}
        if d.rows.pending:
            why.append("a row remapping waits for a GPU reset")
        if d.rows.failed:
            why.append("a row remapping failed (no spare rows)")
    if d.retired_pending:
        why.append("a page retirement waits for a GPU reset")
    if seen:
        ev["drain_xids"] = seen
        why.append("XID " + ", ".join(f"{x} ({DRAIN_XIDS[x]})" for x in sorted(seen)))
    if d.ecc is not None:
        ev["ecc_uncorrected_volatile"] = d.ecc.uncorrected_volatile
    fid = f"gpu{d.index}.errors"
    if why:
        return Finding(fid, "fail", f"GPU {d.index} ({d.model}) needs a drain: {'; '.join(why)}", ev, RUNBOOK_DRAIN)
    if d.ecc is not None and d.ecc.uncorrected_volatile:
        summary = (
            f"GPU {d.index} ({d.model}): {d.ecc.uncorrected_volatile} uncorrected ECC errors since the driver loaded"
        )
        return Finding(fid, "warn", summary, ev, RUNBOOK_DRAIN)
    return Finding(fid, "ok", f"GPU {d.index} ({d.model}): no error that needs a drain", ev, RUNBOOK_DRAIN)


def gpm_finding(d: _Device, status: object) -> Finding:
    """``ok`` with what the GPU really does; ``skip`` (absent, with the reason) where there is no GPM."""
    fid = f"gpu{d.index}.gpm"
    values = d.gpm.get(d.uuid)
    if values:
        shown = ", ".join(f"{k.replace('_', ' ')} {v:.0%}" for k, v in sorted(values.items()))
        return Finding(fid, "ok", f"GPU {d.index} ({d.model}) GPM: {shown}", {"uuid": d.uuid, **values})
    if "gpm" in d.absent:
        summary = (
            f"GPU {d.index} ({d.model}): no GPM ({d.absent['gpm']}); SM/tensor/DRAM activity absent, "
            "memory-controller utilisation reported instead"
        )
        return Finding(fid, "skip", summary, {"uuid": d.uuid, "reason": d.absent["gpm"]})
    return Finding(fid, "ok", f"GPU {d.index} ({d.model}) GPM: {status}", {"uuid": d.uuid})


ENTRY = Entry(GPUCollector, order=40, absent_retry_s=NVML_ABSENT_RETRY_S, needs="absent without an NVIDIA driver")
