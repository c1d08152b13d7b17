"""What the agent costs with everything on, and how that cost grows: beside node_exporter in the same run.

Every agent runs as a user's install runs it: from a runtime-only venv (``requirements.lock`` + this checkout's
wheel, bytecode compiled by pip; ``engine_scale.runtime_venv``), started from a folder outside the checkout, at
its default interval (5 s), with a runtime to watch (a sleeping child, as benchmarks/agent_overhead.py). Each case
runs Debian's ``prometheus-node-exporter`` beside the agent; both are scraped once per interval for ``--window``
seconds, the first scrape alternating, and each /metrics is then scraped ``--scrapes`` times back to back.
Reported per case: CPU (user+system of the process, psutil) as % of one core and per cycle for both exporters,
the agent's VmRSS and VmHWM (/proc), the scrape time of its /metrics within the window (each scrape meets the
collections due, as Prometheus's does) and back to back, its own series, and the 1-minute load average at the
start and end of the case (the machine is shared: CPU time, not wall time, is the figure).

Cases:

1. **defaults**: the agent's default collectors, nothing configured (the ≤ 50 MB target);
2. **everything on** at 10 models and 100 req/s: the engine collector reading a live 10-model × 2-rank vLLM
   exposition (``engine_scale.LiveExposition``: every read the next version, so hang detection, on with the
   engine, sees progress), the streaming probe against the project's simulator (an OpenAI-compatible server:
   ``python -m inferwatch.agent simulate``), the span receiver fed one ``llm_request`` span per request over
   OTLP/HTTP in one batch per second (payloads of benchmarks/span_intake.py, times set to now), OTLP metric
   export (``http/protobuf``, the SDK's default 15 s period) to a local receiver that decodes each POST
   /v1/metrics as ``ExportMetricsServiceRequest`` with opentelemetry-proto and counts its data points, and one
   status-page viewer (``GET /?refresh=10`` every 10 s). Targets: CPU per cycle ≤ 0.5× node_exporter's, VmRSS
   ≤ 60 MB;
3. **axes**, one varied at a time from the defaults: engine models (``--models``, 1, 10, 50, 200, each × 2 DP
   ranks as ``engine_scale.exposition`` builds them; above 32 models the engine limits (and a baseline build's
   timeouts) raised as engine_scale.py raises them, as a user must), span rate (``--rates``, 10, 100, 1000 req/s,
   receiver on, no engine) and engines per agent (``--engines``, 1, 4, 16 idle simulators as ``file_sd`` targets,
   as benchmarks/engine_targets.py). Per axis a least-squares slope of CPU, RSS and scrape time.

    .venv/bin/python benchmarks/cost_profile.py [--window 60] [--venv build/cost-venv] [--out FILE]
        [--cases defaults,all,models,span_rate,engines] [--models 1,10,50,200] [--rates ...] [--engines ...]
        [--baseline-venv build/cost-venv-base --baseline-label COMMIT]

``--baseline-venv``: an earlier build's runtime-only venv (``requirements.lock``, then ``pip install --no-deps`` of
that build's tree); every case then runs with both builds, one right after the other, the order alternating from
case to case, so the two are compared within one run (the rows say which ``build``).

Needs ``prometheus-node-exporter`` on PATH or in /usr/bin. Not a test: prints a table, writes
benchmarks/results/cost_profile.json.
"""

from __future__ import annotations

import argparse
import gzip
import http.server
import json
import os
import platform
import re
import shutil
import signal
import statistics
import subprocess
import sys
import tempfile
import threading
import time
from collections import Counter as Tally
from collections.abc import Callable
from datetime import datetime, timezone
from pathlib import Path
from typing import Any

import httpx
import psutil
import yaml

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

from opentelemetry.proto.collector.metrics.v1.metrics_service_pb2 import (  # noqa: E402
    ExportMetricsServiceRequest,
    ExportMetricsServiceResponse,
)
from opentelemetry.proto.collector.trace.v1.trace_service_pb2 import ExportTraceServiceRequest  # noqa: E402

from benchmarks.agent_overhead import NODE_EXPORTER, RESULTS, free_port, stop, wait_ready  # noqa: E402
from benchmarks.engine_scale import LiveExposition, exposition, runtime_venv, status_kib  # noqa: E402
from benchmarks.engine_targets import simulators  # noqa: E402
from benchmarks.span_intake import payload  # noqa: E402

