"""Time to page: SLO burn-rate detection with promtool, and fault → PagerDuty with the real binaries.

Part 1 (promtool, the shipped alerts/slo.rules.yml): for each burn scenario, the first evaluation minute at which
TTFTErrorBudgetBurn fires, found by asserting "not firing" at every minute and reading which minutes promtool
reports as failing. Baseline in the same run: the ideal detection time of the window pair (threshold / burn ×
long window, plus for:), computed from the same rule file's numbers.

Part 1b (promtool, the same rule file): resolution. After a burn that paged, traffic recovers; for each burn
alert (window pair), the minutes after recovery at which it fired first and last, and when its resolved notice
is due (last + 1 + the route's group_interval, alerts/alertmanager.yml).

Part 2 (end to end, tests/e2e): runs the e2e test module RUNS times and reports, per pitfall, min / median /
max seconds from injection to the receiver, side by side with the pipeline floor measured in the same runs
(the always-firing Watchdog: Prometheus start → dead-man's-switch webhook) and the configured budget
(test-profile for: + Alertmanager group_wait).

Part 3 (production timings, tests/e2e/test_hang_production.py): the simulator's ``hang`` through agent →
Prometheus (15 s scrape and evaluation, shipped rules unscaled) → Alertmanager (shipped routes) → PagerDuty sink,
HANG_RUNS times: seconds from the hang to the page, side by side with the computed budget of the pipeline (agent
allowance 30 s + ≤ 15 s scrape + ≤ 15 s evaluation + for: 30s + group_wait 10s), and the cost of the evidence
bundle the agent captured on its own.

    .venv/bin/python benchmarks/alert_time_to_page.py [--runs 3] [--skip-e2e] [--hang-runs 3]
"""

from __future__ import annotations

import argparse
import json
import os
import re
import statistics
import subprocess
import sys
import tempfile
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parents[1]
RESULTS = ROOT / "benchmarks" / "results" / "alert_time_to_page.json"

# name, per-minute requests, per-minute good requests during the burn, clean minutes before, description
BURNS = [
    ("15x burn from a fresh series", 100, 85, 0, "15% slow"),
    ("14x burn from a fresh series (near miss for 14.4x)", 100, 86, 0, "14% slow"),
    ("100x (total outage) after 6h of clean traffic", 100, 0, 360, "100% slow"),
    ("20x burn after 6h of clean traffic", 100, 80, 360, "20% slow"),
]
SCAN_MINUTES = 60


def _run_not_firing_scan(count: str, bucket: str, minutes: range, workdir: Path, name: str) -> str:
    """promtool on the shipped SLO rules with these TTFT count/bucket series, asserting TTFTErrorBudgetBurn is
    not firing at each of ``minutes``; its output (each failure names a minute and what fired)."""
    checks = "\n".join(f"      - {{eval_time: {m}m, alertname: TTFTErrorBudgetBurn, exp_alerts: []}}" for m in minutes)
    test = f"""rule_files: [{ROOT / "alerts" / "slo.rules.yml"}]
evaluation_interval: 1m
group_eval_order: [inferwatch-slo-ttft-500ms-sli, inferwatch-slo-ttft-500ms-alerts]
tests:
  - interval: 1m
    input_series:
      - series: 'gen_ai_server_time_to_first_token_seconds_count{{gen_ai_request_model="m"}}'
        values: '{count}'
      - series: 'gen_ai_server_time_to_first_token_seconds_bucket{{gen_ai_request_model="m",le="0.5"}}'
        values: '{bucket}'
    alert_rule_test:
{checks}
"""
    path = workdir / f"{name}.test.yml"
    path.write_text(test)
    r = subprocess.run(["promtool", "test", "rules", str(path)], capture_output=True, text=True, timeout=600)
    return r.stdout + r.stderr


