"""The gpu collector on a real GPU: does it read what the driver says, and does it tell real work from
a busy flag? Written for one NVIDIA H200 (any Hopper or later GPU works; older GPUs run it without GPM) and meant
to finish in well under 5 minutes. Not a test: it prints a summary and writes a JSON result.

1. **Against nvidia-smi**: the collector's readings (utilisation, memory, SM clock, power, temperature) beside
   ``nvidia-smi --query-gpu=...`` taken at the same moment, in every phase below.
2. **Three phases** driven by a torch worker process: idle, a bf16 matmul loop, a device-to-device copy loop.
   ``utilization.gpu`` reads ~100 % in both busy phases; GPM SM activity, tensor activity and DRAM bandwidth
   should tell the matmul (tensor cores busy) from the copy (DRAM busy, tensor cores idle). Reported with the
   worker's own throughput (TFLOP/s, GB/s).
3. **Attribution**: the worker's PID in the collector's process series (memory, SM busy time, GPM SM activity of
   the sole process) beside ``nvidia-smi --query-compute-apps``.
4. **Overhead**: the collector's own time per collection in this process; then the real agent
   (``python -m inferwatch.agent run --interval 1``) as a separate process: its CPU per collection cycle, and the
   worker's matmul throughput with the agent running against without it, alternating (ABBA) over ``--rounds``.

    python benchmarks/gpu_real.py [--out benchmarks/results/gpu_real.json] [--phase-s 20] [--rounds 3]

Needs: the NVIDIA driver (libnvidia-ml.so.1), nvidia-ml-py, torch with CUDA, psutil, httpx, and this project's
dependencies importable (``pip install -e .`` or the wheels); nvidia-smi on PATH for item 1. Where the driver, a
GPU or CUDA torch is missing it prints why and exits 2 before importing torch (tests/test_gpu_benchmark.py checks
that on a GPU-less host).
"""

from __future__ import annotations

import argparse
import contextlib
import json
import os
import shutil
import socket
import statistics
import subprocess
import sys
import threading
import time
from collections.abc import Iterator, Mapping, Sequence
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))  # the agent from this checkout, installed or not
DEFAULT_OUT = ROOT / "benchmarks" / "results" / "gpu_real.json"
EXIT_CANNOT_RUN = 2
SMI_FIELDS = (
    "index",
    "uuid",
    "utilization.gpu",
    "utilization.memory",
    "memory.used",
    "memory.total",
    "clocks.sm",
    "power.draw",
    "temperature.gpu",
)
MATMUL_N = 8192  # bf16 8192³: ~1.1 TFLOP per product, tensor-core bound on Hopper
COPY_BYTES = 2 * 2**30  # 2 GiB device-to-device per copy: DRAM bound, no tensor work
SAMPLE_EVERY_S = 2.0  # collector and nvidia-smi readings inside a phase
WARMUP_S = 3.0  # a phase's load settles before it is measured


# --- preflight: why this host cannot run it (no torch import before the driver is known to be there) ---------


def preflight() -> str | None:
    """None when the host can run the benchmark, else the reason it cannot."""
    try:
        import pynvml
    except ImportError:
        return "nvidia-ml-py is not installed (pip install nvidia-ml-py)"
    try:
        pynvml.nvmlInit()
    except pynvml.NVMLError_LibraryNotFound:
        return "no NVIDIA driver on this host (libnvidia-ml.so.1 not found)"
    except pynvml.NVMLError_DriverNotLoaded:
        return "the NVIDIA kernel driver is not loaded"
    except pynvml.NVMLError as exc:
        return f"NVML cannot start: {exc}"
    try:
        if pynvml.nvmlDeviceGetCount() == 0:
            return "NVML found no GPU"
    finally:
        pynvml.nvmlShutdown()
    try:
        import inferwatch.agent.node.collectors.gpu  # noqa: F401  (this project's dependencies)
    except ImportError as exc:
        return f"the agent cannot be imported ({exc}); install the project: pip install -e ."
    probe = subprocess.run(
        [sys.executable, "-c", "import torch, sys; sys.exit(0 if torch.cuda.is_available() else 3)"],
        capture_output=True,
        text=True,
        timeout=120,
    )
    if probe.returncode == 3:
        return "torch cannot use CUDA here (torch.cuda.is_available() is False)"
    if probe.returncode != 0:
        return f"torch cannot be imported: {probe.stderr.strip().splitlines()[-1:]}"
    return None


