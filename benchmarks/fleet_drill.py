"""Drill at production timings: every scenario the simulator makes, on stacks started empty, to a local pager.

One command runs every scenario (``--set all``, the default) in two parts, each on its own cold stack (no history):

- the fleet set: ten simulated nodes, each with its own identity (tests/fleet.py: recorded cpuinfo and meminfo
  trees, DMI machine type, a fake NVML GPU, a simulator on the matching --hardware profile with its model, load from
  ``inferwatch loadgen`` at 2 req/s with lognormal prompts); vmagent scrapes the agents and the engines every 15 s
  and remote-writes to VictoriaMetrics; vmalert evaluates alerts/*.rules.yml unchanged every 15 s. Its healthy
  phase has noise — load steps, a runtime restart, a model redeploy, a node joining and leaving — and it ends with
  ``inferwatch matrix`` (raw and --recorded) over the fleet storage;
- the engine-signal set: one node per engine feature (spec decode, LoRA, a KV connector, two data-parallel ranks,
  the runtime's process and cgroup found by the agent) and the named causes, on one Prometheus as compose runs it,
  with a quiet healthy phase (default 30 min).

Both alert through Alertmanager running the shipped alertmanager.yml (only receiver URLs and the key file
replaced) to a local PagerDuty Events v2 / webhook sink, and every agent pushes its critical findings to that
Alertmanager as docker-compose.yml wires it (``--no-push``: the rules alone). In each part, every delivery in the
healthy phase is a false page; then every fault at once, each on its own node (some nodes carry two independent
faults: different alerts, different Alertmanager groups); each fault recovers ``--hold`` after its page arrived (or
when it never arrives within --deliver-timeout), its resolution is awaited, and ``--settle`` more seconds count
late deliveries (a backlog's page, a symptom freed from inhibition) as collateral.

    .venv/bin/python benchmarks/fleet_drill.py --hold 120 --settle 360 --deliver-timeout 420  # ~80 min
    .venv/bin/python benchmarks/fleet_drill.py --set fleet --healthy-s 60 --deliver-timeout 45 --smoke
    .venv/bin/python benchmarks/fleet_drill.py --faults bimodal,hang --healthy-s 120 --results FILE   # a subset
    .venv/bin/python benchmarks/fleet_drill.py --faults bimodal --noise --healthy-s 600   # one fault, the noise too
    .venv/bin/python benchmarks/fleet_drill.py --doc   # docs/alerts.md's table from results/fleet_drill_all.json

Writes benchmarks/results/fleet_drill_all.json (``--set fleet``: fleet_drill.json, ``--set issue33``:
fleet_drill_issue33.json; not with --smoke) and prints the table ``--doc`` puts in docs/alerts.md.
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


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument(
        "--set",
        choices=("all", "fleet", "issue33"),
        default="all",
        help="all: every scenario the simulator makes, the fleet set then the engine-signal set, each on its own "
        "cold stack (default); fleet or issue33: one of them",
    )
    ap.add_argument(
        "--healthy-s",
        type=float,
        help="healthy phase, seconds (default: 1800; 600 for the fleet part "
        "of --set all, whose noise the engine-signal part's quiet 30 minutes do not have)",
    )
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
    ap.add_argument(
        "--noise", action="store_true", help="with --faults: the fleet set's healthy noise too (and its nodes)"
    )
    ap.add_argument("--results", type=Path, help="where the JSON goes (default: per --set, under benchmarks/results)")
    ap.add_argument(
        "--backend",
        choices=("vm", "prometheus"),
        help="vm: vmagent → VictoriaMetrics ← vmalert; prometheus: one Prometheus as compose runs it "
        "(default: vm for the fleet set, prometheus for the engine-signal set)",
    )
    ap.add_argument("--no-push", action="store_true", help="agents do not push to Alertmanager (the rules alone)")
    args = ap.parse_args()

    def stop(signum: int, frame: object) -> None:
        raise KeyboardInterrupt(f"signal {signum}")

    signal.signal(signal.SIGTERM, stop)
    started = time.time()
    sets = ("fleet", "issue33") if args.set == "all" else (args.set,)
    parts = []
    for name in sets:
        healthy_s = (
            args.healthy_s
            if args.healthy_s is not None
            else (600.0 if args.set == "all" and name == "fleet" else 1800.0)
        )
        part = run_part(name, args, healthy_s)
        if part is not None:
            parts.append(part)
    if not parts:
        raise SystemExit(f"--faults {args.faults}: no such fault (faults: {sorted({*ASSIGN, *ISSUE33})})")
    data = {
        "what": "drill at production timings (benchmarks/fleet_drill.py): every scenario of its sets, each set on a "
        "cold stack",
        "started_utc": time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime(started)),
        "wall_s": round(time.time() - started),
        "machine": f"{platform.node()} ({os.cpu_count()} CPUs, {platform.machine()}), load average at the end "
        f"{os.getloadavg()[0]:.1f}",
        "command": " ".join(["benchmarks/fleet_drill.py", *sys.argv[1:]]),
        "parts": parts,
    }
    print(drill_table(data))
    if not args.smoke:
        out = args.results or RESULTS_BY_SET[args.set]
        out.parent.mkdir(parents=True, exist_ok=True)
        out.write_text(json.dumps(data, indent=2) + "\n")
        print(f"wrote {out}")
    return 0


RESULTS_BY_SET = {
    "all": ROOT / "benchmarks" / "results" / "fleet_drill_all.json",
    "fleet": RESULTS,
    "issue33": ROOT / "benchmarks" / "results" / "fleet_drill_issue33.json",
}
TIMINGS_TEXT = (
    "scrape 15s, evaluation 15s, alerts/*.rules.yml unchanged, shipped alertmanager.yml (receivers at a local sink), "
    "agents at 15s (probe 30s, runtime profile 60s) pushing their critical findings to Alertmanager as compose wires "
    "them, loadgen 2 req/s per node, prompts lognormal:512:0.6, 32 output tokens, no history (empty storage at start)"
)


def run_part(name: str, args: argparse.Namespace, healthy_s: float) -> dict[str, Any] | None:
    """One set on its own stack, started empty: its nodes (each with its simulator, agent and loadgen, as compose wires
    one), a healthy phase (with the fleet set's noise), every fault at once, each on its own node, then recovery; the
    shipped rules and routes unchanged at 15 s. None when ``--faults`` leaves none of this set's faults."""
    fleet_set = name == "fleet"
    assign = dict(ASSIGN if fleet_set else ISSUE33)
    if args.faults:
        assign = {k: v for k, v in assign.items() if k in args.faults.split(",")}
        if not assign:
            return None
    backend = args.backend or ("vm" if fleet_set else "prometheus")
    needed = BINARIES if backend == "vm" else ("prometheus", "promtool", "prometheus-alertmanager")
    missing = [b for b in needed if shutil.which(b) is None]
    if missing:
        raise SystemExit(f"not installed: {missing} (Debian: prometheus victoria-metrics prometheus-alertmanager)")
    binaries = {b: str(shutil.which(b)) for b in BINARIES if shutil.which(b)}
    tmp = Path(tempfile.mkdtemp(prefix=f"fleet-drill-{name}-"))
    print(f"[{name}] work directory {tmp}", flush=True)
    started = time.time()

    def log(msg: str) -> None:
        print(f"[{time.strftime('%H:%M:%S')}] [{name}] {msg}", flush=True)

    if fleet_set:
        with_noise = not args.faults or args.noise
        noisy = {n for role, n in NOISE_ROLES.items() if role != "joiner"} if with_noise else set()
        nodes = tuple(n for n in NODES if n in assign.values() or n in noisy)
        events = noise(NOISE_ROLES) if with_noise else []
        specs = [CATALOG[n] for n in (*nodes, JOINER, NOSVE)]
    else:
        nodes = tuple(dict.fromkeys(assign.values()))
        events = []
        specs = [CATALOG[n] for n in nodes]
    rules = sorted((ROOT / "alerts").glob("*.rules.yml"))
    extra: dict[str, Any] = {}
    with Sink() as sink:
        fleet = Fleet(tmp, sink, Timings(), specs)
        fleet.backend = backend
        fleet.push = not args.no_push
        with fleet.running(nodes, rules, binaries):
            log(f"up ({backend}): {fleet.vm}, Alertmanager {fleet.alertmanager}")
            result = run_drill(
                fleet,
                healthy_s,
                events,
                faults(assign),
                args.deliver_timeout,
                args.resolve_timeout,
                args.hold,
                log,
                args.settle,
            )
            if fleet_set and backend == "vm":
                extra["matrix"] = fleet_matrix(fleet, started)
    if not args.keep:
        shutil.rmtree(tmp, ignore_errors=True)
    return {
        "set": name,
        "started_utc": time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime(started)),
        "wall_s": round(time.time() - started),
        "backend": backend,
        "timings": TIMINGS_TEXT if fleet.push else TIMINGS_TEXT.replace(" pushing", " not pushing"),
        "nodes": {
            n.name: {
                "hardware": n.hardware,
                "machine_type": n.machine_type,
                "gpu": n.gpu,
                "model": n.model,
                "sim_args": list(n.sim_args),
            }
            for n in specs
        },
        **result_json(result),
        **extra,
    }


