"""What waking up costs on this machine: the same work after an idle gap and warm, in one process.

Three measurements, each CPU time of the calling thread (``time.thread_time``):

1. a fixed pure-Python loop and a dict-building task, run after sleeping ``gap`` seconds, for several gaps
   (0 = back to back, warm);
2. the CPU of a loop that only sleeps, per sleep period (the floor of any periodic wake-up);
3. every default collector's ``collect()`` run one after another every ``gap`` seconds, as one agent cycle,
   cold (5 s gap) and warm (10 ms gap), watching a sleeping child process as the runtime;
4. touching (reading, then writing) one byte in each of N pages of memory the process already owns, after
   a 5 s and a 1 s gap and back to back: what a page costs to touch again after an idle gap.

    .venv/bin/python benchmarks/wake_cost.py [--rounds 5]
"""

from __future__ import annotations

import argparse
import contextlib
import os
import statistics
import subprocess
import sys
import time
import uuid
from collections.abc import Callable
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))


def loop() -> int:
    s = 0
    for i in range(20_000):
        s += i * i
    return s


def dicts() -> int:
    d = {i: str(i) for i in range(20_000)}
    return len("".join(d.values()))


def after_gap(fn, gap: float, rounds: int) -> float:
    out = []
    for _ in range(rounds):
        time.sleep(gap)
        t = time.thread_time()
        fn()
        out.append(time.thread_time() - t)
    return 1000 * statistics.median(out)


PAGES = bytearray(64 * 1024 * 1024)  # allocated and touched once at import: owned, resident memory


def _read_pages(n: int) -> Callable[[], int]:
    def read() -> int:
        buf, total = PAGES, 0
        for i in range(0, n * 4096, 4096):
            total += buf[i]
        return total

    return read


def _write_pages(n: int) -> Callable[[], None]:
    def write() -> None:
        buf = PAGES
        for i in range(0, n * 4096, 4096):
            buf[i] = (buf[i] + 1) & 0xFF

    return write


def sleep_loop_percent(period: float, seconds: float) -> float:
    t, w = time.process_time(), time.monotonic()
    while time.monotonic() - w < seconds:
        time.sleep(period)
    return 100 * (time.process_time() - t) / (time.monotonic() - w)


def collector_cycle(gap: float, rounds: int) -> dict[str, float]:
    from inferwatch.agent.config import Settings
    from inferwatch.agent.node.app import Agent

    agent = Agent(Settings())
    cols = agent.runner.collectors
    total = dict.fromkeys((c.name for c in cols), 0.0)
    for i in range(rounds + 1):
        time.sleep(gap)
        for c in cols:
            t = time.thread_time()
            with contextlib.suppress(Exception):  # absent data is expected here (no GPU, no engine)
                c.collect()
            if i:  # the first cycle warms imports and caches
                total[c.name] += time.thread_time() - t
    return {k: round(1000 * v / rounds, 2) for k, v in total.items()}


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--rounds", type=int, default=5)
    args = ap.parse_args()
    print("CPU ms of the same work after an idle gap (median):")
    for gap in (5.0, 1.0, 0.1, 0.01, 0.0):
        a, b = after_gap(loop, gap, args.rounds), after_gap(dicts, gap, args.rounds)
        print(f"  gap {gap:>5} s: loop {a:6.2f} ms   dicts {b:6.2f} ms")
    for i in range(0, len(PAGES), 4096):
        PAGES[i] = 1
    print("CPU ms to touch N pages of owned memory after an idle gap (median; read / write):")
    for n in (100, 1000, 10000):
        row = []
        for gap in (5.0, 1.0, 0.0):
            r, w = after_gap(_read_pages(n), gap, args.rounds), after_gap(_write_pages(n), gap, args.rounds)
            row.append(f"gap {gap:>3} s {r:7.2f} / {w:7.2f}")
        print(f"  {n:>6} pages: " + "   ".join(row))
    print("CPU of a loop that only sleeps, % of one core:")
    for period in (1.0, 0.1, 0.01):
        print(f"  sleep({period}): {sleep_loop_percent(period, 10):.3f} %")
    marker = uuid.uuid4().hex
    runtime = subprocess.Popen([sys.executable, "-c", "import time; time.sleep(3600)", f"bench-runtime-{marker}"])
    os.environ["INFERWATCH_RUNTIME__CMDLINE_PATTERN"] = f"bench-runtime-{marker}"
    try:
        for gap in (5.0, 0.01):
            cycle = collector_cycle(gap, args.rounds)
            print(f"collectors, one cycle every {gap} s (CPU ms): {cycle}  total {sum(cycle.values()):.1f} ms")
    finally:
        runtime.kill()
    return 0


if __name__ == "__main__":
    sys.exit(main())
