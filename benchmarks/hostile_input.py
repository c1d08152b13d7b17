"""Peak RSS of the agent under hostile engine input, a hostile procfs and a hostile config, vs a clean baseline.

Run from the repository root: ``.venv/bin/python benchmarks/hostile_input.py [--phase-s 8] [--cases ...]``.

Each engine or procfs case is a fresh ``python -m inferwatch.agent run`` (interval 1 s) scraping a local HTTP server on
127.0.0.1; once its own ``/metrics`` says it read the clean exposition (``inferwatch_engine_up 1``),
phases: *clean* → *hostile* → *clean* again. Engine cases change the exposition (clean: a two-model vLLM
exposition); procfs cases run the agent on a procfs tree of recorded files (``INFERWATCH_PATH__PROCFS``,
the CPU collector every second) and make one file hostile during the hostile phase: a 50 MB cpuinfo
(real blocks repeated) or a meminfo that never ends (a link to /dev/zero). The agent's RSS is sampled from
``/proc/PID/status`` every 50 ms; reported per case: the clean baseline (median RSS over the last half of
the first clean phase), the peak during the hostile phase (max of the samples and of the rise of
``VmHWM``), and the RSS at the end of the recovery phase (median of its last quarter), plus what the
agent's own ``/metrics`` said (``engine_up``, scrape errors, limit hits). Config cases start the agent with
a hostile ``--config`` (the YAML alias bomb, a 64 MiB file) and report its exit code, time to exit and peak
RSS (``ru_maxrss`` of that child alone, from ``wait4``) against the same agent started with a small
config it refuses (``config_rejected_clean``: the same start and exit path, no hostile input).
Target: peak ≤ 30 MB above the clean baseline, and back to baseline after recovery (here:
within 10 MB, a third of the allowance); a config case must exit 2 within the allowance.
Results go to ``benchmarks/results/hostile_input.json``. Not a test.
"""

from __future__ import annotations

import argparse
import contextlib
import json
import os
import shutil
import signal
import socket
import statistics
import subprocess
import sys
import tempfile
import threading
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path

import httpx

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

from tests.engine_expo import VllmLike  # noqa: E402
from tests.test_config_hostile import BOMB  # noqa: E402
from tests.test_read_limits import CPUINFO, HOSTILE_CPUINFO_BYTES, MEMINFO, procfs_tree  # noqa: E402

MB = 1e6
TARGET_MB = 30.0
RECOVERED_MB = TARGET_MB / 3  # "back to baseline": within a third of the allowance after the recovery phase
OVERSIZED_CONFIG_BYTES = 64 << 20  # 64 MiB of YAML, 64 times the config file cap (DEFAULT_CONFIG_MAX_BYTES)


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


@dataclass(frozen=True)
class Case:
    """What the hostile phase changes: the engine's body (None: the clean one) and/or one procfs file."""

    body: Callable[[], bytes] | None = None
    env: dict[str, str] = field(default_factory=dict)
    procfs: str | None = None  # "cpuinfo": 50 MB of real blocks; "meminfo": a link to /dev/zero
    cpuinfo_bytes: int = HOSTILE_CPUINFO_BYTES  # the hostile cpuinfo's size (real blocks repeated)


CASES: dict[str, Case] = {
    "145k_models": Case(lambda: gauges(145_000)),
    "145k_models_max_series_raised": Case(lambda: gauges(145_000), {"INFERWATCH_ENGINE__MAX_SERIES": "200000"}),
    "145k_models_max_models_raised": Case(
        lambda: gauges(145_000),
        {"INFERWATCH_ENGINE__MAX_SERIES": "200000", "INFERWATCH_ENGINE__MAX_MODELS": "1000"},
    ),
    "1M_series_max_bytes_256MiB": Case(lambda: series(1_000_000), {"INFERWATCH_ENGINE__MAX_BYTES": str(256 << 20)}),
    "200k_other_series_max_series_raised": Case(
        lambda: other_family(200_000), {"INFERWATCH_ENGINE__MAX_SERIES": "300000"}
    ),
    # every series kept (one model, 1M ranks): what the user allowed by raising both caps is held
    "1M_series_max_bytes_and_max_series_raised": Case(
        lambda: series(1_000_000),
        {"INFERWATCH_ENGINE__MAX_BYTES": str(256 << 20), "INFERWATCH_ENGINE__MAX_SERIES": "2000000"},
    ),
    "4MiB_label_value": Case(lambda: long_label(4 << 20)),
    "50MB_cpuinfo": Case(procfs="cpuinfo"),
    # under the 16 MiB read_limits.max_cpuinfo_bytes: read, so its parse must stay bounded in memory
    "10MB_cpuinfo": Case(procfs="cpuinfo", cpuinfo_bytes=10_000_000),
    "meminfo_dev_zero": Case(procfs="meminfo"),
}
CONFIG_CASES = ("config_rejected_clean", "yaml_alias_bomb", "64MiB_config")


