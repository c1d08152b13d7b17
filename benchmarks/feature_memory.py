"""Where everything-on's megabytes go: the agent's RSS with its features switched on one at a time.

Run: ``python benchmarks/feature_memory.py [--venv build/cost-venv] [--installed] [--window 70] [--steps ...]
[--baseline-venv VENV] [--rounds N] [--trace] [--out FILE]``. Each step starts the agent as benchmarks/cost_profile.py
does (a runtime-only venv, outside the checkout, a sleeping child as its runtime, the same load for each feature) with
the features of the steps before it and its own: **defaults**; **engine** (a live 10-model × 2-rank vLLM exposition,
hang detection with it); **probe** (the streaming probe on the project's simulator); **receiver** (OTLP/HTTP and
OTLP/gRPC endpoints, one ``llm_request`` span per request at 100 req/s over OTLP/HTTP); **export** (OTLP metric export,
``http/protobuf``, to a decoding receiver); **viewer** (one status-page viewer every 10 s): the last is
cost_profile.py's everything-on case. Extra steps: ``nogrpc`` (everything on, the gRPC endpoint off: the load comes over
HTTP) and ``arenas`` (everything on with ``MALLOC_ARENA_MAX=2``). Each agent's VmRSS (/proc) is read ``--window``
seconds after it is ready (the engine up, the load started; cost_profile.py reads it ~72 s after), its /metrics scraped
every 5 s. ``--baseline-venv``: another build's runtime venv (used as it is), run beside ``--venv`` in the same run:
each step once per build and round, one agent at a time, the order of the two alternating from round to round
(``--rounds``).

``--imports``: what each feature's modules add to the agent's imports in a fresh interpreter of the venv, each step
above the ones before it (the median of three; the default agent's imports first, benchmarks/import_cost.py's CHAIN),
and each alone above the default imports.

``--trace``: the everything-on agent once more under tracemalloc (12 frames, started before its first import; it
slows the agent and adds its own memory: an attribution, not a figure of RSS): what Python objects it holds after
the window, split into what imports made (a frame of importlib on the stack) and what running made, by the agent
source line (the innermost frame in inferwatch) or the package that allocated it.
"""

from __future__ import annotations

import argparse
import json
import os
import platform
import subprocess
import sys
import tempfile
import time
from contextlib import ExitStack
from pathlib import Path
from typing import Any

import httpx

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

from benchmarks.agent_overhead import RESULTS, free_port, stop, wait_ready  # noqa: E402
from benchmarks.cost_profile import (  # noqa: E402
    MetricsSink,
    Periodic,
    SpanSender,
    Viewer,
    clean_env,
    engine_env,
    engines_up,
    launch,
    series_of,
)
from benchmarks.engine_scale import LiveExposition, exposition, runtime_venv, status_kib  # noqa: E402
from benchmarks.engine_targets import simulators  # noqa: E402

# What each feature imports (and makes: an httpx client, the OTLP/HTTP exporter with its transport), in cost order.
IMPORT_STEPS = [
    ("engine: httpx and a client", "import inferwatch.agent.common.httpclient, httpx; httpx.Client()"),
    ("probe: its client", "import inferwatch.agent.node.probe.client"),
    ("probe: jsonschema (a chunk in no common shape)", "import jsonschema"),
    ("receiver: analytics", "from inferwatch.agent.node.analytics import explain, processor"),
    ("receiver: intake (protobuf, OTLP proto)", "from inferwatch.agent.node.receiver import spans"),
    ("receiver: OTLP/HTTP server", "import inferwatch.agent.node.receiver.http_server"),
    ("receiver: OTLP/gRPC server module", "import inferwatch.agent.node.receiver.grpc_server"),
    ("receiver: grpcio (the gRPC server's)", "import grpc"),
    ("export: the OTel metrics SDK", "import inferwatch.exporters.otlp"),
    ("export: http/protobuf exporter, made", "from inferwatch.exporters.otlp import make_exporter; make_exporter()"),
]
IMPORT_ENV = {
    "OTEL_EXPORTER_OTLP_METRICS_PROTOCOL": "http/protobuf",
    "OTEL_EXPORTER_OTLP_ENDPOINT": "http://127.0.0.1:9",
}
RSS_LINE = "print(next(l.split()[1] for l in open('/proc/self/status') if l.startswith('VmRSS')))"

STEPS = ["defaults", "engine", "probe", "receiver", "export", "viewer", "nogrpc", "arenas"]