# --- nvidia-smi --------------------------------------------------------------------------------------------


def parse_smi_csv(text: str) -> list[dict[str, float | str]]:
    """``nvidia-smi --query-gpu=<SMI_FIELDS> --format=csv,noheader,nounits`` rows; '[N/A]' becomes absent."""
    rows = []
    for line in text.strip().splitlines():
        cells = [c.strip() for c in line.split(",")]
        if len(cells) != len(SMI_FIELDS):
            continue
        row: dict[str, float | str] = {}
        for field, cell in zip(SMI_FIELDS, cells, strict=True):
            if field == "uuid":
                row[field] = cell
            elif cell and not cell.startswith("[") and cell != "N/A":
                row[field] = float(cell)
        rows.append(row)
    return rows


def smi() -> list[dict[str, float | str]]:
    exe = shutil.which("nvidia-smi")
    if exe is None:
        return []
    out = subprocess.run(
        [exe, f"--query-gpu={','.join(SMI_FIELDS)}", "--format=csv,noheader,nounits"],
        capture_output=True,
        text=True,
        timeout=30,
    )
    return parse_smi_csv(out.stdout) if out.returncode == 0 else []


def smi_apps() -> list[dict[str, str]]:
    exe = shutil.which("nvidia-smi")
    if exe is None:
        return []
    out = subprocess.run(
        [exe, "--query-compute-apps=pid,gpu_uuid,used_memory", "--format=csv,noheader,nounits"],
        capture_output=True,
        text=True,
        timeout=30,
    )
    apps = []
    for line in out.stdout.strip().splitlines():
        cells = [c.strip() for c in line.split(",")]
        if len(cells) == 3:
            apps.append({"pid": cells[0], "gpu_uuid": cells[1], "used_memory_mib": cells[2]})
    return apps


def agent_view(samples: Sequence[Any], uuid: str) -> dict[str, float]:
    """The collector's readings of one GPU in nvidia-smi's units (percent, MiB, MHz, W, °C)."""
    want = {
        "hw.gpu.utilization": ("utilization.gpu", 100.0),
        "inferwatch.gpu.memory_controller.utilization": ("utilization.memory", 100.0),
        "hw.gpu.memory.usage": ("memory.used", 1 / 2**20),
        "hw.gpu.memory.limit": ("memory.total", 1 / 2**20),
        "inferwatch.gpu.clock.sm": ("clocks.sm", 1e-6),
        "inferwatch.gpu.power": ("power.draw", 1.0),
        "inferwatch.gpu.temperature": ("temperature.gpu", 1.0),
        "inferwatch.gpu.sm.activity": ("sm_activity", 100.0),
        "inferwatch.gpu.sm.occupancy": ("sm_occupancy", 100.0),
        "inferwatch.gpu.tensor.activity": ("tensor_activity", 100.0),
        "inferwatch.gpu.dram.bandwidth.utilization": ("dram_bandwidth", 100.0),
    }
    out: dict[str, float] = {}
    for s in samples:
        a = dict(s.attributes)
        if s.name in want and a.get("hw.id") == uuid:
            key, scale = want[s.name]
            out[key] = float(s.value) * scale
    return out


def compare(agent: Mapping[str, float], reference: Mapping[str, float | str]) -> dict[str, dict[str, float]]:
    """Field by field: the agent's value, nvidia-smi's, and the difference (agent − smi)."""
    out = {}
    for field in SMI_FIELDS[2:]:
        if field in agent and isinstance(reference.get(field), float):
            ref = float(reference[field])
            out[field] = {"agent": round(agent[field], 2), "nvidia_smi": ref, "diff": round(agent[field] - ref, 2)}
    return out


