"""A/B of agent builds: several checkouts of the agent and node_exporter, scraped in the same loop.

Each ``TREE[:FLAG...]`` argument is a checkout of this repository (``git worktree add /tmp/base <rev>``)
whose agent runs with ``--interval 5`` and the given flags (``--no-collector.simd``), all watching the
same sleeping "runtime" process. Every 5 s each process is scraped once; the order rotates each cycle,
because on this VM the first process to run after an idle gap pays for waking the CPU. Reported: CPU
(user+system) as % of one core over the window.

    .venv/bin/python benchmarks/agent_ab.py --window 150 /tmp/base . .:--no-collector.simd
"""

from __future__ import annotations

import argparse
import contextlib
import os
import signal
import subprocess
import sys
import time
import uuid
from collections.abc import Iterator
from pathlib import Path

import httpx
import psutil

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))
from benchmarks.agent_overhead import NODE_EXPORTER, free_port, wait_ready


def start_exporters(trees: list[str], interval: float, marker: str) -> dict[str, tuple[subprocess.Popen[bytes], str]]:
    """Each ``TREE[:FLAG...]``'s agent (watching the ``bench-runtime-MARKER`` process) and node_exporter, ready.

    Returns name -> (process, /metrics URL); the caller stops them with :func:`stop_exporters`.
    """
    procs: dict[str, tuple[subprocess.Popen[bytes], str]] = {}
    try:
        for spec in trees:
            root, *flags = spec.split(":")
            tree = str(Path(root).resolve())
            port = free_port()
            env = {
                **os.environ,
                "INFERWATCH_RUNTIME__CMDLINE_PATTERN": f"bench-runtime-{marker}",
                "INFERWATCH_LOG_LEVEL": "warning",
                "PYTHONPATH": tree,
            }
            cmd = [
                sys.executable,
                "-m",
                "inferwatch.agent",
                "run",
                "--port",
                str(port),
                "--interval",
                str(interval),
                *flags,
            ]
            p = subprocess.Popen(cmd, cwd=tree, env=env, start_new_session=True, stderr=subprocess.DEVNULL)
            procs[spec] = (p, f"http://127.0.0.1:{port}/metrics")
            wait_ready(f"http://127.0.0.1:{port}/readyz", p)
        port = free_port()
        ne = [NODE_EXPORTER, f"--web.listen-address=127.0.0.1:{port}", "--no-collector.systemd"]
        procs["node_exporter"] = (
            subprocess.Popen(ne, start_new_session=True, stderr=subprocess.DEVNULL),
            f"http://127.0.0.1:{port}/metrics",
        )
        wait_ready(procs["node_exporter"][1], procs["node_exporter"][0])
    except BaseException:
        stop_exporters(procs)
        raise
    return procs


def stop_exporters(procs: dict[str, tuple[subprocess.Popen[bytes], str]]) -> None:
    for p, _ in procs.values():
        if p.poll() is None:
            os.killpg(p.pid, signal.SIGTERM)
            p.wait(15)


@contextlib.contextmanager
def running_exporters(trees: list[str], interval: float) -> Iterator[dict[str, tuple[subprocess.Popen[bytes], str]]]:
    """:func:`start_exporters` around a sleeping stand-in runtime; everything is stopped on exit."""
    marker = uuid.uuid4().hex
    runtime = subprocess.Popen([sys.executable, "-c", "import time; time.sleep(3600)", f"bench-runtime-{marker}"])
    procs: dict[str, tuple[subprocess.Popen[bytes], str]] = {}
    try:
        procs = start_exporters(trees, interval, marker)
        yield procs
    finally:
        stop_exporters(procs)
        runtime.kill()


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--window", type=float, default=150.0, help="measurement window, s")
    ap.add_argument("--interval", type=float, default=5.0, help="collection and scrape interval, s")
    ap.add_argument("trees", nargs="+", help="TREE[:FLAG...]")
    args = ap.parse_args()
    with running_exporters(args.trees, args.interval) as procs:
        time.sleep(2 * args.interval)
        ps = {k: psutil.Process(p.pid) for k, (p, _) in procs.items()}
        start = {k: sum(p.cpu_times()[:2]) for k, p in ps.items()}
        items = list(procs.items())
        t0 = time.monotonic()
        cycle = 0
        with httpx.Client(timeout=10) as client:
            while time.monotonic() - t0 < args.window:
                tick = time.monotonic()
                k = cycle % len(items)
                for _, (_, url) in items[k:] + items[:k]:
                    client.get(url)
                cycle += 1
                time.sleep(max(0.0, args.interval - (time.monotonic() - tick)))
        elapsed = time.monotonic() - t0
        for name, p in ps.items():
            print(f"{name:50s} {100 * (sum(p.cpu_times()[:2]) - start[name]) / elapsed:.3f} % of one core")
    return 0


if __name__ == "__main__":
    sys.exit(main())
