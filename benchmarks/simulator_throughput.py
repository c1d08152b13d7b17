"""Simulator overhead: sustained requests/s of 32-token streams and event-loop lag p99.

Starts ``inferwatch simulate`` (h100 profile, 8B model) in a subprocess, then drives it open-loop
(Poisson arrivals) at increasing rates with a lean asyncio HTTP/1.1 client (so the client's own cost
does not hide the server's). For each rate it reports achieved completions/s, errors, client-side
TTFT/ITL, the server's CPU time per request (from /proc/PID/stat) and its event-loop lag p50/p99
(``GET /sim/stats``). Baselines measured in the same run: the event-loop lag of the idle server and
of an idle asyncio process running alongside each step (the host's own scheduling noise on a shared
machine), and the timing model's own TTFT/ITL for the same load in virtual time (``run_offline``) — the
difference between client-observed and modelled latency is the simulator's overhead.

    .venv/bin/python benchmarks/simulator_throughput.py [--rates 50,100,150] [--seconds 10]
        [--servers asyncio+h11,uvloop+httptools] [--rounds 2] [--extra-path DIR]

``--servers`` runs one simulator per uvicorn setup (``--loop``/``--http``) and drives them in turn at
every rate, alternating which goes first each round, so the setups are compared under the same load.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import os
import random
import socket
import statistics
import subprocess
import sys
import time
import urllib.request
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

from inferwatch.simulator.engine import EngineCore, Recorder, poisson_requests, run_offline  # noqa: E402
from inferwatch.simulator.profiles import deploy  # noqa: E402
from inferwatch.simulator.scenarios import ScenarioSet  # noqa: E402

MODEL = "meta-llama/Llama-3.1-8B-Instruct"
OUTPUT_TOKENS = 32
PROMPT_WORDS = 120


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


def cpu_seconds(pid: int) -> float:
    fields = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()
    return (int(fields[11]) + int(fields[12])) / os.sysconf("SC_CLK_TCK")


def get_json(url: str) -> dict:
    with urllib.request.urlopen(url, timeout=5) as r:
        return json.loads(r.read())


async def one(port: int, body: bytes) -> tuple[float | None, list[float], bool]:
    start = time.perf_counter()
    reader, writer = await asyncio.open_connection("127.0.0.1", port)
    writer.write(
        b"POST /v1/chat/completions HTTP/1.1\r\nHost: x\r\nContent-Type: application/json\r\nConnection: close\r\n"
        b"Content-Length: " + str(len(body)).encode() + b"\r\n\r\n" + body
    )
    ttft = None
    last = None
    itls: list[float] = []
    ok = False
    buf = b""
    try:
        while True:
            data = await reader.read(65536)
            if not data:
                break
            now = time.perf_counter()
            buf += data
            n = buf.count(b'"delta":{"content":"') - buf.count(b'"delta":{"content":""')
            if n > 0:
                if ttft is None:
                    ttft = now - start
                elif last is not None:
                    itls.append(now - last)
                last = now
            if b"data: [DONE]" in buf:
                ok = True
            buf = buf[-64:]
    finally:
        writer.close()
    return ttft, itls, ok


async def drive(port: int, rate: float, seconds: float, seed: int) -> dict:
    rng = random.Random(seed)
    words = ["the", "model", "serves", "requests", "across", "the", "batch", "while"]
    results: list[tuple[float | None, list[float], bool]] = []
    tasks = set()

    async def run(body: bytes) -> None:
        try:
            results.append(await one(port, body))
        except OSError:
            results.append((None, [], False))

    start = time.perf_counter()
    t = start
    while True:
        t += rng.expovariate(rate)
        if t - start > seconds:
            break
        await asyncio.sleep(max(0.0, t - time.perf_counter()))
        prompt = " ".join(rng.choice(words) for _ in range(PROMPT_WORDS))
        body = json.dumps(
            {"model": MODEL, "messages": [{"role": "user", "content": prompt}], "max_tokens": OUTPUT_TOKENS,
             "ignore_eos": True, "stream": True}
        ).encode()  # fmt: skip
        task = asyncio.create_task(run(body))
        tasks.add(task)
        task.add_done_callback(tasks.discard)
    launched = time.perf_counter() - start
    await asyncio.wait_for(asyncio.gather(*tasks), timeout=120)
    elapsed = time.perf_counter() - start
    ok = [r for r in results if r[2]]
    ttfts = sorted(r[0] for r in ok if r[0] is not None)
    itls = sorted(x for r in ok for x in r[1])
    q = lambda v, p: v[min(len(v) - 1, int(p * len(v)))] if v else float("nan")  # noqa: E731
    return {
        "target_rate": rate,
        "requests": len(results),
        "ok": len(ok),
        "errors": len(results) - len(ok),
        "launch_rate": len(results) / launched,
        "completed_per_s": len(ok) / elapsed,
        "client_ttft_p50_ms": q(ttfts, 0.5) * 1e3,
        "client_ttft_p99_ms": q(ttfts, 0.99) * 1e3,
        "client_itl_mean_ms": statistics.fmean(itls) * 1e3 if itls else float("nan"),
    }


LAG_PROBE = """
import asyncio, json, sys, time
async def main(seconds):
    lags = []
    end = time.perf_counter() + seconds
    while time.perf_counter() < end:
        t0 = time.perf_counter()
        await asyncio.sleep(0.01)
        lags.append(max(0.0, time.perf_counter() - t0 - 0.01))
    lags.sort()
    print(json.dumps({"p50_s": lags[len(lags) // 2], "p99_s": lags[int(0.99 * len(lags))]}))
asyncio.run(main(float(sys.argv[1])))
"""


def start_lag_probe(seconds: float) -> subprocess.Popen[str]:
    """An idle asyncio process measuring its own timer lag over the same window: the host's share of the lag."""
    return subprocess.Popen([sys.executable, "-c", LAG_PROBE, str(seconds)], stdout=subprocess.PIPE, text=True)


def modelled(rate: float, seed: int) -> dict:
    core = EngineCore(0, deploy(MODEL, "h100"), ScenarioSet(), rec := Recorder(), seed=seed)
    run_offline(core, poisson_requests(2000, rate, PROMPT_WORDS + 4, OUTPUT_TOKENS, seed=seed))
    ttft = sorted(r.first_token - r.arrival for r in rec.finished)
    return {
        "model_ttft_p50_ms": ttft[len(ttft) // 2] * 1e3,
        "model_ttft_p99_ms": ttft[int(0.99 * len(ttft))] * 1e3,
        "model_itl_mean_ms": statistics.fmean(rec.itls) * 1e3,
    }


SERVERS = {"asyncio+h11": ("asyncio", "h11"), "uvloop+httptools": ("uvloop", "httptools")}


def start_sim(name: str, seed: int, extra_path: str | None) -> tuple[subprocess.Popen[bytes], int]:
    loop, http = SERVERS[name]
    port = free_port()
    env = dict(os.environ)
    if extra_path:
        env["PYTHONPATH"] = extra_path + os.pathsep + env.get("PYTHONPATH", "")
    log = open(f"/tmp/simulator_throughput-{name}.log", "wb")  # noqa: SIM115
    proc = subprocess.Popen(
        [sys.executable, "-m", "inferwatch.agent", "simulate", "--port", str(port), "--model", MODEL, "--seed",
         str(seed),
         "--loop", loop, "--http", http],
        cwd=ROOT, stdout=log, stderr=subprocess.STDOUT, start_new_session=True, env=env,
    )  # fmt: skip
    base = f"http://127.0.0.1:{port}"
    for _ in range(300):
        try:
            stats = get_json(base + "/sim/stats")
            assert stats["server"] == {"loop": loop, "http": http}, stats
            return proc, port
        except OSError:
            time.sleep(0.1)
    raise SystemExit(f"simulator {name} did not start (see /tmp/simulator_throughput-{name}.log)")


def step(proc: subprocess.Popen[bytes], port: int, rate: float, seconds: float, seed: int) -> dict:
    base = f"http://127.0.0.1:{port}"
    cpu0 = cpu_seconds(proc.pid)
    get_json(base + "/sim/stats?reset=1")
    probe = start_lag_probe(seconds)
    row = asyncio.run(drive(port, rate, seconds, seed))
    lag = get_json(base + "/sim/stats?reset=1")["loop_lag"]
    host = json.loads(probe.communicate(timeout=60)[0])
    row["idle_process_lag_p99_ms"] = host["p99_s"] * 1e3
    row["server_cpu_ms_per_request"] = (cpu_seconds(proc.pid) - cpu0) / max(1, row["requests"]) * 1e3
    row["loop_lag_p50_ms"] = lag["p50_s"] * 1e3
    row["loop_lag_p99_ms"] = lag["p99_s"] * 1e3
    row.update(modelled(rate, seed))
    row["load_average_1m"] = os.getloadavg()[0]
    return row


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--rates", default="50,100,150")
    ap.add_argument("--seconds", type=float, default=10.0)
    ap.add_argument("--seed", type=int, default=1)
    ap.add_argument("--servers", default="asyncio+h11", help=f"comma list of {', '.join(SERVERS)}")
    ap.add_argument("--rounds", type=int, default=1, help="repeat every (rate, server) step; order alternates")
    ap.add_argument("--extra-path", default=None, help="prepended to PYTHONPATH of the simulators (uvloop elsewhere)")
    args = ap.parse_args()
    names = args.servers.split(",")
    sims = {name: start_sim(name, args.seed, args.extra_path) for name in names}
    try:
        time.sleep(3)
        print(f"load average at start: {os.getloadavg()}")
        for name, (_proc, port) in sims.items():
            idle = get_json(f"http://127.0.0.1:{port}/sim/stats?reset=1")["loop_lag"]
            print(f"{name} idle: loop lag p50 {idle['p50_s'] * 1e3:.2f} ms, p99 {idle['p99_s'] * 1e3:.2f} ms")
        rows = []
        for rnd in range(args.rounds):
            for rate in (float(r) for r in args.rates.split(",")):
                order = names if rnd % 2 == 0 else names[::-1]  # ABBA: neither server always goes first
                for name in order:
                    proc, port = sims[name]
                    row = {"server": name, "round": rnd, **step(proc, port, rate, args.seconds, args.seed)}
                    rows.append(row)
                    print(json.dumps({k: round(v, 2) if isinstance(v, float) else v for k, v in row.items()}))
    finally:
        for proc, _port in sims.values():
            proc.terminate()
            proc.wait(10)
    print(f"load average at end: {os.getloadavg()}")
    hdr = ("server", "round", "rate", "completed/s", "errors", "lag p50 ms", "lag p99 ms", "idle-process lag p99 ms",
           "cpu ms/req", "client TTFT p50/p99 ms", "model TTFT p50/p99 ms", "client/model ITL ms",
           "load 1m")  # fmt: skip
    print("| " + " | ".join(hdr) + " |")
    print("|" + "---|" * len(hdr))
    for r in rows:
        print(
            f"| {r['server']} | {r['round']} | {r['target_rate']:.0f} | {r['completed_per_s']:.1f} | {r['errors']} | "
            f"{r['loop_lag_p50_ms']:.2f} | {r['loop_lag_p99_ms']:.2f} | {r['idle_process_lag_p99_ms']:.2f} | "
            f"{r['server_cpu_ms_per_request']:.2f} | "
            f"{r['client_ttft_p50_ms']:.1f} / {r['client_ttft_p99_ms']:.1f} | "
            f"{r['model_ttft_p50_ms']:.1f} / {r['model_ttft_p99_ms']:.1f} | "
            f"{r['client_itl_mean_ms']:.2f} / {r['model_itl_mean_ms']:.2f} | {r['load_average_1m']:.1f} |"
        )


if __name__ == "__main__":
    main()
