"""Fleet drill at production timings: ten simulated nodes, the shipped rules and routes, a local pager.

Eight nodes serve from the start, each with its own identity (tests/fleet.py: recorded cpuinfo and meminfo
trees, DMI machine type, a fake NVML GPU, a simulator on the matching --hardware profile with its model, load
from ``inferwatch loadgen`` at 2 req/s with lognormal prompts). vmagent scrapes the agents and the engines every
15 s and remote-writes to VictoriaMetrics; vmalert evaluates alerts/*.rules.yml unchanged every 15 s and notifies
Alertmanager running the shipped alertmanager.yml (only receiver URLs and the key file replaced), which delivers
to a local PagerDuty Events v2 / webhook sink.

Phases: a healthy phase (default 30 min) with noise — load steps, a runtime restart, a model redeploy, a node
joining and leaving — where every delivery is a false page; then every fault at once, each on its own node (three
nodes carry two independent faults: different alerts, different Alertmanager groups); each fault recovers a
minute after its page arrived (or when it never arrives within --deliver-timeout), and its resolution is awaited.
Finally ``inferwatch matrix`` (raw and --recorded) reads the fleet storage.

    .venv/bin/python benchmarks/fleet_drill.py                          # ~65 min
    .venv/bin/python benchmarks/fleet_drill.py --healthy-s 60 --deliver-timeout 45 --resolve-timeout 20 --smoke
    .venv/bin/python benchmarks/fleet_drill.py --faults bimodal --healthy-s 120 --results FILE   # a subset, no noise

Writes benchmarks/results/fleet_drill.json (not with --smoke) and prints the docs/benchmarks.md table.

``--set issue33``: the engine-signal set: its faults and named causes (ISSUE33), one node per engine feature, on one
Prometheus as compose runs it (``--backend vm`` for vmalert), started empty; writes
benchmarks/results/fleet_drill_issue33.json, and ``--doc`` turns its last run into the table of docs/alerts.md:

    .venv/bin/python benchmarks/fleet_drill.py --set issue33 --healthy-s 1800 --hold 120 --settle 360   # ~50 min
    .venv/bin/python benchmarks/fleet_drill.py --doc
"""

from __future__ import annotations

import argparse
import json
import os
import platform
import shutil
import signal
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

from tests.e2e.harness import Sink  # noqa: E402
from tests.fleet import (  # noqa: E402
    CATALOG,
    Fleet,
    Timings,
    faults,
    hardware_types,
    matrix,
    noise,
    result_json,
    run_drill,
)

RESULTS = ROOT / "benchmarks" / "results" / "fleet_drill.json"
NODES = ("p5-h100", "p4d-a100", "g6e-l40s", "p5e-h100", "m7i-spr", "c7g-graviton3", "r8g-graviton4", "a3-h100")
JOINER, NOSVE = "c7g-joiner", "c7g-nosve"  # joins and leaves in the healthy phase; joins booted with arm64.nosve
ASSIGN = {  # simd_missing last: its node boots (~30 s here) before it joins
    "page_cache_pressure": "c7g-graviton3",
    "bimodal": "p5-h100",
    "tail_ratio": "p4d-a100",
    "hardware_mismatch": "a3-h100",
    "stream_usage_only": "p4d-a100",
    "debug_in_production": "a3-h100",
    "hang": "r8g-graviton4",
    "engine_down": "g6e-l40s",
    "ttft_burn": "p5e-h100",
    "error_burst": "m7i-spr",
    "simd_fallback": "m7i-spr",
    "simd_missing": "c7g-nosve",
}
# The engine-signal set: each engine-signal fault and named cause on its own node with the engine feature it needs
# (spec decode, LoRA, a KV connector, two data-parallel ranks, the runtime's process and cgroup found by the agent), and
# a hang whose backlog must not page again after it recovers.
# Run with --set issue33 (these nodes only, on Prometheus by default: compose's stack).
ISSUE33 = {
    "prefix_cache_collapse": "p5-prefix",
    "spec_decode_collapse": "p5-spec",
    "kv_saturation": "p5-kv",
    "lora_slot_exhaustion": "p5-lora",
    "slow_kv_transfer": "p5-pd",
    "slow_rank": "p5-dp",
    "frontend_delay": "p5-frontend",
    "hang": "p5-hang",
    "simd_fallback_restart": "p5-simd",
    "cgroup_thrashing": "p5-cgroup",
}
NOISE_ROLES = {
    "load_a": "p5-h100",
    "load_b": "c7g-graviton3",
    "restart": "p4d-a100",
    "redeploy": "g6e-l40s",
    "joiner": "c7g-joiner",
}
BINARIES = ("victoria-metrics", "vmagent", "vmalert", "prometheus-alertmanager")


