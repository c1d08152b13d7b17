"""alerts/scenarios.yml against the simulator, the rules and the drills: every fault has an alert, every alert a case.

Fails when a simulator scenario has no expected alert, an alert (Watchdog aside) has neither a scenario nor a
crafted promtool fixture, a case names an alert or a scenario that does not exist, or a drill fault expects another
alert than the case it claims to run.
"""

from __future__ import annotations

import yaml

from simulator.scenarios import DEFAULTS, parse
from tests.alerting import ALERTS_DIR, alert_names, rule_test_files
from tests.fleet import faults

MAPPING = yaml.safe_load((ALERTS_DIR / "scenarios.yml").read_text())
CASES: list[dict[str, str]] = MAPPING["cases"]
FIXTURE_ONLY: dict[str, str] = MAPPING["fixture_only"]


def test_every_simulator_scenario_has_an_expected_alert() -> None:
    covered = {parse(c["scenario"]).name for c in CASES}  # parse: a bad name or parameter fails here
    assert set(DEFAULTS) - covered == set(), "simulator scenarios with no expected alert in alerts/scenarios.yml"


def test_every_alert_has_a_scenario_or_a_crafted_fixture() -> None:
    alerts = alert_names() - {"Watchdog"}
    by_scenario = {c["alert"] for c in CASES}
    assert by_scenario <= alerts | {"Watchdog"}, f"cases for alerts that do not exist: {by_scenario - alerts}"
    assert set(FIXTURE_ONLY) <= alerts, f"fixture_only alerts that do not exist: {set(FIXTURE_ONLY) - alerts}"
    assert not by_scenario & set(FIXTURE_ONLY), "an alert is both a scenario's and fixture-only"
    assert alerts - by_scenario - set(FIXTURE_ONLY) == set(), "alerts with neither a scenario nor a fixture"
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
