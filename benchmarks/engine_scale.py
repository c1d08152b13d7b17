"""Ten times today's size: a vLLM exposition of 200 models x 2 data-parallel ranks with every family the agent reads.

Run from the repository root: ``python benchmarks/engine_scale.py [--models 200] [--repeat 7] [--out FILE]``.

The exposition is built with prometheus_client (as vLLM builds its own): the latency, token and request families
of tests/engine_expo.py plus the issue-18 signal families with vLLM's names, labels and buckets (prefix cache,
external prefix cache, cached prompt tokens, prompt tokens by source, speculative decoding with acceptance per
position, the NIXL connector's transfer time, bytes and failures, requests waiting by reason, LoRA info). Then:

1. **identical values**: every sample of every family the vLLM adapter reads, as inferwatch's reader returns it,
   equals prometheus_client's parser's (names, labels, values), and so does every per-model figure derived;
2. **ingest**: interleaved rounds of prometheus_client's ``text_string_to_metric_families`` (consumed to the end)
   against the reader + vLLM adapter, cold (new reader) and warm (the collector's case); medians, ratio;
3. **the agent as a process** (``python -m inferwatch.agent run``, a 5 s interval) reading that exposition from a local
HTTP
   server with ``engine.max_models`` and ``engine.max_series`` raised to hold it. The engine is under steady
   traffic: every read gets the next version of the exposition (more requests finished), made while the agent
   waits. ``/metrics`` is scraped every 15 s, as Prometheus does in production; the engine collections are
   counted from ``/api/v1/status`` each second. Its RSS (VmRSS, and the peak VmHWM, from /proc) after
   ``--early`` collections and after ``--collections`` (the default 80: past 5 minutes, every window and ring
   holds all it will hold), its own ``/metrics`` series in total and per model, and the self-metric
   ``inferwatch_agent_series`` against the count of lines in the same scrape.

   ``--live``: also the engine collector's memory in this process (tracemalloc): what it holds by source file, and
   each run's peak over it, full reads and progress passes.

   ``--runtime-venv DIR``: the agent runs from a virtual environment holding only its runtime dependencies, as the
   image installs them (``requirements.lock``, then this checkout's wheel, bytecode compiled by pip), from a
   folder outside the checkout. The development venv also holds the test dependencies, and some of them change
   the agent: selenium brings trio, which httpcore imports when the agent makes its HTTP client (~5 MB).
"""

from __future__ import annotations

import argparse
import gc
import http.server
import json
import os
import re
import socket
import statistics
import subprocess
import sys
import tempfile
import threading
import time
import tracemalloc
import urllib.parse
from collections import Counter as Tally
from collections.abc import Callable
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

import httpx  # noqa: E402
from prometheus_client import Counter, Gauge, Histogram, generate_latest  # noqa: E402
from prometheus_client.parser import text_string_to_metric_families  # noqa: E402

from benchmarks.exposition_ingest import check_identical  # noqa: E402
from inferwatch.agent.node.engine.adapters import VLLM, KeyCache, read  # noqa: E402
from inferwatch.agent.node.engine.limits import EngineLimits  # noqa: E402
from tests.engine_expo import VllmLike  # noqa: E402

NIXL_TIME_BUCKETS = (0.005, 0.01, 0.025, 0.05, 0.075, 0.1, 0.2, 0.3, 0.5, 0.75, 1.0, 5.0)  # NixlPromMetrics
NIXL_BYTES_BUCKETS = (1e6, 1e7, 1e8, 1e9)
SOURCES = ("local_compute", "local_cache_hit", "external_kv_transfer")
WAIT_REASONS = ("capacity", "deferred")
POSITIONS = ("0", "1", "2")  # --num-speculative-tokens 3