def _scan(total: int, good: int, clean_min: int, workdir: Path) -> tuple[int | None, str]:
    minutes = clean_min + SCAN_MINUTES + 1
    count = f"0+{total}x{minutes}"
    # good requests: all of them while clean, then `good` per minute (no discontinuity at the switch)
    after = f"{total * clean_min + good}+{good}x{SCAN_MINUTES}"
    bucket = f"0+{total}x{clean_min} {after}" if clean_min else f"0+{good}x{minutes}"
    out = _run_not_firing_scan(count, bucket, range(clean_min + 1, clean_min + SCAN_MINUTES + 1), workdir, "scan")
    fails = re.findall(r"time: (?:(\d+)h)?(\d+)m(?:0s)?, \s*exp:.*?got:\[\s*0:\s*Labels:\{([^}]*)\}", out, re.S)
    if not fails:
        return None, ""
    h, m, labels = fails[0]
    minute = int(h or 0) * 60 + int(m) - clean_min
    pair = re.search(r'long="(\w+)".*short="(\w+)"', labels)
    return minute, f"{pair.group(1)}/{pair.group(2)}" if pair else labels


def promtool_part() -> list[dict[str, object]]:
    rows = []
    with tempfile.TemporaryDirectory() as tmp:
        for name, total, good, clean, what in BURNS:
            minute, pair = _scan(total, good, clean, Path(tmp))
            burn = (total - good) / total / 0.01
            ideal = None
            if burn > 14.4:
                # long window (60 min) must hold 14.4% errors; fresh series: as soon as rates exist (1 min)
                ideal = 1 + 2 if clean == 0 else round(60 * 14.4 / burn + 2, 1)
            rows.append(
                {
                    "scenario": name,
                    "slow_share": what,
                    "burn_rate": round(burn, 1),
                    "pages_after_min": minute,
                    "by_pair": pair,
                    "ideal_min_14.4x_pair": ideal,
                }
            )
    return rows


# Resolution: how long each burn-rate pair keeps firing after the fault ends (the slow pairs hold a short burst long
# after recovery, which is what an operator sees as a page that will not resolve):
# name, per-minute requests, good requests per minute during the fault, clean minutes before, fault minutes.
RECOVERIES = [
    ("30 min total outage after 6h of clean traffic", 100, 0, 360, 30),
    ("30 min 20x burn after 6h of clean traffic", 100, 80, 360, 30),
    ("10 min total outage after 6h of clean traffic", 100, 0, 360, 10),
]
RECOVERY_SCAN_MINUTES = 240
GROUP_INTERVAL_MIN = {"critical": 5, "warning": 5}  # alerts/alertmanager.yml: a resolved notice waits for one
_FIRING_AT = re.compile(r"time: (?:(\d+)h)?(?:(\d+)m)?(?:0s)?, \s*exp:\[\],\s*got:\[(.*?)\n\s*\]", re.S)
_PAIR = re.compile(r'long="(\w+)".*?severity="(\w+)", short="(\w+)"')


def _recovery_scan(total: int, good: int, clean: int, fault: int, workdir: Path) -> dict[str, dict[str, object]]:
    """Per burn alert (long/short pair): minutes after recovery at which it first and last fired."""
    minutes = clean + fault + RECOVERY_SCAN_MINUTES + 1
    count = f"0+{total}x{minutes}"
    bad_end = total * clean + good * fault
    bucket = (
        f"0+{total}x{clean} {total * clean + good}+{good}x{fault - 1} {bad_end + total}+{total}x{RECOVERY_SCAN_MINUTES}"
    )
    recovered = clean + fault
    text = _run_not_firing_scan(
        count, bucket, range(recovered, recovered + RECOVERY_SCAN_MINUTES + 1), workdir, "recovery"
    )
    out: dict[str, dict[str, object]] = {}
    for h, m, got in _FIRING_AT.findall(text):
        minute = int(h or 0) * 60 + int(m or 0) - recovered
        for long, severity, short in _PAIR.findall(got):
            row = out.setdefault(f"{long}/{short}", {"severity": severity, "minutes": []})
            row["minutes"].append(minute)  # type: ignore[union-attr]
    for row in out.values():
        mins = row.pop("minutes")
        assert isinstance(mins, list)
        row["fires_from_min"] = min(mins)
        row["resolved_after_min"] = max(mins) + 1 if max(mins) < RECOVERY_SCAN_MINUTES else None
        interval = GROUP_INTERVAL_MIN[str(row["severity"])]
        row["resolved_notice_by_min"] = (
            None if row["resolved_after_min"] is None else row["resolved_after_min"] + interval
        )
    return out


