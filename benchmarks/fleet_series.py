"""Series per node at 1 / 10 / 50 models, and what a fleet of such nodes costs in VictoriaMetrics.

For each model count N: the simulator serving N models (a few requests to each, so every per-model series
exists), the inferwatch agent reading it, vmagent scraping both (deploy/vmagent/scrape.yml) into a fresh
single-node VictoriaMetrics. Measured:
- series in the agent's /metrics and in the engine's own /metrics (sample lines of one scrape);
- active series in VictoriaMetrics after ingestion, per job (``count({job=...})``);
- bytes per sample as VictoriaMetrics stores them: ``sum(vm_data_size_bytes) / sum(vm_rows)`` from its own
  /metrics after ``/internal/force_flush`` (and once more after ``/internal/force_merge``), over the run.
Projected for 1,000 and 10,000 nodes at a 15 s scrape: samples/s, samples/day and disk per day and per
30 days (bytes/sample as measured here, at this run's scrape interval; real data at 15 s over days compresses
at least as well, see docs/scaling.md).

    .venv/bin/python benchmarks/fleet_series.py [--models 1,10,50] [--seconds 120] [--scrape 5s]

Writes benchmarks/results/fleet_series.json.
"""

from __future__ import annotations

import argparse
import contextlib
import json
import platform
import shutil
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

import httpx

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

from inferwatch.agent.alerts.profile import duration_s  # noqa: E402
from tests.conftest import PYTHON, free_port  # noqa: E402
from tests.procs import running, wait_http  # noqa: E402
from tests.vmstack import instant, self_metric, victoria_metrics, vmagent  # noqa: E402

RESULTS = ROOT / "benchmarks" / "results" / "fleet_series.json"
FLEET_NODES = (1_000, 10_000)
PRODUCTION_SCRAPE_S = 15.0
REQUESTS_PER_MODEL = 3
DAY_S = 86_400
RETENTION_DAYS = 30


def sample_lines(url: str) -> int:
    text = httpx.get(url, timeout=30).text
    return sum(1 for ln in text.splitlines() if ln and not ln.startswith("#"))


def check_agent(agent_url: str, models: list[str]) -> None:
    """The agent's engine collector succeeded and exports every model (a timed-out collection exports none)."""
    text = httpx.get(f"{agent_url}/metrics", timeout=30).text
    if 'inferwatch_collector_success{collector="engine"} 1.0' not in text:
        raise RuntimeError("the agent's engine collector failed: the series count would leave the models out")
    missing = [m for m in models if f'"{m}"' not in text]
    if missing:
        raise RuntimeError(f"the agent exports no series for {len(missing)} models, e.g. {missing[0]}")


def warm(sim_url: str, models: list[str]) -> None:
    """A few completions per model, so the per-model latency and token series exist on the agent too."""
    with httpx.Client(timeout=60) as client:
        for model in models:
            for _ in range(REQUESTS_PER_MODEL):
                body = {"model": model, "prompt": "hello", "max_tokens": 8}
                client.post(f"{sim_url}/v1/completions", json=body).raise_for_status()


def vm_bytes_per_sample(vm: str) -> dict[str, float]:
    rows = self_metric(vm, "vm_rows")
    size = self_metric(vm, "vm_data_size_bytes")
    return {"rows": rows, "data_size_bytes": size, "bytes_per_sample": size / rows if rows else float("nan")}