class SignalsVllmLike(VllmLike):
    """tests/engine_expo.py's vLLM plus the engine-signal families of vLLM v1 (engines.md §1.2-1.4, NIXL)."""

    def restart(self) -> None:
        super().restart()
        r, ln = self.registry, ["model_name", "engine"]
        c = {
            n: Counter(f"vllm:{n}", n, ln, registry=r)
            for n in (
                "prompt_tokens_cached",
                "prefix_cache_queries",
                "prefix_cache_hits",
                "external_prefix_cache_queries",
                "external_prefix_cache_hits",
                "spec_decode_num_drafts",
                "spec_decode_num_draft_tokens",
                "spec_decode_num_accepted_tokens",
                "nixl_num_failed_transfers",
            )
        }
        self.signal_counters = c
        self.by_source = Counter("vllm:prompt_tokens_by_source", "By source.", [*ln, "source"], registry=r)
        self.per_pos = Counter(
            "vllm:spec_decode_num_accepted_tokens_per_pos", "Per pos.", [*ln, "position"], registry=r
        )
        self.waiting_by_reason = Gauge("vllm:num_requests_waiting_by_reason", "Waiting.", [*ln, "reason"], registry=r)
        self.xfer = Histogram("vllm:nixl_xfer_time_seconds", "Xfer.", ln, buckets=NIXL_TIME_BUCKETS, registry=r)
        self.xfer_bytes = Histogram("vllm:nixl_bytes_transferred", "Bytes.", ln, buckets=NIXL_BYTES_BUCKETS, registry=r)
        self.lora = Gauge(
            "vllm:lora_requests_info",
            "LoRA.",
            ["max_lora", "running_lora_adapters", "waiting_lora_adapters"],
            registry=r,
        )

    def observe(self, requests: int, model: str | None = None, engine: str | None = None, slow: float = 1.0) -> None:
        super().observe(requests, model, engine, slow)
        rng = self.rng
        for m in [model] if model else self.models:
            for e in [engine] if engine else self.engines:
                for counter in self.signal_counters.values():
                    counter.labels(m, e).inc(rng.randint(0, 10_000))
                for s in SOURCES:
                    self.by_source.labels(m, e, s).inc(rng.randint(0, 10_000))
                for p in POSITIONS:
                    self.per_pos.labels(m, e, p).inc(rng.randint(0, 1000))
                for reason in WAIT_REASONS:
                    self.waiting_by_reason.labels(m, e, reason).set(rng.randint(0, 4))
                for _ in range(requests):
                    self.xfer.labels(m, e).observe(rng.lognormvariate(-3.5, 0.8))
                    self.xfer_bytes.labels(m, e).observe(rng.uniform(1e5, 2e9))
        self.lora.labels("4", "adapter-000,adapter-001", "adapter-002").set(time.time())


def exposition(models: int, seed: int = 1) -> tuple[str, SignalsVllmLike]:
    gen = SignalsVllmLike([f"org/model-{i:03d}" for i in range(models)], engines=2, seed=seed)
    gen.observe(3)
    return gen.text(), gen


def limits(series: int, models: int) -> EngineLimits:
    return EngineLimits(max_series=series * 2, max_models=models * 2)


def timed(fn: Callable[[], object]) -> float:
    gc.collect()
    t0 = time.perf_counter()
    result = fn()
    elapsed = time.perf_counter() - t0
    del result
    return elapsed


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


def restricted_text(body: bytes, names: set[str]) -> bytes:
    """What prometheus_client's exposition app (vLLM's ``/metrics``) answers a ``name[]=`` query with, from the whole
    text: the samples of those names, each family's HELP and TYPE lines before its first (``restricted_registry``;
    tests/test_engine_progress.py holds it to prometheus_client's own answer)."""
    out: list[bytes] = []
    head: list[bytes] = []
    for line in body.split(b"\n"):
        if line.startswith(b"#"):
            head = [line] if line.startswith(b"# HELP") else [*head, line]
            continue
        if line and line.split(b"{", 1)[0].split(b" ", 1)[0].decode() in names:
            out.extend(head)
            head = []
            out.append(line)
    return b"\n".join(out) + b"\n" if out else b""


def serve_metrics(
    next_body: Callable[[], bytes], restricted: Callable[[set[str]], bytes] | None = None
) -> tuple[http.server.ThreadingHTTPServer, str]:
    """An engine's /metrics on 127.0.0.1: each GET answers ``next_body()``, a GET with ``name[]=`` in its query
    ``restricted(names)`` as vLLM's prometheus_client app does (default: :func:`restricted_text` of the next body);
    the server and its URL."""

    def answer(names: set[str]) -> bytes:
        return restricted(names) if restricted is not None else restricted_text(next_body(), names)

    class Handler(http.server.BaseHTTPRequestHandler):
        protocol_version = "HTTP/1.1"  # keep-alive, as engines serve (uvicorn): a read is not a new connection

        def do_GET(self) -> None:
            parts = urllib.parse.urlsplit(self.path)
            if parts.path != "/metrics":  # the agent also asks /v1/models and /health: none here
                self.send_error(404)
                return
            names = urllib.parse.parse_qs(parts.query).get("name[]")
            body = answer(set(names)) if names else next_body()
            self.send_response(200)
            self.send_header("Content-Type", "text/plain; version=0.0.4; charset=utf-8")
            self.send_header("Content-Length", str(len(body)))
            self.end_headers()
            self.wfile.write(body)

        def log_message(self, *args: object) -> None:
            pass

    server = http.server.ThreadingHTTPServer(("127.0.0.1", 0), Handler)
    threading.Thread(target=server.serve_forever, daemon=True).start()
    return server, f"http://127.0.0.1:{server.server_address[1]}/metrics"