def replace(path: Path, make: Callable[[Path], object]) -> None:
    """Swap ``path`` for what ``make`` writes next to it, in one rename (the agent never sees half a file)."""
    tmp = path.with_name(path.name + ".new")
    with contextlib.suppress(FileNotFoundError):
        tmp.unlink()
    make(tmp)
    os.replace(tmp, path)


def procfs_phase(root: Path, what: str, hostile: bool, cpuinfo_bytes: int = HOSTILE_CPUINFO_BYTES) -> None:
    """Make ``root``'s ``what`` (cpuinfo of ``cpuinfo_bytes``, or meminfo) hostile or clean again."""
    if what == "cpuinfo":
        blocks = CPUINFO.read_bytes()

        def write(tmp: Path) -> None:
            with tmp.open("wb") as f:
                for _ in range(cpuinfo_bytes // len(blocks) + 1 if hostile else 1):
                    f.write(blocks)

        replace(root / "cpuinfo", write)
    elif hostile:
        replace(root / "meminfo", lambda tmp: os.symlink("/dev/zero", tmp))
    else:
        replace(root / "meminfo", lambda tmp: tmp.write_text(MEMINFO.read_text()))


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
            (
                "inferwatch_engine_up",
                "inferwatch_engine_scrape_errors_total",
                "inferwatch_engine_limit",
                "inferwatch_source_limit_hits_total",
                'inferwatch_collector_success{collector="cpu"}',
                'inferwatch_collector_success{collector="pagecache"}',
            )
        ):
            head, _, value = line.rpartition(" ")
            if float(value) or head.startswith("inferwatch_collector_success"):
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


