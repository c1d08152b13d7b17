"""Peak RSS of the real agent under hostile engine input and a hostile config, against a clean baseline.

Run from the repository root: ``.venv/bin/python benchmarks/hostile_input.py [--phase-s 8] [--cases ...]``.

Each case is a fresh ``python -m agent run`` (engine interval 1 s) scraping a local HTTP server on
127.0.0.1; once its own ``/metrics`` says it read the clean exposition (``inferwatch_engine_up 1``),
phases: *clean* (a two-model vLLM exposition) → *hostile* (the case's body) → *clean* again.
The agent's RSS is sampled from ``/proc/PID/status`` every 50 ms; reported per case: the clean baseline
(median RSS over the last half of the first clean phase), the peak during the hostile phase (max of the
samples and of the rise of ``VmHWM``), and the RSS at the end of the recovery phase, plus what the
agent's own ``/metrics`` said (``engine_up``, scrape errors and limit hits). The YAML alias bomb is an
agent started with the bomb as ``--config``: its time to exit, exit code and peak RSS (``ru_maxrss``).
Target (issue 14): peak ≤ 30 MB above the clean baseline, and back to baseline after recovery.
Results go to ``benchmarks/results/hostile_input.json``. Not a test.
"""

from __future__ import annotations

import argparse
import contextlib
import json
import os
import resource
import socket
import statistics
import subprocess
import sys
import tempfile
import threading
import time
from collections.abc import Callable
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path

import httpx

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

from tests.engine_expo import VllmLike  # noqa: E402
from tests.test_config_hostile import BOMB  # noqa: E402

MB = 1e6
TARGET_MB = 30.0


def gauges(models: int) -> bytes:
    """One gauge line per model: ~145k distinct names fit under the default 10 MiB body cap."""
    head = "# TYPE vllm:num_requests_running gauge\n"
    return (
        head + "".join(f'vllm:num_requests_running{{model_name="model-{i:06d}"}} 1\n' for i in range(models))
    ).encode()


def series(n: int) -> bytes:
    head = "# TYPE vllm:num_requests_running gauge\n"
    return (
        head + "".join(f'vllm:num_requests_running{{model_name="m",rank="{i:07d}"}} 1\n' for i in range(n))
    ).encode()


def other_family(n: int) -> bytes:
    """One vLLM gauge (the engine is told) and ``n`` series of a family no adapter reads."""
    head = 'vllm:num_requests_running{model_name="m"} 1\n'
    return (head + "".join(f'engine_other_info{{i="{i:07d}"}} 1\n' for i in range(n))).encode()


def long_label(size: int) -> bytes:
    return ('vllm:num_requests_running{model_name="' + "x" * size + '"} 1\n').encode()


CASES: dict[str, tuple[Callable[[], bytes], dict[str, str]]] = {
    "145k_models": (lambda: gauges(145_000), {}),
    "145k_models_max_series_raised": (lambda: gauges(145_000), {"INFERWATCH_ENGINE__MAX_SERIES": "200000"}),
    "145k_models_max_models_raised": (
        lambda: gauges(145_000),
        {"INFERWATCH_ENGINE__MAX_SERIES": "200000", "INFERWATCH_ENGINE__MAX_MODELS": "1000"},
    ),
    "1M_series_max_bytes_256MiB": (lambda: series(1_000_000), {"INFERWATCH_ENGINE__MAX_BYTES": str(256 << 20)}),
    "200k_other_series_max_series_raised": (lambda: other_family(200_000), {"INFERWATCH_ENGINE__MAX_SERIES": "300000"}),
    # every series kept (one model, 1M ranks): what the user allowed by raising both caps is held
    "1M_series_max_bytes_and_max_series_raised": (
        lambda: series(1_000_000),
        {"INFERWATCH_ENGINE__MAX_BYTES": str(256 << 20), "INFERWATCH_ENGINE__MAX_SERIES": "2000000"},
    ),
    "4MiB_label_value": (lambda: long_label(4 << 20), {}),
}


class Body:
    data = b""


