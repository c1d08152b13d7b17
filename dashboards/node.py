"""Node pitfalls: CPU features, identity, page cache, GPU health and the runtime process, per node."""

from __future__ import annotations

from grafana_foundation_sdk.models import dashboard as dm

from inferwatch.dashboards.common import (
    SEL_NODE,
    Board,
    Target,
    colored_cells,
    datasource_variable,
    describe,
    job_variable,
    merge,
    organize,
    query_variable,
    stat_panel,
    table_panel,
    ts,
    value_map,
)

UID = "inferwatch-node"
PSI_SOME_WARN_RATIO = 0.1  # 10 % of wall time with some task stalled on memory: latency is affected
GPU_HOT_CELSIUS = 85
_MISSING_MAPPING = dm.DynamicConfigValue(
    id_val="mappings",
    value=[
        {"type": "value", "options": {"0": {"text": "ok", "color": "green"}, "1": {"text": "MISSING", "color": "red"}}}
    ],
)


def build() -> dm.Dashboard:
    b = Board(
        UID,
        "inferwatch / Node pitfalls",
        "The node-level causes of latency that the engine cannot see: lost SIMD features, page-cache "
        "pressure, GPU throttling, the runtime process.",
        [
            datasource_variable(),
            job_variable(),
            query_variable(
                "instance",
                "Node",
                'label_values(inferwatch_agent_info{job=~"$job"}, instance)',
                "Agent scrape target (one per node).",
            ),
        ],
    )
    b.row("Identity and CPU features")
    b.add(
        table_panel(
            "Node identity",
            describe(
                "One row per node: CPU model, machine type (DMI product name, the instance type on AWS), "
                "kernel release and architecture. Nodes serving the same model should agree; an odd one out "
                "explains an outlier in the hardware × model matrix.",
                "LatencyRegressionAfterNodeChange",
            ),
            "string",
            [
                Target(
                    "max by (instance, cpu_model, machine_type, kernel_release, arch) "
                    f"(inferwatch_node_info{{{SEL_NODE}}})",
                    instant=True,
                    fmt="table",
                )
            ],
            transformations=[
                organize(
                    {
                        "instance": "Node",
                        "machine_type": "Machine type",
                        "cpu_model": "CPU model",
                        "kernel_release": "Kernel",
                        "arch": "Arch",
                    },
                    exclude=("Time", "Value"),
                )
            ],
        ),
        14,
        8,
    )
    b.add(
        stat_panel(
            "Expected CPU features missing",
            describe(
                "Count of SIMD features this CPU model should have but the node does not report (e.g. AVX-512 "
                "hidden by a hypervisor or a container's CPU model). Anything above 0 means the runtime "
                "silently fell back to a slower kernel: ~20 % more latency, no errors.",
                "CPUFeatureMissing",
            ),
            "none",
            [Target(f"sum by (instance) (inferwatch_cpu_feature_missing{{{SEL_NODE}}})", "{{instance}}", instant=True)],
            steps=((None, "green"), (1, "red")),
        ),
        10,
        8,
    )
    b.add(
        table_panel(
            "CPU features: expected vs present",
            describe(
                "One row per node and SIMD feature: Expected (the CPU model should have it), Present (every CPU "
                "of the node reports it), Missing. A red 'MISSING' cell is the silent fallback; sort by "
                "Missing to bring them to the top.",
                "CPUFeatureMissing",
            ),
            "none",
            [
                Target(
                    f"max by (instance, feature) (inferwatch_cpu_feature_expected{{{SEL_NODE}}})",
                    instant=True,
                    fmt="table",
                ),
                Target(
                    f"max by (instance, feature) (inferwatch_cpu_feature_present{{{SEL_NODE}}})",
                    instant=True,
                    fmt="table",
                ),
                Target(
                    f"max by (instance, feature) (inferwatch_cpu_feature_missing{{{SEL_NODE}}})",
                    instant=True,
                    fmt="table",
                ),
            ],
            transformations=[
                merge(),
                organize(
                    {
                        "instance": "Node",
                        "feature": "Feature",
                        "Value #A": "Expected",
                        "Value #B": "Present",
                        "Value #C": "Missing",
                    }
                ),
            ],
            overrides=[
                ("Missing", [*colored_cells(), _MISSING_MAPPING]),
                ("Present", colored_cells()),
            ],
            steps=((None, "transparent"),),
        ).mappings([value_map({"0": ("no", "transparent"), "1": ("yes", "transparent")})]),
        24,
        10,
    )

    b.row("Page cache")
    b.add(
        ts(
            "Inactive(file) vs threshold",
            describe(
                "Inactive(file) page cache (the model weights' reclaimable pages live here) against the configured "
                "floor (pagecache.inactive_file_threshold_bytes). Below the floor, the kernel evicts weight "
                "pages and the runtime re-reads them from disk: P99 jitter with no engine-side cause.",
                "PageCachePressureTailLatency",
            ),
            "bytes",
            [
                Target(
                    f'inferwatch_memory_file_lru_bytes{{{SEL_NODE}, list="inactive"}}', "Inactive(file) {{instance}}"
                ),
                Target(f"inferwatch_memory_inactive_file_threshold_bytes{{{SEL_NODE}}}", "threshold {{instance}}"),
            ],
        ),
        8,
        8,
    )
    b.add(
        ts(
            "Memory pressure (PSI)",
            describe(
                "Share of wall time in which some (or all) tasks stalled waiting for memory, 10-second average "
                "(/proc/pressure/memory). 'some' above 10 % (dashed line) is latency the runtime feels; "
                "'full' above 0 means the whole node stalled.",
                "PageCachePressureTailLatency",
            ),
            "percentunit",
            [
                Target(
                    f'inferwatch_pressure_memory_avg_ratio{{{SEL_NODE}, window="10s"}}',
                    "{{kind}} {{instance}}",
                )
            ],
            steps=((None, "green"), (PSI_SOME_WARN_RATIO, "red")),
        ),
        8,
        8,
    )
    b.add(
        ts(
            "Page-cache refaults and major faults",
            describe(
                "File pages read back in shortly after eviction (workingset refaults) and major page faults "
                "per second (/proc/vmstat). Refaults rising with falling Inactive(file) confirm the model's "
                "pages are thrashing.",
                "PageCachePressureTailLatency",
            ),
            "short",
            [
                Target(
                    f'rate(inferwatch_memory_vmstat_total{{{SEL_NODE}, event=~"workingset_refault_file|pgmajfault"}}'
                    "[$__rate_interval])",
                    "{{event}} {{instance}}",
                )
            ],
        ),
        8,
        8,
    )

    b.row("GPU")
    b.add(
        ts(
            "GPU utilisation",
            describe(
                "Busy time against real work, per GPU. Busy (NVML utilization.gpu) is the share of time any kernel "
                "ran: a decode loop waiting on memory and dense matrix work both read ~100 %. SM active is the share "
                "of SMs busy and tensor the share of time the tensor cores issued (GPM over the agent's interval, "
                "Hopper and later; absent, not 0, elsewhere). Busy high with SM or tensor low: the GPU is waiting on "
                "memory, launches or the host. Low busy time with high latency points away from the GPU: CPU, page "
                "cache or front-end.",
                "GPUDecodeMemoryBound",
            ),
            "percentunit",
            [
                Target(f"hw_gpu_utilization_ratio{{{SEL_NODE}}}", "busy {{hw_id}} @ {{instance}}"),
                Target(f"inferwatch_gpu_sm_activity_ratio{{{SEL_NODE}}}", "SM active {{hw_id}} @ {{instance}}"),
                Target(f"inferwatch_gpu_tensor_activity_ratio{{{SEL_NODE}}}", "tensor {{hw_id}} @ {{instance}}"),
            ],
            max_val=1,
        ),
        12,
        8,
    )
    b.add(
        ts(
            "DRAM bandwidth and memory controller",
            describe(
                "DRAM bandwidth used over its peak (GPM, Hopper and later) and the memory controller's busy time "
                "(NVML utilization.memory, every GPU). DRAM bandwidth high while tensor activity is low is "
                "memory-bound decode: a larger batch reuses each weight read; with requests waiting and KV cache "
                "to spare it fires GPUDecodeMemoryBound.",
                "GPUDecodeMemoryBound",
            ),
            "percentunit",
            [
                Target(
                    f"inferwatch_gpu_dram_bandwidth_utilization_ratio{{{SEL_NODE}}}",
                    "DRAM bandwidth {{hw_id}} @ {{instance}}",
                ),
                Target(
                    f"inferwatch_gpu_memory_controller_utilization_ratio{{{SEL_NODE}}}",
                    "controller busy {{hw_id}} @ {{instance}}",
                ),
            ],
            max_val=1,
        ),
        12,
        8,
    )
    b.add(
        ts(
            "GPU memory used",
            describe(
                "Device memory in use as a fraction of each GPU's total (NVML); a MIG device is its own series. "
                "Engines pre-allocate the KV cache, so a steady 90 % is normal; growth past it means another "
                "process shares the GPU (inferwatch_gpu_process_memory_usage_bytes names it).",
                None,
            ),
            "percentunit",
            [
                Target(
                    f"hw_gpu_memory_usage_bytes{{{SEL_NODE}}} / hw_gpu_memory_limit_bytes{{{SEL_NODE}}}",
                    "{{hw_id}} {{hw_model}} @ {{instance}}",
                )
            ],
            max_val=1,
        ),
        6,
        8,
    )
    b.add(
        ts(
            "SM clock and temperature",
            describe(
                "Streaming-multiprocessor clock (left) per GPU. A clock dropping under load while temperature "
                "or power is at its limit is thermal or power throttling: see the throttle panel.",
                "GPUThrottling",
            ),
            "hertz",
            [Target(f"inferwatch_gpu_clock_sm_hertz{{{SEL_NODE}}}", "{{hw_id}} {{hw_model}} @ {{instance}}")],
        ),
        6,
        8,
    )
    b.add(
        ts(
            "GPU temperature",
            describe(
                f"GPU core temperature (NVML). Above {GPU_HOT_CELSIUS} °C (dashed line) most data-centre GPUs "
                "start to reduce clocks.",
                "GPUThrottling",
            ),
            "celsius",
            [Target(f"inferwatch_gpu_temperature_celsius{{{SEL_NODE}}}", "{{hw_id}} {{hw_model}} @ {{instance}}")],
            steps=((None, "green"), (GPU_HOT_CELSIUS, "red")),
        ),
        6,
        8,
    )
    b.add(
        ts(
            "GPU power",
            describe(
                "Board power draw per GPU (NVML), watts. At the power limit under full load is normal (the "
                "sw_power_cap reason); a drop with the power brake reason is a fault.",
                "GPUThrottling",
            ),
            "watt",
            [Target(f"inferwatch_gpu_power_watts{{{SEL_NODE}}}", "{{hw_id}} {{hw_model}} @ {{instance}}")],
        ),
        6,
        8,
    )
    b.add(
        ts(
            "GPU throttle reasons",
            describe(
                "1 while NVML reports the throttle reason active, per GPU and reason (power cap, thermal, "
                "hardware slowdown). Thermal, hardware-slowdown and power-brake reasons held for minutes are faults "
                "(GPUThrottling); sw_power_cap under full load and gpu_idle are normal.",
                "GPUThrottling",
            ),
            "none",
            [Target(f"inferwatch_gpu_throttle{{{SEL_NODE}}}", "{{reason}} {{hw_id}} @ {{instance}}")],
            max_val=1,
        ),
        8,
        8,
    )
    b.add(
        ts(
            "GPU errors",
            describe(
                "Per GPU: critical XID events per interval (by XID; 48, 63, 64, 74, 79, 92, 94, 95, 119 and 120 mean "
                "drain), 1 while NVML reports the GPU lost, 1 while a memory repair waits for a reset, and new "
                "uncorrected ECC errors. Any non-zero line but an application XID (13, 31, 43, 45, 68) pages "
                "GPUErrorNeedsDrain.",
                "GPUErrorNeedsDrain",
            ),
            "short",
            [
                Target(
                    f"sum by (instance, hw_id, xid) (increase(inferwatch_gpu_xid_events_total{{{SEL_NODE}}}"
                    "[$__rate_interval]))",
                    "XID {{xid}} {{hw_id}} @ {{instance}}",
                ),
                Target(f"inferwatch_gpu_lost{{{SEL_NODE}}}", "lost {{hw_id}} @ {{instance}}"),
                Target(
                    f"inferwatch_gpu_memory_repair_pending{{{SEL_NODE}}}",
                    "{{mechanism}} pending {{hw_id}} @ {{instance}}",
                ),
                Target(
                    f'increase(inferwatch_gpu_ecc_errors_total{{{SEL_NODE}, error_type="uncorrected", '
                    'ecc_counter="volatile"}[$__rate_interval])',
                    "uncorrected ECC {{hw_id}} @ {{instance}}",
                ),
            ],
        ),
        8,
        8,
    )
    b.add(
        ts(
            "PCIe and NVLink traffic per second",
            describe(
                "Bytes per second received and transmitted by each GPU over PCIe and NVLink (GPM, Hopper and later). "
                "PCIe carries weights at load time and host-device copies; steady PCIe traffic while serving means "
                "offloading or swapping to host memory. NVLink carries tensor-parallel all-reduces.",
                None,
            ),
            "bytes",
            [
                Target(
                    "sum by (instance, hw_id, link, network_io_direction) "
                    f"(rate(hw_gpu_io_bytes_total{{{SEL_NODE}}}[$__rate_interval]))",
                    "{{link}} {{network_io_direction}} {{hw_id}} @ {{instance}}",
                )
            ],
        ),
        8,
        8,
    )

    b.row("Runtime process")
    b.add(
        stat_panel(
            "Runtime up",
            describe(
                "Whether the agent found the inference runtime process (runtime.pid / pidfile / cmdline_pattern), "
                "per node. 'down' with the engine's /metrics also down is an engine outage.",
                "EngineDown",
            ),
            "none",
            [Target(f"inferwatch_runtime_up{{{SEL_NODE}}}", "{{runtime}} @ {{instance}}", instant=True)],
            steps=((None, "red"), (1, "green")),
            mappings=[value_map({"0": ("down", "red"), "1": ("up", "green")})],
        ),
        6,
        8,
    )
    b.add(
        ts(
            "Runtime CPU",
            describe(
                "CPU seconds per second used by the runtime process, by mode (user, system). Near the node's "
                "core count the front-end is CPU-bound; high system time points at page faults or I/O.",
                None,
            ),
            "short",
            [
                Target(
                    f"sum by (instance, runtime, cpu_mode) (rate(process_cpu_time_seconds_total{{{SEL_NODE}}}"
                    "[$__rate_interval]))",
                    "{{cpu_mode}} {{runtime}} @ {{instance}}",
                )
            ],
        ),
        6,
        8,
    )
    b.add(
        ts(
            "Runtime resident memory",
            describe("Resident set size of the runtime process.", None),
            "bytes",
            [Target(f"process_memory_usage_bytes{{{SEL_NODE}}}", "{{runtime}} @ {{instance}}")],
        ),
        6,
        8,
    )
    b.add(
        ts(
            "Runtime major faults and threads",
            describe(
                "Major page faults per second of the runtime (each one a read from disk, e.g. evicted weight "
                "pages) and its thread count.",
                "PageCachePressureTailLatency",
            ),
            "short",
            [
                Target(
                    f'rate(process_paging_faults_total{{{SEL_NODE}, process_paging_fault_type="major"}}'
                    "[$__rate_interval])",
                    "major faults/s {{runtime}} @ {{instance}}",
                ),
                Target(f"process_thread_count{{{SEL_NODE}}}", "threads {{runtime}} @ {{instance}}"),
            ],
        ),
        6,
        8,
    )
    b.add(
        stat_panel(
            "Runtime binary: missing libraries",
            describe(
                "Shared libraries the runtime binary needs that this host cannot resolve (ldd), per runtime. "
                "Above 0 the binary was built for other hardware or another image: it fails or runs a fallback.",
                "RuntimeHardwareMismatch",
            ),
            "none",
            [
                Target(
                    f"inferwatch_runtime_binary_missing_libraries{{{SEL_NODE}}}",
                    "{{runtime}} @ {{instance}}",
                    instant=True,
                )
            ],
            steps=((None, "green"), (1, "red")),
        ),
        12,
        6,
    )
    b.add(
        stat_panel(
            "Debug runtime profile",
            describe(
                "Whether the runtime answers the debug runtime_profile request (1 = debug mode on). Off outside "
                "production loses the per-request profile (RuntimeProfileUnavailable); on in production costs "
                "latency and pages as DebugProfileEnabledInProduction.",
                "RuntimeProfileUnavailable",
            ),
            "none",
            [Target(f"inferwatch_runtime_profile_available{{{SEL_NODE}}}", "{{instance}}", instant=True)],
            steps=((None, "blue"),),
            mappings=[value_map({"0": ("off", "blue"), "1": ("on", "orange")})],
        ),
        12,
        6,
    )
    return b.build()