def measure(models: int, seconds: float, scrape: str, vm_bin: str, vmagent_bin: str) -> dict[str, Any]:
    names = [f"bench/model-{i:02d}" for i in range(models)]
    with tempfile.TemporaryDirectory(prefix="fleet-series-") as d, contextlib.ExitStack() as es:
        tmp = Path(d)
        sim_port, agent_port = free_port(), free_port()
        sim_url, agent_url = f"http://127.0.0.1:{sim_port}", f"http://127.0.0.1:{agent_port}"
        sim_cmd = [
            PYTHON,
            "-m",
            "inferwatch.agent",
            "simulate",
            "--port",
            str(sim_port),
            "--seed",
            "6",
            "--log-level",
            "warning",
        ]
        for name in names:
            sim_cmd += ["--model", name]
        sim = es.enter_context(running(sim_cmd, tmp / "sim.log", cwd=ROOT))
        wait_http(f"{sim_url}/health", timeout_s=60, proc=sim)
        interval_s = duration_s(scrape)
        agent_cmd = [PYTHON, "-m", "inferwatch.agent", "run", "--port", str(agent_port), "--interval", str(interval_s)]
        # A 50-model engine exposition is ~16,000 lines: give its scrape the whole interval, not the default.
        env = {
            "INFERWATCH_ENGINE__METRICS_URL": f"{sim_url}/metrics",
            "INFERWATCH_ENGINE__TIMEOUT_S": str(interval_s),
            "INFERWATCH_COLLECTORS__ENGINE__TIMEOUT_S": str(interval_s),
        }
        agent = es.enter_context(running(agent_cmd, tmp / "agent.log", cwd=ROOT, env=env))
        wait_http(f"{agent_url}/metrics", timeout_s=60, proc=agent)
        warm(sim_url, names)
        time.sleep(3)  # the agent's next collections see the requests
        vm = es.enter_context(victoria_metrics(tmp, vm_bin))
        targets = {"inferwatch-agent": [f"127.0.0.1:{agent_port}"], "engine": [f"127.0.0.1:{sim_port}"]}
        es.enter_context(vmagent(tmp, vmagent_bin, targets, [f"{vm}/api/v1/write"], interval=scrape))
        started = time.monotonic()
        time.sleep(seconds)
        agent_series, engine_series = sample_lines(f"{agent_url}/metrics"), sample_lines(f"{sim_url}/metrics")
        check_agent(agent_url, names)
        at = time.time() - 2
        active = {
            job: int(float(r[0]["value"][1])) if (r := instant(vm, f'count({{job="{job}"}})', at)) else 0
            for job in targets
        }
        httpx.get(f"{vm}/internal/force_flush", timeout=60)
        flushed = vm_bytes_per_sample(vm)
        httpx.get(f"{vm}/internal/force_merge", timeout=120)
        time.sleep(5)
        merged = vm_bytes_per_sample(vm)
        for job, lines in (("inferwatch-agent", agent_series), ("engine", engine_series)):
            if active[job] < lines:  # a scrape that timed out leaves only up and the scrape_* series
                raise RuntimeError(f"{models} models: {job} has {lines} series but {active[job]} arrived")
        return {
            "models": models,
            "agent_series": agent_series,
            "engine_series": engine_series,
            "vm_active_series": active,
            "ingested_s": round(time.monotonic() - started, 1),
            "vm_after_flush": flushed,
            "vm_after_merge": merged,
        }


def project(per_node: int, bytes_per_sample: float) -> dict[str, Any]:
    out: dict[str, Any] = {}
    for nodes in FLEET_NODES:
        sps = per_node * nodes / PRODUCTION_SCRAPE_S
        per_day = sps * DAY_S
        out[str(nodes)] = {
            "active_series": per_node * nodes,
            "samples_per_s": round(sps),
            "samples_per_day": round(per_day),
            "disk_gb_per_day": round(per_day * bytes_per_sample / 1e9, 2),
            f"disk_gb_{RETENTION_DAYS}d": round(per_day * bytes_per_sample * RETENTION_DAYS / 1e9, 1),
        }
    return out


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--models", default="1,10,50", help="model counts, comma-separated")
    ap.add_argument("--seconds", type=float, default=120.0, help="ingestion time per model count")
    ap.add_argument("--scrape", default="5s", help="scrape interval of the run (vmagent, and the agent's own)")
    ap.add_argument("--output", type=Path, default=RESULTS)
    args = ap.parse_args(argv)
    vm_bin, vmagent_bin = shutil.which("victoria-metrics"), shutil.which("vmagent")
    if vm_bin is None or vmagent_bin is None:
        print("victoria-metrics/vmagent not found: apt-get install victoria-metrics", file=sys.stderr)
        return 2
    runs = []
    for n in (int(x) for x in args.models.split(",")):
        r = measure(n, args.seconds, args.scrape, vm_bin, vmagent_bin)
        bps = r["vm_after_merge"]["bytes_per_sample"]
        per_node_agent = r["vm_active_series"]["inferwatch-agent"]
        per_node_all = per_node_agent + r["vm_active_series"]["engine"]
        r["fleet_agent_only"] = project(per_node_agent, bps)
        r["fleet_agent_and_engine"] = project(per_node_all, bps)
        print(json.dumps(r, indent=1), flush=True)
        runs.append(r)
    result = {
        "benchmark": "fleet_series",
        "when": time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime()),
        "machine": f"{platform.machine()} {platform.python_version()}",
        "victoria_metrics": _vm_version(),
        "scrape_interval_of_run": args.scrape,
        "seconds_per_run": args.seconds,
        "projection_scrape_s": PRODUCTION_SCRAPE_S,
        "runs": runs,
    }
    args.output.write_text(json.dumps(result, indent=1) + "\n")
    print(f"wrote {args.output}")
    return 0


def _vm_version() -> str:
    r = subprocess.run(["dpkg-query", "-W", "-f=${Version}", "victoria-metrics"], capture_output=True, text=True)
    return r.stdout.strip() or "unknown (not the Debian package)"


if __name__ == "__main__":
    sys.exit(main())
