"""/metrics and the API while an engine of hundreds of models is read: latency, GC pauses, memory, per build.

Run from the repository root: ``python benchmarks/scrape_latency.py [--models 200] [--seconds 90]
[--tree DIR ...] [--rounds 2] [--page-every 5] [--out FILE]``.

The engine is engine_scale.py's live vLLM exposition (``--models`` x 2 data-parallel ranks, every read the next
version: an engine under steady traffic), served by a child process: making each version is a busy Python thread,
which in the scraping process would hold up the scrapers' own reads of the answers (their waits for the interpreter
counted as the agent's latency). For each ``--tree`` (a checkout of some build; default this one, and a
``git worktree`` of an earlier build is the baseline) an agent runs as a process with that tree first on its path
(its ``inferwatch/`` links resolve to that build), the engine collector raised to hold the exposition
(``max_models``, ``max_series``, ``max_bytes``, a 30 s timeout). Once it has read the engine twice, ``/metrics`` is
scraped once a second, ``/api/v1/status`` five times a second and the status page (``/``) every ``--page-every``
seconds, for ``--seconds``, each by a client process of its own; the agent's own garbage collections over 5 ms are
logged by a ``gc.callbacks`` hook loaded through ``sitecustomize``. Trees run in turn, ``--rounds`` times, so a load
change hits each. Reported per run: scrape, API and page medians, p99 and max, the exposition's size, engine reads, the
agent's CPU over the window (user + system, a share of one core: its work, which the machine's load changes less than it
changes the latencies), GC pauses by generation (count, total, over 50 ms; from the agent's start), VmRSS/VmHWM at the
end and the load average.
"""

from __future__ import annotations

import argparse
import json
import multiprocessing
import os
import platform
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

import httpx  # noqa: E402

from benchmarks.engine_scale import LiveExposition, exposition, free_port  # noqa: E402

GC_HOOK = """
import gc, os, time
_t = {}
_f = open(os.path.join(os.environ["SCRAPE_LATENCY_GC_DIR"], f"gc-{os.getpid()}.log"), "w", buffering=1)
def _cb(phase, info):
    if phase == "start":
        _t["s"] = time.perf_counter()
    else:
        d = time.perf_counter() - _t.get("s", time.perf_counter())
        if d > 0.005:
            _f.write(f"{info['generation']} {d * 1000:.1f} {info['collected']}\\n")
gc.callbacks.append(_cb)
"""


class EngineProcess:
    """:class:`LiveExposition` in a child process: its URL, and how many times it was read so far (:attr:`reads`)."""

    def __init__(self, models: int) -> None:
        ctx = multiprocessing.get_context("fork")
        self._conn, child = ctx.Pipe()
        self._proc = ctx.Process(target=self._serve, args=(models, child), daemon=True)
        self._proc.start()
        self.url = self._conn.recv()

    @staticmethod
    def _serve(models: int, conn: Any) -> None:
        _, gen = exposition(models)
        live = LiveExposition(gen)
        conn.send(live.url)
        while conn.recv() == "reads":
            conn.send(live.reads)
        live.close()

    @property
    def reads(self) -> int:
        self._conn.send("reads")
        return int(self._conn.recv())

    def close(self) -> None:
        self._conn.send("stop")
        self._proc.join(15)


def cpu_s(pid: int) -> float:
    """A process's user + system CPU seconds so far (/proc/PID/stat)."""
    fields = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()
    return (int(fields[11]) + int(fields[12])) / os.sysconf("SC_CLK_TCK")


def summary(values: list[float]) -> dict[str, float]:
    ms = 1000.0
    if not values:
        return {"n": 0}
    return {"n": len(values), "median": round(statistics.median(values) * ms, 1),
            "p90": round(quantile(values, 0.90) * ms, 1), "p99": round(quantile(values, 0.99) * ms, 1),
            "max": round(max(values) * ms, 1)}  # fmt: skip


def quantile(values: list[float], q: float) -> float:
    ordered = sorted(values)
    return ordered[min(len(ordered) - 1, int(q * len(ordered)))]


def _poll(url: str, wait_before: float, wait_after: float, seconds: float, conn: Any) -> None:
    """GET ``url`` in turn for ``seconds`` (waiting ``wait_before`` before and ``wait_after`` after each); sends the
    latencies and the last answer's size back through ``conn``."""
    times: list[float] = []
    size = 0
    end = time.monotonic() + seconds
    with httpx.Client(timeout=60) as c:
        while True:
            if wait_before:
                time.sleep(wait_before)
            if time.monotonic() >= end:
                break
            t = time.perf_counter()
            r = c.get(url)
            r.raise_for_status()
            times.append(time.perf_counter() - t)
            size = len(r.content)
            if wait_after:
                time.sleep(wait_after)
    conn.send((times, size))