def recovery_part() -> list[dict[str, object]]:
    rows = []
    with tempfile.TemporaryDirectory() as tmp:
        for name, total, good, clean, fault in RECOVERIES:
            rows.append({"scenario": name, "alerts": _recovery_scan(total, good, clean, fault, Path(tmp))})
    return rows


def _reports(test: str, report_env: str, runs: int) -> list[dict[str, object]]:
    """Run one pytest target ``runs`` times; each run writes its figures to the file named by ``report_env``."""
    reports = []
    with tempfile.TemporaryDirectory() as tmp:
        for i in range(runs):
            report = Path(tmp) / f"run{i}.json"
            env = {**os.environ, report_env: str(report)}
            r = subprocess.run(
                [sys.executable, "-m", "pytest", "-q", test], cwd=ROOT, env=env, capture_output=True, text=True,
                timeout=900,
            )  # fmt: skip
            if r.returncode != 0 or not report.exists():
                print(r.stdout[-3000:], file=sys.stderr)
                raise SystemExit(f"{test} run {i} failed")
            reports.append(json.loads(report.read_text()))
    return reports


def e2e_part(runs: int) -> dict[str, object]:
    reports: list[dict[str, Any]] = _reports("tests/e2e/test_alert_pipeline.py", "INFERWATCH_E2E_REPORT", runs)
    per: dict[str, list[float]] = {}
    for rep in reports:
        for k, v in rep["time_to_receiver_s"].items():
            if v is not None:
                per.setdefault(k, []).append(v)
    floor = [rep["watchdog_s_from_prometheus_start"] for rep in reports]
    return {
        "runs": runs,
        "timings": reports[0]["timings"],
        "watchdog_floor_s": {"min": min(floor), "median": statistics.median(floor), "max": max(floor)},
        "time_to_receiver_s": {
            k: {"min": min(v), "median": statistics.median(v), "max": max(v)} for k, v in sorted(per.items())
        },
    }


HANG_BUDGET_S = {"best": 30 + 30 + 10, "worst": 30 + 15 + 15 + 30 + 10}  # computed, seconds


def hang_part(runs: int) -> dict[str, object]:
    reports: list[dict[str, Any]] = _reports("tests/e2e/test_hang_production.py", "INFERWATCH_HANG_REPORT", runs)
    pages = [rep["time_to_page_s"] for rep in reports]
    walls = [rep["bundle_wall_s"] for rep in reports]
    cpus = [rep["bundle_cpu_s"]["total"] for rep in reports]
    return {
        "runs": runs,
        "time_to_page_s": {"min": min(pages), "median": statistics.median(pages), "max": max(pages), "all": pages},
        "computed_budget_s": HANG_BUDGET_S,
        "bundle_wall_s": {"median": statistics.median(walls), "max": max(walls)},
        "bundle_cpu_s": {"median": statistics.median(cpus), "max": max(cpus)},
        "bundle_bytes": [rep["bundle_bytes"] for rep in reports],
        "summary": reports[-1]["summary"],
    }


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--runs", type=int, default=3)
    ap.add_argument("--skip-e2e", action="store_true")
    ap.add_argument("--hang-runs", type=int, default=3, help="production-timing hang runs (0: keep the last)")
    args = ap.parse_args()
    result: dict[str, object] = {"promtool_burn_rate": promtool_part(), "promtool_recovery": recovery_part()}
    for row in result["promtool_burn_rate"]:  # type: ignore[union-attr]
        print(row)
    for row in result["promtool_recovery"]:  # type: ignore[union-attr]
        print(row)
    if not args.skip_e2e:
        result["e2e"] = e2e_part(args.runs)
        print(json.dumps(result["e2e"], indent=2))
    elif RESULTS.exists():  # keep the last end-to-end figures
        result["e2e"] = json.loads(RESULTS.read_text()).get("e2e")
    if args.hang_runs:
        result["hang_production"] = hang_part(args.hang_runs)
        print(json.dumps(result["hang_production"], indent=2))
    elif RESULTS.exists():
        result["hang_production"] = json.loads(RESULTS.read_text()).get("hang_production")
    RESULTS.parent.mkdir(parents=True, exist_ok=True)
    RESULTS.write_text(json.dumps(result, indent=2) + "\n")
    print(f"wrote {RESULTS}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
