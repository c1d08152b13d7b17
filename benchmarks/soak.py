"""Soak: the agent's RSS slope over a long run with span and engine traffic. Target: ≤ 10 kB/min.

One agent (``python -m inferwatch.agent run``, default 5 s interval, OTLP receiver on, engine collector and streaming
probe on) reads one simulator serving two models; the simulator sends one ``llm_request`` span per request to the
agent's OTLP/HTTP receiver (``--otlp-traces-endpoint``), one load generator per model keeps it busy, and a
scraper reads the agent's ``/metrics`` every 15 s as Prometheus would. Every ``--hostile-every-s`` seconds
one OTLP export of spans with absurd timestamps (zero, end before start, 1970 against 2500: a client with a
skewed clock) is also sent, so the rejection path runs for the whole soak as well.

The agent's RSS (``VmRSS`` of ``/proc/PID/status``) is sampled every ``--sample-s`` seconds. Reported: RSS at
start, at 5 min and at the end; the least-squares slope of RSS against time over the last ``--fit-s``
seconds (default 15 minutes), in kB/min, and over the whole run after the first 5 minutes for context.

``--tracemalloc DIR`` runs the agent under ``tracemalloc`` (25 frames) and writes a snapshot to DIR every
``--snapshot-s`` seconds (benchmarks/soak_agent.py); ``--diff DIR`` prints the top growth between the
first snapshot after the warm-up and the last one. Tracing roughly doubles the agent's memory, so a traced
run's slope is not the figure to report; it says *what* grows.

    .venv/bin/python benchmarks/soak.py [--duration-s 1800] [--out benchmarks/results/soak.json]

Not a test.
"""

from __future__ import annotations

import argparse
import contextlib
import json
import os
import subprocess
import sys
import tempfile
import threading
import time
import tracemalloc
from pathlib import Path

import httpx

ROOT = Path(__file__).resolve().parents[1]
if str(ROOT) not in sys.path:
    sys.path.insert(0, str(ROOT))

from opentelemetry.proto.collector.trace.v1.trace_service_pb2 import ExportTraceServiceRequest  # noqa: E402
from opentelemetry.proto.common.v1.common_pb2 import AnyValue, KeyValue  # noqa: E402
from opentelemetry.proto.resource.v1.resource_pb2 import Resource  # noqa: E402
from opentelemetry.proto.trace.v1.trace_pb2 import ResourceSpans, ScopeSpans, Span  # noqa: E402

from tests.conftest import free_port  # noqa: E402
from tests.procs import stop, wait_http  # noqa: E402

PYTHON = sys.executable
RESULTS = ROOT / "benchmarks" / "results"
MODELS = ("meta-llama/Llama-3.1-8B-Instruct", "Qwen/Qwen2.5-7B-Instruct")
TARGET_KB_PER_MIN = 10.0
WARMUP_S = 300.0  # the 1m/5m quantile windows fill during the first five minutes


def hostile_export(model: str = "skewed-clock") -> bytes:
    """Three spans with absurd timestamps, the shapes a real export sent (zero, end before start, 1970 against 2500)."""
    year_2500_ns = 16_725_225_600 * 10**9

    def span(i: int, start: int, end: int) -> Span:
        return Span(
            trace_id=bytes([i + 1]) * 16,
            span_id=bytes([i + 1]) * 8,
            name="llm_request",
            kind=Span.SPAN_KIND_SERVER,
            start_time_unix_nano=start,
            end_time_unix_nano=end,
            attributes=[
                KeyValue(key="gen_ai.response.model", value=AnyValue(string_value=model)),
                KeyValue(key="gen_ai.latency.time_to_first_token", value=AnyValue(double_value=0.2)),
                KeyValue(key="gen_ai.usage.completion_tokens", value=AnyValue(int_value=64)),
            ],
        )

    spans = [span(0, 0, 0), span(1, 2_000_000_000, 1_000_000_000), span(2, 1, year_2500_ns)]
    req = ExportTraceServiceRequest(
        resource_spans=[ResourceSpans(resource=Resource(), scope_spans=[ScopeSpans(spans=spans)])]
    )
    return req.SerializeToString()


def rss_kb(pid: int) -> int:
    for line in Path(f"/proc/{pid}/status").read_text().splitlines():
        if line.startswith("VmRSS:"):
            return int(line.split()[1])
    raise RuntimeError(f"no VmRSS for {pid}")


def slope_kb_per_min(points: list[tuple[float, int]]) -> float:
    """Least-squares slope of (seconds, kB) points, in kB per minute."""
    n = len(points)
    if n < 2:
        return float("nan")
    mx = sum(t for t, _ in points) / n
    my = sum(v for _, v in points) / n
    sxx = sum((t - mx) ** 2 for t, _ in points)
    sxy = sum((t - mx) * (v - my) for t, v in points)
    return sxy / sxx * 60.0 if sxx else float("nan")