def serve(bodies: list[bytes]) -> tuple[http.server.ThreadingHTTPServer, str]:
    """Serve ``bodies`` in turn at /metrics (the engine under traffic: counters grow), then the last one."""
    served = [0]
    lock = threading.Lock()

    def next_body() -> bytes:
        with lock:
            body = bodies[min(served[0], len(bodies) - 1)]
            served[0] += 1
        return body

    return serve_metrics(next_body)


class LiveExposition:
    """An engine under steady traffic at /metrics: each read gets the next version of the exposition (``gen`` with
    ``requests`` more finished per model and rank), made in a thread while the agent waits for its next read."""

    def __init__(self, gen: SignalsVllmLike, requests: int = 3) -> None:
        self.gen, self.requests = gen, requests
        self.body = gen.text().encode()
        self.reads = 0
        self._served = threading.Event()
        self._stop = threading.Event()
        threading.Thread(target=self._produce, daemon=True).start()
        self.server, self.url = serve_metrics(self._next_body, self._restricted)

    def _next_body(self) -> bytes:
        body = self.body
        self.reads += 1
        self._served.set()
        return body

    def _restricted(self, names: set[str]) -> bytes:
        """The answer to a ``name[]=`` query: prometheus_client's own, from the registry as it is now."""
        self.reads += 1
        self._served.set()
        return generate_latest(self.gen.registry.restricted_registry(names))

    def _produce(self) -> None:
        while not self._stop.is_set():
            if not self._served.wait(0.5):
                continue
            self._served.clear()
            self.gen.observe(self.requests)
            self.body = self.gen.text().encode()

    def close(self) -> None:
        self._stop.set()
        self.server.shutdown()


def status_kib(pid: int, field: str) -> int:
    for line in Path(f"/proc/{pid}/status").read_text().splitlines():
        if line.startswith(field + ":"):
            return int(line.split()[1])
    raise KeyError(field)


def engine_collections(base: str) -> int:
    """The engine collector's successful runs so far, as the agent's status API says."""
    status = httpx.get(f"{base}/api/v1/status", timeout=60).json()
    engine = next(c for c in status["collectors"] if c["name"] == "engine")
    return int(engine["runs"] - engine["errors"])


