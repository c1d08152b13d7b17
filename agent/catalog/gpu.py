"""GPU devices through NVML (OpenTelemetry hw.gpu.* where a convention exists).

Names: the OpenTelemetry hardware conventions (``model/hardware/gpu-metrics.yaml``) define ``hw.gpu.utilization``
(busy time), ``hw.gpu.memory.usage`` / ``.limit``, ``hw.gpu.memory.utilization`` (the share of memory *in use*,
not the memory controller's activity, so that name is not used for it) and ``hw.gpu.io`` (bytes received and
transmitted). Everything else is ``inferwatch.gpu.*``.

Busy time is not work: ``hw_gpu_utilization_ratio`` is the share of the driver's sample period in which *any*
kernel ran, so a decode loop starved by memory bandwidth and dense matrix work both read 100 %. On Hopper and later
GPUs the agent samples NVML's GPU Performance Monitoring (GPM) over its collection interval: SM activity (share of
SMs busy), SM occupancy, tensor-pipe activity and DRAM bandwidth utilisation, and PCIe/NVLink bytes as
``hw_gpu_io_bytes_total``. On GPUs or drivers without GPM these series are **absent, never zero**; the reason is in
the collector's status (``gpuN.gpm``) and doctor's ``gpuN.gpm`` finding. Every GPU with NVML utilisation also
reports the memory controller's busy time (``inferwatch_gpu_memory_controller_utilization_ratio``).

Labels: ``hw_id`` is the GPU UUID (``MIG-…`` for a MIG device), ``hw_model`` the NVML name, ``hw_parent`` the UUID of
the physical GPU a MIG device belongs to (empty, so absent in Prometheus, for a whole GPU). Per-process series add
``pid`` (host PID namespace), ``k8s_pod_uid`` and ``container_id`` read from the process's cgroup path (empty
outside Kubernetes; join ``kube_pod_info{uid=…}`` of kube-state-metrics for the pod's name); at most 16 processes
per device are reported (largest GPU memory first), and only the runtime's processes when a runtime is configured.
XIDs are counted from NVML's critical-XID events since the agent started; the XIDs that mean "drain this GPU"
(48, 63, 64, 74, 79, 92, 94, 95, 119, 120) are exported at 0 from the start so a first event is an increase.
"""

from inferwatch.agent.catalog.spec import Kind, MetricSpec

_DEV = ("hw.id", "hw.model")
_PART = (*_DEV, "hw.parent")  # series a MIG device has as well (its own hw.id, the physical GPU as hw.parent)
_PROC = (*_PART, "pid", "k8s.pod.uid", "container.id")

METRICS = (
    MetricSpec("hw.gpu.utilization", Kind.GAUGE, "1", "GPU busy-time share over the driver's sample period.", _DEV),
    MetricSpec("hw.gpu.memory.usage", Kind.UPDOWNCOUNTER, "By", "GPU memory in use.", _PART),
    MetricSpec("hw.gpu.memory.limit", Kind.UPDOWNCOUNTER, "By", "GPU memory in total.", _PART),
    MetricSpec("inferwatch.gpu.clock.sm", Kind.GAUGE, "Hz", "Current SM clock.", _DEV),
    MetricSpec("inferwatch.gpu.power", Kind.GAUGE, "W", "Current power draw.", _DEV),
    MetricSpec("inferwatch.gpu.temperature", Kind.GAUGE, "Cel", "GPU core temperature.", _DEV),
    MetricSpec(
        "inferwatch.gpu.throttle",
        Kind.GAUGE,
        "",
        "1 when the clock-throttle reason is active (hw_slowdown, sw_thermal, sw_power_cap, ...), else 0.",
        (*_DEV, "reason"),
    ),
    MetricSpec(
        "inferwatch.gpu.memory_controller.utilization",
        Kind.GAUGE,
        "1",
        "Share of the driver's sample period in which device memory was read or written (NVML utilization.memory).",
        _DEV,
    ),
    MetricSpec(
        "inferwatch.gpu.sm.activity",
        Kind.GAUGE,
        "1",
        "Share of SMs busy over the collection interval (GPM, Hopper+); absent without GPM.",
        _PART,
    ),
    MetricSpec(
        "inferwatch.gpu.sm.occupancy",
        Kind.GAUGE,
        "1",
        "Resident warps over the theoretical maximum over the collection interval (GPM, Hopper+).",
        _PART,
    ),
    MetricSpec(
        "inferwatch.gpu.tensor.activity",
        Kind.GAUGE,
        "1",
        "Share of time the SMs issued tensor-core instructions over the collection interval (GPM, Hopper+).",
        _PART,
    ),
    MetricSpec(
        "inferwatch.gpu.dram.bandwidth.utilization",
        Kind.GAUGE,
        "1",
        "DRAM bandwidth used over its theoretical maximum over the collection interval (GPM, Hopper+).",
        _PART,
    ),
    MetricSpec(
        "hw.gpu.io",
        Kind.COUNTER,
        "By",
        "Bytes received and transmitted by the GPU over PCIe or NVLink (link), integrated from GPM rates.",
        (*_DEV, "network.io.direction", "link"),
    ),
    MetricSpec(
        "inferwatch.gpu.xid.events",
        Kind.COUNTER,
        "{event}",
        "Critical XID events (NVML event set) since the agent started, per GPU and XID.",
        (*_DEV, "xid"),
    ),
    MetricSpec(
        "inferwatch.gpu.ecc.errors",
        Kind.COUNTER,
        "{error}",
        "ECC errors; error.type corrected|uncorrected, ecc.counter volatile (since the driver loaded) | aggregate "
        "(the GPU's life).",
        (*_DEV, "error.type", "ecc.counter"),
    ),
    MetricSpec(
        "inferwatch.gpu.memory.remapped_rows",
        Kind.UPDOWNCOUNTER,
        "{row}",
        "Memory rows remapped to spares (Ampere+), by cause: correctable | uncorrectable.",
        (*_DEV, "cause"),
    ),
    MetricSpec(
        "inferwatch.gpu.memory.repair.pending",
        Kind.GAUGE,
        "",
        "1 when a memory repair waits for a GPU reset (mechanism row_remapping on Ampere+, page_retirement before).",
        (*_DEV, "mechanism"),
    ),
    MetricSpec(
        "inferwatch.gpu.memory.repair.failed",
        Kind.GAUGE,
        "",
        "1 when a row remapping failed (no spare rows left): the GPU needs service.",
        (*_DEV, "mechanism"),
    ),
    MetricSpec(
        "inferwatch.gpu.lost",
        Kind.GAUGE,
        "",
        "1 when NVML reports the GPU lost (fallen off the bus) or needing a reset, else 0.",
        _DEV,
    ),
    MetricSpec(
        "inferwatch.gpu.process.memory.usage",
        Kind.UPDOWNCOUNTER,
        "By",
        "GPU memory used by the runtime's processes on the device.",
        _PROC,
    ),
    MetricSpec(
        "inferwatch.gpu.process.sm.utilization",
        Kind.GAUGE,
        "1",
        "Share of the interval in which the process had a kernel on the SMs (NVML process samples; busy time).",
        _PROC,
    ),
    MetricSpec(
        "inferwatch.gpu.process.sm.activity",
        Kind.GAUGE,
        "1",
        "The device's GPM SM activity, attributed to the process when it is the only compute process there.",
        _PROC,
    ),
)