def diff(snap_dir: Path, warmup_s: float, top: int = 25) -> list[str]:
    snaps = sorted(snap_dir.glob("snap-*.bin"), key=lambda p: int(p.stem.split("-")[1]))
    after = [p for p in snaps if int(p.stem.split("-")[1]) >= warmup_s] or snaps
    if len(after) < 2:
        return [f"need two snapshots after {warmup_s:.0f} s in {snap_dir}, found {len(after)}"]
    first, last = tracemalloc.Snapshot.load(str(after[0])), tracemalloc.Snapshot.load(str(after[-1]))
    filters = [tracemalloc.Filter(False, tracemalloc.__file__), tracemalloc.Filter(False, "<frozen *>")]
    first, last = first.filter_traces(filters), last.filter_traces(filters)
    lines = [f"{after[0].name} -> {after[-1].name}"]
    for stat in last.compare_to(first, "traceback")[:top]:
        lines.append(f"{stat.size_diff / 1024:+9.1f} KiB {stat.count_diff:+7d} blocks")
        lines.extend("    " + line for line in stat.traceback.format(limit=8))
    return lines


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--duration-s", type=float, default=1800.0)
    ap.add_argument("--fit-s", type=float, default=900.0, help="fit the slope over the last this many seconds")
    ap.add_argument("--sample-s", type=float, default=5.0)
    ap.add_argument("--rate", type=float, default=2.0, help="requests/s per model")
    ap.add_argument("--hostile-every-s", type=float, default=60.0, help="0: no hostile spans")
    ap.add_argument("--tracemalloc", type=Path, default=None, help="trace the agent, snapshots to this folder")
    ap.add_argument("--snapshot-s", type=float, default=300.0)
    ap.add_argument("--diff", type=Path, default=None, help="only print the growth between snapshots in DIR")
    ap.add_argument("--out", type=Path, default=RESULTS / "soak.json")
    args = ap.parse_args()
    if args.diff is not None:
        print("\n".join(diff(args.diff, WARMUP_S)))
        return

    work = Path(tempfile.mkdtemp(prefix="iw-soak-"))
    sim_port, agent_port, recv_port = free_port(), free_port(), free_port()
    sim_url, agent_url = f"http://127.0.0.1:{sim_port}", f"http://127.0.0.1:{agent_port}"
    clean = {k: v for k, v in os.environ.items() if not k.startswith(("INFERWATCH_", "OTEL_"))}
    procs: list[subprocess.Popen[bytes]] = []

    def spawn(name: str, cmd: list[str], env: dict[str, str] | None = None) -> subprocess.Popen[bytes]:
        log = (work / f"{name}.log").open("wb")
        proc = subprocess.Popen(
            cmd, cwd=ROOT, stdout=log, stderr=subprocess.STDOUT, env=env or clean, start_new_session=True
        )
        procs.append(proc)
        return proc

    samples: list[tuple[float, int]] = []
    scrapes = {"ok": 0, "failed": 0}
    hostile = {"sent": 0, "status": {}}  # type: dict[str, object]
    try:
        sim_cmd = [
            PYTHON,
            "-m",
            "inferwatch.agent",
            "simulate",
            "--port",
            str(sim_port),
            "--seed",
            "31",
            "--log-level",
            "warning",
        ]
        for m in MODELS:
            sim_cmd += ["--model", m]
        sim_cmd += ["--otlp-traces-endpoint", f"http://127.0.0.1:{recv_port}/v1/traces"]
        sim = spawn("simulator", sim_cmd)
        wait_http(f"{sim_url}/health", proc=sim, timeout_s=120)
        env = dict(clean)
        env.update(
            INFERWATCH_ENGINE__METRICS_URL=f"{sim_url}/metrics",
            INFERWATCH_PROBE__URL=sim_url,
            INFERWATCH_RUNTIME__CMDLINE_PATTERN=rf"-m inferwatch.agent simulate --port {sim_port} ",
            INFERWATCH_RECEIVER__ENABLED="true",
            INFERWATCH_RECEIVER__GRPC_ENDPOINT="",
            INFERWATCH_RECEIVER__HTTP_ENDPOINT=f"127.0.0.1:{recv_port}",
            INFERWATCH_LOG_LEVEL="warning",
            INFERWATCH_SNAPSHOTS__DIR=str(work / "snapshots"),
        )
        agent_cmd = [PYTHON, "-m", "inferwatch.agent", "run", "--port", str(agent_port)]
        if args.tracemalloc is not None:
            args.tracemalloc.mkdir(parents=True, exist_ok=True)
            env.update(SOAK_TRACEMALLOC_DIR=str(args.tracemalloc), SOAK_SNAPSHOT_S=str(args.snapshot_s))
            agent_cmd = [PYTHON, str(ROOT / "benchmarks" / "soak_agent.py"), "run", "--port", str(agent_port)]
        agent = spawn("agent", agent_cmd, env)
        # tracemalloc (25 frames) makes the agent's start several times slower
        wait_http(f"{agent_url}/metrics", proc=agent, timeout_s=120 if args.tracemalloc is None else 600)
        t0 = time.monotonic()
        end = t0 + args.duration_s
        for i, m in enumerate(MODELS):
            spawn(
                f"loadgen-{i}",
                [
                    *(
                        PYTHON,
                        "-m",
                        "inferwatch.agent",
                        "loadgen",
                        "--url",
                        sim_url,
                        "--model",
                        m,
                        "--rate",
                        str(args.rate),
                    ),
                    *("--duration", str(int(args.duration_s) + 30), "--prompt-tokens", "lognormal:512:0.6"),
                    *("--output-tokens", "lognormal:128:0.5", "--timeout", "120", "--seed", str(i + 1)),
                    "--no-progress",
                ],
            )
        stop_evt = threading.Event()

        def scraper() -> None:
            with httpx.Client(timeout=10.0) as client:
                while not stop_evt.wait(15.0):
                    try:
                        client.get(f"{agent_url}/metrics").raise_for_status()
                        scrapes["ok"] += 1
                    except httpx.HTTPError:
                        scrapes["failed"] += 1

        def hostile_sender() -> None:
            status: dict[str, int] = {}
            body = hostile_export()
            with httpx.Client(timeout=10.0) as client:
                while not stop_evt.wait(args.hostile_every_s):
                    try:
                        r = client.post(
                            f"http://127.0.0.1:{recv_port}/v1/traces",
                            content=body,
                            headers={"Content-Type": "application/x-protobuf"},
                        )
                        key = str(r.status_code)
                    except httpx.HTTPError as exc:
                        key = type(exc).__name__
                    status[key] = status.get(key, 0) + 1
                    hostile["sent"] = int(hostile["sent"]) + 1  # type: ignore[call-overload]
                    hostile["status"] = dict(status)

        threads = [threading.Thread(target=scraper, daemon=True)]
        if args.hostile_every_s > 0:
            threads.append(threading.Thread(target=hostile_sender, daemon=True))
        for t in threads:
            t.start()
        next_report = t0
        while (now := time.monotonic()) < end:
            if agent.poll() is not None:
                raise RuntimeError(f"agent exited with {agent.returncode}; see {work / 'agent.log'}")
            samples.append((now - t0, rss_kb(agent.pid)))
            if now >= next_report:
                print(f"{now - t0:7.0f} s  RSS {samples[-1][1] / 1024:7.1f} MiB", flush=True)
                next_report += 60.0
            time.sleep(max(0.0, min(args.sample_s, end - time.monotonic())))
        stop_evt.set()
        final_metrics = httpx.get(f"{agent_url}/metrics", timeout=10.0).text
    finally:
        for proc in reversed(procs):
            stop(proc)

    fit = [(t, v) for t, v in samples if t >= args.duration_s - args.fit_s]
    after_warmup = [(t, v) for t, v in samples if t >= WARMUP_S]
    at5 = next((v for t, v in samples if t >= WARMUP_S), samples[-1][1])
    wanted = ("inferwatch_receiver_", "inferwatch_request_", "inferwatch_engine_up", "inferwatch_collector_success")
    result = {
        "command": " ".join([Path(PYTHON).name, *sys.argv]),
        "duration_s": args.duration_s,
        "fit_s": args.fit_s,
        "rate_per_model": args.rate,
        "models": list(MODELS),
        "traced": args.tracemalloc is not None,
        "rss_kb_start": samples[0][1],
        "rss_kb_5min": at5,
        "rss_kb_end": samples[-1][1],
        "rss_kb_max": max(v for _, v in samples),
        "slope_kb_per_min_last_fit": round(slope_kb_per_min(fit), 2),
        "slope_kb_per_min_after_warmup": round(slope_kb_per_min(after_warmup), 2),
        "target_kb_per_min": TARGET_KB_PER_MIN,
        "scrapes": scrapes,
        "hostile_exports": hostile,
        "final_metrics_excerpt": [
            line
            for line in final_metrics.splitlines()
            if line.startswith(wanted) and "bucket" not in line and len(line) < 300
        ][:80],
        "samples": [[round(t, 1), v] for t, v in samples],
    }
    args.out.parent.mkdir(parents=True, exist_ok=True)
    args.out.write_text(json.dumps(result, indent=1) + "\n")
    print(
        f"RSS {result['rss_kb_start'] / 1024:.1f} -> {at5 / 1024:.1f} (5 min) -> {result['rss_kb_end'] / 1024:.1f} MiB;"
        f" slope over the last {args.fit_s:.0f} s: {result['slope_kb_per_min_last_fit']} kB/min"
        f" (after warm-up: {result['slope_kb_per_min_after_warmup']}); target <= {TARGET_KB_PER_MIN}"
    )
    print(f"wrote {args.out}; logs in {work}")
    with contextlib.suppress(OSError):
        (work / "done").write_text("ok\n")


if __name__ == "__main__":
    main()