def agent_run(
    url: str,
    series: int,
    models: int,
    collections: int,
    early: int = 6,
    pycache: Path | None = None,
    python: Path | None = None,
    scrape_s: float = 15.0,
) -> dict[str, object]:
    """Start the agent on ``url``; count its engine collections each second and scrape its /metrics every
    ``scrape_s`` until ``collections`` have succeeded: its RSS after ``early`` and after ``collections``, and its own
    series.

    ``python``: the interpreter of a runtime-only venv (see ``--runtime-venv``), run from outside the checkout so it
    imports the installed package. ``pycache``: the agent imports its modules' bytecode from there
    (``PYTHONPYCACHEPREFIX``, writing what is missing), as the image's agent imports the bytecode pip compiled at
    install; else as the environment says (with ``PYTHONDONTWRITEBYTECODE=1`` and no bytecode installed, every start
    compiles its imports from source, which leaves the compiler's memory in the process: ~4 MB at 50 models)."""
    port = free_port()
    env = {k: v for k, v in os.environ.items() if pycache is None or k != "PYTHONDONTWRITEBYTECODE"}
    if pycache is not None:
        env["PYTHONPYCACHEPREFIX"] = str(pycache)
    env = {
        **env,
        "INFERWATCH_ENGINE__METRICS_URL": url,
        "INFERWATCH_ENGINE__KIND": "vllm",
        "INFERWATCH_ENGINE__MAX_MODELS": str(models * 2),
        "INFERWATCH_ENGINE__MAX_SERIES": str(series * 2),
        "INFERWATCH_ENGINE__MAX_BYTES": str(256 << 20),
        "INFERWATCH_ENGINE__TIMEOUT_S": "30",
        "INFERWATCH_COLLECTORS__ENGINE__TIMEOUT_S": "30",
        "INFERWATCH_SERIES_BUDGET": str(10_000_000),
        "INFERWATCH_LOG_LEVEL": "warning",
    }
    cmd = [str(python or sys.executable), "-m", "inferwatch.agent", "run", "--port", str(port), "--interval", "5"]
    cwd = Path(tempfile.gettempdir()) if python is not None else ROOT
    proc = subprocess.Popen(cmd, cwd=cwd, env=env, stdout=subprocess.DEVNULL, stderr=subprocess.PIPE)
    try:
        base = f"http://127.0.0.1:{port}"
        deadline = time.monotonic() + 120
        while time.monotonic() < deadline:
            try:
                if httpx.get(f"{base}/readyz", timeout=5).status_code == 200:
                    break
            except httpx.HTTPError:
                pass
            if proc.poll() is not None:
                raise RuntimeError(f"agent exited: {proc.stderr.read().decode() if proc.stderr else ''}")
            time.sleep(0.5)
        text, scrape_ms, rss = "", [], {}
        done, next_scrape = 0, 0.0
        deadline = time.monotonic() + 60 * collections
        while done < collections and time.monotonic() < deadline:
            if time.monotonic() >= next_scrape:
                t0 = time.perf_counter()
                text = httpx.get(f"{base}/metrics", timeout=120).text
                scrape_ms.append((time.perf_counter() - t0) * 1e3)
                next_scrape = time.monotonic() + scrape_s
            n = engine_collections(base)
            if n != done and n not in rss:
                rss[n] = round(status_kib(proc.pid, "VmRSS") / 1024, 1)
            done = n
            time.sleep(1.0)
        if done < collections:
            raise RuntimeError(f"only {done} of {collections} engine collections in {60 * collections} s")
        at_early = rss.get(early, rss[min(rss, key=lambda k: abs(k - early))])
        text = httpx.get(f"{base}/metrics", timeout=120).text
        lines = [ln for ln in text.splitlines() if ln and not ln.startswith("#")]
        per_model: Tally[str] = Tally()
        for ln in lines:
            m = re.search(r'gen_ai_request_model="([^"]*)"', ln)
            if m:
                per_model[m.group(1)] += 1
        models_by_count = Tally(per_model.values())
        own = next(float(ln.split()[-1]) for ln in lines if ln.startswith("inferwatch_agent_series "))
        late = [v for k, v in sorted(rss.items()) if k > collections - 10]
        return {
            "rss_mib": round(status_kib(proc.pid, "VmRSS") / 1024, 1),
            "peak_rss_mib": round(status_kib(proc.pid, "VmHWM") / 1024, 1),
            f"rss_mib_after_{early}": at_early,
            "rss_mib_last_10_collections": [min(late), max(late)],
            "rss_mib_by_collection": rss,
            "engine_collections": done,
            "scrapes": len(scrape_ms),
            "scrape_median_ms": round(statistics.median(scrape_ms), 1),
            "series": len(lines),
            "self_metric_series": own,
            "models_seen": len(per_model),
            "series_per_model": {str(n): k for n, k in sorted(models_by_count.items())},
            "models_with_few_series": sorted(m for m, n in per_model.items() if n < max(per_model.values())),
            "series_not_per_model": len(lines) - sum(per_model.values()),
        }
    finally:
        proc.terminate()
        try:
            proc.wait(10)
        except subprocess.TimeoutExpired:
            proc.kill()
            proc.wait()


def runtime_venv(folder: Path) -> Path:
    """A venv with the agent's runtime dependencies only, as the image installs them (``requirements.lock`` with
    its hashes, then this checkout's wheel, no dependency resolution); made if missing, the package reinstalled from
    this checkout each time. Returns its interpreter."""
    python = folder / "bin" / "python"
    pip = [str(python), "-m", "pip", "install", "--quiet", "--disable-pip-version-check", "--no-deps"]
    if not python.exists():
        subprocess.run([sys.executable, "-m", "venv", str(folder)], check=True)
        subprocess.run([*pip, "--require-hashes", "-r", str(ROOT / "requirements.lock")], check=True)
    subprocess.run([*pip, "--force-reinstall", str(ROOT)], check=True, cwd=tempfile.gettempdir())
    subprocess.run([str(python), "-m", "pip", "check"], check=True, stdout=subprocess.DEVNULL)
    return python


