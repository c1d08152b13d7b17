"""tests/alert_scenarios.yml against the simulator, the rules and the drills: every fault has an alert and back.

Fails when a simulator scenario has no expected alert, an alert (Watchdog aside) has no live case (a scenario here,
or a crafted node of tests/test_runbooks_exec.py that turns it pending in a real Prometheus) and is not listed as
fixture-only with why, a case names an alert or a scenario that does not exist, or a drill fault expects another
alert than the case it claims to run.
"""

from __future__ import annotations

import importlib.util
import json
from pathlib import Path

import yaml

from inferwatch.simulator.scenarios import DEFAULTS, parse
from tests.alerting import alert_names, rule_test_files
from tests.conftest import ROOT
from tests.fleet import faults, incidents
from tests.test_runbooks_exec import FAULTS

MAPPING = yaml.safe_load((ROOT / "tests" / "alert_scenarios.yml").read_text())
CASES: list[dict[str, str]] = MAPPING["cases"]
FIXTURE_ONLY: dict[str, str] = MAPPING["fixture_only"]


def test_every_simulator_scenario_has_an_expected_alert() -> None:
    covered = {parse(c["scenario"]).name for c in CASES}  # parse: a bad name or parameter fails here
    assert set(DEFAULTS) - covered == set(), "simulator scenarios with no expected alert in tests/alert_scenarios.yml"


def test_every_alert_has_a_scenario_or_a_crafted_fixture() -> None:
    alerts = alert_names() - {"Watchdog"}
    by_scenario = {c["alert"] for c in CASES}
    assert by_scenario <= alerts | {"Watchdog"}, f"cases for alerts that do not exist: {by_scenario - alerts}"
    assert set(FIXTURE_ONLY) <= alerts, f"fixture_only alerts that do not exist: {set(FIXTURE_ONLY) - alerts}"
    assert not by_scenario & set(FIXTURE_ONLY), "an alert is both a scenario's and fixture-only"
    # the runbook execution test makes these faults live (a crafted node, a stopped agent...) and waits for the alert
    live = {name for name, fault in FAULTS.items() if fault.alert}
    uncovered = alerts - by_scenario - set(FIXTURE_ONLY) - live
    assert uncovered == set(), "alerts with no scenario, no live crafted fault and no fixture_only reason"
    fired: set[str] = set()
    for path in rule_test_files():
        for case in yaml.safe_load(path.read_text())["tests"]:
            fired |= {c["alertname"] for c in case.get("alert_rule_test", []) if c["exp_alerts"]}
    assert set(FIXTURE_ONLY) - fired == set(), "fixture_only alerts without a firing promtool case"
    for name, why in FIXTURE_ONLY.items():
        assert len(why.split()) >= 4, f"{name}: say why the simulator cannot make it"


def test_drill_faults_expect_the_alert_of_their_case() -> None:
    drilled = {c["drill"]: c for c in CASES if "drill" in c}
    by_name = {f.name: f for f in faults(dict.fromkeys(drilled, "node"))}
    for name, case in drilled.items():
        fault = by_name[name]
        assert fault.alertname == case["alert"], f"drill fault {name}: {fault.alertname} != {case['alert']}"