RSS_TARGET_ALL_MB, RSS_TARGET_DEFAULTS_MB, CPU_RATIO_TARGET = 60.0, 50.0, 0.5
ENGINE_UP = re.compile(r"^inferwatch_engine_up(\{[^}]*\})? 1(\.0)?$")


def node_exporter() -> str | None:
    return shutil.which(NODE_EXPORTER) or (
        f"/usr/bin/{NODE_EXPORTER}" if Path(f"/usr/bin/{NODE_EXPORTER}").exists() else None
    )


def launch(cmd: list[str], env: dict[str, str], cwd: Path) -> subprocess.Popen[bytes]:
    return subprocess.Popen(
        cmd, cwd=cwd, env=env, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL, start_new_session=True
    )


def clean_env() -> dict[str, str]:
    """This environment without anything that would configure the agent or its imports."""
    drop = ("INFERWATCH_", "OTEL_", "PYTHONPATH", "PYTHONDONTWRITEBYTECODE", "PYTHONPYCACHEPREFIX", "VIRTUAL_ENV")
    return {k: v for k, v in os.environ.items() if not k.startswith(drop)}


class MetricsSink:
    """An OTLP/HTTP metrics receiver on 127.0.0.1: decodes every POST /v1/metrics as ExportMetricsServiceRequest
    (opentelemetry-proto) and counts requests, metrics and data points."""

    def __init__(self) -> None:
        self.posts = self.metrics = self.points = self.undecodable = 0
        sink = self

        class Handler(http.server.BaseHTTPRequestHandler):
            def do_POST(self) -> None:
                body = self.rfile.read(int(self.headers.get("Content-Length", "0")))
                if self.path != "/v1/metrics":
                    self.send_error(404)
                    return
                try:
                    if self.headers.get("Content-Encoding") == "gzip":
                        body = gzip.decompress(body)
                    req = ExportMetricsServiceRequest.FromString(body)
                except Exception:  # any decode failure: counted, answered 400
                    sink.undecodable += 1
                    self.send_error(400)
                    return
                sink.posts += 1
                for rm in req.resource_metrics:
                    for sm in rm.scope_metrics:
                        for m in sm.metrics:
                            sink.metrics += 1
                            kind = m.WhichOneof("data")
                            if kind:
                                sink.points += len(getattr(m, kind).data_points)
                out = ExportMetricsServiceResponse().SerializeToString()
                self.send_response(200)
                self.send_header("Content-Type", "application/x-protobuf")
                self.send_header("Content-Length", str(len(out)))
                self.end_headers()
                self.wfile.write(out)

            def log_message(self, *args: object) -> None:
                pass

        self.server = http.server.ThreadingHTTPServer(("127.0.0.1", 0), Handler)
        self.url = f"http://127.0.0.1:{self.server.server_address[1]}/v1/metrics"
        threading.Thread(target=self.server.serve_forever, daemon=True).start()

    def close(self) -> None:
        self.server.shutdown()
        self.server.server_close()


class Periodic:
    """A daemon thread calling ``fn`` every ``period_s`` until closed."""

    def __init__(self, fn: Callable[[], None], period_s: float) -> None:
        self._fn, self._period, self._stop = fn, period_s, threading.Event()
        self._thread = threading.Thread(target=self._loop, daemon=True)
        self._thread.start()

    def _loop(self) -> None:
        nxt = time.monotonic()
        while not self._stop.is_set():
            self._fn()
            nxt += self._period
            self._stop.wait(max(0.0, nxt - time.monotonic()))

    def close(self) -> None:
        self._stop.set()
        self._thread.join(30)