class Handler(BaseHTTPRequestHandler):
    def do_GET(self) -> None:
        data = Body.data
        self.send_response(200)
        self.send_header("Content-Type", "text/plain; version=0.0.4")
        self.send_header("Content-Length", str(len(data)))
        self.end_headers()
        with contextlib.suppress(OSError):  # the agent stopped reading (a cap): expected
            self.wfile.write(data)

    def log_message(self, *args: object) -> None:
        pass


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


def status_kb(pid: int) -> dict[str, int]:
    out = {}
    with open(f"/proc/{pid}/status") as f:
        for line in f:
            key, _, rest = line.partition(":")
            if key in ("VmRSS", "VmHWM"):
                out[key] = int(rest.split()[0])
    return out


def agent_env(url: str, port: int, extra: dict[str, str]) -> dict[str, str]:
    env = {k: v for k, v in os.environ.items() if not k.startswith(("INFERWATCH_", "OTEL_"))}
    env.update(
        INFERWATCH_ENGINE__METRICS_URL=url,
        INFERWATCH_LISTEN_PORT=str(port),
        INFERWATCH_INTERVAL_S="1",
        INFERWATCH_LOG_LEVEL="warning",
        INFERWATCH_SNAPSHOTS__DIR=tempfile.mkdtemp(prefix="iw-hostile-"),
    )
    env.update(extra)
    return env


def engine_metrics(port: int) -> dict[str, float]:
    try:
        text = httpx.get(f"http://127.0.0.1:{port}/metrics", timeout=10).text
    except httpx.HTTPError as exc:
        return {"error": str(exc)}  # type: ignore[dict-item]
    out = {}
    for line in text.splitlines():
        if line.startswith(
            ("inferwatch_engine_up", "inferwatch_engine_scrape_errors_total", "inferwatch_engine_limit")
        ):
            head, _, value = line.rpartition(" ")
            if float(value):
                out[head] = float(value)
        elif line.startswith("inferwatch_engine_models_dropped"):
            out[line.rpartition(" ")[0]] = float(line.rpartition(" ")[2])
    return out


def wait_ready(port: int, timeout_s: float = 90.0) -> None:
    """Until the agent's own /metrics says it has read the clean exposition (``inferwatch_engine_up 1``)."""
    end = time.monotonic() + timeout_s
    while time.monotonic() < end:
        with contextlib.suppress(httpx.HTTPError):
            text = httpx.get(f"http://127.0.0.1:{port}/metrics", timeout=5).text
            up = [ln.rpartition(" ")[2] for ln in text.splitlines() if ln.startswith("inferwatch_engine_up{")]
            if up and float(up[0]) == 1:
                return
        time.sleep(0.2)
    raise RuntimeError(f"the agent on port {port} did not read the clean exposition within {timeout_s:g} s")


