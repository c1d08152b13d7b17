"""GPU devices through NVML (OpenTelemetry hw.gpu.* where a convention exists)."""

from agent.catalog.spec import Kind, MetricSpec

_DEV = ("hw.id", "hw.model")

METRICS = (
    MetricSpec("hw.gpu.utilization", Kind.GAUGE, "1", "GPU busy-time share over the driver's sample period.", _DEV),
    MetricSpec("hw.gpu.memory.usage", Kind.UPDOWNCOUNTER, "By", "GPU memory in use.", _DEV),
    MetricSpec("hw.gpu.memory.limit", Kind.UPDOWNCOUNTER, "By", "GPU memory in total.", _DEV),
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
        "inferwatch.gpu.process.memory.usage",
        Kind.UPDOWNCOUNTER,
        "By",
        "GPU memory used by the runtime's processes on the device.",
        (*_DEV, "pid"),
    ),
)