def _fmt(v: float | None) -> str:
    return "—" if v is None else f"{v:.0f} s" if v < 120 else f"{v / 60:.1f} min"


def table(data: dict[str, Any]) -> str:
    rows = [
        "| pitfall | node (machine type) | alert → receiver | injection → delivery | target | met | "
        "recovery → resolved | also delivered for this node |",
        "|---|---|---|---|---|---|---|---|",
    ]
    for f in data["faults"]:
        met = "—" if f["delivered_s"] is None else ("yes" if f["delivered_s"] <= f["target_s"] else "no")
        if f["delivered_s"] is None:
            met = "no (never)"
        rows.append(
            f"| {f['fault']} | {f['node']} ({f['machine_type']}) | {f['alertname']} → {f['receiver']} | "
            f"{_fmt(f['delivered_s'])} | ≤ {_fmt(f['target_s'])} | {met} | {_fmt(f['resolved_s'])} | "
            f"{', '.join(f['other_deliveries']) or '—'} |"
        )
    return "\n".join(rows)


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--healthy-s", type=float, default=1800.0)
    ap.add_argument("--deliver-timeout", type=float, default=1080.0, help="per fault, seconds (default 18 min)")
    ap.add_argument("--resolve-timeout", type=float, default=600.0, help="per fault, seconds (default 10 min)")
    ap.add_argument("--hold", type=float, default=60.0, help="fault kept on after its page arrived, seconds")
    ap.add_argument(
        "--settle",
        type=float,
        default=0.0,
        help="seconds of watching after every fault resolved: later deliveries count as collateral (Alertmanager's "
        "group_interval is 5 min: a symptom freed from inhibition comes within it)",
    )
    ap.add_argument("--smoke", action="store_true", help="do not write the results file")
    ap.add_argument("--keep", action="store_true", help="keep the work directory (logs)")
    ap.add_argument("--faults", help="comma-separated subset of the faults (only their nodes run; no noise)")
    ap.add_argument("--results", type=Path, default=RESULTS, help="where the JSON goes")
    ap.add_argument("--set", choices=("fleet", "issue33"), default="fleet", help="which faults and nodes")
    ap.add_argument(
        "--backend",
        choices=("vm", "prometheus"),
        help="vm: vmagent → VictoriaMetrics ← vmalert; prometheus: one Prometheus as compose runs it "
        "(default: vm for --set fleet, prometheus for --set issue33)",
    )
    args = ap.parse_args()
    if args.set == "issue33":
        return run_issue33(args)
    missing = [b for b in BINARIES if shutil.which(b) is None]
    if missing:
        raise SystemExit(f"not installed: {missing} (Debian: victoria-metrics prometheus-alertmanager)")
    binaries = {b: str(shutil.which(b)) for b in BINARIES}

    def stop(signum: int, frame: object) -> None:
        raise KeyboardInterrupt(f"signal {signum}")

    signal.signal(signal.SIGTERM, stop)
    tmp = Path(tempfile.mkdtemp(prefix="fleet-drill-"))
    print(f"work directory {tmp}", flush=True)
    started = time.time()

    def log(msg: str) -> None:
        print(f"[{time.strftime('%H:%M:%S')}] {msg}", flush=True)

    rules = sorted((ROOT / "alerts").glob("*.rules.yml"))
    assign, nodes, events = ASSIGN, NODES, noise(NOISE_ROLES)
    if args.faults:
        assign = {k: v for k, v in ASSIGN.items() if k in args.faults.split(",")}
        nodes = tuple(n for n in NODES if n in assign.values())
        events = []
    timings = Timings()
    with Sink() as sink:
        fleet = Fleet(tmp, sink, timings, [CATALOG[n] for n in (*nodes, JOINER, NOSVE)])
        with fleet.running(nodes, rules, binaries):
            log(f"fleet up: VictoriaMetrics {fleet.vm}, vmalert {fleet.vmalert}, Alertmanager {fleet.alertmanager}")
            result = run_drill(
                fleet,
                args.healthy_s,
                events,
                faults(assign),
                args.deliver_timeout,
                args.resolve_timeout,
                args.hold,
                log,
            )
            raw = matrix(fleet.vm, "30m", recorded=False)
            recorded = matrix(fleet.vm, "30m", recorded=True)
            whole = f"{int((time.time() - started) / 60) + 5}m"  # the whole run: the joiner left long ago
            raw_all = matrix(fleet.vm, whole, recorded=False)
            recorded_all = matrix(fleet.vm, whole, recorded=True)
    expected = sorted({CATALOG[n].machine_type for n in fleet.ever})
    data = {
        "what": "fleet drill at production timings (benchmarks/fleet_drill.py)",
        "started_utc": time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime(started)),
        "wall_s": round(time.time() - started),
        "timings": "vmagent scrape 15s, vmalert evaluation 15s, alerts/*.rules.yml unchanged, shipped "
        "alertmanager.yml (receivers at a local sink), agents at 15s (probe 30s, runtime profile 60s), "
        "loadgen 2 req/s per node, prompts lognormal:512:0.6, 32 output tokens",
        "nodes": {
            n.name: {
                "hardware": n.hardware,
                "machine_type": n.machine_type,
                "cpuinfo": n.cpuinfo,
                "gpu": n.gpu,
                "model": n.model,
            }
            for n in (CATALOG[x] for x in (*NODES, JOINER, NOSVE))
        },
        **result_json(result),
        "matrix": {
            "expected_machine_types": expected,
            "raw_30m": sorted(hardware_types(raw)),
            "recorded_30m": sorted(hardware_types(recorded)),
            "whole_run_window": whole,
            "raw_whole_run": sorted(hardware_types(raw_all)),
            "recorded_whole_run": sorted(hardware_types(recorded_all)),
            "raw_error": raw.get("error"),
            "recorded_error": recorded.get("error"),
            "raw_models": raw.get("models"),
        },
    }
    print(json.dumps(data, indent=2))
    print(table(data))
    if not args.smoke:
        args.results.parent.mkdir(parents=True, exist_ok=True)
        args.results.write_text(json.dumps(data, indent=2) + "\n")
        print(f"wrote {args.results}")
    if not args.keep:
        shutil.rmtree(tmp, ignore_errors=True)
    return 0


