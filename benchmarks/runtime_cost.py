"""The agent's cost to a real runtime: llama-server throughput and TTFT with and without the agent beside it.

One llama-server (native build, generated ``small`` model: 24M parameters, F16) serves a fixed closed-loop
load: ``--clients`` concurrent streaming completions (fixed prompt, ``--max-tokens`` each, prompt cache off).
Each round runs three phases in rotated order — no agent, agent at a 1 s interval, agent at a 5 s interval —
each ``--phase-s`` seconds after a short warm-up. The agent runs as its own process (``python -m inferwatch.agent run``,
default collectors, the engine collector on the server's /metrics, the simd collector on its pid) and its
/metrics is scraped at the same interval, as Prometheus would. Reported per setting, against the baseline
phases of the same rounds: throughput ratio (generated tokens/s) and client TTFT p50 ratio, as the median of
the per-round ratios with min..max.

    python benchmarks/runtime_cost.py --rounds 4 --phase-s 15 --threads 1 [--json FILE]   # figures: docs/benchmarks.md

Not a pass/fail test. On a shared machine the spread between identical phases is usually larger than the
effect; read the baseline-vs-baseline spread that is printed alongside.
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import sys
import tempfile
import threading
import time
from collections.abc import Iterator
from contextlib import contextmanager, suppress
from dataclasses import dataclass
from pathlib import Path

import httpx

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

from tests.conftest import free_port  # noqa: E402
from tests.llamacpp_model import PRESETS, cached  # noqa: E402
from tests.llamacpp_server import find_binary, llama_server  # noqa: E402
from tests.procs import running, wait_http  # noqa: E402

PROMPT = "The quick brown fox jumps over the lazy dog. " * 4


@dataclass
class Phase:
    setting: str
    tokens: int
    seconds: float
    ttfts: list[float]
    errors: int
    agent_cpu_s: float = 0.0  # CPU seconds the agent process used during the phase (utime + stime)

    @property
    def throughput(self) -> float:
        return self.tokens / self.seconds

    @property
    def ttft_p50(self) -> float:
        return statistics.median(self.ttfts) if self.ttfts else float("nan")


def _stream_once(client: httpx.Client, url: str, max_tokens: int) -> tuple[float, int]:
    body = {"prompt": PROMPT, "max_tokens": max_tokens, "stream": True, "cache_prompt": False, "temperature": 0.8}
    start = time.perf_counter()
    ttft = None
    tokens = 0
    # a fresh connection per request: llama-server (cpp-httplib) drops idle keep-alive connections, which
    # a reused client then sees as RemoteProtocolError
    with client.stream("POST", f"{url}/completion", json=body, timeout=120, headers={"Connection": "close"}) as r:
        r.raise_for_status()
        for line in r.iter_lines():
            if not line.startswith("data: "):
                continue
            chunk = json.loads(line[6:])
            if chunk.get("content") and ttft is None:
                ttft = time.perf_counter() - start
            if chunk.get("stop"):
                tokens = int(chunk.get("timings", {}).get("predicted_n", 0))
    return (ttft if ttft is not None else float("nan")), tokens


def run_load(url: str, clients: int, seconds: float, max_tokens: int, setting: str) -> Phase:
    stop_at = time.perf_counter() + seconds
    lock = threading.Lock()
    tokens = errors = 0
    ttfts: list[float] = []
    error_kinds: dict[str, int] = {}

    def worker() -> None:
        nonlocal tokens, errors
        with httpx.Client() as client:
            while time.perf_counter() < stop_at:
                try:
                    ttft, n = _stream_once(client, url, max_tokens)
                except (httpx.HTTPError, ValueError) as exc:
                    with lock:
                        errors += 1
                        error_kinds[type(exc).__name__] = error_kinds.get(type(exc).__name__, 0) + 1
                    continue
                with lock:
                    tokens += n
                    ttfts.append(ttft)

    started = time.perf_counter()
    threads = [threading.Thread(target=worker) for _ in range(clients)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    if error_kinds:
        print(f"  errors in {setting}: {error_kinds}", flush=True)
    return Phase(setting, tokens, time.perf_counter() - started, ttfts, errors)


def cpu_seconds(pid: int) -> float:
    """utime + stime of a process and its threads, from /proc/PID/stat (clock ticks → seconds)."""
    fields = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()
    return (int(fields[11]) + int(fields[12])) / os.sysconf("SC_CLK_TCK")


@contextmanager
def agent_beside(server_url: str, pid: int, interval_s: float, workdir: Path) -> Iterator[int]:
    port = free_port()
    env = {
        "INFERWATCH_ENGINE__METRICS_URL": f"{server_url}/metrics",
        "INFERWATCH_RUNTIME__PID": str(pid),
        "INFERWATCH_LOG_LEVEL": "warning",
    }
    cmd = [sys.executable, "-m", "inferwatch.agent", "run", "--port", str(port), "--interval", str(interval_s)]
    with running(cmd, workdir / f"agent-{interval_s:g}.log", cwd=ROOT, env=env) as proc:
        base = f"http://127.0.0.1:{port}"
        wait_http(f"{base}/readyz", timeout_s=60, ok=lambda r: r.status_code == 200, proc=proc)
        stop = threading.Event()

        def scrape() -> None:  # Prometheus scraping the agent at the same interval
            with httpx.Client() as c:
                while not stop.wait(interval_s):
                    with suppress(httpx.HTTPError):
                        c.get(f"{base}/metrics", timeout=5)

        scraper = threading.Thread(target=scrape, daemon=True)
        scraper.start()
        try:
            yield proc.pid
        finally:
            stop.set()
            scraper.join(10)


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n", 1)[0])
    parser.add_argument("--rounds", type=int, default=5)
    parser.add_argument("--phase-s", type=float, default=20.0)
    parser.add_argument("--warmup-s", type=float, default=3.0)
    parser.add_argument("--clients", type=int, default=2)
    parser.add_argument("--max-tokens", type=int, default=64)
    parser.add_argument("--preset", default="small", choices=sorted(PRESETS))
    parser.add_argument("--threads", type=int, default=2, help="llama-server -t")
    parser.add_argument("--json", type=Path, help="write raw phases as JSON")
    args = parser.parse_args(argv)

    binary = find_binary()
    if binary is None:
        sys.exit("llama-server not built: run scripts/build-llama-server.sh")
    work = Path(tempfile.mkdtemp(prefix="runtime-cost-"))
    model = cached(work, PRESETS[args.preset])
    settings = ["none", "agent_1s", "agent_5s"]
    phases: list[Phase] = []
    with llama_server(binary, model, work / "server.log", threads=args.threads, parallel=args.clients) as server:
        run_load(server.url, args.clients, args.warmup_s, args.max_tokens, "warmup")
        for r in range(args.rounds):
            order = settings[r % 3 :] + settings[: r % 3]
            for setting in order:
                if setting == "none":
                    phases.append(run_load(server.url, args.clients, args.phase_s, args.max_tokens, setting))
                else:
                    interval = 1.0 if setting == "agent_1s" else 5.0
                    with agent_beside(server.url, server.pid, interval, work) as agent_pid:
                        time.sleep(min(interval, 2.0))  # first collections (code scan) before the measurement
                        before = cpu_seconds(agent_pid)
                        phase = run_load(server.url, args.clients, args.phase_s, args.max_tokens, setting)
                        phase.agent_cpu_s = cpu_seconds(agent_pid) - before
                        phases.append(phase)
                p = phases[-1]
                print(
                    f"round {r + 1} {setting:9s} {p.throughput:8.1f} tok/s  TTFT p50 {p.ttft_p50 * 1e3:6.1f} ms  "
                    f"requests {len(p.ttfts)} errors {p.errors}  agent CPU {p.agent_cpu_s / p.seconds:.2%} of a core",
                    flush=True,
                )
    by_round = [phases[i * 3 : i * 3 + 3] for i in range(args.rounds)]
    print(
        f"\nllama-server {binary}, model {args.preset}, {args.clients} clients, {args.max_tokens} tokens/request, "
        f"{args.rounds} rounds x {args.phase_s:g} s per phase, cpu count {os.cpu_count()}"
    )
    print(
        "| setting | throughput ratio (median, min..max) | TTFT p50 ratio (median, min..max) | tok/s (median) "
        "| agent CPU, % of one core (median) |"
    )
    print("|---|---|---|---|---|")
    for setting in settings:
        tput, ttft, abs_tput, cpu = [], [], [], []
        for rnd in by_round:
            base = next(p for p in rnd if p.setting == "none")
            this = next(p for p in rnd if p.setting == setting)
            tput.append(this.throughput / base.throughput)
            ttft.append(this.ttft_p50 / base.ttft_p50)
            abs_tput.append(this.throughput)
            cpu.append(this.agent_cpu_s / this.seconds)
        print(
            f"| {setting} | {statistics.median(tput):.3f} ({min(tput):.3f}..{max(tput):.3f}) | "
            f"{statistics.median(ttft):.3f} ({min(ttft):.3f}..{max(ttft):.3f}) | {statistics.median(abs_tput):.1f} | "
            f"{statistics.median(cpu):.2%} |"
        )
    base_tput = [p.throughput for p in phases if p.setting == "none"]
    if len(base_tput) > 1:
        spread = (max(base_tput) - min(base_tput)) / statistics.median(base_tput)
        print(f"\nbaseline-vs-baseline spread across rounds: {spread:.1%} of the median (machine noise)")
    if args.json:
        args.json.write_text(json.dumps([p.__dict__ for p in phases], indent=1))


if __name__ == "__main__":
    main()