class SpanSender:
    """One ``llm_request`` span per request at ``rate`` req/s to an OTLP/HTTP receiver, one export request per
    second as the SDK's BatchSpanProcessor sends them (span_intake.py's payload, start and end set to now)."""

    def __init__(self, url: str, rate: int) -> None:
        self.url, self.sent, self.failed = url, 0, 0
        self.template = ExportTraceServiceRequest.FromString(payload(rate))
        self.client = httpx.Client(timeout=10)
        self.periodic: Periodic | None = None

    def start(self) -> None:
        self.periodic = Periodic(self._send, 1.0)

    def _send(self) -> None:
        now = time.time_ns()
        for rs in self.template.resource_spans:
            for ss in rs.scope_spans:
                for span in ss.spans:
                    length = span.end_time_unix_nano - span.start_time_unix_nano
                    span.end_time_unix_nano = now
                    span.start_time_unix_nano = now - length
        body = self.template.SerializeToString()
        try:
            r = self.client.post(self.url, content=body, headers={"Content-Type": "application/x-protobuf"})
            ok = r.status_code == 200
        except httpx.HTTPError:
            ok = False
        n = len(self.template.resource_spans[0].scope_spans[0].spans)
        if ok:
            self.sent += n
        else:
            self.failed += n

    def close(self) -> None:
        if self.periodic is not None:
            self.periodic.close()
        self.client.close()


class Viewer:
    """One status-page viewer: ``GET /?refresh=10`` every 10 s; the page's latency."""

    def __init__(self, base: str) -> None:
        self.url, self.errors = f"{base}/?refresh=10", 0
        self.ms: list[float] = []
        self.client = httpx.Client(timeout=30)
        self.periodic = Periodic(self._view, 10.0)

    def _view(self) -> None:
        t = time.perf_counter()
        try:
            ok = self.client.get(self.url).status_code == 200
        except httpx.HTTPError:
            ok = False
        if ok:
            self.ms.append(round(1000 * (time.perf_counter() - t), 1))
        else:
            self.errors += 1

    def close(self) -> None:
        self.periodic.close()
        self.client.close()


def cpu_s(p: psutil.Process) -> float:
    t = p.cpu_times()
    return t.user + t.system


def pct(values: list[float], q: float) -> float:
    ordered = sorted(values)
    return ordered[min(len(ordered) - 1, int(q * len(ordered)))]


def engines_up(url: str, n: int, timeout_s: float = 180.0) -> None:
    deadline, up = time.monotonic() + timeout_s, 0
    while time.monotonic() < deadline:
        up = sum(1 for line in httpx.get(url, timeout=60).text.splitlines() if ENGINE_UP.match(line))
        if up >= n:
            return
        time.sleep(1.0)
    raise TimeoutError(f"{up} of {n} engines up at {url}")


def back_to_back(url: str, n: int) -> tuple[list[float], str]:
    times, text = [], ""
    with httpx.Client(timeout=120) as client:
        client.get(url)
        for _ in range(n):
            t = time.perf_counter()
            text = client.get(url).text
            times.append(1000 * (time.perf_counter() - t))
    return times, text


