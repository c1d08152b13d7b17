"""The page-cache verdict shared by the collector's findings and ``inferwatch doctor`` (one function, one
set of thresholds, so the agent and the doctor say the same thing about the same host at the same moment).

Low Inactive(file) alone is a warning (the cache is small but nothing is being thrown out yet); low
Inactive(file) under memory pressure is a failure: reclaim is evicting pages that get touched again, which
is what makes P99 jitter while P50 stays flat. What counts as pressure, first signal that is there:

1. PSI ``some`` avg10 above zero (``/proc/pressure/memory``, or the cgroup's ``memory.pressure``). Where PSI
   is read it decides alone: with PSI at 0 nothing stalled on memory, and refaults on a host with plenty
   available are ordinary cache turnover (a recorded host with 23 GB available, PSI 0 and Inactive(file) 0.37 GiB
   is healthy).
2. Without PSI: MemAvailable (the kernel's estimate of what can be had without swapping) below
   :data:`AVAILABLE_PRESSURE_RATIO` of MemTotal: so little is left that reclaim must be taking the cache.
3. Without either (a cgroup on a kernel without PSI): file refaults above
   :data:`REFAULT_PRESSURE_PAGES_PER_S` since the previous reading, the alert's own refault threshold.
"""

from __future__ import annotations

from inferwatch.agent.common.samples import Finding
from inferwatch.agent.node.host.meminfo import mem_available
from inferwatch.agent.node.host.pressure import PressureLine

RUNBOOK = "PageCachePressureTailLatency"
PSI_SOME_AVG10_PRESSURE_RATIO = 0.0  # any stall in the last 10 s counts as pressure
# File refaults per second that count as pressure where neither PSI nor MemAvailable is known; the same
# 1000 pages/s as PageCachePressureTailLatency's refault branch (alerts/inferwatch.rules.yml).
REFAULT_PRESSURE_PAGES_PER_S = 1000.0
# Without PSI: MemAvailable below this share of MemTotal counts as pressure (the kernel's own low watermarks
# sit well below it, so reclaim is already running there).
AVAILABLE_PRESSURE_RATIO = 0.10
_GIB = 1 << 30


def pagecache_verdict(
    meminfo: dict[str, int],
    threshold_bytes: int,
    pressure: dict[str, PressureLine] | None,
    refaults_per_s: float | None = None,
) -> Finding:
    """The ``pagecache`` finding from one reading (``meminfo`` in bytes; ``refaults_per_s`` in pages/s)."""
    inactive = meminfo.get("Inactive(file)")
    if inactive is None:
        return Finding("pagecache", "skip", "meminfo has no Inactive(file) field (kernel < 2.6.28)", {}, RUNBOOK)
    evidence: dict[str, object] = {"inactive_file_bytes": inactive, "threshold_bytes": threshold_bytes}
    available = mem_available(meminfo) if "MemTotal" in meminfo else None
    if available is not None:
        evidence["mem_available_bytes"] = available
    if refaults_per_s is not None:
        evidence["workingset_refault_file_per_s"] = round(refaults_per_s, 3)
    gib = inactive / _GIB
    if inactive >= threshold_bytes:
        return Finding("pagecache", "ok", f"Inactive(file) {gib:.2f} GiB is above the threshold", evidence, RUNBOOK)
    if pressure is not None and "some" in pressure:
        avg10 = pressure["some"].avg10
        evidence["psi_memory_some_avg10_ratio"] = avg10
        pressured = avg10 > PSI_SOME_AVG10_PRESSURE_RATIO
        calm = f"PSI memory some avg10 is {avg10:g}"
        why = f"PSI memory some avg10 is {avg10:.2%}"
    elif available is not None:
        pressured = available < AVAILABLE_PRESSURE_RATIO * meminfo["MemTotal"]
        total = meminfo["MemTotal"] / _GIB
        calm = why = f"MemAvailable is {available / _GIB:.2f} GiB of {total:.2f} GiB (no PSI on this kernel)"
    else:
        pressured = refaults_per_s is not None and refaults_per_s > REFAULT_PRESSURE_PAGES_PER_S
        rate = "not measured yet" if refaults_per_s is None else f"{refaults_per_s:.0f}/s"
        calm = why = f"file refaults {rate} (no PSI, no MemAvailable)"
    if pressured:
        return Finding(
            "pagecache",
            "fail",
            f"Inactive(file) {gib:.2f} GiB is below the threshold and memory is under pressure ({why}): "
            "expect P99 jitter from page-cache refaults",
            evidence,
            RUNBOOK,
        )
    if available is not None and "MemAvailable" not in calm:
        calm = f"{available / _GIB:.2f} GiB available, {calm}"
    return Finding(
        "pagecache",
        "warn",
        f"Inactive(file) {gib:.2f} GiB is below the threshold, no memory pressure ({calm})",
        evidence,
        RUNBOOK,
    )
