"""Many engines per agent: the agent's CPU and RSS at 1, 4 and 16 engine targets, beside node_exporter in the same run.

Each case starts N simulators on 127.0.0.1 (``inferwatch simulate``, one model each, no traffic: their /metrics
answer as an idle vLLM's), an agent whose targets are those N from a ``file_sd`` file (``discovery.file``,
agent/node/targets.py: an engine collector per target), and node_exporter (``--no-collector.systemd``). Both exporters
are scraped once per interval for the window, as Prometheus would; the agent's CPU (user+system of its process) and
RSS are read with psutil, as benchmarks/agent_overhead.py reads them. The single configured engine
(``engine.metrics_url``, no discovery) is measured first as the baseline of the one-target case: the wiring's own
cost is the difference between those two rows.

    .venv/bin/python benchmarks/engine_targets.py [--window 60] [--interval 5] [--counts 1,4,16]

Needs ``prometheus-node-exporter`` on PATH. Not a test: prints a table and writes
benchmarks/results/engine_targets.json.
"""

from __future__ import annotations

import argparse
import contextlib
import json
import os
import shutil
import subprocess
import sys
import tempfile
import time
from collections.abc import Iterator
from pathlib import Path

import httpx
import psutil
import yaml

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))
from benchmarks.agent_overhead import NODE_EXPORTER, RESULTS, free_port, measure_window, start, stop, wait_ready


@contextlib.contextmanager
def simulators(n: int) -> Iterator[list[int]]:
    """``n`` simulators, ready; their ports."""
    procs, ports = [], []
    try:
        for i in range(n):
            port = free_port()
            cmd = [sys.executable, "-m", "inferwatch.agent", "simulate", "--port", str(port), "--model", f"model-{i}",
                   "--seed", str(i), "--log-level", "warning"]  # fmt: skip
            procs.append(start(cmd))
            ports.append(port)
        for port, proc in zip(ports, procs, strict=True):
            wait_ready(f"http://127.0.0.1:{port}/health", proc, timeout_s=120)
        yield ports
    finally:
        for proc in procs:
            stop(proc)


def engines_ready(url: str, n: int, timeout_s: float = 120.0) -> None:
    """Wait until the agent exposes ``inferwatch_engine_up 1`` for all ``n`` engines."""
    deadline = time.monotonic() + timeout_s
    up = 0
    while time.monotonic() < deadline:
        body = httpx.get(url, timeout=10).text
        up = sum(1 for line in body.splitlines() if line.startswith("inferwatch_engine_up") and line.endswith(" 1.0"))
        if up >= n:
            return
        time.sleep(0.5)
    raise TimeoutError(f"{up} of {n} engines up at {url}")


def run_case(label: str, ports: list[int], targets: bool, interval_s: float, window_s: float) -> dict[str, object]:
    with tempfile.TemporaryDirectory() as tmp:
        env = {"INFERWATCH_LOG_LEVEL": "warning", "INFERWATCH_SNAPSHOTS__DIR": f"{tmp}/snap",
               "INFERWATCH_EVIDENCE__DIR": f"{tmp}/evidence"}  # fmt: skip
        if targets:
            groups = [{"targets": [f"127.0.0.1:{p}"], "labels": {"__inferwatch_name__": f"gpu{i}"}}
                      for i, p in enumerate(ports)]  # fmt: skip
            Path(tmp, "targets.yaml").write_text(yaml.safe_dump(groups))
            env["INFERWATCH_DISCOVERY__FILE"] = f"{tmp}/targets.yaml"
        else:
            env["INFERWATCH_ENGINE__METRICS_URL"] = f"http://127.0.0.1:{ports[0]}/metrics"
        agent_port, ne_port = free_port(), free_port()
        agent = start([sys.executable, "-m", "inferwatch.agent", "run", "--port", str(agent_port), "--interval",
                       str(interval_s)], env=env)  # fmt: skip
        node = start([NODE_EXPORTER, f"--web.listen-address=127.0.0.1:{ne_port}", "--no-collector.systemd"])
        try:
            agent_url, ne_url = f"http://127.0.0.1:{agent_port}/metrics", f"http://127.0.0.1:{ne_port}/metrics"
            wait_ready(f"http://127.0.0.1:{agent_port}/healthz", agent, timeout_s=120)
            wait_ready(ne_url, node)
            engines_ready(agent_url, len(ports))
            time.sleep(2 * interval_s)  # warm-up: the first cycles and each engine's model-length question done
            window = measure_window(
                {"agent": (psutil.Process(agent.pid), agent_url), "node_exporter": (psutil.Process(node.pid), ne_url)},
                interval_s,
                window_s,
            )
            series = sum(1 for line in httpx.get(agent_url, timeout=10).text.splitlines() if not line.startswith("#"))
        finally:
            stop(agent)
            stop(node)
    a, ne = window["agent"], window["node_exporter"]
    return {
        "case": label,
        "engines": len(ports),
        "window_s": round(a["window_s"], 1),
        "agent_cpu_percent_one_core": round(a["cpu_percent_one_core"], 3),
        "agent_cpu_per_cycle_ms": round(a["cpu_per_cycle_ms"], 2),
        "agent_rss_mb": round(a["rss_mb"], 1),
        "agent_rss_peak_mb": round(a["rss_peak_mb"], 1),
        "agent_series": series,
        "node_exporter_cpu_percent_one_core": round(ne["cpu_percent_one_core"], 3),
        "node_exporter_rss_mb": round(ne["rss_mb"], 1),
    }


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--window", type=float, default=60.0, help="measurement window per case, s")
    ap.add_argument("--interval", type=float, default=5.0, help="the agent's interval and the scrape interval, s")
    ap.add_argument("--counts", default="1,4,16", help="engine targets per case")
    ap.add_argument("--output", default=str(RESULTS / "engine_targets.json"))
    args = ap.parse_args()
    if shutil.which(NODE_EXPORTER) is None:
        print(f"{NODE_EXPORTER} not found: apt-get install -y --no-install-recommends {NODE_EXPORTER}", file=sys.stderr)
        return 2
    counts = [int(c) for c in args.counts.split(",")]
    rows = []
    with simulators(max(counts)) as ports:
        rows.append(run_case("engine.metrics_url", ports[:1], False, args.interval, args.window))
        for n in counts:
            rows.append(run_case(f"{n} targets", ports[:n], True, args.interval, args.window))
    cols = list(rows[0])
    print("| " + " | ".join(cols) + " |")
    print("|" + "---|" * len(cols))
    for r in rows:
        print("| " + " | ".join(str(v) for v in r.values()) + " |")
    version = subprocess.run([NODE_EXPORTER, "--version"], capture_output=True, text=True)
    meta = {
        "cpus": os.cpu_count(),
        "load_avg_1m_at_end": os.getloadavg()[0],
        "python": sys.version.split()[0],
        "interval_s": args.interval,
        "node_exporter": version.stderr.split("\n")[0] or version.stdout.split("\n")[0],
    }
    Path(args.output).write_text(json.dumps({"meta": meta, "results": rows}, indent=2) + "\n")
    print(json.dumps(meta))
    return 0


if __name__ == "__main__":
    sys.exit(main())
