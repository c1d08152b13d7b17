"""alerts/alertmanager.yml with amtool 0.25: valid, and each severity routes to the receiver docs/alerts.md names."""

from __future__ import annotations

import pytest
import yaml

from tests.alerting import ALERTMANAGER_YML, run_tool, tool

pytestmark = pytest.mark.integration


def test_amtool_check_config_passes() -> None:
    r = run_tool(tool("amtool"), "check-config", ALERTMANAGER_YML)
    assert r.returncode == 0, r.stdout + r.stderr
    assert "SUCCESS" in r.stdout


@pytest.mark.parametrize(
    ("labels", "receiver"),
    [
        (["alertname=CPUFeatureMissing", "severity=critical", "instance=node-a:9435"], "agent-evidence,pagerduty"),
        (["alertname=TailLatencyRatioHigh", "severity=warning", "instance=node-a:9435"], "ticket"),
        (["alertname=SomethingInformational", "severity=info"], "blackhole"),
        (["alertname=Watchdog", "severity=info"], "deadmansswitch"),
        (["alertname=TTFTErrorBudgetBurn", "severity=critical", "slo=ttft-500ms"], "agent-evidence,pagerduty"),
    ],
)
def test_routes(labels: list[str], receiver: str) -> None:
    r = run_tool(tool("amtool"), "config", "routes", "test", f"--config.file={ALERTMANAGER_YML}", *labels)
    assert r.returncode == 0, r.stdout + r.stderr
    assert r.stdout.strip() == receiver


def test_links_and_evidence_avoid_common_annotations() -> None:
    cfg = yaml.safe_load(ALERTMANAGER_YML.read_text())
    pd = next(r for r in cfg["receivers"] if r["name"] == "pagerduty")["pagerduty_configs"][0]
    assert "routing_key_file" in pd and "routing_key" not in pd and "service_key" not in pd
    assert pd["severity"] == "critical"
    text = yaml.safe_dump(pd)
    assert "CommonAnnotations" not in text  # empty when grouped alerts differ: links would silently vanish
    evidence = (
        "{{ with (index .Alerts 0).Annotations.evidence_url }}{{ . }}{{ else }}{{ with .CommonLabels.instance }}"
        "http://{{ . }}/api/v1/evidence/latest?alertname={{ $.CommonLabels.alertname }}{{ end }}{{ end }}"
    )
    assert [link["href"] for link in pd["links"]] == [
        "{{ (index .Alerts 0).Annotations.runbook_url }}",
        "{{ (index .Alerts 0).Annotations.dashboard_url }}",
        evidence,
    ]
    assert pd["details"]["evidence_url"] == evidence
    hook = next(r for r in cfg["receivers"] if r["name"] == "agent-evidence")["webhook_configs"][0]
    assert hook["url"].endswith("/api/v1/alertmanager") and hook["send_resolved"] is False
    assert hook["http_config"]["authorization"]["credentials_file"]  # a token with the evidence scope
    first = cfg["route"]["routes"][0]
    assert first["receiver"] == "agent-evidence" and first["continue"] is True and first["group_wait"] == "0s"
    assert all(isinstance(v, str) for v in pd["details"].values())  # 0.25: flat map of strings
    inhibit = cfg["inhibit_rules"][0]
    assert inhibit["source_matchers"] == ['severity="critical"'] and inhibit["target_matchers"] == [
        'severity="warning"'
    ]
    assert {"alertname", "instance"} <= set(inhibit["equal"])


def test_amtool_rejects_fields_newer_than_0_25(tmp_path) -> None:
    """The check above is meaningful: amtool 0.25 does reject 0.30-only fields."""
    cfg = yaml.safe_load(ALERTMANAGER_YML.read_text())
    next(r for r in cfg["receivers"] if r["name"] == "pagerduty")["pagerduty_configs"][0]["timeout"] = "10s"
    bad = tmp_path / "am.yml"
    bad.write_text(yaml.safe_dump(cfg))
    r = run_tool(tool("amtool"), "check-config", bad)
    assert r.returncode == 1 and "timeout" in r.stdout + r.stderr