class Bench:
    def __init__(
        self, python: Path, ne: str, interval_s: float, window_s: float, scrapes: int, build: str = "current"
    ) -> None:
        self.python, self.ne, self.interval, self.window, self.scrapes = python, ne, interval_s, window_s, scrapes
        self.build = build  # which agent build this bench runs ("current", or the baseline's venv)
        self.profile: Path | None = None  # a folder: py-spy samples the agent over each window (raw stacks there)
        self.marker = f"cost-profile-runtime-{os.getpid()}"
        self.runtime = launch([sys.executable, "-c", "import time; time.sleep(7200)", self.marker], clean_env(), ROOT)

    def close(self) -> None:
        stop(self.runtime)

    def case(
        self,
        label: str,
        axis: str,
        x: float,
        env: dict[str, str],
        *,
        engines: int = 0,
        span_rate: int = 0,
        viewer: bool = False,
        sink: MetricsSink | None = None,
    ) -> dict[str, Any]:
        """One agent with ``env`` and node_exporter beside it, measured over the window."""
        print(f"[{datetime.now(timezone.utc):%H:%M:%S}] {label} ...", flush=True)
        with tempfile.TemporaryDirectory(prefix="cost-profile-") as tmp:
            agent_port, ne_port = free_port(), free_port()
            full = {
                **clean_env(),
                "INFERWATCH_LOG_LEVEL": "warning",
                "INFERWATCH_RUNTIME__CMDLINE_PATTERN": self.marker,
                "INFERWATCH_SNAPSHOTS__DIR": f"{tmp}/snap",
                "INFERWATCH_EVIDENCE__DIR": f"{tmp}/evidence",
                **{k: v.replace("{tmp}", tmp) for k, v in env.items()},
            }
            if span_rate:
                http_port = free_port()
                full.update(
                    INFERWATCH_RECEIVER__ENABLED="true",
                    INFERWATCH_RECEIVER__HTTP_ENDPOINT=f"127.0.0.1:{http_port}",
                    INFERWATCH_RECEIVER__GRPC_ENDPOINT=f"127.0.0.1:{free_port()}",
                )
            cmd = [str(self.python), "-m", "inferwatch.agent", "run", "--port", str(agent_port), "--interval",
                   str(self.interval)]  # fmt: skip
            load0 = os.getloadavg()
            agent = launch(cmd, full, Path(tmp))
            node = launch(
                [self.ne, f"--web.listen-address=127.0.0.1:{ne_port}", "--no-collector.systemd"], clean_env(), Path(tmp)
            )
            sender: SpanSender | None = None
            view: Viewer | None = None
            base = f"http://127.0.0.1:{agent_port}"
            agent_url, ne_url = f"{base}/metrics", f"http://127.0.0.1:{ne_port}/metrics"
            try:
                wait_ready(f"{base}/readyz", agent, timeout_s=180)
                wait_ready(ne_url, node)
                if engines:
                    engines_up(agent_url, engines)
                if span_rate:
                    sender = SpanSender(f"http://127.0.0.1:{http_port}/v1/traces", span_rate)
                    sender.start()
                if viewer:
                    view = Viewer(base)
                time.sleep(2 * self.interval)  # warm-up: first cycles, first batches, first page
                posts0 = sink.posts if sink else 0
                procs = {"agent": psutil.Process(agent.pid), "node_exporter": psutil.Process(node.pid)}
                urls = {"agent": agent_url, "node_exporter": ne_url}
                spy = spy_start(self.profile, self.build, self.window, agent.pid, label)
                cpu0 = {n: cpu_s(p) for n, p in procs.items()}
                scrape_ms: dict[str, list[float]] = {n: [] for n in procs}
                cycles, t0 = 0, time.monotonic()
                with httpx.Client(timeout=120) as client:
                    while time.monotonic() - t0 < self.window:
                        tick = time.monotonic()
                        order = list(procs) if cycles % 2 == 0 else list(procs)[::-1]
                        for name in order:
                            t = time.perf_counter()
                            client.get(urls[name])
                            scrape_ms[name].append(1000 * (time.perf_counter() - t))
                        cycles += 1
                        time.sleep(max(0.0, self.interval - (time.monotonic() - tick)))
                elapsed = time.monotonic() - t0
                used = {n: cpu_s(p) - cpu0[n] for n, p in procs.items()}
                profile = spy_end(spy)
                load1 = os.getloadavg()
                rss_mb = status_kib(agent.pid, "VmRSS") * 1024 / 1e6
                hwm_mb = status_kib(agent.pid, "VmHWM") * 1024 / 1e6
                ne_rss_mb = procs["node_exporter"].memory_info().rss / 1e6
                exports = (sink.posts - posts0) if sink else None
                b2b = {n: back_to_back(u, self.scrapes) for n, u in urls.items()}
                text = b2b["agent"][1]
                findings = httpx.get(f"{base}/api/v1/findings", timeout=60).json()
            finally:
                if sender is not None:
                    sender.close()
                if view is not None:
                    view.close()
                stop(agent)
                stop(node)
        lines = [ln for ln in text.splitlines() if ln and not ln.startswith("#")]
        row: dict[str, Any] = {
            "case": label,
            "axis": axis,
            "x": x,
            "window_s": round(elapsed, 1),
            "cycles": cycles,
            "agent_cpu_percent_one_core": round(100 * used["agent"] / elapsed, 3),
            "agent_cpu_per_cycle_ms": round(1000 * used["agent"] / cycles, 2),
            "node_exporter_cpu_percent_one_core": round(100 * used["node_exporter"] / elapsed, 3),
            "node_exporter_cpu_per_cycle_ms": round(1000 * used["node_exporter"] / cycles, 2),
            "cpu_ratio_agent_to_node_exporter": round(used["agent"] / used["node_exporter"], 3),
            "agent_vmrss_mb": round(rss_mb, 1),
            "agent_vmhwm_mb": round(hwm_mb, 1),
            "node_exporter_rss_mb": round(ne_rss_mb, 1),
            "agent_scrape_in_window_median_ms": round(statistics.median(scrape_ms["agent"]), 1),
            "agent_scrape_in_window_max_ms": round(max(scrape_ms["agent"]), 1),
            "agent_scrape_median_ms": round(statistics.median(b2b["agent"][0]), 2),
            "agent_scrape_p99_ms": round(pct(b2b["agent"][0], 0.99), 2),
            "node_exporter_scrape_median_ms": round(statistics.median(b2b["node_exporter"][0]), 2),
            "node_exporter_scrape_p99_ms": round(pct(b2b["node_exporter"][0], 0.99), 2),
            "agent_series": len(lines),
            "engines_up": sum(1 for ln in lines if ENGINE_UP.match(ln)),  # at the end: the engines still read
            "engines_expected": engines,
            "findings": {f["id"]: f["status"] for f in sorted(findings, key=lambda f: f["id"])},
            "load_avg_1m_start_end": [round(load0[0], 2), round(load1[0], 2)],
            "build": self.build,
        }
        if profile is not None:
            row["profile"] = profile
        if span_rate:
            assert sender is not None
            row["spans_sent"], row["spans_failed"] = sender.sent, sender.failed
        if view is not None:
            row["status_page_ms"], row["status_page_errors"] = view.ms, view.errors
        if sink is not None:
            row["otlp_exports_in_window"] = exports
            row["otlp_sink_totals"] = {"posts": sink.posts, "metrics": sink.metrics, "points": sink.points,
                                       "undecodable": sink.undecodable}  # fmt: skip
        if "INFERWATCH_PROBE__URL" in env:
            row["probe_series"] = sum(1 for ln in lines if ln.startswith("inferwatch_probe"))
            row["probe_lines"] = [
                ln for ln in lines if ln.startswith(("inferwatch_probe_up", "inferwatch_probe_success"))
            ]
        print(json.dumps(row), flush=True)
        return row


