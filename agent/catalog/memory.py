"""Memory: page-cache pressure (/proc/meminfo, /proc/pressure/memory, /proc/vmstat, the runtime's cgroup v2) and huge
pages (/proc/meminfo's HugePages lines, transparent huge pages in sysfs)."""

from inferwatch.agent.catalog.spec import Kind, MetricSpec

METRICS = (
    MetricSpec("system.memory.limit", Kind.UPDOWNCOUNTER, "By", "Total usable memory (MemTotal)."),
    MetricSpec(
        "system.memory.usage",
        Kind.UPDOWNCOUNTER,
        "By",
        "Memory by state: used = MemTotal − MemAvailable, free = MemFree, cached = Cached (includes "
        "tmpfs/shmem), buffers = Buffers.",
        ("system.memory.state",),
    ),
    MetricSpec(
        "system.memory.linux.available",
        Kind.UPDOWNCOUNTER,
        "By",
        "MemAvailable: the kernel's estimate of memory available to new workloads without swapping.",
    ),
    MetricSpec(
        "inferwatch.memory.file_lru",
        Kind.UPDOWNCOUNTER,
        "By",
        "Page cache on the file LRU lists, Active(file) and Inactive(file); inactive pages are reclaimed first.",
        ("list",),
    ),
    MetricSpec(
        "inferwatch.memory.inactive_file.threshold",
        Kind.GAUGE,
        "By",
        "Configured Inactive(file) floor below which the page cache counts as low (default 1 GiB).",
    ),
    MetricSpec(
        "inferwatch.memory.writeback",
        Kind.UPDOWNCOUNTER,
        "By",
        "Dirty and writeback page cache (Dirty, Writeback) and shared memory (Shmem).",
        ("state",),
    ),
    MetricSpec(
        "inferwatch.pressure.memory.avg",
        Kind.GAUGE,
        "1",
        "PSI memory stall share over a window (avg10/avg60/avg300 divided by 100): some = at least one task "
        "stalled, full = all non-idle tasks stalled.",
        ("kind", "window"),
    ),
    MetricSpec(
        "inferwatch.pressure.memory.stalled",
        Kind.COUNTER,
        "s",
        "PSI memory stall time (total, µs converted to seconds).",
        ("kind",),
    ),
    MetricSpec(
        "inferwatch.memory.vmstat",
        Kind.COUNTER,
        "{event}",
        "Paging events from /proc/vmstat: pgmajfault, workingset_refault_file, pgscan_direct, pgsteal_direct, "
        "pgscan_kswapd, pgsteal_kswapd, allocstall (zoned counters summed on old kernels).",
        ("event",),
    ),
    MetricSpec(
        "inferwatch.runtime.cgroup.memory.stat",
        Kind.UPDOWNCOUNTER,
        "By",
        "The runtime's cgroup v2 memory.stat sizes (anon, file, inactive_file, active_file, shmem, "
        "file_mapped, file_dirty).",
        ("field",),
    ),
    MetricSpec(
        "inferwatch.runtime.cgroup.memory.events",
        Kind.COUNTER,
        "{event}",
        "The runtime's cgroup v2 memory.stat event counters (workingset_refault_file, pgmajfault, pgscan, pgsteal).",
        ("event",),
    ),
    MetricSpec(
        "inferwatch.runtime.cgroup.pressure.memory.avg",
        Kind.GAUGE,
        "1",
        "PSI memory stall share of the runtime's cgroup (memory.pressure), as inferwatch.pressure.memory.avg.",
        ("kind", "window"),
    ),
    MetricSpec(
        "inferwatch.memory.hugepages",
        Kind.UPDOWNCOUNTER,
        "{page}",
        "Reserved huge pages of the default size (HugePages_Total, _Free, _Rsvd, _Surp): total = the pool, free = "
        "not yet faulted in, reserved = promised to a mapping but not faulted in, surplus = above the pool.",
        ("state",),
    ),
    MetricSpec(
        "inferwatch.memory.hugepages.size", Kind.UPDOWNCOUNTER, "By", "The default huge page size (Hugepagesize)."
    ),
    MetricSpec(
        "inferwatch.memory.anon_hugepages",
        Kind.UPDOWNCOUNTER,
        "By",
        "Anonymous memory backed by transparent huge pages (AnonHugePages).",
    ),
    MetricSpec(
        "inferwatch.memory.transparent_hugepage",
        Kind.GAUGE,
        "",
        "1 for the transparent huge page mode in force per setting (/sys/kernel/mm/transparent_hugepage/enabled and "
        "defrag): `always` lets khugepaged and faults compact memory behind a latency-sensitive process.",
        ("setting", "mode"),
    ),
)
