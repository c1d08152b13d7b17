"""/proc/vmstat counters that show page-cache churn, both the modern and the pre-4.8 zoned shapes."""

from __future__ import annotations

from pathlib import Path

from agent.errors import NoDataError
from agent.host.procfs import DEFAULT_READ_LIMITS, ReadLimits

# Modern name -> prefixes whose zoned/old variants are summed into it.
EVENTS: dict[str, tuple[str, ...]] = {
    "pgmajfault": ("pgmajfault",),
    "workingset_refault_file": ("workingset_refault_file", "workingset_refault"),
    "pgscan_direct": ("pgscan_direct",),
    "pgsteal_direct": ("pgsteal_direct",),
    "pgscan_kswapd": ("pgscan_kswapd",),
    "pgsteal_kswapd": ("pgsteal_kswapd",),
    "allocstall": ("allocstall",),
}


def parse_vmstat(text: str) -> dict[str, int]:
    raw: dict[str, int] = {}
    for line in text.splitlines():
        parts = line.split()
        if len(parts) == 2 and parts[1].lstrip("-").isdigit():
            try:
                raw[parts[0]] = int(parts[1])
            except ValueError:  # digits int() does not take ("²"), or more than Python's 4300-digit limit
                continue
    out: dict[str, int] = {}
    for event, prefixes in EVENTS.items():
        if event in raw:
            out[event] = raw[event]
            continue
        total, found = 0, False
        for key, value in raw.items():
            for prefix in prefixes:
                # zoned: pgscan_direct_normal, allocstall_movable; old single: workingset_refault
                zoned = key.startswith(prefix + "_") and not key.endswith("_throttle")
                if key == prefix or (zoned and not key.startswith("workingset_refault_anon")):
                    total += value
                    found = True
                    break
        if found:
            out[event] = total
    return out


def read_vmstat(procfs: Path, limits: ReadLimits = DEFAULT_READ_LIMITS) -> dict[str, int]:
    path = procfs / "vmstat"
    try:
        return parse_vmstat(limits.text(path, "vmstat"))
    except FileNotFoundError:
        raise NoDataError(f"{path} does not exist", hint="point --path.procfs at the host's /proc") from None