ISSUE33_RESULTS = ROOT / "benchmarks" / "results" / "fleet_drill_issue33.json"


def run_issue33(args: argparse.Namespace) -> int:
    """The engine-signal set: every node of ISSUE33 at once (its own simulator, agent and loadgen, as compose wires
    one), a healthy phase, every fault at once, then recovery; Prometheus (or vmalert) with the shipped rules and routes
    unchanged at 15 s, started empty: no history."""
    backend = args.backend or "prometheus"
    needed = ("prometheus", "promtool", "prometheus-alertmanager") if backend == "prometheus" else BINARIES
    missing = [b for b in needed if shutil.which(b) is None]
    if missing:
        raise SystemExit(f"not installed: {missing}")
    binaries = {b: str(shutil.which(b)) for b in BINARIES if shutil.which(b)}

    def stop(signum: int, frame: object) -> None:
        raise KeyboardInterrupt(f"signal {signum}")

    signal.signal(signal.SIGTERM, stop)
    tmp = Path(tempfile.mkdtemp(prefix="fleet-drill-33-"))
    print(f"work directory {tmp}", flush=True)
    started = time.time()

    def log(msg: str) -> None:
        print(f"[{time.strftime('%H:%M:%S')}] {msg}", flush=True)

    assign = dict(ISSUE33)
    if args.faults:
        assign = {k: v for k, v in assign.items() if k in args.faults.split(",")}
    nodes = tuple(dict.fromkeys(assign.values()))
    rules = sorted((ROOT / "alerts").glob("*.rules.yml"))
    with Sink() as sink:
        fleet = Fleet(tmp, sink, Timings(), [CATALOG[n] for n in nodes])
        fleet.backend = backend
        with fleet.running(nodes, rules, binaries):
            log(f"fleet up ({backend}): {fleet.vm}, Alertmanager {fleet.alertmanager}")
            result = run_drill(
                fleet,
                args.healthy_s,
                [],
                faults(assign),
                args.deliver_timeout,
                args.resolve_timeout,
                args.hold,
                log,
                args.settle,
            )
    data = {
        "what": "issue 33 drill at production timings (benchmarks/fleet_drill.py --set issue33)",
        "started_utc": time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime(started)),
        "wall_s": round(time.time() - started),
        "machine": f"{platform.node()} ({os.cpu_count()} CPUs, {platform.machine()}), load average at the end "
        f"{os.getloadavg()[0]:.1f}",
        "backend": backend,
        "timings": "scrape 15s, evaluation 15s, alerts/*.rules.yml unchanged, shipped alertmanager.yml (receivers at "
        "a local sink), agents at 15s, loadgen 2 req/s per node, prompts lognormal:512:0.6, 32 output tokens, "
        "no history (empty storage at start)",
        "command": " ".join(["benchmarks/fleet_drill.py", *sys.argv[1:]]),
        "nodes": {n: {"model": CATALOG[n].model, "sim_args": list(CATALOG[n].sim_args)} for n in nodes},
        **result_json(result),
    }
    print(json.dumps(data, indent=2))
    print(issue33_table(data))
    if not args.smoke:
        out = args.results if args.results != RESULTS else ISSUE33_RESULTS
        out.parent.mkdir(parents=True, exist_ok=True)
        out.write_text(json.dumps(data, indent=2) + "\n")
        print(f"wrote {out}")
    if not args.keep:
        shutil.rmtree(tmp, ignore_errors=True)
    return 0


