"""Healthy noise: the shipped rules and routes against a healthy simulator with realistic variation. Target: no page.

No fault is injected. The simulator (vLLM-shaped, `--debug-profile` like the compose stack) is loaded through phases
of prompt-length mixes from narrow to wide lognormal and load steps, is restarted once (a runtime restart: new pid,
counters reset) and redeployed once with another model name (the old model's series end, the new one starts with
an empty window). One agent reads it like the compose agent does (engine collector, streaming probe,
runtime_profile, the runtime located by its command line, so the binary and SIMD collectors judge the Python
simulator too). Prometheus evaluates the shipped ``alerts/*.rules.yml``; Alertmanager runs the shipped
``alerts/alertmanager.yml`` with only its receiver addresses pointed at a local sink (tests/e2e/harness.py).
Runbook links point at a static copy of ``runbooks/`` served by a separate process (``runbook_base``), not at
the agent.

Production timings (the default): 15 s scrape and evaluation, rules unscaled, agent interval 15 s, probe 30 s,
runtime_profile 60 s, at least 30 minutes. ``--compressed`` is the test variant (tests/test_healthy_noise.py):
1 s scrape and evaluation and every rule duration divided by 60 (inferwatch.agent.alerts.profile, as tests/e2e does),
agent interval 0.5 s, probe and runtime_profile 1 s; the agent's own 1m/5m quantile windows are not scaled, so
the compressed run is the stricter one (a 10m ``for:`` becomes 10 s of the same 5-minute window).

Reported: every page (PagerDuty) and ticket (webhook) delivered, with its alert and time; every alert seen pending
or firing in Prometheus with its longest pending streak; the Watchdog heartbeat's intervals. Target: zero pages,
zero tickets.

    .venv/bin/python benchmarks/healthy_noise.py [--duration 1800] [--compressed] [--out FILE]
"""

from __future__ import annotations

import argparse
import contextlib
import functools
import http.server
import itertools
import json
import os
import subprocess
import sys
import threading
import time
from collections.abc import Iterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import httpx
import yaml

ROOT = Path(__file__).resolve().parents[1]
if str(ROOT) not in sys.path:
    sys.path.insert(0, str(ROOT))

from inferwatch.agent.alerts.profile import DEFAULT_FACTOR, render_file  # noqa: E402
from tests.conftest import free_port  # noqa: E402
from tests.e2e.harness import ROUTING_KEY, Sink, alertmanager_config  # noqa: E402
from tests.procs import running, stop, wait_http  # noqa: E402

PYTHON = sys.executable
RESULTS = ROOT / "benchmarks" / "results"
SIM_CONTROL_TOKEN = "healthy-noise-control-token"
API_TOKEN = "healthy-noise-operator-token"  # >= 16 characters: the agent's minimum
MODELS = ("meta-llama/Llama-3.1-8B-Instruct", "Qwen/Qwen2.5-7B-Instruct")  # before / after the redeploy

# (share of the run, requests/s, prompt-length distribution): narrow → compose's mix → wide → load steps.
PHASES: tuple[tuple[float, float, str], ...] = (
    (0.15, 4.0, "lognormal:512:0.2"),
    (0.20, 4.0, "lognormal:512:0.6"),
    (0.20, 4.0, "lognormal:512:1.0"),
    (0.15, 8.0, "lognormal:512:0.6"),
    (0.15, 1.0, "lognormal:1024:0.8"),
    (0.15, 4.0, "lognormal:512:0.6"),
)
RESTART_AT = 0.45  # share of the run: the runtime is restarted (same model)
REDEPLOY_AT = 0.75  # the runtime is replaced by one serving MODELS[1]


@dataclass(frozen=True, slots=True)
class Timings:
    name: str
    interval: str  # Prometheus scrape and evaluation
    factor: int  # rule durations divided by this
    agent_interval_s: float
    probe_interval_s: float
    profile_interval_s: float


PRODUCTION = Timings("production", "15s", 1, 15.0, 30.0, 60.0)
COMPRESSED = Timings("compressed", "1s", DEFAULT_FACTOR, 0.5, 1.0, 1.0)


