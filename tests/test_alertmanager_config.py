"""alerts/alertmanager.yml with amtool 0.25: valid, and each severity routes to the receiver docs/alerts.md names."""

from __future__ import annotations

import pytest
import yaml

from tests.alerting import ALERTMANAGER_YML, run_tool, tool
from tests.e2e.harness import Sink, alertmanager

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
    # the rule's generated annotation as it is, never an address made up from .CommonLabels.instance (an SLO page's
    # instance is the engine's, or there is none): empty when the page has no agent bundle (see the test below)
    evidence = "{{ (index .Alerts 0).Annotations.evidence_url }}"
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


def _add(am_url: str, *args: str) -> None:
    r = run_tool(tool("amtool"), "alert", "add", f"--alertmanager.url={am_url}", *args)
    assert r.returncode == 0, r.stdout + r.stderr


@pytest.mark.slow
def test_pagerduty_links_the_evidence_only_when_the_page_has_one(tmp_path) -> None:
    """The real Alertmanager 0.25 with the shipped receivers: a page with an evidence_url gets the "Evidence bundle"
    link and the URL in custom_details; a page whose evidence_url is empty (an SLO page, a job that is not the
    agent's: Prometheus sends the annotation empty) gets no such link, not a link to nowhere."""
    url = "http://node-a:9435/api/v1/evidence/latest?alertname=EngineDown"
    with Sink() as sink, alertmanager(tmp_path, sink) as am:
        down_alert = ["alertname=EngineDown", "instance=node-a:9435", "severity=critical", "job=inferwatch-agent"]
        down_alert += [f"--annotation=evidence_url={url}", "--annotation=runbook_url=http://runbooks/EngineDown"]
        _add(am, *down_alert, "--annotation=dashboard_url=http://grafana/d/x")
        slo_alert = ["alertname=TTFTErrorBudgetBurn", "slo=ttft-500ms", "gen_ai_request_model=llama-3.1-8b"]
        slo_alert += [
            "severity=critical",
            "--annotation=evidence_url=",
            "--annotation=runbook_url=http://runbooks/TTFT",
        ]
        _add(am, *slo_alert, "--annotation=dashboard_url=http://grafana/d/slo")
        down = sink.wait_for(lambda d: d.receiver == "pagerduty" and d.alertname == "EngineDown", 60)
        slo_page = sink.wait_for(lambda d: d.receiver == "pagerduty" and d.alertname == "TTFTErrorBudgetBurn", 60)
    assert down is not None and slo_page is not None
    assert [link["href"] for link in down.body["links"]] == ["http://runbooks/EngineDown", "http://grafana/d/x", url]
    assert down.body["payload"]["custom_details"]["evidence_url"] == url
    assert [link["href"] for link in slo_page.body["links"]] == ["http://runbooks/TTFT", "http://grafana/d/slo"]
    assert slo_page.body["payload"]["custom_details"]["evidence_url"] == ""