def separation(phases: Mapping[str, Mapping[str, float]]) -> dict[str, Any]:
    """Does GPM tell the matmul phase from the copy phase where utilization.gpu cannot? Figures, not a verdict."""
    mm, cp = phases.get("matmul", {}), phases.get("copy", {})
    out: dict[str, Any] = {}
    for key in ("utilization.gpu", "sm_activity", "tensor_activity", "dram_bandwidth"):
        if key in mm and key in cp:
            out[key] = {"matmul": round(mm[key], 1), "copy": round(cp[key], 1)}
    if {"tensor_activity", "dram_bandwidth"} <= set(mm) & set(cp):
        out["tensor_tells_matmul"] = mm["tensor_activity"] > 3 * max(cp["tensor_activity"], 1.0)
        out["dram_tells_copy"] = cp["dram_bandwidth"] > mm["dram_bandwidth"]
    if "utilization.gpu" in mm and "utilization.gpu" in cp:
        out["busy_flag_alike"] = abs(mm["utilization.gpu"] - cp["utilization.gpu"]) < 10
    return out


# --- the torch worker (a separate process: its PID is what attribution must find) ---------------------------


def worker() -> int:
    """Reads commands on stdin (idle | matmul | copy | report | quit); answers 'report' with one JSON line."""
    import torch

    dev = torch.device("cuda")
    a = torch.randn(MATMUL_N, MATMUL_N, dtype=torch.bfloat16, device=dev)
    b = torch.randn(MATMUL_N, MATMUL_N, dtype=torch.bfloat16, device=dev)
    src = torch.empty(COPY_BYTES, dtype=torch.uint8, device=dev)
    dst = torch.empty_like(src)
    state = {"mode": "idle", "iters": 0, "since": time.perf_counter()}
    lock = threading.Lock()

    def commands() -> None:
        for line in sys.stdin:
            cmd = line.strip()
            with lock:
                if cmd in ("idle", "matmul", "copy"):
                    torch.cuda.synchronize()
                    state.update(mode=cmd, iters=0, since=time.perf_counter())
                elif cmd == "report":
                    torch.cuda.synchronize()
                    seconds = time.perf_counter() - float(state["since"])
                    n = int(state["iters"])
                    rate = {
                        "matmul": n * 2 * MATMUL_N**3 / seconds / 1e12,  # TFLOP/s
                        "copy": n * 2 * COPY_BYTES / seconds / 1e9,  # GB/s read + written
                    }.get(str(state["mode"]), 0.0)
                    print(json.dumps({"mode": state["mode"], "iters": n, "seconds": seconds, "rate": rate}), flush=True)
                elif cmd == "quit":
                    state["mode"] = "quit"
                    return

    threading.Thread(target=commands, daemon=True).start()
    print(json.dumps({"ready": True, "pid": os.getpid(), "memory_reserved": torch.cuda.memory_reserved()}), flush=True)
    while True:
        with lock:
            mode = state["mode"]
            if mode == "matmul":
                torch.matmul(a, b)
                state["iters"] = int(state["iters"]) + 1
            elif mode == "copy":
                dst.copy_(src)
                state["iters"] = int(state["iters"]) + 1
        if mode == "quit":
            return 0
        if mode == "idle":
            time.sleep(0.05)
        elif int(state["iters"]) % 8 == 0:
            torch.cuda.synchronize()  # keep the launch queue short, so a mode switch is prompt


class Worker:
    def __init__(self) -> None:
        self.proc = subprocess.Popen(
            [sys.executable, __file__, "--worker"],
            stdin=subprocess.PIPE,
            stdout=subprocess.PIPE,
            text=True,
            bufsize=1,
            env={**os.environ, "CUDA_DEVICE_ORDER": "PCI_BUS_ID"},  # cuda:0 is NVML's GPU 0
        )
        hello = json.loads(self._line())
        self.pid = int(hello["pid"])
        self.memory_reserved = int(hello["memory_reserved"])

    def _line(self) -> str:
        assert self.proc.stdout is not None
        line = self.proc.stdout.readline()
        if not line:
            raise RuntimeError(f"the torch worker exited ({self.proc.wait()})")
        return line

    def send(self, cmd: str) -> None:
        assert self.proc.stdin is not None
        self.proc.stdin.write(cmd + "\n")
        self.proc.stdin.flush()

    def report(self) -> dict[str, Any]:
        self.send("report")
        return dict(json.loads(self._line()))

    def close(self) -> None:
        with contextlib.suppress(OSError, ValueError):
            self.send("quit")
        try:
            self.proc.wait(timeout=20)
        except subprocess.TimeoutExpired:
            self.proc.kill()