@dataclass
class Report:
    timings: str
    duration_s: float
    events: list[dict[str, Any]] = field(default_factory=list)
    deliveries: list[dict[str, Any]] = field(default_factory=list)  # pages and tickets, never Watchdog
    watchdog_intervals_s: list[float] = field(default_factory=list)
    seen_in_prometheus: dict[str, dict[str, Any]] = field(default_factory=dict)  # alertname → state, longest pending
    startup: list[dict[str, Any]] = field(default_factory=list)  # delivered before the first successful scrape
    regression_evidence: dict[str, float | None] = field(default_factory=dict)

    @property
    def pages(self) -> list[dict[str, Any]]:
        return [d for d in self.deliveries if d["receiver"] == "pagerduty" and d["action"] in ("trigger", "firing")]

    @property
    def tickets(self) -> list[dict[str, Any]]:
        return [d for d in self.deliveries if d["receiver"] == "ticket" and d["action"] == "firing"]

    def as_dict(self) -> dict[str, Any]:
        return {
            "timings": self.timings,
            "duration_s": round(self.duration_s, 1),
            "pages": len(self.pages),
            "tickets": len(self.tickets),
            "deliveries": self.deliveries,
            "startup_deliveries": self.startup,
            "regression_evidence": self.regression_evidence,
            "watchdog_intervals_s": self.watchdog_intervals_s,
            "seen_in_prometheus": self.seen_in_prometheus,
            "events": self.events,
        }


class StaticRunbooks:
    """``runbooks/`` over plain HTTP from its own process-independent thread: links that do not need the agent."""

    def __init__(self, directory: Path) -> None:
        handler = functools.partial(_QuietHandler, directory=str(directory))
        self.server = http.server.ThreadingHTTPServer(("127.0.0.1", 0), handler)
        self.url = f"http://127.0.0.1:{self.server.server_address[1]}"
        self._thread = threading.Thread(target=self.server.serve_forever, daemon=True)

    def __enter__(self) -> StaticRunbooks:
        self._thread.start()
        return self

    def __exit__(self, *exc: object) -> None:
        self.server.shutdown()
        self.server.server_close()


class _QuietHandler(http.server.SimpleHTTPRequestHandler):
    def log_message(self, format: str, *args: Any) -> None:
        pass

    def send_head(self) -> Any:
        # /runbooks/AlertName → AlertName.md, the same URL shape as the agent's /runbooks/<AlertName>
        name = self.path.split("?", 1)[0].rstrip("/").rsplit("/", 1)[-1]
        if name and name.isidentifier() and not self.path.endswith(".md"):
            self.path = f"/{name}.md"
        return super().send_head()


class Simulator:
    def __init__(self, stack: contextlib.ExitStack, workdir: Path, port: int) -> None:
        self.stack, self.workdir, self.port = stack, workdir, port
        self.proc: subprocess.Popen[bytes] | None = None
        self.starts = 0

    @property
    def url(self) -> str:
        return f"http://127.0.0.1:{self.port}"

    def start(self, model: str) -> None:
        self.starts += 1
        cmd = [PYTHON, "-m", "inferwatch.agent", "simulate", "--port", str(self.port), "--model", model, "--seed", "6"]
        cmd += ["--debug-profile", "--control-token", SIM_CONTROL_TOKEN, "--log-level", "warning"]
        log = (self.workdir / f"sim-{self.starts}.log").open("wb")
        self.proc = subprocess.Popen(cmd, cwd=ROOT, stdout=log, stderr=subprocess.STDOUT, start_new_session=True)
        wait_http(f"{self.url}/health", proc=self.proc, timeout_s=60)

    def stop(self) -> None:
        if self.proc is not None:
            stop(self.proc)
            self.proc = None


class Loadgen:
    def __init__(self, workdir: Path, url: str) -> None:
        self.workdir, self.url = workdir, url
        self.proc: subprocess.Popen[bytes] | None = None
        self.n = 0

    def start(self, rate: float, prompt: str, duration_s: float) -> None:
        self.stop()
        self.n += 1
        cmd = [PYTHON, "-m", "inferwatch.agent", "loadgen", "--url", self.url, "--rate", str(rate)]
        cmd += ["--duration", str(int(duration_s) + 5), "--prompt-tokens", prompt]
        cmd += ["--output-tokens", "lognormal:128:0.5"]
        cmd += ["--timeout", "120", "--seed", str(self.n), "--no-progress"]
        log = (self.workdir / f"loadgen-{self.n}.log").open("wb")
        self.proc = subprocess.Popen(cmd, cwd=ROOT, stdout=log, stderr=subprocess.STDOUT, start_new_session=True)

    def stop(self) -> None:
        if self.proc is not None:
            stop(self.proc)
            self.proc = None