def run_case(name: str, case: Case, clean: bytes, phase_s: float) -> dict:
    hostile = case.body() if case.body is not None else clean
    Body.data = clean
    server = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
    threading.Thread(target=server.serve_forever, daemon=True).start()
    port = free_port()
    url = f"http://127.0.0.1:{server.server_address[1]}/metrics"
    extra = dict(case.env)
    procfs: Path | None = None
    if case.procfs is not None:
        procfs = procfs_tree(Path(tempfile.mkdtemp(prefix="iw-hostile-procfs-")) / "proc", hostile=False)
        extra.update(INFERWATCH_PATH__PROCFS=str(procfs), INFERWATCH_COLLECTORS__CPU__INTERVAL_S="1")
    proc = subprocess.Popen(
        [sys.executable, "-m", "inferwatch.agent", "run"],
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
            if procfs is not None and case.procfs is not None and phase != "clean":
                procfs_phase(procfs, case.procfs, hostile=phase == "hostile", cpuinfo_bytes=case.cpuinfo_bytes)
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
        if procfs is not None:
            shutil.rmtree(procfs.parent, ignore_errors=True)
    first = [v for p, v in samples if p == "clean"]
    base = statistics.median(first[len(first) // 2 :])
    peak = max(max(v for p, v in samples if p == "hostile"), hwm["hostile"] if hwm["hostile"] > hwm["clean"] else 0)
    rec = [v for p, v in samples if p == "recovered"]
    end_rss = statistics.median(rec[-max(len(rec) // 4, 1) :])
    log_lines = [ln for ln in err.splitlines() if ln.strip()]
    return {
        "case": name,
        "body_bytes": len(hostile),
        "procfs": {"cpuinfo": f"{case.cpuinfo_bytes} bytes", "meminfo": "-> /dev/zero"}.get(case.procfs or ""),
        "settings": extra,
        "baseline_mb": round(base, 1),
        "hostile_peak_mb": round(peak, 1),
        "peak_above_baseline_mb": round(peak - base, 1),
        "recovered_mb": round(end_rss, 1),
        "recovered_above_baseline_mb": round(end_rss - base, 1),
        "meets_target": peak - base <= TARGET_MB and end_rss - base <= RECOVERED_MB,
        "agent_metrics_during": during,
        "agent_metrics_after": after,
        "agent_log_lines": len(log_lines),
        "agent_log_head": log_lines[:4],
    }


def config_case(name: str, tmp: Path) -> dict:
    """The agent started with a hostile (or a small, refused) ``--config``: exit code, seconds, its own peak RSS."""
    path = tmp / f"{name}.yaml"
    if name == "yaml_alias_bomb":
        path.write_text(BOMB)
    elif name == "64MiB_config":
        line = "# " + "x" * 1021 + "\n"  # comments: valid YAML, were it read
        with path.open("w") as f:
            f.write("interval_s: 5\n")
            for _ in range(OVERSIZED_CONFIG_BYTES // len(line)):
                f.write(line)
    else:  # config_rejected_clean: a few bytes, refused for a bad value (the same start and exit path)
        path.write_text("interval_s: -1\n")
    started = time.monotonic()
    proc = subprocess.Popen(
        [sys.executable, "-m", "inferwatch.agent", "run", "--config", str(path)],
        cwd=ROOT,
        env={k: v for k, v in os.environ.items() if not k.startswith(("INFERWATCH_", "OTEL_"))},  # the file alone
        stdout=subprocess.DEVNULL,
        stderr=subprocess.PIPE,
    )
    timer = threading.Timer(120, lambda: os.kill(proc.pid, signal.SIGKILL))
    timer.start()
    assert proc.stderr is not None
    stderr = proc.stderr.read().decode(errors="replace")
    _, status, usage = os.wait4(proc.pid, 0)  # this child's own rusage (RUSAGE_CHILDREN is a max over all)
    timer.cancel()
    proc.returncode = os.waitstatus_to_exitcode(status)
    return {
        "case": name,
        "config_bytes": path.stat().st_size,
        "exit_code": proc.returncode,
        "seconds": round(time.monotonic() - started, 2),
        "peak_rss_mb": round(usage.ru_maxrss * 1024 / MB, 1),
        "stderr_bytes": len(stderr),
        "stderr": stderr.strip()[:300],
    }


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--phase-s", type=float, default=8.0)
    ap.add_argument("--cases", nargs="*", default=[*CONFIG_CASES, *CASES])
    ap.add_argument("--out", type=Path, default=ROOT / "benchmarks" / "results" / "hostile_input.json")
    args = ap.parse_args()
    gen = VllmLike(["m1", "m2"], engines=2, seed=3)
    gen.observe(50)
    clean = gen.text().encode()
    results = []
    with tempfile.TemporaryDirectory(prefix="iw-hostile-config-") as tmp:
        configs = [name for name in CONFIG_CASES if name in args.cases]
        if configs and "config_rejected_clean" not in configs:
            configs.insert(0, "config_rejected_clean")  # the baseline of every config case
        for name in configs:
            results.append(config_case(name, Path(tmp)))
            print(json.dumps(results[-1]))
    base_config = next((r for r in results if r["case"] == "config_rejected_clean"), None)
    for r in results:
        if base_config is not None:
            r["baseline_mb"] = base_config["peak_rss_mb"]
            r["peak_above_baseline_mb"] = round(r["peak_rss_mb"] - base_config["peak_rss_mb"], 1)
            r["meets_target"] = r["exit_code"] == 2 and r["peak_above_baseline_mb"] <= TARGET_MB
    for name in args.cases:
        if name in CASES:
            results.append(run_case(name, CASES[name], clean, args.phase_s))
            print(json.dumps(results[-1]))
    load = os.getloadavg()
    doc = {
        "load_average": [round(x, 2) for x in load],
        "phase_s": args.phase_s,
        "cpus": os.cpu_count(),
        "target": f"peak <= {TARGET_MB:g} MB above the clean baseline, <= {RECOVERED_MB:g} MB above it after recovery",
        "results": results,
    }
    args.out.parent.mkdir(parents=True, exist_ok=True)
    args.out.write_text(json.dumps(doc, indent=2) + "\n")
    print(f"\n{'case':<42} {'base MB':>8} {'peak MB':>8} {'+MB':>6} {'after MB':>9} {'+MB':>6}  target")
    for r in results:
        ok = "yes" if r.get("meets_target") else "NO"
        if "recovered_mb" in r:
            print(
                f"{r['case']:<42} {r['baseline_mb']:>8} {r['hostile_peak_mb']:>8} {r['peak_above_baseline_mb']:>6} "
                f"{r['recovered_mb']:>9} {r['recovered_above_baseline_mb']:>6}  {ok}"
            )
        else:
            print(
                f"{r['case']:<42} {r.get('baseline_mb', '-'):>8} {r['peak_rss_mb']:>8} "
                f"{r.get('peak_above_baseline_mb', '-'):>6} {'(exit ' + str(r['exit_code']) + ')':>9} "
                f"{str(r['seconds']) + 's':>6}  {ok}"
            )
    print(f"load average {load[0]:.1f} {load[1]:.1f} {load[2]:.1f} on {os.cpu_count()} CPUs")


if __name__ == "__main__":
    main()