def fleet_matrix(fleet: Fleet, started: float) -> dict[str, Any]:
    """``inferwatch matrix`` (raw and --recorded) over the fleet storage: every machine type that ever served."""
    raw = matrix(fleet.vm, "30m", recorded=False)
    recorded = matrix(fleet.vm, "30m", recorded=True)
    whole = f"{int((time.time() - started) / 60) + 5}m"  # the whole run: the joiner left long ago
    raw_all = matrix(fleet.vm, whole, recorded=False)
    recorded_all = matrix(fleet.vm, whole, recorded=True)
    return {
        "expected_machine_types": sorted({CATALOG[n].machine_type for n in fleet.ever}),
        "raw_30m": sorted(hardware_types(raw)),
        "recorded_30m": sorted(hardware_types(recorded)),
        "whole_run_window": whole,
        "raw_whole_run": sorted(hardware_types(raw_all)),
        "recorded_whole_run": sorted(hardware_types(recorded_all)),
        "raw_error": raw.get("error"),
        "recorded_error": recorded.get("error"),
        "raw_models": raw.get("models"),
    }


def baseline(fault: dict[str, Any]) -> str:
    """`` (baseline: recent)`` where the delivered alert compared with a baseline (day-0 or history), else ''."""
    return f" (baseline: {fault['baseline']})" if fault.get("baseline") else ""


