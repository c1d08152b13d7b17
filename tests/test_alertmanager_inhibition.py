"""Why TailLatencyRatioHigh's inhibition is also in the rule: the real Alertmanager, with the shipped routes.

Alertmanager inhibits a target only while the source alert is firing *in Alertmanager*. Posted the way the leak
happened in issue 15 (amtool, against a real Alertmanager 0.25 with alerts/alertmanager.yml): with
PageCachePressureTailLatency firing, TailLatencyRatioHigh is held back; once the source resolves while the
target still fires, Alertmanager delivers the target. The shipped rule therefore never lets the target fire while
its inhibitors are pending or firing (tests/rules/inferwatch.test.yml), and this test keeps the reason visible:
if an Alertmanager release ever kept the inhibition past the source's resolution, the rule's clause could go.
"""

from __future__ import annotations

import time
from pathlib import Path

import pytest
import yaml

from tests.alerting import alertmanager, run_tool, tool
from tests.e2e.harness import ROUTING_KEY, Sink, alertmanager_config

pytestmark = [pytest.mark.integration, pytest.mark.slow]

LABELS = ["instance=node-a:9435", "gen_ai_request_model=llama-3.1-8b", "severity=warning", "job=inferwatch-agent"]


def _add(am_url: str, alertname: str, *extra: str) -> None:
    r = run_tool(
        tool("amtool"), "alert", "add", f"--alertmanager.url={am_url}", f"alertname={alertname}", *LABELS, *extra
    )
    assert r.returncode == 0, r.stdout + r.stderr


def test_alertmanager_inhibits_only_while_the_source_fires(tmp_path: Path) -> None:
    with Sink() as sink:
        key = tmp_path / "key"
        key.write_text(ROUTING_KEY + "\n")
        cfg = tmp_path / "alertmanager.yml"
        am_cfg = alertmanager_config(sink.url, key)
        # Only the ticket route's group_interval is shortened (5m → 5s): the inhibited group is re-evaluated at its
        # next group_interval tick, and this test is about what Alertmanager decides then, not when.
        ticket = next(r for r in am_cfg["route"]["routes"] if r["receiver"] == "ticket")
        ticket["group_interval"] = "5s"
        cfg.write_text(yaml.safe_dump(am_cfg, sort_keys=False))
        with alertmanager(cfg, tmp_path) as url:
            _add(url, "PageCachePressureTailLatency")
            time.sleep(1)
            _add(url, "TailLatencyRatioHigh")
            # ticket route: group_wait 30 s. The source arrives; the target stays inhibited.
            src = sink.wait_for(lambda d: d.alertname == "PageCachePressureTailLatency", 60)
            assert src is not None and src.receiver == "ticket"
            time.sleep(5)
            assert [d for d in sink.snapshot() if d.alertname == "TailLatencyRatioHigh"] == []
            # The source resolves (endsAt now) while the target keeps firing: Alertmanager now delivers it.
            now = time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime())
            _add(url, "PageCachePressureTailLatency", f"--end={now}")
            _add(url, "TailLatencyRatioHigh")
            leaked = sink.wait_for(lambda d: d.alertname == "TailLatencyRatioHigh", 60)
            assert leaked is not None, "Alertmanager kept the inhibition after the source resolved"
