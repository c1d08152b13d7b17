"""The page-cache verdict shared by the collector's findings and ``inferwatch doctor``.

Low Inactive(file) alone is a warning (the cache is small but nothing is being thrown out yet);
low Inactive(file) together with memory pressure (PSI ``some`` avg10 above zero, or file refaults
since the previous reading) is a failure: reclaim is evicting pages that get touched again, which is
what makes P99 jitter while P50 stays flat.
"""

from __future__ import annotations

from agent.host.pressure import PressureLine
from agent.samples import Finding

RUNBOOK = "PageCachePressureTailLatency"
PSI_SOME_AVG10_PRESSURE_RATIO = 0.0  # any stall in the last 10 s counts as pressure


def pagecache_verdict(
    meminfo: dict[str, int],
    threshold_bytes: int,
    pressure: dict[str, PressureLine] | None,
    refaults_per_s: float | None = None,
) -> Finding:
    inactive = meminfo.get("Inactive(file)")
    if inactive is None:
        return Finding("pagecache", "skip", "meminfo has no Inactive(file) field (kernel < 2.6.28)", {}, RUNBOOK)
    evidence: dict[str, object] = {"inactive_file_bytes": inactive, "threshold_bytes": threshold_bytes}
    pressured = False
    if pressure is not None and "some" in pressure:
        evidence["psi_memory_some_avg10_ratio"] = pressure["some"].avg10
        pressured = pressure["some"].avg10 > PSI_SOME_AVG10_PRESSURE_RATIO
    if refaults_per_s is not None:
        evidence["workingset_refault_file_per_s"] = round(refaults_per_s, 3)
        pressured = pressured or refaults_per_s > 0
    gib = inactive / (1 << 30)
    if inactive >= threshold_bytes:
        return Finding("pagecache", "ok", f"Inactive(file) {gib:.2f} GiB is above the threshold", evidence, RUNBOOK)
    if pressured:
        return Finding(
            "pagecache",
            "fail",
            f"Inactive(file) {gib:.2f} GiB is below the threshold and memory is under pressure: "
            "expect P99 jitter from page-cache refaults",
            evidence,
            RUNBOOK,
        )
    return Finding(
        "pagecache",
        "warn",
        f"Inactive(file) {gib:.2f} GiB is below the threshold (no memory pressure seen yet)",
        evidence,
        RUNBOOK,
    )
