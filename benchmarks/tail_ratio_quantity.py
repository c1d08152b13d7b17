"""Which tail ratio separates jitter from prompt mix? (the measurement behind TailLatencyRatioHigh)

Five simulators, each under 4 req/s from loadgen with a prompt-length mix (lognormal median 512, sigma 0.2 / 0.6
/ 1.0) and two with the ``page_cache_pressure`` fault (20% of requests stall 0.55 s before prefill), each read by
its own agent (engine collector, histogram source). Every ~15 s the agent's 1m-window P99/P50 of every quantity
(ttft, queue, prefill, e2e, inference, decode, itl) is read; the report gives min / median / max per case after a
80 s warm-up. A quantity separates when every healthy max is below every faulty min.

    .venv/bin/python benchmarks/tail_ratio_quantity.py [SECONDS]   # default 270; results/tail_ratio_quantity.json
"""

from __future__ import annotations

import argparse
import contextlib
import json
import re
import statistics
import subprocess
import sys
import time
from pathlib import Path

import httpx

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

from tests.conftest import free_port  # noqa: E402

PY = sys.executable
OUT = ROOT / "benchmarks" / "results" / "tail_ratio_quantity.json"
CASES = {
    "narrow0.2": ("lognormal:512:0.2", None),
    "mix0.6": ("lognormal:512:0.6", None),
    "wide1.0": ("lognormal:512:1.0", None),
    "mix0.6+pagecache": ("lognormal:512:0.6", "page_cache_pressure"),
    "wide1.0+pagecache": ("lognormal:512:1.0", "page_cache_pressure"),
}
LINE_RE = re.compile(r"^inferwatch_engine_latency_(tail_ratio|seconds)\{([^}]*)\} (\S+)")
WARMUP_S = 80


def measure(duration_s: float, logdir: Path) -> dict[str, list[dict[str, float]]]:
    procs: list[subprocess.Popen[bytes]] = []
    ports: dict[str, tuple[int, int]] = {}
    samples: dict[str, list[dict[str, float]]] = {n: [] for n in CASES}

    def start(cmd: list[str], log: str, env: dict[str, str] | None = None) -> None:
        out = (logdir / log).open("wb")
        procs.append(subprocess.Popen(cmd, cwd=ROOT, stdout=out, stderr=subprocess.STDOUT, env=env))

    try:
        for name, (_, scenario) in CASES.items():
            ports[name] = (free_port(), free_port())
            cmd = [PY, "-m", "inferwatch.agent", "simulate", "--port", str(ports[name][0]), "--seed", "6"]
            cmd += ["--log-level", "warning"]
            start(cmd + (["--scenario", scenario] if scenario else []), f"sim-{name}.log")
        time.sleep(8)
        for name, (mix, _) in CASES.items():
            sim, agent = ports[name]
            load = [PY, "-m", "inferwatch.agent", "loadgen", "--url", f"http://127.0.0.1:{sim}", "--rate", "4"]
            load += ["--duration", str(duration_s + 60), "--prompt-tokens", mix, "--output-tokens", "lognormal:128:0.5"]
            start([*load, "--no-progress", "--timeout", "600"], f"loadgen-{name}.log")
            env = {"PATH": "/usr/bin:/bin", "INFERWATCH_ENGINE__METRICS_URL": f"http://127.0.0.1:{sim}/metrics"}
            start(
                [PY, "-m", "inferwatch.agent", "run", "--port", str(agent), "--interval", "2"], f"agent-{name}.log", env
            )
        t0 = time.time()
        while time.time() - t0 < duration_s:
            time.sleep(15)
            for name, (_, agent) in ports.items():
                with contextlib.suppress(httpx.HTTPError):
                    text = httpx.get(f"http://127.0.0.1:{agent}/metrics", timeout=5).text
                    row: dict[str, float] = {"t": round(time.time() - t0)}
                    for line in text.splitlines():
                        m = LINE_RE.match(line)
                        if m:
                            labels = dict(re.findall(r'(\w+)="([^"]*)"', m.group(2)))
                            if labels.get("window") == "1m":
                                key = "/".join((m.group(1), labels["quantity"], labels.get("quantile", "")))
                                row[key] = float(m.group(3))
                    samples[name].append(row)
    finally:
        for p in procs:
            p.terminate()
        for p in procs:
            with contextlib.suppress(subprocess.TimeoutExpired):
                p.wait(10)
    return samples


def report(samples: dict[str, list[dict[str, float]]]) -> None:
    for name, rows in samples.items():
        rows = [r for r in rows if r["t"] >= WARMUP_S]
        print(name, f"{len(rows)} samples")
        for q in ("ttft", "queue", "prefill", "e2e", "decode", "itl"):
            v = [r[f"tail_ratio/{q}/"] for r in rows if f"tail_ratio/{q}/" in r]
            if v:
                print(f"   {q:8} P99/P50 min {min(v):6.2f}  median {statistics.median(v):6.2f}  max {max(v):6.2f}")


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("seconds", nargs="?", type=float, default=270.0, help="sampling time (default 270)")
    duration = ap.parse_args().seconds
    logdir = Path(f"/tmp/tail-ratio-quantity-{int(time.time())}")
    logdir.mkdir(parents=True)
    samples = measure(duration, logdir)
    OUT.write_text(json.dumps(samples, indent=1) + "\n")
    report(samples)


if __name__ == "__main__":
    main()
