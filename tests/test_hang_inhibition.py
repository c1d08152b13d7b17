"""A hang's recovery holds back its own node's latency alerts, not the other nodes' (the real Alertmanager).

alerts/alertmanager.yml inhibits, while EngineHangRecovering fires, the latency alerts a drained backlog makes:
the hung node's (equal on instance and model) and the model's TTFT SLO (which carries no instance). Posted with
amtool to a real Alertmanager 0.25 running the shipped configuration; its API says which alert is suppressed and
by what.
"""

from __future__ import annotations

import time
from pathlib import Path
from typing import Any

import httpx
import pytest
import yaml

from tests.alerting import alertmanager, run_tool, tool
from tests.e2e.harness import ROUTING_KEY, Sink, alertmanager_config

pytestmark = [pytest.mark.integration, pytest.mark.slow]

MODEL, OTHER_MODEL = "llama-3.1-8b", "qwen-7b"
HUNG, PEER = "node-a:9435", "node-b:9435"


def _add(am_url: str, alertname: str, **labels: str) -> None:
    args = [f"{k}={v}" for k, v in labels.items()]
    r = run_tool(tool("amtool"), "alert", "add", f"--alertmanager.url={am_url}", f"alertname={alertname}", *args)
    assert r.returncode == 0, r.stdout + r.stderr


def _node(instance: str, model: str = MODEL) -> dict[str, str]:
    return {"instance": instance, "gen_ai_request_model": model, "job": "inferwatch-agent", "severity": "warning"}


def _states(am_url: str) -> dict[tuple[str, str, str], str]:
    alerts: list[dict[str, Any]] = httpx.get(f"{am_url}/api/v2/alerts", timeout=10).json()
    return {
        (a["labels"]["alertname"], a["labels"].get("instance", ""), a["labels"].get("gen_ai_request_model", "")): a[
            "status"
        ]["state"]
        for a in alerts
    }


def test_hang_recovery_inhibits_its_node_and_its_model_slo_only(tmp_path: Path) -> None:
    with Sink() as sink:
        key = tmp_path / "key"
        key.write_text(ROUTING_KEY + "\n")
        cfg = tmp_path / "alertmanager.yml"
        cfg.write_text(yaml.safe_dump(alertmanager_config(sink.url, key), sort_keys=False))
        with alertmanager(cfg, tmp_path) as url:
            _add(url, "EngineHangRecovering", **{**_node(HUNG), "severity": "info"})
            for instance in (HUNG, PEER):
                for name in ("LatencyBimodal", "KVCacheSaturatedWithPreemptions", "GoodputBelowTarget"):
                    _add(url, name, **_node(instance))
            for model in (MODEL, OTHER_MODEL):
                _add(url, "TTFTErrorBudgetBurn", gen_ai_request_model=model, slo="ttft-500ms", severity="critical")
            _add(url, "LatencyBimodal", **_node(HUNG, OTHER_MODEL))
            want = {
                ("EngineHangRecovering", HUNG, MODEL): "active",
                ("LatencyBimodal", HUNG, MODEL): "suppressed",
                ("KVCacheSaturatedWithPreemptions", HUNG, MODEL): "suppressed",
                ("GoodputBelowTarget", HUNG, MODEL): "suppressed",
                ("LatencyBimodal", PEER, MODEL): "active",  # another node of the same model still reaches a person
                ("KVCacheSaturatedWithPreemptions", PEER, MODEL): "active",
                ("GoodputBelowTarget", PEER, MODEL): "active",
                ("LatencyBimodal", HUNG, OTHER_MODEL): "active",  # another model on the hung node
                ("TTFTErrorBudgetBurn", "", MODEL): "suppressed",  # the model's SLO: no instance to tell nodes apart
                ("TTFTErrorBudgetBurn", "", OTHER_MODEL): "active",
            }
            deadline = time.monotonic() + 60
            states = _states(url)
            while states != want and time.monotonic() < deadline:
                time.sleep(0.5)
                states = _states(url)
            assert states == want