# --- the measurements ---------------------------------------------------------------------------------------


def mean_readings(readings: list[dict[str, float]]) -> dict[str, float]:
    keys = {k for r in readings for k in r}
    return {k: statistics.fmean(r[k] for r in readings if k in r) for k in sorted(keys)}


def run_phase(name: str, worker_: Worker, collector: Any, uuid: str, seconds: float) -> dict[str, Any]:
    worker_.send(name)
    time.sleep(WARMUP_S)
    collector.collect()  # primes GPM: the next collection reports the interval since this one
    worker_.report()  # throughput counted from here
    readings, smis, costs = [], [], []
    last = None
    deadline = time.monotonic() + seconds
    while time.monotonic() < deadline:
        time.sleep(SAMPLE_EVERY_S)
        began = time.perf_counter()
        last = collector.collect()
        costs.append(time.perf_counter() - began)
        ref = next((r for r in smi() if r.get("uuid") == uuid), {})
        readings.append(agent_view(last.samples, uuid))
        smis.append({k: float(v) for k, v in ref.items() if isinstance(v, float)})
    throughput = worker_.report()
    agent_mean, smi_mean = mean_readings(readings), mean_readings(smis)
    procs = []
    for s in last.samples if last is not None else []:
        a = dict(s.attributes)
        if s.name.startswith("inferwatch.gpu.process.") and a.get("pid") == str(worker_.pid):
            procs.append({"metric": s.name, "value": s.value, **a})
    return {
        "phase": name,
        "agent": {k: round(v, 2) for k, v in agent_mean.items()},
        "nvidia_smi": {k: round(v, 2) for k, v in smi_mean.items()},
        "agent_vs_nvidia_smi": compare(agent_mean, smi_mean),
        "throughput": throughput,
        "worker_process_series": procs,
        "collect_seconds": {"median": statistics.median(costs), "max": max(costs)} if costs else {},
        "gpm_status": last.details.get("gpu0.gpm") if last is not None else None,
    }


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


@contextlib.contextmanager
def agent_process(interval_s: float) -> Iterator[subprocess.Popen[bytes]]:
    """The real agent, collecting every ``interval_s``, until the block ends."""
    import httpx

    port = free_port()
    env = {**os.environ, "INFERWATCH_LOG_LEVEL": "warning", "PYTHONPATH": str(ROOT)}
    cmd = [sys.executable, "-m", "inferwatch.agent", "run", "--port", str(port), "--interval", str(interval_s)]
    proc = subprocess.Popen(cmd, cwd=ROOT, env=env, start_new_session=True, stderr=subprocess.DEVNULL)
    try:
        deadline = time.monotonic() + 60
        while True:
            if proc.poll() is not None:
                raise RuntimeError(f"the agent exited with {proc.returncode}")
            with contextlib.suppress(httpx.HTTPError):
                if httpx.get(f"http://127.0.0.1:{port}/readyz", timeout=2).status_code == 200:
                    break
            if time.monotonic() > deadline:
                raise TimeoutError("the agent did not become ready in 60 s")
            time.sleep(0.2)
        yield proc
    finally:
        proc.terminate()
        try:
            proc.wait(timeout=15)
        except subprocess.TimeoutExpired:
            proc.kill()


