"""The shipped deployments push with the labels their Prometheus gives the same alerts (one alert, one page).

docker-compose.yml: ``instance`` is deploy/prometheus.yml's agent target, ``labels`` its external labels. The
kube-prometheus-stack overlay: ``instance`` is the node (the ServiceMonitor's relabeling), the target labels are the
ones prometheus-operator and the ServiceMonitor add. Both load through the agent's own settings model.
"""

from __future__ import annotations

import json
import re
from typing import Any

import pytest
import yaml

from inferwatch.agent.config import Settings
from tests.conftest import ROOT
from tests.test_kubernetes import render


def _settings_from_env(env: dict[str, str]) -> Settings:
    data: dict[str, Any] = {}
    for key, value in env.items():
        if key.startswith("INFERWATCH_ALERTMANAGER__"):
            field = key.removeprefix("INFERWATCH_ALERTMANAGER__").lower()
            data[field] = json.loads(value) if value.startswith(("[", "{")) else value
    return Settings.from_values({"alertmanager": data})


def test_compose_pushes_with_the_labels_of_its_prometheus() -> None:
    compose = yaml.safe_load((ROOT / "docker-compose.yml").read_text())
    env = compose["services"]["agent"]["environment"]
    am = _settings_from_env(env).alertmanager
    prom = yaml.safe_load((ROOT / "deploy" / "prometheus.yml").read_text())
    job = next(j for j in prom["scrape_configs"] if j["job_name"] == am.job)
    assert [am.instance] == job["static_configs"][0]["targets"]
    assert am.labels == prom["global"]["external_labels"]
    targets = prom["alerting"]["alertmanagers"][0]["static_configs"][0]["targets"]
    assert am.urls == [f"http://{t}" for t in targets]  # every Alertmanager Prometheus sends to


def test_kube_prometheus_stack_overlay_pushes_with_the_service_monitors_labels() -> None:
    docs = render("kube-prometheus-stack")
    ds = next(d for d in docs if d["kind"] == "DaemonSet")
    env = {e["name"]: e.get("value", "") for e in ds["spec"]["template"]["spec"]["containers"][0]["env"]}
    defined = list(env)
    for key, value in env.items():  # $(VAR) needs VAR defined earlier in the list (Kubernetes' expansion rule)
        for ref in re.findall(r"\$\(([A-Z_]+)\)", value):
            assert defined.index(ref) < defined.index(key), (key, ref)
    fake = {"NODE_NAME": "node-a", "POD_NAME": "inferwatch-agent-x", "POD_NAMESPACE": "inferwatch"}
    expanded = {k: re.sub(r"\$\(([A-Z_]+)\)", lambda m: fake.get(m[1], m[0]), v) for k, v in env.items()}
    am = _settings_from_env(expanded).alertmanager
    assert am.urls and am.instance == "node-a"
    sm = next(d for d in docs if d["kind"] == "ServiceMonitor")
    relabelings = sm["spec"]["endpoints"][0]["relabelings"]
    relabeled = {r["targetLabel"] for r in relabelings if "targetLabel" in r}
    assert relabeled - {"instance"} <= set(am.target_labels)  # what the relabeling adds, the push adds
    dropped = [re.compile(r["regex"]) for r in relabelings if r.get("action") == "labeldrop"]
    assert not [k for k in am.target_labels if any(d.fullmatch(k) for d in dropped)]  # what it drops, the push does not
    assert am.target_labels["service"] == sm["metadata"]["name"] and am.job == sm["metadata"]["name"]


@pytest.mark.parametrize("name", ["base", "plain-prometheus", "profiling"])
def test_push_stays_off_where_no_alertmanager_is_deployed(name: str) -> None:
    ds = next(d for d in render(name) if d["kind"] == "DaemonSet")
    env = {e["name"] for e in ds["spec"]["template"]["spec"]["containers"][0]["env"]}
    assert not any(k.startswith("INFERWATCH_ALERTMANAGER__") for k in env)
