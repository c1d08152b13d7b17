"""Huge pages: the reserved pool (/proc/meminfo's HugePages lines) and the transparent huge page settings.

Engines that pin model weights or KV cache in huge pages fail to start, or fall back to small pages, when the
pool is short; transparent huge pages set to ``always`` let the kernel compact memory under a running engine,
a source of tail-latency spikes. Reads ``<procfs>/meminfo`` and ``<sysfs>/kernel/mm/transparent_hugepage/
{enabled,defrag}`` (``always [madvise] never``: the bracketed word is in force); a kernel without THP has no such
directory, and only the pool is reported.
"""

from __future__ import annotations

from pathlib import Path
from typing import ClassVar

from inferwatch.agent.common.samples import AnySample, Sample, attrs
from inferwatch.agent.errors import NoDataError, SourceFormatError
from inferwatch.agent.node.collectors.base import BaseCollector, Collection
from inferwatch.agent.node.collectors.registry import Entry
from inferwatch.agent.node.host.meminfo import read_meminfo

POOL = (
    ("total", "HugePages_Total"),
    ("free", "HugePages_Free"),
    ("reserved", "HugePages_Rsvd"),
    ("surplus", "HugePages_Surp"),
)
THP_SETTINGS = ("enabled", "defrag")


def thp_mode(text: str) -> str:
    """The mode in force in a THP setting file: the bracketed word of ``always [madvise] never``."""
    words = [w for w in text.split() if w.startswith("[") and w.endswith("]")]
    if len(words) != 1 or len(words[0]) < 3:
        raise SourceFormatError(f"no single [mode] in {text.strip()[:80]!r}")
    return words[0][1:-1]


class HugePagesCollector(BaseCollector):
    name: ClassVar[str] = "hugepages"
    description: ClassVar[str] = "Huge pages: the reserved pool and the transparent huge page mode"
    reads: ClassVar[str] = (
        "`/proc/meminfo` (HugePages, AnonHugePages), `/sys/kernel/mm/transparent_hugepage/{enabled,defrag}`"
    )

    def collect(self) -> Collection:
        info = read_meminfo(self.ctx.procfs, self.ctx.read_limits)
        if "HugePages_Total" not in info:
            raise NoDataError("/proc/meminfo has no HugePages lines", hint="a kernel without CONFIG_HUGETLBFS")
        samples: list[AnySample] = [
            Sample("inferwatch.memory.hugepages", info[key], attrs(state=state)) for state, key in POOL if key in info
        ]
        if "Hugepagesize" in info:
            samples.append(Sample("inferwatch.memory.hugepages.size", info["Hugepagesize"]))
        if "AnonHugePages" in info:
            samples.append(Sample("inferwatch.memory.anon_hugepages", info["AnonHugePages"]))
        thp = Path(self.ctx.sysfs) / "kernel" / "mm" / "transparent_hugepage"
        for setting in THP_SETTINGS:
            try:
                mode = thp_mode(self.ctx.read_limits.text(thp / setting, f"transparent_hugepage/{setting}"))
            except FileNotFoundError:
                continue  # no THP in this kernel
            samples.append(Sample("inferwatch.memory.transparent_hugepage", 1.0, attrs(setting=setting, mode=mode)))
        return Collection(samples)


# Off by default: the page-cache collector already reads /proc/meminfo each interval, and most engines use
# neither pool; switch it on (--collector.hugepages) on nodes that reserve huge pages or tune THP.
ENTRY = Entry(
    HugePagesCollector,
    order=15,
    enabled=lambda s: False,
    needs="on with `--collector.hugepages`",
    interval_s=lambda s: 60.0,
)
