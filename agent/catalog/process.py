"""The runtime process (OpenTelemetry process.* conventions)."""

from inferwatch.agent.catalog.spec import Kind, MetricSpec

_P = ("runtime",)

METRICS = (
    MetricSpec(
        "inferwatch.runtime.up",
        Kind.GAUGE,
        "",
        "1 when the configured runtime process is found, else 0.",
        _P,
    ),
    MetricSpec("process.cpu.time", Kind.COUNTER, "s", "CPU time of the runtime process.", (*_P, "cpu.mode")),
    MetricSpec("process.memory.usage", Kind.UPDOWNCOUNTER, "By", "Resident set size of the runtime.", _P),
    MetricSpec("process.memory.virtual", Kind.UPDOWNCOUNTER, "By", "Virtual memory size of the runtime.", _P),
    MetricSpec("process.thread.count", Kind.UPDOWNCOUNTER, "{thread}", "Threads of the runtime process.", _P),
    MetricSpec(
        "process.context_switches",
        Kind.COUNTER,
        "{context_switch}",
        "Context switches of the runtime process.",
        (*_P, "process.context_switch_type"),
    ),
    MetricSpec(
        "process.paging.faults",
        Kind.COUNTER,
        "{fault}",
        "Page faults of the runtime process (major faults read from disk: a page-cache refault signal).",
        (*_P, "process.paging.fault_type"),
    ),
    MetricSpec("process.uptime", Kind.GAUGE, "s", "Seconds since the runtime process started.", _P),
    MetricSpec(
        "inferwatch.runtime.restarts",
        Kind.COUNTER,
        "{restart}",
        "Times the agent saw the runtime process replaced by a new one (pid or start time changed).",
        _P,
    ),
)