def _agent_env(sim_url: str, timings: Timings, tokens_file: Path) -> dict[str, str]:
    env = {k: v for k, v in os.environ.items() if not k.startswith(("INFERWATCH_", "OTEL_"))}
    env.update(
        {
            "INFERWATCH_ENGINE__METRICS_URL": f"{sim_url}/metrics",
            "INFERWATCH_PROBE__URL": sim_url,
            "INFERWATCH_PROBE__INTERVAL_S": str(timings.probe_interval_s),
            "INFERWATCH_RUNTIME_PROFILE__URL": f"{sim_url}/debug/runtime_profile",
            "INFERWATCH_RUNTIME_PROFILE__INTERVAL_S": str(timings.profile_interval_s),
            # as docker-compose.yml: the simulator is the runtime process (binary check, SIMD verdict, restarts)
            "INFERWATCH_RUNTIME__CMDLINE_PATTERN": rf"-m inferwatch.agent simulate --port {sim_url.rsplit(':', 1)[1]} ",
            "INFERWATCH_RUNTIME__NAME": "simulator",
            "INFERWATCH_API__TOKENS_FILE": str(tokens_file),
        }
    )
    return env


@contextlib.contextmanager
def _pipeline(
    workdir: Path, sink: Sink, agent_port: int, runbook_base: str, timings: Timings
) -> Iterator[tuple[str, str]]:
    """Prometheus and Alertmanager with the shipped files (rules scaled by ``timings.factor``); yield both URLs."""
    rules_dir = workdir / "rules"
    rules_dir.mkdir(parents=True, exist_ok=True)
    for path in sorted((ROOT / "alerts").glob("*.rules.yml")):
        text = path.read_text() if timings.factor == 1 else render_file(path, timings.factor)
        (rules_dir / path.name).write_text(text)
    key_file = workdir / "pagerduty_routing_key"
    key_file.write_text(ROUTING_KEY + "\n")
    am_yml = workdir / "alertmanager.yml"
    am_yml.write_text(yaml.safe_dump(alertmanager_config(sink.url, key_file), sort_keys=False))
    am_port, prom_port = free_port(), free_port()
    prom_cfg = {
        "global": {
            "scrape_interval": timings.interval,
            "scrape_timeout": timings.interval if timings.interval != "15s" else "10s",
            "evaluation_interval": timings.interval,
            "external_labels": {"runbook_base": runbook_base},
        },
        "rule_files": [str(rules_dir / "*.rules.yml")],
        "alerting": {"alertmanagers": [{"static_configs": [{"targets": [f"127.0.0.1:{am_port}"]}]}]},
        "scrape_configs": [
            {
                "job_name": "inferwatch-agent",
                "authorization": {"credentials": API_TOKEN},
                "static_configs": [{"targets": [f"127.0.0.1:{agent_port}"]}],
            }
        ],
    }
    prom_yml = workdir / "prometheus.yml"
    prom_yml.write_text(yaml.safe_dump(prom_cfg, sort_keys=False))
    am_url, prom_url = f"http://127.0.0.1:{am_port}", f"http://127.0.0.1:{prom_port}"
    am_cmd = [
        "prometheus-alertmanager",
        f"--config.file={am_yml}",
        f"--storage.path={workdir / 'am'}",
        f"--web.listen-address=127.0.0.1:{am_port}",
        f"--web.external-url={am_url}",
        "--cluster.listen-address=",
    ]
    prom_cmd = [
        "prometheus",
        f"--config.file={prom_yml}",
        f"--storage.tsdb.path={workdir / 'prom'}",
        f"--web.listen-address=127.0.0.1:{prom_port}",
        f"--web.external-url={prom_url}",
    ]
    if timings.factor != 1:
        prom_cmd.append("--rules.alert.resend-delay=1s")
    with running(am_cmd, workdir / "alertmanager.log") as am, running(prom_cmd, workdir / "prometheus.log") as prom:
        wait_http(f"{am_url}/-/ready", ok=lambda r: r.status_code == 200, proc=am, timeout_s=60)
        wait_http(f"{prom_url}/-/ready", ok=lambda r: r.status_code == 200, proc=prom, timeout_s=60)
        yield prom_url, am_url