def run_case(name: str, make: Callable[[], bytes], extra: dict[str, str], clean: bytes, phase_s: float) -> dict:
    hostile = make()
    Body.data = clean
    server = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
    threading.Thread(target=server.serve_forever, daemon=True).start()
    port = free_port()
    url = f"http://127.0.0.1:{server.server_address[1]}/metrics"
    proc = subprocess.Popen(
        [sys.executable, "-m", "agent", "run"],
        cwd=ROOT,
        env=agent_env(url, port, extra),
        stdout=subprocess.DEVNULL,
        stderr=subprocess.PIPE,
        text=True,
    )
    samples: list[tuple[str, float]] = []  # (phase, RSS MB)
    hwm: dict[str, float] = {}
    try:
        wait_ready(port)  # on a loaded machine the agent's start alone can take longer than a phase
        for phase, body in (("clean", clean), ("hostile", hostile), ("recovered", clean)):
            Body.data = body
            end = time.monotonic() + phase_s
            while time.monotonic() < end:
                st = status_kb(proc.pid)
                samples.append((phase, st["VmRSS"] * 1024 / MB))
                time.sleep(0.05)
            hwm[phase] = status_kb(proc.pid)["VmHWM"] * 1024 / MB
            if phase == "hostile":
                during = engine_metrics(port)
        after = engine_metrics(port)
    finally:
        proc.terminate()
        try:
            _, err = proc.communicate(timeout=20)
        except subprocess.TimeoutExpired:
            proc.kill()
            _, err = proc.communicate()
        server.shutdown()
    first = [v for p, v in samples if p == "clean"]
    base = statistics.median(first[len(first) // 2 :])
    peak = max(max(v for p, v in samples if p == "hostile"), hwm["hostile"] if hwm["hostile"] > hwm["clean"] else 0)
    rec = [v for p, v in samples if p == "recovered"]
    end_rss = statistics.median(rec[-max(len(rec) // 4, 1) :])
    log_lines = [ln for ln in err.splitlines() if ln.strip()]
    return {
        "case": name,
        "body_bytes": len(hostile),
        "settings": extra,
        "baseline_mb": round(base, 1),
        "hostile_peak_mb": round(peak, 1),
        "peak_above_baseline_mb": round(peak - base, 1),
        "recovered_mb": round(end_rss, 1),
        "recovered_above_baseline_mb": round(end_rss - base, 1),
        "meets_target": peak - base <= TARGET_MB and end_rss - base <= TARGET_MB / 3,
        "agent_metrics_during": during,
        "agent_metrics_after": after,
        "agent_log_lines": len(log_lines),
        "agent_log_head": log_lines[:4],
    }


def yaml_bomb() -> dict:
    with tempfile.NamedTemporaryFile("w", suffix=".yaml", delete=False) as f:
        f.write(BOMB)
    before = resource.getrusage(resource.RUSAGE_CHILDREN).ru_maxrss
    started = time.monotonic()
    got = subprocess.run(
        [sys.executable, "-m", "agent", "run", "--config", f.name],
        cwd=ROOT,
        env=agent_env("http://127.0.0.1:1/metrics", free_port(), {}),
        capture_output=True,
        text=True,
        timeout=120,
    )
    peak_kb = resource.getrusage(resource.RUSAGE_CHILDREN).ru_maxrss
    return {
        "case": "yaml_alias_bomb",
        "exit_code": got.returncode,
        "seconds": round(time.monotonic() - started, 2),
        "peak_rss_mb": round(peak_kb * 1024 / MB, 1),
        "children_peak_before_mb": round(before * 1024 / MB, 1),
        "stderr_bytes": len(got.stderr),
        "stderr": got.stderr.strip()[:300],
    }


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--phase-s", type=float, default=8.0)
    ap.add_argument("--cases", nargs="*", default=[*CASES, "yaml_alias_bomb"])
    ap.add_argument("--out", type=Path, default=ROOT / "benchmarks" / "results" / "hostile_input.json")
    args = ap.parse_args()
    gen = VllmLike(["m1", "m2"], engines=2, seed=3)
    gen.observe(50)
    clean = gen.text().encode()
    results = []
    if "yaml_alias_bomb" in args.cases:  # first: ru_maxrss of children is a maximum over all of them
        results.append(yaml_bomb())
        print(json.dumps(results[-1]))
    for name in args.cases:
        if name in CASES:
            make, extra = CASES[name]
            results.append(run_case(name, make, extra, clean, args.phase_s))
            print(json.dumps(results[-1]))
    load = os.getloadavg()
    doc = {
        "load_average": [round(x, 2) for x in load],
        "phase_s": args.phase_s,
        "cpus": os.cpu_count(),
        "results": results,
    }
    args.out.parent.mkdir(parents=True, exist_ok=True)
    args.out.write_text(json.dumps(doc, indent=2) + "\n")
    print(f"\n{'case':<34} {'base MB':>8} {'peak MB':>8} {'+MB':>6} {'after MB':>9} {'+MB':>6}  target")
    for r in results:
        if "baseline_mb" in r:
            print(
                f"{r['case']:<34} {r['baseline_mb']:>8} {r['hostile_peak_mb']:>8} {r['peak_above_baseline_mb']:>6} "
                f"{r['recovered_mb']:>9} {r['recovered_above_baseline_mb']:>6}  {'yes' if r['meets_target'] else 'NO'}"
            )
        else:
            print(f"{r['case']:<34} exit {r['exit_code']} in {r['seconds']} s, peak RSS {r['peak_rss_mb']} MB")
    print(f"load average {load[0]:.1f} {load[1]:.1f} {load[2]:.1f} on {os.cpu_count()} CPUs")


if __name__ == "__main__":
    main()
