"""Cost of the status page at 10 models: agent CPU to build and render ``/`` (and ``/api/v1/overview``).

The state is real: the simulator serves N models (``--model`` repeated, spans over OTLP/gRPC to the agent), the
load generator sends a burst to each (fast and slow requests, so the histograms and quantiles are filled), and the
agent (``inferwatch.agent.node.app.Agent``, in this process) collects them. The page's history is full: an hour of
points (one per 10 s) fed from the agent's own engine and span collections at a simulated clock, so every line chart has
360.

Measured with ``time.thread_time()`` (CPU of the rendering thread only, not the collectors running beside it),
ROUNDS times, interleaved with the baseline of the same state in the same run: a ``/metrics`` scrape's
render (``inferwatch.exporters.prometheus.render``), which Prometheus does every 15 s. Target: page <= 20 ms of CPU.

    .venv/bin/python benchmarks/status_page.py [--models 10] [--rounds 50] [--json out.json]
"""

from __future__ import annotations

import argparse
import json
import os
import socket
import statistics
import subprocess
import sys
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

from inferwatch.agent.config import load_settings  # noqa: E402
from inferwatch.agent.node.api.pagehistory import HISTORY_POINTS, HISTORY_S, HISTORY_STEP_S, PageHistory  # noqa: E402
from inferwatch.agent.node.api.statushtml import render_page  # noqa: E402
from inferwatch.agent.node.api.statuspage import build_overview  # noqa: E402
from inferwatch.agent.node.app import Agent  # noqa: E402
from inferwatch.exporters.prometheus import render as render_metrics  # noqa: E402

PY = sys.executable


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


def cpu_ms(fn, rounds: int) -> list[float]:  # type: ignore[no-untyped-def]
    out = []
    for _ in range(rounds):
        t0 = time.thread_time()
        fn()
        out.append((time.thread_time() - t0) * 1e3)
    return out


def summary(xs: list[float]) -> dict[str, float]:
    xs = sorted(xs)
    return {"median": statistics.median(xs), "p90": xs[int(0.9 * (len(xs) - 1))], "max": xs[-1]}


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--models", type=int, default=10)
    ap.add_argument("--rounds", type=int, default=50)
    ap.add_argument("--requests", type=int, default=60, help="requests per model")
    ap.add_argument("--json", type=Path)
    args = ap.parse_args()
    models = [f"bench/model-{i:02d}-8B" for i in range(args.models)]
    sim_port, grpc_port, http_port = free_port(), free_port(), free_port()
    sim_cmd = [PY, "-m", "inferwatch.agent", "simulate", "--port", str(sim_port), "--seed", "1", "--scenario",
               "page_cache_pressure", "--otlp-traces-endpoint", f"http://127.0.0.1:{grpc_port}"]  # fmt: skip
    for m in models:
        sim_cmd += ["--model", m]
    env = {
        "INFERWATCH_ENGINE__METRICS_URL": f"http://127.0.0.1:{sim_port}/metrics",
        "INFERWATCH_RECEIVER__ENABLED": "true",
        "INFERWATCH_RECEIVER__GRPC_ENDPOINT": f"127.0.0.1:{grpc_port}",
        "INFERWATCH_RECEIVER__HTTP_ENDPOINT": f"127.0.0.1:{http_port}",
        "INFERWATCH_INTERVAL_S": "2",
        "INFERWATCH_ENGINE__MAX_MODELS": str(max(args.models, 16)),
    }
    os.environ.update(env)
    sim = subprocess.Popen(sim_cmd, cwd=ROOT, stdout=subprocess.DEVNULL, stderr=subprocess.STDOUT,
                           env={**os.environ, "OTEL_BSP_SCHEDULE_DELAY": "100"})  # fmt: skip
    agent = Agent(load_settings())
    try:
        deadline = time.monotonic() + 60
        while time.monotonic() < deadline:
            try:
                socket.create_connection(("127.0.0.1", sim_port), timeout=1).close()
                break
            except OSError:
                time.sleep(0.2)
        agent.start()
        loads = [
            subprocess.Popen(
                [
                    PY,
                    "-m",
                    "inferwatch.agent",
                    "loadgen",
                    "--url",
                    f"http://127.0.0.1:{sim_port}",
                    "--model",
                    m,
                    "--count",
                    str(args.requests),
                    "--rate",
                    "30",
                    "--seed",
                    str(i),
                    "--prompt-tokens",
                    "lognormal:256:0.3",
                    "--output-tokens",
                    "4",
                    "--json",
                ],
                cwd=ROOT,
                stdout=subprocess.DEVNULL,
                stderr=subprocess.DEVNULL,
            )
            for i, m in enumerate(models)
        ]
        for p in loads:
            p.wait(300)
        time.sleep(4)  # spans flushed, engine scraped after the last request
        state = agent.state
        collections = state.collections()
        # an hour of history from the agent's own collections, at a simulated clock
        clock = [time.time() - HISTORY_S]
        history = PageHistory(clock=lambda: clock[0])
        for _ in range(int(HISTORY_S / HISTORY_STEP_S)):
            for name in ("engine", "spans"):
                if name in collections:
                    history.on_collection(name, collections[name])
            clock[0] += HISTORY_STEP_S
        ov = build_overview(state, history)
        shown = len(ov["models"])
        page = render_page(ov)
        samples = sum(len(c.samples) for c in collections.values())
        page_ms, overview_ms, metrics_ms = [], [], []
        for _ in range(args.rounds):  # interleaved: a noisy neighbour hits all alike
            page_ms += cpu_ms(lambda: render_page(build_overview(state, history)), 1)
            overview_ms += cpu_ms(lambda: json.dumps(build_overview(state, history)), 1)
            metrics_ms += cpu_ms(lambda: render_metrics(state), 1)
        result = {
            "models_configured": args.models,
            "models_on_page": shown,
            "state_samples": samples,
            "history_points_per_series": HISTORY_POINTS,
            "page_bytes": len(page.encode()),
            "page_cpu_ms": summary(page_ms),
            "overview_json_cpu_ms": summary(overview_ms),
            "metrics_render_cpu_ms": summary(metrics_ms),
            "page_vs_metrics_median": statistics.median(page_ms) / statistics.median(metrics_ms),
        }
    finally:
        agent.stop()
        sim.terminate()
        sim.wait(10)
    print(json.dumps(result, indent=2))
    if args.json:
        args.json.write_text(json.dumps(result, indent=2) + "\n")


if __name__ == "__main__":
    main()