def live_breakdown(bodies: list[bytes], series: int, models: int, collections: int) -> dict[str, Any]:
    """The engine collector in this process (as the agent runs it: a full read every 5 s, progress passes 2 s apart
    between, on a clock of its own) over ``bodies`` served in turn: the memory its objects hold between collections
    (tracemalloc, after ``collections`` of them), MB by source file, and each run's peak over what was held before it
    (``peak_mb``: by the read it made, full or progress)."""
    from inferwatch.agent.config import Settings
    from inferwatch.agent.node.collectors.engine import EngineCollector
    from inferwatch.agent.node.wiring import collect_context

    server, url = serve(bodies)
    engine: dict[str, Any] = {"metrics_url": url, "kind": "vllm", "max_models": models * 2, "max_series": series * 2}
    settings = Settings.from_values({"engine": {**engine, "max_bytes": 256 << 20, "timeout_s": 120}})
    try:
        now = [1000.0]
        collector = EngineCollector(collect_context(settings), settings.engine, 5.0, lambda: now[0])
        peaks: dict[str, list[float]] = {}
        tracemalloc.start()
        for _ in range(collections):
            held = tracemalloc.get_traced_memory()[0]
            tracemalloc.reset_peak()
            kind = collector.collect().details["read"]["kind"]
            peak = tracemalloc.get_traced_memory()[1] - held
            peaks.setdefault(kind, []).append(round(peak / 1e6, 2))
            now[0] += 2.0
            gc.collect()
        snap = tracemalloc.take_snapshot()
        tracemalloc.stop()
    finally:
        server.shutdown()
    by_file = Tally[str]()
    for stat in snap.statistics("filename"):
        name = stat.traceback[0].filename
        if name.startswith((str(ROOT / "agent"), str(ROOT / "inferwatch"))):  # the tree, or its import layout
            by_file[str(Path(name).relative_to(ROOT))] += stat.size
    del collector
    return {name: round(size / 1e6, 2) for name, size in by_file.most_common() if size >= 50_000} | {"peak_mb": peaks}


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--models", type=int, default=200)
    ap.add_argument("--repeat", type=int, default=7)
    ap.add_argument(
        "--collections",
        type=int,
        default=80,
        help="engine collections of each agent (80: past its 5 m windows and rings)",
    )
    ap.add_argument("--early", type=int, default=6, help="also the RSS after this many collections")
    ap.add_argument("--scrape-s", type=float, default=15.0, help="the agent's /metrics is scraped this often")
    ap.add_argument("--versions", type=int, default=4, help="--live: exposition versions served in turn")
    ap.add_argument("--baseline-models", type=int, default=20, help="the same-run baseline: today's size (0: none)")
    ap.add_argument("--out", type=Path, help="write the figures as JSON")
    ap.add_argument(
        "--live", action="store_true", help="also the collector's live memory by source file (tracemalloc, slow)"
    )
    ap.add_argument(
        "--pycache",
        type=Path,
        help="the agents import bytecode cached in this folder (PYTHONPYCACHEPREFIX), as the image's agent does",
    )
    ap.add_argument(
        "--runtime-venv",
        type=Path,
        help="run the agents from a venv in this folder with only the runtime dependencies, as the image (made if "
        "missing; the package reinstalled from this checkout)",
    )
    args = ap.parse_args()
    python = runtime_venv(args.runtime_venv.resolve()) if args.runtime_venv else None
    load_before = os.getloadavg()

    text, gen = exposition(args.models)
    samples = [ln for ln in text.splitlines() if ln and not ln.startswith("#")]
    families = {ln.split()[2] for ln in text.splitlines() if ln.startswith("# TYPE ")}
    lim = limits(len(samples), args.models)
    matched, read_families = check_identical(text, lim)
    print(
        f"exposition: {len(samples)} series, {len(text) / 1e6:.1f} MB, {len(families)} families, "
        f"{args.models} models x {len(gen.engines)} DP ranks"
    )
    print(f"read by the vLLM adapter: {read_families} families, {matched} samples, identical to prometheus_client's")

    warm = VLLM.reader(lim)
    warm_keys = KeyCache(VLLM.model_labels, "unknown")
    read(VLLM, warm.read(text), keys=warm_keys)

    def cold() -> object:
        reader = VLLM.reader(lim)
        return reader, read(VLLM, reader.read(text))

    cases: list[tuple[str, Callable[[], object]]] = [
        ("prometheus_client text_string_to_metric_families", lambda: list(text_string_to_metric_families(text))),
        ("inferwatch reader + vLLM adapter, cold", cold),
        ("inferwatch reader + vLLM adapter, warm", lambda: read(VLLM, warm.read(text), keys=warm_keys)),
    ]
    runs: dict[str, list[float]] = {name: [] for name, _ in cases}
    for _ in range(args.repeat):  # interleaved: a noisy neighbour slows every case alike
        for name, fn in cases:
            runs[name].append(timed(fn))
    base = statistics.median(runs[cases[0][0]])
    figures = []
    print(f"\n{'case':<52} {'median ms':>10} {'best ms':>9} {'x (median)':>11}")
    for name, _ in cases:
        med = statistics.median(runs[name])
        figures.append({"case": name, "median_ms": round(med * 1e3, 1), "best_ms": round(min(runs[name]) * 1e3, 1)})
        figures[-1]["speedup_median"] = round(base / med, 2)
        print(f"{name:<52} {med * 1e3:>10.1f} {min(runs[name]) * 1e3:>9.1f} {base / med:>10.2f}x")
    cases.clear()  # the readers' memory is not the agent's: let it go before the agent runs
    gc.collect()

    agents = {}
    live: dict[str, Any] = {}
    for label, n in (("baseline", args.baseline_models), ("scale", args.models)):
        if n <= 0:  # --baseline-models 0: the scale agent only
            continue
        small, g = (text, gen) if n == args.models else exposition(n)
        n_series = len([ln for ln in small.splitlines() if ln and not ln.startswith("#")])
        if args.live and label == "scale":
            bodies = [small.encode()]
            for _ in range(args.versions - 1):  # versions with more requests finished, one per read
                g.observe(3)
                bodies.append(g.text().encode())
            live = live_breakdown(bodies, n_series, n, args.early)
            del bodies
            print(f"\nthe engine collector's live memory after {args.early} collections (MB by file):")
            print(json.dumps(live))
        engine = LiveExposition(g)
        try:
            agents[label] = {
                "models": n,
                "exposition_series": n_series,
                **agent_run(engine.url, n_series, n, args.collections, args.early, args.pycache, python, args.scrape_s),
                "exposition_versions_read": engine.reads,
            }
        finally:
            engine.close()
        del small, g, engine
        gc.collect()
        print(f"\nagent process, {label} ({n} models, {n_series} series), {args.collections} engine collections:")
        print(json.dumps(agents[label]))
    load_after = os.getloadavg()
    print(f"load average before {load_before[0]:.1f}, after {load_after[0]:.1f} on {os.cpu_count()} CPUs")
    if args.out:
        doc = {
            "models": args.models,
            "ranks": len(gen.engines),
            "series": len(samples),
            "bytes": len(text),
            "families": len(families),
            "adapter_families": read_families,
            "adapter_samples_identical": matched,
            "repeat": args.repeat,
            "ingest": figures,
            "agent": agents,
            "collector_live_mb_by_file": live if args.live else None,
            "collections": args.collections,
            "early": args.early,
            "scrape_s": args.scrape_s,
            "agent_install": "runtime-only venv (requirements.lock + this checkout's wheel), as the image"
            if args.runtime_venv
            else "this checkout, in the interpreter running the benchmark",
            "agent_bytecode": f"cached in {args.pycache}"
            if args.pycache
            else "compiled by pip at install"
            if args.runtime_venv
            else "as the environment says",
            "agent_dont_write_bytecode": os.environ.get("PYTHONDONTWRITEBYTECODE") if not args.pycache else None,
            "load_average_before": [round(x, 2) for x in load_before],
            "load_average_after": [round(x, 2) for x in load_after],
            "cpus": os.cpu_count(),
            "python": sys.version.split()[0],
        }
        args.out.parent.mkdir(parents=True, exist_ok=True)
        args.out.write_text(json.dumps(doc, indent=2) + "\n")


if __name__ == "__main__":
    main()