def baseline(fault: dict[str, Any]) -> str:
    """`` (baseline: recent)`` where the delivered alert compared with a baseline (day-0 or history), else ''."""
    return f" (baseline: {fault['baseline']})" if fault.get("baseline") else ""


def issue33_table(data: dict[str, Any]) -> str:
    """The docs/alerts.md table of an issue-33 run: per scenario, what reached a person and when."""
    rows = [
        f"Run {data['started_utc']} on {data['machine']}; {data['backend']}; healthy phase "
        f"{data['healthy_phase_s'] / 60:.0f} min with {len(data['healthy_deliveries'])} deliveries other than "
        f"Watchdog. Command: `.venv/bin/python {data['command']}`.",
        "",
        "| scenario | node | expected alert → receiver | injection → delivery | ≤ target | repeats | "
        "recovery → resolved | also delivered for this node |",
        "|---|---|---|---|---|---|---|---|",
    ]
    for f in data["faults"]:
        met = "no (never)" if f["delivered_s"] is None else ("yes" if f["delivered_s"] <= f["target_s"] else "no")
        rows.append(
            f"| `{f['fault']}` | {f['node']} | {f['alertname']}{baseline(f)} → {f['receiver']} | "
            f"{_fmt(f['delivered_s'])} | "
            f"{met} (≤ {_fmt(f['target_s'])}) | {f.get('repeats', 0)} | {_fmt(f['resolved_s'])} | "
            f"{', '.join(f['other_deliveries']) or '—'} |"
        )
    return "\n".join(rows)


DOC = ROOT / "docs" / "alerts.md"
BEGIN, END = "<!-- drill-table:begin (benchmarks/fleet_drill.py --doc) -->", "<!-- drill-table:end -->"


def write_doc(results: Path = ISSUE33_RESULTS, doc: Path = DOC) -> None:
    """Replace the table between the markers of docs/alerts.md with the one of the last run's JSON (and of each
    ``<results stem>_*.json`` beside it: a subset re-run with ``--faults``, ``--results``)."""
    text = doc.read_text()
    if BEGIN not in text or END not in text:
        raise SystemExit(f"{doc}: no drill-table markers")
    head, rest = text.split(BEGIN, 1)
    _, tail = rest.split(END, 1)
    runs = [results, *sorted(results.parent.glob(f"{results.stem}_*.json"))]
    table = "\n\n".join(issue33_table(json.loads(r.read_text())) for r in runs)
    doc.write_text(f"{head}{BEGIN}\n{table}\n{END}{tail}")


if __name__ == "__main__":
    if sys.argv[1:] == ["--doc"]:
        write_doc()
        sys.exit(0)
    sys.exit(main())
