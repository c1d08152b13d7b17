"""Cost of the diagnostics on the runtime and on the agent.

1. py-spy on a CPU-bound Python target: the target counts loop iterations per second; each condition
   (none = baseline, ``record`` blocking at RATE Hz, ``record --nonblocking`` at RATE Hz, one
   ``py-spy dump`` per second) is measured for SECONDS, conditions interleaved ROUNDS times so a noisy
   neighbour hits them alike. Reported: iterations/s and the ratio to the baseline of the same round.
2. Redaction: wall time to redact a synthetic runtime profile of N leaves (denylist and allowlist),
   baseline = ``json.dumps`` of the same object (the snapshot is serialised anyway).
3. Probe: client-side TTFT and total time against a local streaming server (tests/fake_runtime.py),
   baseline = the same request read by plain httpx without validation.

    .venv/bin/python benchmarks/diag_overhead.py [--seconds 4] [--rounds 3] [--rate 100]
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

from inferwatch.agent.node.actions.pyspy import resolve_executable  # noqa: E402
from inferwatch.agent.node.debugprofile.redaction import RedactionPolicy  # noqa: E402

TARGET = r"""
import sys, time
n = 0; last = time.monotonic()
while True:
    sum(i * i for i in range(200)); n += 1
    now = time.monotonic()
    if now - last >= 0.5:
        print(n / (now - last), flush=True); n = 0; last = now
"""


def measure(proc: subprocess.Popen[str], seconds: float) -> float:
    """Mean of the target's iterations/s reports over ``seconds`` (first report dropped: warm-up)."""
    assert proc.stdout is not None
    deadline = time.monotonic() + seconds
    values = []
    proc.stdout.readline()
    while time.monotonic() < deadline:
        values.append(float(proc.stdout.readline()))
    return statistics.fmean(values)


def pyspy_bench(seconds: float, rounds: int, rate: int) -> None:
    """A-B-A: each condition's window sits between two baseline windows; ratio = B / mean(A, A')."""
    exe = str(resolve_executable(None))
    target = subprocess.Popen([sys.executable, "-c", TARGET], stdout=subprocess.PIPE, text=True)
    results: dict[str, list[float]] = {}
    bases: list[float] = []

    spy_cpu: dict[str, list[float]] = {}

    def run_spy(name: str, argv: list[str]) -> subprocess.Popen[bytes]:
        return subprocess.Popen(argv, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)

    def reap(name: str, spy: subprocess.Popen[bytes], wall: float) -> None:
        _, _, usage = os.wait4(spy.pid, 0)
        spy.returncode = 0
        spy_cpu.setdefault(name, []).append((usage.ru_utime + usage.ru_stime) / wall)

    def condition(name: str, tmp: str) -> float:
        if name == "dump once per second":
            ratios = []
            stop = time.monotonic() + seconds
            while time.monotonic() < stop:
                t = time.monotonic()
                spy = run_spy(name, [exe, "dump", "-p", str(target.pid), "--nonblocking"])
                ratios.append(measure(target, 1.0))
                reap(name, spy, time.monotonic() - t)
            return statistics.fmean(ratios)
        argv = [exe, "record", "-p", str(target.pid), "-r", str(rate), "-d", str(int(seconds) + 2), "-f", "raw"]
        argv += ["-o", f"{tmp}/p.txt"] + (["--nonblocking"] if "nonblocking" in name else [])
        t = time.monotonic()
        spy = run_spy(name, argv)
        time.sleep(0.5)
        value = measure(target, seconds)
        reap(name, spy, time.monotonic() - t)
        return value

    try:
        time.sleep(1)
        with tempfile.TemporaryDirectory() as tmp:
            for _ in range(rounds):
                for name in ("record blocking", "record --nonblocking", "dump once per second"):
                    a = measure(target, seconds)
                    b = condition(name, tmp)
                    a2 = measure(target, seconds)
                    bases += [a, a2]
                    results.setdefault(name, []).append(b / ((a + a2) / 2))
    finally:
        target.kill()
        target.wait(5)
    print(f"py-spy on a CPU-bound target ({rate} Hz, {seconds:g}s windows, {rounds} A-B-A rounds per condition)")
    lo, hi = min(bases), max(bases)
    print(f"  baseline iterations/s: median {statistics.median(bases):,.0f} (min {lo:,.0f}, max {hi:,.0f})")
    for name, ratios in results.items():
        print(f"  {name:24s} throughput vs baseline: median {statistics.median(ratios):.3f} "
              f"(min {min(ratios):.3f}, max {max(ratios):.3f}); py-spy's own CPU: "
              f"{statistics.median(spy_cpu[name]) * 100:.1f}% of one core")  # fmt: skip


def synthetic_profile(leaves: int) -> dict:
    out: dict = {}
    for i in range(leaves // 10):
        out[f"section_{i}"] = {
            "gpu_memory_used_bytes": i, "num_running_requests": i, "model": "m", "api_key": f"k{i}",
            "cpu_affinity_mask": "0-63", "note": f"Bearer sk-{i:020d}", "list": [1, 2, 3], "flag": True, "x": None,
        }  # fmt: skip
    return out


def redaction_bench() -> None:
    print("redaction of a synthetic runtime profile (median of 7)")
    key = b"k" * 32
    for leaves in (1_000, 10_000, 100_000):
        prof = synthetic_profile(leaves)
        size = len(json.dumps(prof))
        rows = []
        for label, fn in (
            ("json.dumps (baseline)", lambda p=prof: json.dumps(p)),
            ("denylist", lambda p=prof: RedactionPolicy.build(key).redact(p)),
            ("allowlist", lambda p=prof: RedactionPolicy.build(key, "allowlist", allow_keys=["model"]).redact(p)),
        ):
            times = []
            for _ in range(7):
                t = time.perf_counter()
                fn()
                times.append(time.perf_counter() - t)
            rows.append((label, statistics.median(times)))
        base = rows[0][1]
        print(f"  {leaves:>7,} leaves ({size / 1024:,.0f} KiB): " + "; ".join(
            f"{label} {t * 1000:.1f} ms ({t / base:.1f}x)" for label, t in rows))  # fmt: skip


def probe_bench(n: int = 30) -> None:
    import httpx

    from inferwatch.agent.node.probe import run_probe
    from tests.fake_runtime import fake_runtime

    print(f"probe against a local stream (median of {n})")
    with fake_runtime() as rt, httpx.Client() as http:
        for protocol, path in (("openai", "/v1/chat/completions"), ("anthropic", "/v1/messages")):
            plain, probed = [], []
            for _ in range(n):
                t = time.perf_counter()
                body = {"model": "m", "messages": [{"role": "user", "content": "hi"}], "max_tokens": 8, "stream": True}
                with http.stream("POST", rt.url + path, json=body) as r:
                    for _chunk in r.iter_bytes():
                        pass
                plain.append(time.perf_counter() - t)
                res = run_probe(rt.url, protocol, model="m", client=http)
                assert res.ok, res.as_dict()
                probed.append(res.duration_s or 0.0)
            p, q = statistics.median(plain), statistics.median(probed)
            print(f"  {protocol:9s} plain read {p * 1000:.1f} ms; probe (SSE parse + schema + order) {q * 1000:.1f} ms "
                  f"({q / p:.2f}x)")  # fmt: skip


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--seconds", type=float, default=2.0)
    ap.add_argument("--rounds", type=int, default=4)
    ap.add_argument("--rate", type=int, default=100)
    args = ap.parse_args()
    redaction_bench()
    probe_bench()
    pyspy_bench(args.seconds, args.rounds, args.rate)


if __name__ == "__main__":
    main()
