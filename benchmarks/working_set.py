"""Memory pages each exporter touches per scrape cycle: the agent (one or more checkouts) and node_exporter.

Why pages: on this VM, memory a process has not touched for a few seconds costs tens of microseconds a page
to touch again (``benchmarks/wake_cost.py``), so an exporter's CPU per 5 s cycle follows the number of
distinct pages its cycle touches far more than the instructions it runs. Unlike CPU time on this VM, the
page count barely moves between runs, so it shows the effect of a change that a CPU figure would drown.

Method: after a scrape, clear the process's referenced bits (``/proc/PID/clear_refs``), let one interval
pass with one scrape in it, and sum ``Referenced:`` over ``/proc/PID/smaps``: the pages (private and
shared) the process touched in that cycle. Reported per exporter: the median over ``--cycles`` cycles and
the split by mapping (Python heap arenas, libpython, the binary ...).

    .venv/bin/python benchmarks/working_set.py [--cycles 5] [TREE[:FLAG...] ...]   # default: this checkout

Each TREE is a checkout of this repository (``git worktree add /tmp/base <rev>``). Needs write access to
``/proc/PID/clear_refs`` (same user) and ``prometheus-node-exporter`` on PATH. Not a test.
"""

from __future__ import annotations

import argparse
import collections
import statistics
import sys
import time
from pathlib import Path

import httpx

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))
from benchmarks.agent_ab import running_exporters


def referenced_kb(pid: int) -> collections.Counter[str]:
    """kB touched since the last clear, per mapping name (anonymous mappings as "[anon]")."""
    out: collections.Counter[str] = collections.Counter()
    name = "[anon]"
    with open(f"/proc/{pid}/smaps") as f:
        for line in f:
            parts = line.split()
            if parts and "-" in parts[0] and not parts[0].endswith(":"):
                name = parts[5].rsplit("/", 1)[-1] if len(parts) > 5 else "[anon]"
            elif parts and parts[0] == "Referenced:":
                out[name] += int(parts[1])
    return out


def clear_refs(pid: int) -> None:
    with open(f"/proc/{pid}/clear_refs", "w") as f:
        f.write("1")


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--cycles", type=int, default=5, help="measured cycles per exporter")
    ap.add_argument("--interval", type=float, default=5.0, help="scrape and collection interval, s")
    ap.add_argument("trees", nargs="*", default=["."], help="TREE[:FLAG...] (default: this checkout)")
    args = ap.parse_args()
    with running_exporters(args.trees, args.interval) as procs:
        totals: dict[str, list[int]] = {name: [] for name in procs}
        split: dict[str, collections.defaultdict[str, list[int]]] = {
            name: collections.defaultdict(list) for name in procs
        }
        with httpx.Client(timeout=10) as client:
            for _ in range(3):  # warm-up: first collections, lazy imports
                for _, url in procs.values():
                    client.get(url)
                time.sleep(args.interval)
            for _ in range(args.cycles):
                for _, url in procs.values():
                    client.get(url)
                time.sleep(1.0)
                for p, _ in procs.values():
                    clear_refs(p.pid)
                time.sleep(args.interval - 1.0)
                for _, url in procs.values():
                    client.get(url)
                time.sleep(0.5)  # collections the scrape started have finished
                for name, (p, _) in procs.items():
                    kb = referenced_kb(p.pid)
                    totals[name].append(sum(kb.values()))
                    for mapping, v in kb.items():
                        split[name][mapping].append(v)
                time.sleep(max(0.0, args.interval - 1.5))
        for name, values in totals.items():
            med = statistics.median(values)
            print(f"{name:40s} {med / 4:7.0f} pages ({med:.0f} kB) per cycle; cycles: {values}")
            top = sorted(split[name].items(), key=lambda kv: -statistics.median(kv[1]))[:5]
            print("    " + ", ".join(f"{m} {statistics.median(v):.0f} kB" for m, v in top))
    return 0


if __name__ == "__main__":
    sys.exit(main())