def test_drill_table_is_generated_from_the_last_run(tmp_path: Path) -> None:
    spec = importlib.util.spec_from_file_location("fleet_drill", ROOT / "benchmarks" / "fleet_drill.py")
    assert spec is not None and spec.loader is not None
    drill = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(drill)
    fleet_part = {
        "set": "fleet",
        "started_utc": "2026-12-06T23:37:10Z",
        "backend": "vm",
        "healthy_phase_s": 600.0,
        "noise": [{"t_s": 72.0, "what": "load step"}],
        "healthy_deliveries": ["LatencyBimodal@ticket"],
        "faults": [
            {
                "fault": "engine_down",
                "node": "g6e-l40s",
                "alertname": "EngineDown",
                "receiver": "pagerduty",
                "delivered_s": 55.1,
                "target_s": 90.0,
                "repeats": 0,
                "resolved_s": 236.5,
                "other_deliveries": [],
            }
        ],
    }
    signals_part = {
        "set": "issue33",
        "started_utc": "2026-12-07T00:02:00Z",
        "backend": "prometheus",
        "healthy_phase_s": 1800.0,
        "healthy_deliveries": [],
        "faults": [
            {
                "fault": "slow_rank",
                "node": "p5-dp",
                "alertname": "DataParallelRankSlow",
                "receiver": "ticket",
                "delivered_s": 138.0,
                "target_s": 240.0,
                "repeats": 0,
                "resolved_s": None,
                "other_deliveries": ["LatencyBimodal@ticket"],
            },
            {
                "fault": "kv_saturation",
                "node": "p5-kv",
                "alertname": "KVCacheSaturatedWithPreemptions",
                "receiver": "ticket",
                "delivered_s": None,
                "target_s": 240.0,
                "repeats": 0,
                "resolved_s": None,
                "other_deliveries": [],
            },
        ],
    }
    run = {
        "started_utc": "2026-12-06T23:37:00Z",
        "wall_s": 4800,
        "machine": "host (2 CPUs, x86_64), load average at the end 8.0",
        "command": "benchmarks/fleet_drill.py",
        "parts": [fleet_part, signals_part],
    }
    results, doc = tmp_path / "run.json", tmp_path / "alerts.md"
    results.write_text(json.dumps(run))
    doc.write_text(f"before\n{drill.BEGIN}\nold table\n{drill.END}\nafter\n")
    drill.write_doc(results, doc)
    text = doc.read_text()
    assert "old table" not in text and text.startswith("before\n") and text.endswith("after\n")
    assert "Run 2026-12-06T23:37:00Z on host (2 CPUs, x86_64), load average at the end 8.0 (80 min)" in text
    assert "Set `fleet` (vm, started 2026-12-06T23:37:10Z): healthy phase 10 min with noise, 1 delivery" in text
    assert "(LatencyBimodal@ticket)" in text
    assert "Set `issue33` (prometheus, started 2026-12-07T00:02:00Z): healthy phase 30 min, 0 deliveries" in text
    assert (
        "| `engine_down` | fleet | g6e-l40s | EngineDown → pagerduty | 55 s | yes (≤ 90 s) | 0 | 3.9 min | — |" in text
    )
    assert (
        "| `slow_rank` | issue33 | p5-dp | DataParallelRankSlow → ticket | 2.3 min | yes (≤ 4.0 min) | 0 | — |" in text
    )
    assert "LatencyBimodal@ticket |" in text
    assert "| `kv_saturation` | issue33 | p5-kv | KVCacheSaturatedWithPreemptions → ticket | — | no (never)" in text


def _d(t: float, receiver: str, action: str, **labels: str) -> dict[str, object]:
    return {
        "t_s": t,
        "receiver": receiver,
        "alertname": labels.pop("alertname", "A"),
        "action": action,
        "labels": labels,
    }


def test_drill_counts_incidents_not_notifications() -> None:
    # Six features of one alert in one ticket notification: one incident.
    six = [_d(824.1, "ticket", "firing", instance="n:9435", feature=f) for f in "abcdef"]
    assert incidents(six) == 1
    # A group renotified while open (the SLO's burn joins its fast page; the pushed and the rule copy): one incident.
    slo = [
        _d(772.7, "pagerduty", "trigger", alertname="TTFTErrorBudgetBurn", slo="ttft", burn_rate="30"),
        _d(1072.7, "pagerduty", "trigger", alertname="TTFTErrorBudgetBurn", slo="ttft", burn_rate="14.4"),
        _d(1372.7, "pagerduty", "resolve", alertname="TTFTErrorBudgetBurn", slo="ttft", burn_rate="14.4"),
    ]
    assert incidents(slo) == 1
    # Resolved, then firing again: a second incident (a repeat page for one episode).
    again = [*slo, _d(1500.0, "pagerduty", "trigger", alertname="TTFTErrorBudgetBurn", slo="ttft")]
    assert incidents(again) == 2
    # One ticket notification resolving some alerts of a group while others fire keeps the incident open.
    mixed = [
        _d(10.0, "ticket", "firing", instance="n:9435", feature="a"),
        _d(20.0, "ticket", "resolved", instance="n:9435", feature="a"),
        _d(20.0, "ticket", "firing", instance="n:9435", feature="b"),
        _d(30.0, "ticket", "firing", instance="n:9435", feature="a"),
    ]
    assert incidents(mixed) == 1
    # Two nodes are two incidents.
    assert incidents([_d(1.0, "ticket", "firing", instance="a:1"), _d(1.0, "ticket", "firing", instance="b:1")]) == 2