# The agent under tracemalloc: a sitecustomize.py on PYTHONPATH, so it starts in the interpreter that serves (the one
# `inferwatch run` execs after its command line: agent/cli/serve.py) before its first import; a thread writes the
# snapshot's attribution to $IW_TRACE_OUT when $IW_TRACE_TRIGGER appears.
TRACED = """
import os, sys
if "--settings-fd" in sys.argv and os.environ.get("IW_TRACE_OUT"):
    import threading, time, tracemalloc
    tracemalloc.start(12)
    trigger, out = os.environ["IW_TRACE_TRIGGER"], os.environ["IW_TRACE_OUT"]
    _serving = True
else:
    _serving = False
def _attribute(snap):
    imports, running, by_line, total = {}, {}, {}, 0
    for tr in snap.traces:
        frames, size = tr.traceback, tr.size
        total += size
        files = [f.filename for f in frames]
        def where(name):
            if "site-packages/" in name:
                return name.split("site-packages/", 1)[1].split("/", 1)[0]
            return name.rsplit("/", 1)[-1]
        if any("importlib" in f for f in files):
            key = where(next((f for f in reversed(files) if "importlib" not in f), files[-1]))
            imports[key] = imports.get(key, 0) + size
            continue
        own = next((f for f in reversed(frames) if "inferwatch/" in f.filename), None)
        key = where(files[-1])
        running[key] = running.get(key, 0) + size
        if own is not None:
            line = own.filename.split("inferwatch/", 1)[1] + ":" + str(own.lineno)
            by_line[line] = by_line.get(line, 0) + size
    top = lambda d, n: dict(sorted(((k, round(v / 1e6, 3)) for k, v in d.items()), key=lambda kv: -kv[1])[:n])
    return {"traced_mb": round(total / 1e6, 2), "imports_mb": round(sum(imports.values()) / 1e6, 2),
            "running_mb": round(sum(running.values()) / 1e6, 2), "imports_by_file": top(imports, 40),
            "running_by_file": top(running, 40), "running_by_agent_line": top(by_line, 60)}
def _watch():
    while not os.path.exists(trigger):
        time.sleep(0.5)
    import gc; gc.collect()
    snap = tracemalloc.take_snapshot()
    import json
    with open(out + ".tmp", "w") as f:
        json.dump(_attribute(snap), f)
    os.rename(out + ".tmp", out)
if _serving:
    threading.Thread(target=_watch, daemon=True).start()
"""


def vm(pid: int) -> dict[str, float]:
    out = {k: round(status_kib(pid, k) / 1024, 1) for k in ("VmRSS", "RssAnon", "RssFile")}
    out["threads"] = int(status_kib(pid, "Threads"))
    return out


def run_step(python: Path, step: str, window_s: float, marker: str, trace: bool = False) -> dict[str, Any]:
    on = STEPS[: STEPS.index(step) + 1] if step in STEPS[:6] else STEPS[:6]
    with ExitStack() as stack, tempfile.TemporaryDirectory(prefix="feature-memory-") as tmp:
        env = {
            **clean_env(),
            "INFERWATCH_LOG_LEVEL": "warning",
            "INFERWATCH_RUNTIME__CMDLINE_PATTERN": marker,
            "INFERWATCH_SNAPSHOTS__DIR": f"{tmp}/snap",
            "INFERWATCH_EVIDENCE__DIR": f"{tmp}/evidence",
        }
        if "engine" in on:
            text, gen = exposition(10)
            live = LiveExposition(gen)
            stack.callback(live.close)
            env.update(engine_env(live.url, 10, series_of(text)))
        if "probe" in on:
            ports = stack.enter_context(simulators(1))
            env["INFERWATCH_PROBE__URL"] = f"http://127.0.0.1:{ports[0]}"
        http_port = free_port()
        if "receiver" in on:
            env.update(
                INFERWATCH_RECEIVER__ENABLED="true",
                INFERWATCH_RECEIVER__HTTP_ENDPOINT=f"127.0.0.1:{http_port}",
                INFERWATCH_RECEIVER__GRPC_ENDPOINT="" if step == "nogrpc" else f"127.0.0.1:{free_port()}",
            )
        if "export" in on:
            sink = MetricsSink()
            stack.callback(sink.close)
            env["OTEL_EXPORTER_OTLP_METRICS_ENDPOINT"] = sink.url
            env["OTEL_EXPORTER_OTLP_METRICS_PROTOCOL"] = "http/protobuf"
        if step == "arenas":
            env["MALLOC_ARENA_MAX"] = "2"
        port = free_port()
        argv = ["run", "--port", str(port), "--interval", "5"]
        trigger, traced = Path(tmp) / "trigger", Path(tmp) / "traced.json"
        cmd = [str(python), "-m", "inferwatch.agent", *argv]
        if trace:
            (Path(tmp) / "sitecustomize.py").write_text(TRACED)
            env.update(PYTHONPATH=tmp, IW_TRACE_TRIGGER=str(trigger), IW_TRACE_OUT=str(traced))
        agent = launch(cmd, env, Path(tmp))
        stack.callback(stop, agent)
        base = f"http://127.0.0.1:{port}"
        wait_ready(f"{base}/readyz", agent, timeout_s=240)
        if "engine" in on:
            engines_up(f"{base}/metrics", 1)
        ready = vm(agent.pid)
        if "receiver" in on:
            sender = SpanSender(f"http://127.0.0.1:{http_port}/v1/traces", 100)
            sender.start()
            stack.callback(sender.close)
        if "viewer" in on:
            stack.callback(Viewer(base).close)
        scraper = httpx.Client(timeout=120)
        stack.callback(scraper.close)
        stack.callback(Periodic(lambda: scraper.get(f"{base}/metrics").close(), 5.0).close)
        time.sleep(window_s)
        row: dict[str, Any] = {"step": step, "features": on, "ready": ready, "after_window": vm(agent.pid)}
        row["load_average"] = [round(x, 2) for x in os.getloadavg()]
        if "receiver" in on:
            row["spans_sent"] = sender.sent
        if trace:
            trigger.touch()
            deadline = time.monotonic() + 300
            while not traced.exists() and time.monotonic() < deadline:
                time.sleep(1)
            row["tracemalloc"] = json.loads(traced.read_text()) if traced.exists() else None
        return row


