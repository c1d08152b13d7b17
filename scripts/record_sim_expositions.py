"""Record the simulator's real ``/metrics`` expositions into tests/fixtures/sim/ (see its SOURCE notes).

Starts ``inferwatch simulate`` with two models and two data-parallel engines each, drives it with
``inferwatch loadgen`` and saves the exposition after each phase:

- ``vllm-sim-dp2-a.prom``: after a first batch of requests (both models);
- ``vllm-sim-dp2-b.prom``: the same process after a second batch (cumulative, a later scrape);
- ``vllm-sim-dp2-restarted.prom``: a fresh process (same flags) after a smaller batch — every counter
  and bucket is lower than in ``b``, as after an engine restart;
- ``vllm-sim-dp2-hidden.prom``: with ``--show-hidden-metrics-for-version 0.11`` (the deprecated
  ``vllm:gpu_cache_usage_perc`` and ``vllm:time_per_output_token_seconds`` next to the current names).

    .venv/bin/python scripts/record_sim_expositions.py [--out tests/fixtures/sim]
"""

from __future__ import annotations

import argparse
import os
import signal
import socket
import subprocess
import sys
import time
import urllib.request
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
MODELS = ("meta-llama/Llama-3.1-8B-Instruct", "Qwen/Qwen2.5-0.5B-Instruct")


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


def get(url: str) -> bytes:
    with urllib.request.urlopen(url, timeout=5) as r:
        return bytes(r.read())


def start(port: int, *extra: str) -> subprocess.Popen[bytes]:
    cmd = [
        sys.executable,
        "-m",
        "inferwatch.agent",
        "simulate",
        "--port",
        str(port),
        "--engines",
        "2",
        "--seed",
        "7",
        *extra,
    ]
    for m in MODELS:
        cmd += ["--model", m]
    proc = subprocess.Popen(cmd, cwd=ROOT, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL, start_new_session=True)
    deadline = time.monotonic() + 30
    while time.monotonic() < deadline:
        try:
            get(f"http://127.0.0.1:{port}/health")
            return proc
        except OSError:
            time.sleep(0.1)
    stop(proc)
    raise SystemExit("the simulator did not start")


def stop(proc: subprocess.Popen[bytes]) -> None:
    os.killpg(proc.pid, signal.SIGTERM)
    proc.wait(15)


def load(port: int, count: int, seed: int) -> None:
    for i, m in enumerate(MODELS):
        subprocess.run(
            [sys.executable, "-m", "inferwatch.agent", "loadgen", "--url", f"http://127.0.0.1:{port}", "--model", m,
             "--rate", "40", "--count", str(count), "--output-tokens", "uniform:8:48", "--prompt-tokens",
             "uniform:32:512", "--seed", str(seed + i), "--no-progress"],
            cwd=ROOT, check=True, stdout=subprocess.DEVNULL, timeout=120,
        )  # fmt: skip


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--out", type=Path, default=ROOT / "tests" / "fixtures" / "sim")
    out: Path = ap.parse_args().out
    out.mkdir(parents=True, exist_ok=True)
    port = free_port()
    proc = start(port)
    try:
        load(port, 60, seed=1)
        (out / "vllm-sim-dp2-a.prom").write_bytes(get(f"http://127.0.0.1:{port}/metrics"))
        load(port, 60, seed=3)
        (out / "vllm-sim-dp2-b.prom").write_bytes(get(f"http://127.0.0.1:{port}/metrics"))
    finally:
        stop(proc)
    proc = start(port)
    try:
        load(port, 20, seed=5)
        (out / "vllm-sim-dp2-restarted.prom").write_bytes(get(f"http://127.0.0.1:{port}/metrics"))
    finally:
        stop(proc)
    proc = start(port, "--show-hidden-metrics-for-version", "0.11")
    try:
        load(port, 30, seed=7)
        (out / "vllm-sim-dp2-hidden.prom").write_bytes(get(f"http://127.0.0.1:{port}/metrics"))
    finally:
        stop(proc)
    print(f"wrote 4 expositions to {out}")


if __name__ == "__main__":
    main()
