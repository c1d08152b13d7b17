"""Time from a hang's start to the page, with the agent's push to Alertmanager, at production timings.

The real binaries as a user runs them: Prometheus scraping and evaluating every 15 s with its default resend delay
and the shipped rules unscaled, Alertmanager with the shipped routes (critical: ``group_wait 10s``) delivering to
a local PagerDuty Events v2 sink, the agent with its defaults plus ``alertmanager.urls``, two simulators under
loadgen (4 requests/s each): one engine, and a data-parallel pair (``--engines 2``).

HANGS hangs of four shapes, back to back, each against a fresh agent (a new ``instance``: an Alertmanager group that
was paged waits its 5 min ``group_interval`` before it notifies again, so a re-used instance would measure the route,
not the detection):

- ``stream``: every rank stops producing tokens while streams are open mid-response (the simulator's ``hang``);
- ``dp_rank``: one rank of the data-parallel pair stops (``hang:engine=1``), the other keeps serving;
- ``sigstop``: the engine process is stopped (SIGSTOP): nothing answers, connections are accepted by the kernel;
- ``loop_block``: the server's event loop blocks (the simulator's ``loop_block``).

Per hang: seconds from the hang's start to the agent's alert (``startsAt`` in Alertmanager), to the page at the
sink, and to the evidence bundle listed by the agent's API. Baseline in the same run (``--baseline N``): the
``stream`` shape with the push off, i.e. the Prometheus rule path alone.

    .venv/bin/python benchmarks/hang_push.py [--hangs 20] [--baseline 3]

Raw results: benchmarks/results/hang_push.json; figures: docs/alerts.md.
"""

from __future__ import annotations

import argparse
import contextlib
import json
import os
import signal
import statistics
import sys
import tempfile
import threading
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import httpx

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

from tests.conftest import PYTHON, free_port  # noqa: E402
from tests.e2e.harness import Sink, pipeline  # noqa: E402
from tests.e2e.test_alert_pipeline import SimProc, _start_simulator, _wait_generation_tokens  # noqa: E402
from tests.procs import running, wait_http  # noqa: E402

RESULTS = ROOT / "benchmarks" / "results" / "hang_push.json"
SHAPES = ("stream", "dp_rank", "sigstop", "loop_block")
TOKEN = "bench-evidence-token-0123456789"
WARM_S = 12.0  # collections of a serving engine before the hang (the engine is read every 2 s)
PAGE_WAIT_S = 120.0
BASELINE_WAIT_S = 240.0
LOOP_BLOCK_S = 45.0


class EvidenceWatch:
    """Polls the agent's evidence list every 0.25 s; the wall time each bundle was first listed."""

    def __init__(self, base: str) -> None:
        self.base, self.seen = base, dict[str, float]()
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._run, daemon=True)
        self._thread.start()

    def _run(self) -> None:
        headers = {"Authorization": f"Bearer {TOKEN}"}
        while not self._stop.wait(0.25):
            with contextlib.suppress(httpx.HTTPError, ValueError, KeyError):
                for b in httpx.get(f"{self.base}/api/v1/evidence", headers=headers, timeout=2).json()["evidence"]:
                    self.seen.setdefault(b["id"], time.time())

    def stop(self) -> None:
        self._stop.set()
        self._thread.join(5)


@contextlib.contextmanager
def agent(work: Path, sim: SimProc, pl: Any, push: bool) -> Iterator[tuple[int, str]]:
    port = free_port()
    base = f"http://127.0.0.1:{port}"
    d = work / f"agent-{port}"
    d.mkdir()
    (d / "tokens").write_text(f"{TOKEN} evidence,read alertmanager\n")
    env = {
        "INFERWATCH_ENGINE__METRICS_URL": f"{sim.url}/metrics",
        "INFERWATCH_API__TOKENS_FILE": str(d / "tokens"),
        "INFERWATCH_SNAPSHOTS__DIR": str(d / "snap"),
        "INFERWATCH_EVIDENCE__DIR": str(d / "evidence"),
        "INFERWATCH_RUNTIME__PID": str(sim.proc.pid),
    }
    if push:
        env |= {
            "INFERWATCH_ALERTMANAGER__URLS": json.dumps([pl.alertmanager_url]),
            "INFERWATCH_ALERTMANAGER__INSTANCE": f"127.0.0.1:{port}",
            "INFERWATCH_ALERTMANAGER__LABELS": json.dumps({"runbook_base": pl.runbook_base}),
        }
    cmd = [PYTHON, "-m", "inferwatch.agent", "run", "--port", str(port)]
    with running(cmd, d / "agent.log", cwd=ROOT, env=env) as proc:
        wait_http(f"{base}/metrics", ok=lambda r: r.status_code == 200, proc=proc, timeout_s=60)
        pl.set_targets([port])
        yield port, base


def inject(shape: str, sim: SimProc) -> None:
    if shape == "stream":
        sim.control({"enable": "hang"})
    elif shape == "dp_rank":
        sim.control({"enable": {"name": "hang", "params": {"engine": 1}}})
    elif shape == "sigstop":
        os.kill(sim.proc.pid, signal.SIGSTOP)
    elif shape == "loop_block":
        sim.control({"enable": {"name": "loop_block", "params": {"seconds": LOOP_BLOCK_S}}})


def clear(shape: str, sim: SimProc) -> None:
    if shape in ("stream", "dp_rank"):
        sim.control({"disable": "hang"})
    elif shape == "sigstop":
        os.kill(sim.proc.pid, signal.SIGCONT)
    elif shape == "loop_block":  # ends by itself; wait until the server answers again
        wait_http(f"{sim.url}/health", timeout_s=LOOP_BLOCK_S + 30)