SPY = Path(sys.executable).parent / "py-spy"


def _frame(f: str) -> str:
    """``func (.../inferwatch/agent/x.py:12)`` as ``func (agent/x.py)``."""
    name, _, where = f.partition(" (")
    return f"{name} ({where.split('inferwatch/')[-1].split(':')[0]})"


def _slug(label: str) -> str:
    return re.sub(r"[^a-z0-9]+", "-", label.lower()).strip("-")


def spy_start(
    folder: Path | None, build: str, window_s: float, pid: int, label: str
) -> tuple[subprocess.Popen[bytes], Path] | None:
    """py-spy sampling ``pid`` for the window (100 Hz, not pausing it), collapsed stacks into ``folder``."""
    if folder is None:
        return None
    folder.mkdir(parents=True, exist_ok=True)
    out = folder / f"{_slug(label)}-{_slug(build)}.txt"
    cmd = [str(SPY if SPY.exists() else "py-spy"), "record", "--pid", str(pid), "--duration", str(int(window_s)),
           "--rate", "100", "--nonblocking", "--format", "raw", "--output", str(out)]  # fmt: skip
    return subprocess.Popen(cmd, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL), out


def spy_end(spy: tuple[subprocess.Popen[bytes], Path] | None) -> dict[str, Any] | None:
    """Wait for py-spy; summarise its collapsed stacks: the share of samples per innermost agent function and per
    function anywhere on the stack (the agent's own code, inferwatch/...), the top 15 of each."""
    if spy is None:
        return None
    proc, out = spy
    try:
        proc.wait(timeout=60)
    except subprocess.TimeoutExpired:
        proc.kill()
    if not out.exists():
        return {"error": "py-spy wrote nothing (ptrace not permitted?)"}
    total, inner, anywhere = 0, Tally[str](), Tally[str]()
    for line in out.read_text().splitlines():
        stack, _, n = line.rpartition(" ")
        if not n.isdigit():
            continue
        count = int(n)
        total += count
        own = [_frame(f) for f in stack.split(";") if "inferwatch/" in f]
        if own:
            inner[own[-1]] += count
        for f in set(own):
            anywhere[f] += count
    share = lambda t: {k: round(v / total, 3) for k, v in t.most_common(15)} if total else {}  # noqa: E731
    return {"file": out.name, "samples": total, "innermost_agent_function": share(inner), "on_stack": share(anywhere)}