def import_steps(python: Path) -> dict[str, float]:
    from benchmarks.import_cost import CHAIN, chain_step

    env = {**clean_env(), **IMPORT_ENV}

    def rss(code: str) -> float:
        runs = []
        for _ in range(3):
            out = subprocess.run([str(python), "-c", f"{code}\n{RSS_LINE}"], capture_output=True, text=True,
                                 cwd=tempfile.gettempdir(), env=env, check=True)  # fmt: skip
            runs.append(int(out.stdout.split()[-1]) / 1024)
        return sorted(runs)[1]

    base = "import asyncio\n" + "\n".join(chain_step(m) for m in CHAIN)
    out = {"default_imports_mb": round(rss(base), 1)}
    code, prev = base, out["default_imports_mb"]
    for name, step in IMPORT_STEPS:
        code += "\n" + step
        now = rss(code)
        out[name] = round(now - prev, 1)
        prev = now
        print(f"{name:45s} +{out[name]:5.1f} MB", flush=True)
    out["all_features_mb"] = round(prev, 1)
    for name, step in IMPORT_STEPS:
        out[f"alone: {name}"] = round(rss(f"{base}\n{step}") - out["default_imports_mb"], 1)
    return out


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--venv", type=Path, default=ROOT / "build" / "cost-venv")
    ap.add_argument("--installed", action="store_true", help="use the venv as it is (do not reinstall this checkout)")
    ap.add_argument("--window", type=float, default=70.0)
    ap.add_argument("--steps", default=",".join(STEPS))
    ap.add_argument("--baseline-venv", type=Path, help="another build's runtime venv, as it is, run beside --venv")
    ap.add_argument("--rounds", type=int, default=1)
    ap.add_argument("--imports", action="store_true", help="also each feature's imports, step by step")
    ap.add_argument("--trace", action="store_true", help="also the everything-on agent under tracemalloc")
    ap.add_argument("--out", type=Path, default=RESULTS / "feature_memory.json")
    args = ap.parse_args()
    python = args.venv / "bin" / "python" if args.installed else runtime_venv(args.venv)
    builds = [("candidate", python)]
    if args.baseline_venv:
        builds.append(("baseline", args.baseline_venv / "bin" / "python"))
    record: dict[str, Any] = {
        "benchmark": "feature_memory",
        "date": time.strftime("%Y-%m-%d %H:%M UTC", time.gmtime()),
        "machine": f"{platform.machine()}, {os.cpu_count()} CPUs, Python {platform.python_version()}",
        "venv": str(args.venv),
        "baseline_venv": str(args.baseline_venv) if args.baseline_venv else None,
        "window_s": args.window,
        "load_average_start": [round(x, 2) for x in os.getloadavg()],
        "steps": [],
    }
    marker = f"feature-memory-runtime-{os.getpid()}"
    runtime = launch([sys.executable, "-c", "import time; time.sleep(7200)", marker], clean_env(), ROOT)
    try:
        if args.imports:
            record["imports"] = import_steps(python)
        for rnd in range(args.rounds):
            prev: dict[str, float | None] = {name: None for name, _ in builds}
            for step in filter(None, args.steps.split(",")):
                for name, interpreter in builds[rnd % 2 :] + builds[: rnd % 2]:  # the first build alternates
                    row = run_step(interpreter, step, args.window, marker)
                    row["build"], row["round"] = name, rnd + 1
                    rss = row["after_window"]["VmRSS"]
                    before = prev[name]
                    row["adds_mb"] = round(rss - before, 1) if before is not None and step in STEPS[:6] else None
                    prev[name] = rss if step in STEPS[:6] else before
                    record["steps"].append(row)
                    after = row["after_window"]
                    print(f"{name:9s} {step:9s} ready {row['ready']['VmRSS']:6.1f}  after {rss:6.1f} MB  "
                          f"(+{row['adds_mb']})  anon {after['RssAnon']}  threads {after['threads']}  "
                          f"load {row['load_average'][0]}", flush=True)  # fmt: skip
        if args.trace:
            row = run_step(python, "viewer", args.window, marker, trace=True)
            record["traced"] = row
            print(json.dumps(row.get("tracemalloc"), indent=1)[:6000], flush=True)
    finally:
        stop(runtime)
    record["load_average_end"] = [round(x, 2) for x in os.getloadavg()]
    args.out.write_text(json.dumps(record, indent=1) + "\n")
    print(f"wrote {args.out}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