def overhead(worker_: Worker, rounds: int, window_s: float) -> dict[str, Any]:
    """Matmul TFLOP/s with and without the agent collecting at 1 s, ABBA order; the agent's CPU per cycle."""
    import psutil

    def matmul_window() -> float:
        worker_.send("matmul")
        time.sleep(WARMUP_S)
        worker_.report()
        time.sleep(window_s)
        return float(worker_.report()["rate"])

    without, with_agent, cpu_per_cycle = [], [], []
    for r in range(rounds):
        order = ("off", "on") if r % 2 == 0 else ("on", "off")
        for which in order:
            if which == "off":
                without.append(matmul_window())
                continue
            with agent_process(1.0) as proc:
                p = psutil.Process(proc.pid)
                before = p.cpu_times()
                began = time.monotonic()
                with_agent.append(matmul_window())
                after = p.cpu_times()
                elapsed = time.monotonic() - began
                cpu = (after.user - before.user) + (after.system - before.system)
                cpu_per_cycle.append(cpu / max(elapsed / 1.0, 1.0))
    worker_.send("idle")
    ratio = statistics.fmean(with_agent) / statistics.fmean(without) if without and with_agent else None
    return {
        "matmul_tflops_without_agent": [round(x, 2) for x in without],
        "matmul_tflops_with_agent_1s": [round(x, 2) for x in with_agent],
        "with_over_without": round(ratio, 4) if ratio is not None else None,
        "agent_cpu_seconds_per_cycle": [round(x, 5) for x in cpu_per_cycle],
        "rounds": rounds,
        "window_s": window_s,
    }


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--out", type=Path, default=DEFAULT_OUT)
    ap.add_argument("--phase-s", type=float, default=20.0, help="measured seconds per phase (after 3 s warm-up)")
    ap.add_argument("--rounds", type=int, default=3, help="ABBA rounds of the overhead measurement")
    ap.add_argument("--overhead-window-s", type=float, default=12.0)
    ap.add_argument("--worker", action="store_true", help=argparse.SUPPRESS)
    args = ap.parse_args(argv)
    if args.worker:
        return worker()
    reason = preflight()
    if reason is not None:
        print(
            f"gpu_real: cannot run here: {reason}. Nothing measured; run it on a host with an NVIDIA GPU.",
            file=sys.stderr,
        )
        return EXIT_CANNOT_RUN

    from inferwatch.agent.config import load_settings
    from inferwatch.agent.node.collectors.gpu import GPUCollector
    from inferwatch.agent.node.wiring import collect_context

    started = time.time()
    collector = GPUCollector(collect_context(load_settings()))
    first = collector.collect()
    gpu0 = dict(next(s.attributes for s in first.samples if s.name == "inferwatch.gpu.lost"))  # every GPU has it
    uuid = gpu0["hw.id"]
    result: dict[str, Any] = {
        "gpu": {"uuid": uuid, "model": gpu0["hw.model"]},
        "driver_smi": shutil.which("nvidia-smi") is not None,
        "phases": [],
    }
    worker_ = Worker()
    try:
        result["worker"] = {"pid": worker_.pid, "torch_memory_reserved_bytes": worker_.memory_reserved}
        for phase in ("idle", "matmul", "copy"):
            got = run_phase(phase, worker_, collector, uuid, args.phase_s)
            result["phases"].append(got)
            print(f"{phase:7s} agent={got['agent']}  throughput={got['throughput'].get('rate', 0):.1f}", flush=True)
        result["nvidia_smi_compute_apps"] = smi_apps()
        by_phase = {p["phase"]: {**p["nvidia_smi"], **p["agent"]} for p in result["phases"]}
        result["separation"] = separation(by_phase)
        worker_.send("idle")
        try:
            result["overhead"] = overhead(worker_, args.rounds, args.overhead_window_s)
        except (RuntimeError, TimeoutError) as exc:
            result["overhead"] = {"error": str(exc)}
    finally:
        worker_.close()
        collector.close()
    result["wall_seconds"] = round(time.time() - started, 1)
    args.out.parent.mkdir(parents=True, exist_ok=True)
    args.out.write_text(json.dumps(result, indent=1) + "\n")
    print(json.dumps({"separation": result["separation"], "overhead": result["overhead"]}, indent=1))
    print(f"wrote {args.out} in {result['wall_seconds']} s")
    return 0


if __name__ == "__main__":
    sys.exit(main())