def am_alerts(am_url: str, instance: str) -> list[dict[str, Any]]:
    r = httpx.get(f"{am_url}/api/v2/alerts", params={"filter": f'instance="{instance}"'}, timeout=5)
    r.raise_for_status()
    return [a for a in r.json() if a["labels"].get("severity") == "critical"]


def _ts(iso: str) -> float:
    from datetime import datetime

    return datetime.fromisoformat(iso.replace("Z", "+00:00")).timestamp()


def one(work: Path, shape: str, sim: SimProc, sink: Sink, pl: Any, push: bool) -> dict[str, Any]:
    with agent(work, sim, pl, push) as (port, base):
        instance = f"127.0.0.1:{port}"
        watch = EvidenceWatch(base)
        time.sleep(WARM_S)
        t0_wall, t0 = time.time(), time.monotonic()
        load1 = os.getloadavg()[0]
        inject(shape, sim)
        try:
            page = sink.wait_for(
                lambda d: d.receiver == "pagerduty" and d.instance == instance and d.action == "trigger",
                PAGE_WAIT_S if push else BASELINE_WAIT_S,
            )
            held = am_alerts(pl.alertmanager_url, instance)
            time.sleep(3 if push else 0)  # the bundle, when it comes after the page
        finally:
            clear(shape, sim)
        watch.stop()
        out: dict[str, Any] = {"shape": shape, "push": push, "instance": instance, "load1": round(load1, 2)}
        out["page_s"] = round(page.t - t0, 2) if page is not None else None
        out["alertname"] = page.alertname if page is not None else None
        starts = [_ts(a["startsAt"]) for a in held]
        out["alert_s"] = round(min(starts) - t0_wall, 2) if starts else None
        bundles = sorted(t for t in watch.seen.values() if t >= t0_wall)
        out["bundle_s"] = round(bundles[0] - t0_wall, 2) if bundles else None
        # wait for the alert to resolve (the next hang's agent must start from a serving engine)
        deadline = time.monotonic() + 60
        while am_alerts(pl.alertmanager_url, instance) and time.monotonic() < deadline:
            time.sleep(1)
        _wait_generation_tokens(sim.url, 60)
        print(json.dumps(out), flush=True)
        return out


def _pct(xs: list[float], q: float) -> float | None:
    if not xs:
        return None
    xs = sorted(xs)
    k = max(0, min(len(xs) - 1, round(q * (len(xs) - 1))))
    return xs[k]


def summary(rows: list[dict[str, Any]], key: str) -> dict[str, Any]:
    xs = [r[key] for r in rows if r.get(key) is not None]
    return {
        "n": len(xs),
        "missing": len(rows) - len(xs),
        "p50": statistics.median(xs) if xs else None,
        "p95": _pct(xs, 0.95),
        "max": max(xs) if xs else None,
    }


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--hangs", type=int, default=20)
    ap.add_argument("--baseline", type=int, default=3)
    args = ap.parse_args()
    rows: list[dict[str, Any]] = []
    started = time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime())
    load_start = os.getloadavg()
    with tempfile.TemporaryDirectory(prefix="hang-push-") as tmp, contextlib.ExitStack() as stack:
        work = Path(tmp)
        sink = stack.enter_context(Sink())
        single = _start_simulator(stack, work, "llama-single")
        pair = _start_simulator(stack, work, "llama-pair", "--engines", "2")
        for sim in (single, pair):
            wait_http(f"{sim.url}/health", proc=sim.proc, timeout_s=60)
            loadgen = [
                PYTHON,
                "-m",
                "inferwatch.agent",
                "loadgen",
                "--url",
                sim.url,
                "--rate",
                "4",
                "--duration",
                "7200",
            ]
            loadgen += ["--output-tokens", "32", "--timeout", "600", "--seed", "6", "--no-progress"]
            stack.enter_context(running(loadgen, work / f"loadgen-{sim.model}.log", cwd=ROOT))
            _wait_generation_tokens(sim.url, 120)
        runbook_base = "http://127.0.0.1:9436/runbooks"
        pl = stack.enter_context(pipeline(work / "pipeline", sink, [], runbook_base, production=True))
        pl.runbook_base = runbook_base  # type: ignore[attr-defined]
        for i in range(args.hangs):
            shape = SHAPES[i % len(SHAPES)]
            rows.append(one(work, shape, pair if shape == "dp_rank" else single, sink, pl, True))
        for _ in range(args.baseline):
            rows.append(one(work, "stream", single, sink, pl, False))
    pushed = [r for r in rows if r["push"]]
    base = [r for r in rows if not r["push"]]
    report = {
        "started": started,
        "command": "benchmarks/hang_push.py " + " ".join(sys.argv[1:]),
        "timings": "Prometheus 15 s scrape/evaluation, shipped rules and routes (critical group_wait 10s)",
        "ended": time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime()),
        "load_average": {  # the machine is shared: 1/5/15-minute load at start and end, 1-minute at each hang
            "start": [round(x, 2) for x in load_start],
            "end": [round(x, 2) for x in os.getloadavg()],
            "at_hangs": summary(rows, "load1"),
            "cpus": os.cpu_count(),
        },
        "push": {k: summary(pushed, k) for k in ("alert_s", "page_s", "bundle_s")},
        "by_shape": {s: summary([r for r in pushed if r["shape"] == s], "page_s") for s in SHAPES},
        "alert_by_shape": {s: summary([r for r in pushed if r["shape"] == s], "alert_s") for s in SHAPES},
        "baseline_rule_only": summary(base, "page_s"),
        "rows": rows,
    }
    RESULTS.write_text(json.dumps(report, indent=2) + "\n")
    print(json.dumps({k: v for k, v in report.items() if k != "rows"}, indent=2))
    return 0


if __name__ == "__main__":
    sys.exit(main())
