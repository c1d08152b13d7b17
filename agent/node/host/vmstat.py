"""/proc/vmstat counters that show page-cache churn, both the modern and the pre-4.8 zoned shapes."""

from __future__ import annotations

from collections.abc import Iterable
from pathlib import Path

from inferwatch.agent.errors import NoDataError
from inferwatch.agent.node.host.procfs import DEFAULT_READ_LIMITS, ReadLimits, text_lines

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


def _counts_for(event: str, key: str) -> bool:
    """Whether counter ``key`` is ``event`` under another name: zoned (pgscan_direct_normal, allocstall_movable)
    or the old single one (workingset_refault)."""
    for prefix in EVENTS[event]:
        zoned = key.startswith(prefix + "_") and not key.endswith("_throttle")
        if key == prefix or (zoned and not key.startswith("workingset_refault_anon")):
            return True
    return False


def parse_vmstat(text: str | Iterable[str]) -> dict[str, int]:
    """The :data:`EVENTS` counters of a /proc/vmstat text (or its lines): the modern counter where the kernel
    has it, else the sum of its zoned/old variants. Summed as read; no other counter is kept."""
    exact: dict[str, int] = {}
    sums: dict[str, int] = {}
    for line in text_lines(text):
        parts = line.split()
        if len(parts) != 2 or not parts[1].lstrip("-").isdigit():
            continue
        key = parts[0]
        for event in EVENTS:
            if key == event or _counts_for(event, key):
                try:
                    value = int(parts[1])
                except ValueError:  # digits int() does not take ("²"), or more than Python's 4300-digit limit
                    break
                if key == event:
                    exact[event] = value
                sums[event] = sums.get(event, 0) + value
    return {event: exact.get(event, sums[event]) for event in EVENTS if event in sums}


def read_vmstat(procfs: Path, limits: ReadLimits = DEFAULT_READ_LIMITS) -> dict[str, int]:
    path = procfs / "vmstat"
    try:
        return parse_vmstat(limits.lines(path, "vmstat"))
    except FileNotFoundError:
        raise NoDataError(f"{path} does not exist", hint="point --path.procfs at the host's /proc") from None