def drill_table(data: dict[str, Any]) -> str:
    """The docs/alerts.md table of a run: per scenario, what reached a person and when, one block per set (a record
    of one set written before sets were parts is read as one part)."""
    parts = data.get("parts") or [data]
    rows = [
        f"Run {data['started_utc']} on {data['machine']} ({data['wall_s'] / 60:.0f} min). "
        f"Command: `.venv/bin/python {data['command']}`."
        if "wall_s" in data
        else f"Run {data['started_utc']} on {data['machine']}. Command: `.venv/bin/python {data['command']}`.",
        "",
    ]
    for part in parts:
        name = part.get("set", "issue33")
        rows.append(
            f"Set `{name}` ({part['backend']}, started {part['started_utc']}): healthy phase "
            f"{part['healthy_phase_s'] / 60:.0f} min{' with noise' if part.get('noise') else ''}, "
            f"{len(part['healthy_deliveries'])} {'delivery' if len(part['healthy_deliveries']) == 1 else 'deliveries'} "
            "other than Watchdog"
            + (
                f" ({', '.join(d if isinstance(d, str) else str(d) for d in part['healthy_deliveries'])})"
                if part["healthy_deliveries"]
                else ""
            )
            + "."
        )
    rows += [
        "",
        "| scenario | set | node | expected alert → receiver | injection → delivery | ≤ target | repeats | "
        "recovery → resolved | also delivered for this node |",
        "|---|---|---|---|---|---|---|---|---|",
    ]
    for part in parts:
        expected: dict[str, set[str]] = {}
        for f in part["faults"]:
            expected.setdefault(f["node"], set()).add(f"{f['alertname']}@{f['receiver']}")
        for f in part["faults"]:
            own = {f"{f['alertname']}@{f['receiver']}"}
            also = [
                o if o not in expected[f["node"]] - own else f"{o} (the node's other fault)"
                for o in f["other_deliveries"]
            ]
            met = "no (never)" if f["delivered_s"] is None else ("yes" if f["delivered_s"] <= f["target_s"] else "no")
            rows.append(
                f"| `{f['fault']}` | {part.get('set', 'issue33')} | {f['node']} | {f['alertname']}{baseline(f)} → "
                f"{f['receiver']} | {_fmt(f['delivered_s'])} | {met} (≤ {_fmt(f['target_s'])}) | "
                f"{f.get('repeats', 0)} | {_fmt(f['resolved_s'])} | {', '.join(also) or '—'} |"
            )
    return "\n".join(rows)


DOC = ROOT / "docs" / "alerts.md"
BEGIN, END = "<!-- drill-table:begin (benchmarks/fleet_drill.py --doc) -->", "<!-- drill-table:end -->"


def write_doc(results: Path = RESULTS_BY_SET["all"], doc: Path = DOC) -> None:
    """Replace the table between the markers of docs/alerts.md with the one of the last run's JSON (and of each
    ``<results stem>_*.json`` beside it: a subset re-run with ``--faults``, ``--results``)."""
    text = doc.read_text()
    if BEGIN not in text or END not in text:
        raise SystemExit(f"{doc}: no drill-table markers")
    head, rest = text.split(BEGIN, 1)
    _, tail = rest.split(END, 1)
    runs = [results, *sorted(results.parent.glob(f"{results.stem}_*.json"))]
    table = "\n\n".join(drill_table(json.loads(r.read_text())) for r in runs)
    doc.write_text(f"{head}{BEGIN}\n{table}\n{END}{tail}")


if __name__ == "__main__":
    if sys.argv[1:] == ["--doc"]:
        write_doc()
        sys.exit(0)
    sys.exit(main())