def _observe_alerts(prom_url: str, seen: dict[str, dict[str, Any]], streaks: dict[str, float], now: float) -> None:
    try:
        r = httpx.get(f"{prom_url}/api/v1/alerts", timeout=5)
        alerts = r.json()["data"]["alerts"]
    except (httpx.HTTPError, ValueError, KeyError):
        return
    active = set()
    for a in alerts:
        name = a["labels"]["alertname"]
        if name == "Watchdog":
            continue
        key = json.dumps(a["labels"], sort_keys=True)
        active.add(key)
        streaks.setdefault(key, now)
        entry = seen.setdefault(name, {"state": "pending", "longest_active_s": 0.0, "labels": a["labels"]})
        if a["state"] == "firing":
            entry["state"] = "firing"
        entry["longest_active_s"] = round(max(entry["longest_active_s"], now - streaks[key]), 1)
    for key in list(streaks):
        if key not in active:
            del streaks[key]


# Proof that the run was a hard one: over the whole run, the healthy node must reach the values that fired earlier
# versions of the rules falsely (TTFT tail ratio above 3; a SIMD verdict of 0 on the Python runtime).
EVIDENCE_QUERIES = {
    "max TTFT P99/P50 (5m window)": (
        'max(max_over_time(inferwatch_engine_latency_tail_ratio{{quantity="ttft",window="5m"}}[{w}s]))'
    ),
    "max prefill P99/P50 (5m window)": (
        'max(max_over_time(inferwatch_engine_latency_tail_ratio{{quantity="prefill",window="5m"}}[{w}s]))'
    ),
    # The TTFT SLO's fast page pages above 0.3 (for: 30s): how close healthy traffic came to it.
    "max TTFT SLO error ratio (5m)": 'max(max_over_time(slo:sli_error:ratio_rate5m{{slo="ttft-500ms"}}[{w}s]))',
    "SIMD verdict samples": "sum(count_over_time(inferwatch_runtime_simd_used[{w}s]))",
    "SIMD verdict max (0: never used)": "max(max_over_time(inferwatch_runtime_simd_used[{w}s]))",
    "runtime restarts seen": "max(max_over_time(inferwatch_runtime_restarts_total[{w}s]))",
}


def _regression_evidence(prom_url: str, duration_s: float) -> dict[str, float | None]:
    out: dict[str, float | None] = {}
    for what, query in EVIDENCE_QUERIES.items():
        try:
            params = {"query": query.format(w=int(duration_s) + 60)}
            r = httpx.get(f"{prom_url}/api/v1/query", params=params, timeout=10)
            result = r.json()["data"]["result"]
            out[what] = round(float(result[0]["value"][1]), 3) if result else None
        except (httpx.HTTPError, ValueError, KeyError, IndexError):
            out[what] = None
    return out