def run_one(
    tree: Path, url: str, models: int, seconds: float, live: EngineProcess, page_every: float
) -> dict[str, Any]:
    hook = Path(tempfile.mkdtemp(prefix="scrape-latency-"))
    (hook / "sitecustomize.py").write_text(GC_HOOK)
    config = hook / "agent.json"
    config.write_text(
        json.dumps(
            {
                "engine": {
                    "metrics_url": url,
                    "kind": "vllm",
                    "max_models": models * 2 + 10,
                    "max_series": 400_000,
                    "max_bytes": 64 << 20,
                    "timeout_s": 30,
                },
                "collectors": {"engine": {"timeout_s": 35}},
            }
        )
    )
    port = free_port()
    env = dict(os.environ, PYTHONPATH=f"{tree}:{hook}", SCRAPE_LATENCY_GC_DIR=str(hook))
    env.pop("INFERWATCH_CONFIG", None)
    cmd = [sys.executable, "-m", "inferwatch.agent", "run", "--port", str(port), "-c", str(config)]
    proc = subprocess.Popen([*cmd, "--no-collector.gpu"], env=env, cwd=str(hook), stdout=subprocess.DEVNULL)
    base = f"http://127.0.0.1:{port}"
    scrapes: list[float] = []
    api: list[float] = []
    page: list[float] = []
    size = 0
    try:
        with httpx.Client(timeout=60) as client:
            deadline = time.monotonic() + 180
            while time.monotonic() < deadline:
                try:
                    status = client.get(base + "/api/v1/status").json()
                    engine = next(c for c in status["collectors"] if c["name"] == "engine")
                    if engine["runs"] - engine["errors"] >= 2:
                        break
                except (httpx.HTTPError, StopIteration, ValueError):
                    pass
                time.sleep(1)
            else:
                raise SystemExit(f"{tree}: the agent did not read the engine twice in 180 s")
            reads0 = live.reads
            cpu0, window0 = cpu_s(proc.pid), time.monotonic()
            # Each poller is a process of its own: as threads of one process, the /metrics reader's Python work on
            # each 5.7 MB answer held up the page's and the API's own reads of theirs (their waits for this process's
            # interpreter counted as the agent's latency).
            ctx = multiprocessing.get_context("fork")
            pollers = []
            for path, wait_before, wait_after in (("/metrics", 0.0, 1.0), ("/api/v1/status", 0.0, 0.2)) + (
                (("/", page_every, 0.0),) if page_every > 0 else ()
            ):
                here, there = ctx.Pipe()
                proc_p = ctx.Process(target=_poll, args=(base + path, wait_before, wait_after, seconds, there))
                proc_p.start()
                pollers.append((path, proc_p, here))
            got: dict[str, tuple[list[float], int]] = {}
            for path, proc_p, here in pollers:
                got[path] = here.recv()
                proc_p.join(30)
            scrapes, size = got["/metrics"]
            api = got["/api/v1/status"][0]
            page = got["/"][0] if "/" in got else []
            reads = live.reads - reads0
            cpu = (cpu_s(proc.pid) - cpu0) / (time.monotonic() - window0)
        status_lines = Path(f"/proc/{proc.pid}/status").read_text().splitlines()
        mem = {ln.split(":")[0]: int(ln.split()[1]) for ln in status_lines if ln.startswith(("VmRSS", "VmHWM"))}
    finally:
        proc.terminate()
        proc.wait(15)
    pauses: dict[str, dict[str, float]] = {}
    for log in hook.glob("gc-*.log"):
        for line in log.read_text().splitlines():
            gen, took, _ = line.split()
            p = pauses.setdefault(f"gen{gen}", {"count": 0, "total_ms": 0.0, "over_50ms": 0})
            p["count"] += 1
            p["total_ms"] = round(p["total_ms"] + float(took), 1)
            p["over_50ms"] += float(took) > 50
    return {
        "tree": str(tree),
        "build": subprocess.run(["git", "-C", str(tree), "rev-parse", "--short", "HEAD"], capture_output=True,
                                text=True).stdout.strip(),
        "metrics_ms": summary(scrapes),
        "status_ms": summary(api),
        "page_ms": summary(page),
        "exposition_bytes": size,
        "engine_reads": reads,
        "agent_cpu_share": round(cpu, 3),  # of one core over the window: the agent's work, whatever the load
        "gc_pauses": pauses,
        "vmrss_mb": round(mem["VmRSS"] / 1024, 1),
        "vmhwm_mb": round(mem["VmHWM"] / 1024, 1),
        "load_average": [round(x, 2) for x in os.getloadavg()],
    }  # fmt: skip


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--models", type=int, default=200)
    ap.add_argument("--seconds", type=float, default=90.0)
    ap.add_argument("--tree", action="append", type=Path, help="a checkout to run (repeatable; default: this one)")
    ap.add_argument("--rounds", type=int, default=1)
    ap.add_argument("--page-every", type=float, default=5.0, help="seconds between status page requests; 0: none")
    ap.add_argument("--out", type=Path)
    args = ap.parse_args()
    trees = [t.resolve() for t in (args.tree or [ROOT])]
    live = EngineProcess(args.models)
    runs = []
    try:
        for r in range(args.rounds):
            for tree in trees:
                result = run_one(tree, live.url, args.models, args.seconds, live, args.page_every) | {"round": r + 1}
                print(json.dumps(result), flush=True)
                runs.append(result)
    finally:
        live.close()
    record = {
        "benchmark": "scrape_latency",
        "date": time.strftime("%Y-%m-%d %H:%M UTC", time.gmtime()),
        "machine": f"{platform.machine()}, {os.cpu_count()} CPUs, Python {platform.python_version()}",
        "models": args.models,
        "ranks": 2,
        "seconds": args.seconds,
        "page_every_s": args.page_every,
        "engine": "a child process (EngineProcess)",
        "runs": runs,
    }
    if args.out:
        args.out.write_text(json.dumps(record, indent=1) + "\n")


if __name__ == "__main__":
    main()