def engine_env(url: str, models: int, series: int, raise_timeouts: bool = False) -> dict[str, str]:
    """The engine collector's settings at ``models`` (x 2 ranks): above the default limits (64 models, 100k series,
    10 MiB) raised as engine_scale.py raises them, as a user must. ``raise_timeouts``: the engine timeouts too (30 s),
    for a baseline build from before the deadline grew with the body (its fixed 1.5 s cut every read of a 12 MB
    body); the current build's grows by itself (agent/node/collectors/engine.py, ``fetch_timeout_s``)."""
    env = {"INFERWATCH_ENGINE__METRICS_URL": url, "INFERWATCH_ENGINE__KIND": "vllm"}
    if models * 2 > 64 or series > 100_000:
        env.update(
            INFERWATCH_ENGINE__MAX_MODELS=str(models * 2),
            INFERWATCH_ENGINE__MAX_SERIES=str(series * 2),
            INFERWATCH_ENGINE__MAX_BYTES=str(256 << 20),
            INFERWATCH_SERIES_BUDGET=str(10_000_000),
        )
        if raise_timeouts:
            env.update(INFERWATCH_ENGINE__TIMEOUT_S="30", INFERWATCH_COLLECTORS__ENGINE__TIMEOUT_S="30")
    return env


def installed_changes(python: Path) -> list[str]:
    """The package's files in the venv that differ from this checkout's HEAD (pip installs the working tree, which
    in a shared checkout may hold uncommitted edits): the record says what was measured."""
    where = subprocess.run(
        [str(python), "-c", "import inferwatch, os; print(os.path.dirname(os.path.realpath(inferwatch.__file__)))"],
        capture_output=True, text=True, cwd=tempfile.gettempdir(), check=True,
    ).stdout.strip()  # fmt: skip
    changed = []
    for path in sorted(Path(where).rglob("*.py")):
        rel = path.relative_to(where).as_posix()
        tracked = f"inferwatch/{rel}" if "/" not in rel else rel  # inferwatch/ holds the top module, links the rest
        head = subprocess.run(["git", "show", f"HEAD:{tracked}"], capture_output=True, cwd=ROOT)
        if head.returncode != 0 or head.stdout != path.read_bytes():
            changed.append(rel)
    return changed


def targets_of(rows: list[dict[str, Any]]) -> dict[str, Any]:
    """Issue 38's targets against the everything-on and defaults cases, where they ran."""
    out: dict[str, Any] = {}
    for r in rows:
        if r["axis"] == "all":
            out["everything_on_cpu_per_cycle_ratio"] = r["cpu_ratio_agent_to_node_exporter"]
            out["everything_on_cpu_met"] = r["cpu_ratio_agent_to_node_exporter"] <= CPU_RATIO_TARGET
            out["everything_on_vmrss_mb"] = r["agent_vmrss_mb"]
            out["everything_on_rss_met"] = r["agent_vmrss_mb"] <= RSS_TARGET_ALL_MB
        elif r["axis"] == "defaults":
            out["defaults_vmrss_mb"] = r["agent_vmrss_mb"]
            out["defaults_rss_met"] = r["agent_vmrss_mb"] <= RSS_TARGET_DEFAULTS_MB
    return out


def series_of(text: str) -> int:
    return sum(1 for ln in text.splitlines() if ln and not ln.startswith("#"))


def slope(rows: list[dict[str, Any]], key: str) -> dict[str, float]:
    xs, ys = [float(r["x"]) for r in rows], [float(r[key]) for r in rows]
    fit = statistics.linear_regression(xs, ys)
    return {"slope": round(fit.slope, 5), "intercept": round(fit.intercept, 3)}