def run(duration_s: float, timings: Timings, workdir: Path, log: Any = print) -> Report:
    """One healthy run of ``duration_s`` seconds; returns what was delivered."""
    workdir.mkdir(parents=True, exist_ok=True)
    report = Report(timings.name, duration_s)
    tokens_file = workdir / "tokens"
    tokens_file.write_text(f"{API_TOKEN} read,snapshots,profile operator\n")
    tokens_file.chmod(0o600)
    with contextlib.ExitStack() as stack:
        sink = stack.enter_context(Sink())
        runbooks = stack.enter_context(StaticRunbooks(ROOT / "runbooks"))
        sim = Simulator(stack, workdir, free_port())
        sim.start(MODELS[0])
        stack.callback(sim.stop)
        agent_port = free_port()
        agent_cmd = [PYTHON, "-m", "inferwatch.agent", "run", "--port", str(agent_port)]
        agent_cmd += ["--interval", str(timings.agent_interval_s), "--environment", "demo"]
        agent = stack.enter_context(
            running(agent_cmd, workdir / "agent.log", cwd=ROOT, env=_agent_env(sim.url, timings, tokens_file))
        )
        wait_http(f"http://127.0.0.1:{agent_port}/healthz", proc=agent, timeout_s=60)
        loadgen = Loadgen(workdir, sim.url)
        stack.callback(loadgen.stop)
        prom_url, _ = stack.enter_context(_pipeline(workdir, sink, agent_port, f"{runbooks.url}/runbooks", timings))
        # The clock starts once Prometheus has scraped the agent: before that, absent(up) is true by construction.
        wait_http(
            f"{prom_url}/api/v1/query?query=up%7Bjob%3D%22inferwatch-agent%22%7D%3D%3D1",
            ok=lambda r: bool(r.json()["data"]["result"]),
            timeout_s=120,
        )
        t0 = time.monotonic()
        starts, acc = [], 0.0
        for share, rate, prompt in PHASES:
            starts.append((acc * duration_s, share * duration_s, rate, prompt))
            acc += share
        pending_events = [(RESTART_AT * duration_s, "restart"), (REDEPLOY_AT * duration_s, "redeploy")]
        phase_i = 0
        current = (0.0, 0.0, "")
        streaks: dict[str, float] = {}
        poll_s = 1.0 if timings.factor != 1 else 5.0
        while (now := time.monotonic() - t0) < duration_s:
            if phase_i < len(starts) and now >= starts[phase_i][0]:
                at, length, rate, prompt = starts[phase_i]
                current = (length - (now - at), rate, prompt)
                loadgen.start(rate, prompt, duration_s - now)
                report.events.append({"t": round(now, 1), "event": f"load {rate:g} req/s, prompts {prompt}"})
                log(f"[{now:7.1f}s] load {rate:g} req/s prompts {prompt}")
                phase_i += 1
            if pending_events and now >= pending_events[0][0]:
                _, what = pending_events.pop(0)
                model = MODELS[1] if what == "redeploy" else (MODELS[1] if sim.starts > 2 else MODELS[0])
                loadgen.stop()
                sim.stop()
                sim.start(model)
                _, rate, prompt = current
                loadgen.start(rate, prompt, duration_s - now)
                report.events.append({"t": round(now, 1), "event": f"runtime {what}: {model}"})
                log(f"[{now:7.1f}s] runtime {what}: {model}")
            _observe_alerts(prom_url, report.seen_in_prometheus, streaks, now)
            time.sleep(poll_s)
        report.regression_evidence = _regression_evidence(prom_url, duration_s)
        deliveries = sink.snapshot()
    beats = sorted(d.t for d in deliveries if d.alertname == "Watchdog")
    report.watchdog_intervals_s = [round(b - a, 1) for a, b in itertools.pairwise(beats)]
    report.deliveries = [
        {
            "t": round(d.t - t0, 1),
            "receiver": d.receiver,
            "alertname": d.alertname,
            "instance": d.instance,
            "action": d.action,
            "labels": d.alert.get("labels", {}),
        }
        for d in deliveries
        if d.alertname != "Watchdog"
    ]
    report.startup = [d for d in report.deliveries if d["t"] < 0]
    report.deliveries = [d for d in report.deliveries if d["t"] >= 0]
    return report


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--duration", type=float, default=1800.0, help="seconds (production timings: at least 1800)")
    ap.add_argument("--compressed", action="store_true", help="the test profile: 1 s intervals, rules / 60")
    ap.add_argument("--out", type=Path, default=None, help="JSON report (default benchmarks/results/...)")
    ap.add_argument("--workdir", type=Path, default=None)
    args = ap.parse_args()
    timings = COMPRESSED if args.compressed else PRODUCTION
    out = args.out or RESULTS / f"healthy_noise_{timings.name}.json"
    workdir = args.workdir or Path(f"/tmp/healthy-noise-{timings.name}-{os.getpid()}")
    started = time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime())
    report = run(args.duration, timings, workdir, log=lambda s: print(s, flush=True))
    result = {"started": started, **report.as_dict()}
    out.parent.mkdir(parents=True, exist_ok=True)
    out.write_text(json.dumps(result, indent=2) + "\n")
    print(f"{timings.name} timings, {args.duration:.0f} s: {len(report.pages)} pages, {len(report.tickets)} tickets")
    for d in report.deliveries:
        print(f"  {d['t']:7.1f}s {d['receiver']:9} {d['action']:8} {d['alertname']} {d['instance']}")
    for name, s in sorted(report.seen_in_prometheus.items()):
        print(f"  seen in Prometheus: {name} {s['state']}, longest active {s['longest_active_s']} s")
    print(f"  Watchdog intervals (s): {report.watchdog_intervals_s}")
    for what, value in report.regression_evidence.items():
        print(f"  {what}: {value}")


if __name__ == "__main__":
    main()