def everything_on(bench: Bench) -> dict[str, Any]:
    """Issue 38's profile: the engine at 10 models (hang detection with it), the probe on a simulator, the span
    receiver at 100 req/s, OTLP export to a decoding receiver, one status-page viewer."""
    text, gen = exposition(10)
    live, sink = LiveExposition(gen), MetricsSink()
    try:
        with simulators(1) as ports:
            env = {
                **engine_env(live.url, 10, series_of(text)),
                "INFERWATCH_PROBE__URL": f"http://127.0.0.1:{ports[0]}",
                "OTEL_EXPORTER_OTLP_METRICS_ENDPOINT": sink.url,
                "OTEL_EXPORTER_OTLP_METRICS_PROTOCOL": "http/protobuf",
            }
            return bench.case(
                "everything on: 10 models, 100 req/s", "all", 0, env, engines=1, span_rate=100, viewer=True, sink=sink
            )
    finally:
        live.close()
        sink.close()


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--window", type=float, default=60.0, help="measurement window per case, s")
    ap.add_argument(
        "--interval", type=float, default=5.0, help="the agent's interval (its default) and the scrape interval"
    )
    ap.add_argument("--scrapes", type=int, default=40, help="back-to-back scrapes per exporter after each window")
    ap.add_argument("--models", default="1,10,50,200")
    ap.add_argument("--rates", default="10,100,1000")
    ap.add_argument("--engines", default="1,4,16")
    ap.add_argument(
        "--venv", type=Path, default=ROOT / "build" / "cost-venv", help="the runtime-only venv (made if missing)"
    )
    ap.add_argument("--out", type=Path, default=RESULTS / "cost_profile.json")
    ap.add_argument("--cases", default="defaults,all,models,span_rate,engines", help="which cases and axes to run")
    ap.add_argument(
        "--baseline-venv",
        type=Path,
        help="a runtime-only venv holding an earlier build (made by hand: requirements.lock, then that build's "
        "tree): each case runs with it too, right after or before the current build's, alternating",
    )
    ap.add_argument(
        "--installed",
        action="store_true",
        help="--venv already holds the build to measure (made as the baseline's is): not reinstalled from here",
    )
    ap.add_argument("--profile", type=Path, help="a folder: py-spy samples each agent over its window (raw stacks)")
    ap.add_argument("--baseline-label", default="baseline", help="what the baseline venv holds (a commit)")
    args = ap.parse_args()
    ne = node_exporter()
    if ne is None:
        print(f"{NODE_EXPORTER} not found: apt-get install -y --no-install-recommends {NODE_EXPORTER}", file=sys.stderr)
        return 2
    python = args.venv.resolve() / "bin" / "python" if args.installed else runtime_venv(args.venv.resolve())
    uncommitted = installed_changes(python)
    started = datetime.now(timezone.utc)
    load_start = os.getloadavg()
    bench = Bench(python, ne, args.interval, args.window, args.scrapes)
    benches = [bench]
    if args.baseline_venv is not None:
        base_python = args.baseline_venv.resolve() / "bin" / "python"
        benches.append(Bench(base_python, ne, args.interval, args.window, args.scrapes, build=args.baseline_label))
    for b in benches:
        b.profile = args.profile
    rows: list[dict[str, Any]] = []
    cases = set(args.cases.split(","))

    def each(make: Callable[[Bench], dict[str, Any]]) -> None:
        """One case with every build, the order alternating from case to case; a baseline's row is kept out of
        the axes' slopes and the targets (its axis gets ``/baseline``)."""
        turn = sum(1 for r in rows if r["build"] == "current")
        for b in benches if turn % 2 == 0 else benches[::-1]:
            row = make(b)
            if b is not bench:
                row["axis"] = f"{row['axis']}/baseline"
            rows.append(row)

    try:
        if "defaults" in cases:
            each(lambda b: b.case("defaults", "defaults", 0, {}))

        if "all" in cases:
            each(everything_on)

        for n in (int(v) for v in args.models.split(",") if "models" in cases):
            text, gen = exposition(n)
            live = LiveExposition(gen)
            try:

                def models_case(b: Bench, n: int = n, text: str = text, live: LiveExposition = live) -> dict[str, Any]:
                    reads = live.reads
                    env = engine_env(live.url, n, series_of(text), raise_timeouts=b.build != "current")
                    row = b.case(f"{n} models", "models", n, env, engines=1)
                    row["exposition_series"], row["exposition_reads"] = series_of(text), live.reads - reads
                    return row

                each(models_case)
            finally:
                live.close()
            del text, gen, live

        for rate in (int(v) for v in args.rates.split(",") if "span_rate" in cases):
            each(lambda b, rate=rate: b.case(f"{rate} req/s", "span_rate", rate, {}, span_rate=rate))

        counts = [int(v) for v in args.engines.split(",") if "engines" in cases]
        with simulators(max(counts, default=0)) as ports:
            for n in counts:
                groups = [{"targets": [f"127.0.0.1:{p}"], "labels": {"__inferwatch_name__": f"gpu{i}"}}
                          for i, p in enumerate(ports[:n])]  # fmt: skip
                path = Path(tempfile.gettempdir()) / f"cost-profile-targets-{os.getpid()}-{n}.yaml"
                path.write_text(yaml.safe_dump(groups))
                try:
                    env = {"INFERWATCH_DISCOVERY__FILE": str(path)}
                    each(lambda b, n=n, env=env: b.case(f"{n} engines", "engines", n, env, engines=n))
                finally:
                    path.unlink()
    finally:
        for b in benches:
            b.close()

    slopes: dict[str, dict[str, Any]] = {}
    units = {"models": ("model", 1), "span_rate": ("100 req/s", 100), "engines": ("engine", 1)}
    for axis, (unit, scale) in units.items():
        axis_rows = [r for r in rows if r["axis"] == axis]
        if len(axis_rows) < 2:
            continue
        slopes[axis] = {"per": unit}
        for key in ("agent_cpu_percent_one_core", "agent_vmrss_mb", "agent_scrape_median_ms", "agent_series"):
            fit = slope(axis_rows, key)
            slopes[axis][key] = {"slope_per_unit": round(fit["slope"] * scale, 4), "intercept": fit["intercept"]}
    targets = targets_of(rows)
    cols = ["case", "build", "agent_cpu_percent_one_core", "agent_cpu_per_cycle_ms", "node_exporter_cpu_per_cycle_ms",
            "agent_vmrss_mb", "agent_vmhwm_mb", "agent_scrape_median_ms", "agent_scrape_p99_ms", "agent_series",
            "load_avg_1m_start_end"]  # fmt: skip
    print("| " + " | ".join(cols) + " |")
    print("|" + "---|" * len(cols))
    for r in rows:
        print("| " + " | ".join(str(r[c]) for c in cols) + " |")
    print(json.dumps({"slopes": slopes, "targets": targets}, indent=2))
    version = subprocess.run([ne, "--version"], capture_output=True, text=True)
    commit = subprocess.run(["git", "rev-parse", "--short", "HEAD"], capture_output=True, text=True, cwd=ROOT)
    meta = {
        "started_utc": started.isoformat(timespec="seconds"),
        "ended_utc": datetime.now(timezone.utc).isoformat(timespec="seconds"),
        "commit": commit.stdout.strip(),
        "machine": " ".join(platform.uname()),
        "cpus": os.cpu_count(),
        "memory_gb": round(psutil.virtual_memory().total / 1e9, 1),
        "load_avg_start": [round(v, 2) for v in load_start],
        "load_avg_end": [round(v, 2) for v in os.getloadavg()],
        "python": sys.version.split()[0],
        "agent_install": f"runtime-only venv {args.venv} (requirements.lock + this checkout's wheel, bytecode "
        "compiled by pip), started outside the checkout",
        "installed_files_differing_from_commit": uncommitted,
        "node_exporter": (version.stderr or version.stdout).split("\n")[0],
        "baseline": f"{args.baseline_label} in {args.baseline_venv}" if args.baseline_venv else None,
        "interval_s": args.interval,
        "window_s": args.window,
        "scrapes_back_to_back": args.scrapes,
        "mb": "10^6 bytes",
        "engine_exposition": "engine_scale.exposition(models): models x 2 DP ranks, a new version per read",
        "otlp_sink": "127.0.0.1 HTTP server decoding each POST /v1/metrics as ExportMetricsServiceRequest "
        "(opentelemetry-proto), counting data points",
    }
    args.out.parent.mkdir(parents=True, exist_ok=True)
    args.out.write_text(
        json.dumps({"meta": meta, "targets": targets, "slopes": slopes, "cases": rows}, indent=2) + "\n"
    )
    return 0


if __name__ == "__main__":
    signal.signal(signal.SIGTERM, lambda *_: sys.exit(1))
    sys.exit(main())
