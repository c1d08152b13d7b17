"""Kubernetes readiness of an engine from its node's agent: the example engine Deployment and its exec probe.

deploy/kubernetes/overlays/engine-readiness/example-engine.yaml validates against the Kubernetes schemas and keeps
to the Baseline Pod Security Standard (no host namespaces, ports, paths, privilege; no ``host`` in a probe: KEP-4940).
Its probe's command is run here, as the kubelet would run it in the engine container, against a real agent reading
a real simulator: exit 0 while the engine serves, 1 once the agent answers 503 ``hung``, 0 again when no agent
answers at all (fail-open: an agent that is down never drains its node's engines). The kubelet's part (a failed
readiness probe removes the pod from the Service's endpoints, never restarts it) is Kubernetes' own; no cluster
runs here.
"""

from __future__ import annotations

import contextlib
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

import kubernetes_validate
import pytest
import yaml

from tests.conftest import PYTHON, ROOT, free_port
from tests.e2e.test_alert_pipeline import SIM_CONTROL_TOKEN, SimProc
from tests.procs import running, wait_http
from tests.test_kubernetes import K8S_VERSION, render

EXAMPLE = ROOT / "deploy" / "kubernetes" / "overlays" / "engine-readiness" / "example-engine.yaml"
NODE_LOCAL = "http://inferwatch-agent-node-local.inferwatch.svc:9435"


def _example() -> dict[str, Any]:
    doc = yaml.safe_load(EXAMPLE.read_text())
    assert isinstance(doc, dict)
    return doc


def _probe_command(url_base: str) -> list[str]:
    cmd = _example()["spec"]["template"]["spec"]["containers"][0]["readinessProbe"]["exec"]["command"]
    assert cmd[:2] == ["python3", "-c"] and NODE_LOCAL in cmd[2]
    return [sys.executable, "-c", cmd[2].replace(NODE_LOCAL, url_base)]


def _run_probe(url_base: str) -> int:
    return subprocess.run(_probe_command(url_base), capture_output=True, timeout=30, check=False).returncode


def test_example_engine_validates_and_keeps_to_baseline() -> None:
    doc = _example()
    kubernetes_validate.validate(doc, K8S_VERSION, strict=True)
    pod = doc["spec"]["template"]["spec"]
    assert not any(pod.get(k) for k in ("hostNetwork", "hostPID", "hostIPC"))
    assert not any(v.get("hostPath") for v in pod.get("volumes", []))
    for c in pod["containers"]:
        assert not (c.get("securityContext") or {}).get("privileged")
        assert not any(p.get("hostPort") for p in c.get("ports", []))
        for probe in ("readinessProbe", "livenessProbe", "startupProbe"):
            handler = c.get(probe) or {}
            assert "host" not in (handler.get("httpGet") or {}) and "host" not in (handler.get("tcpSocket") or {})
        assert "exec" in c["readinessProbe"]
        assert c["livenessProbe"]["httpGet"]["path"] == "/health"  # a hang drains, it never restarts


def test_the_overlay_gives_the_probe_its_node_local_agent_and_open_path() -> None:
    docs = render("engine-readiness")
    svc = next(d for d in docs if d["kind"] == "Service" and d["metadata"]["name"] == "inferwatch-agent-node-local")
    assert svc["spec"]["internalTrafficPolicy"] == "Local"
    assert svc["metadata"]["labels"]["app.kubernetes.io/name"] != "inferwatch-agent"  # not scraped twice
    port = svc["spec"]["ports"][0]["port"]
    assert NODE_LOCAL.endswith(f".{svc['metadata']['namespace']}.svc:{port}")
    ds = next(d for d in docs if d["kind"] == "DaemonSet")
    env = {e["name"]: e.get("value") for e in ds["spec"]["template"]["spec"]["containers"][0]["env"]}
    assert "/engines/*" in yaml.safe_load(env["INFERWATCH_API__OPEN_PATHS"])


@pytest.mark.integration
@pytest.mark.slow
def test_the_probe_command_follows_the_agent(tmp_path: Path) -> None:
    with contextlib.ExitStack() as stack:
        port = free_port()
        cmd = [PYTHON, "-m", "inferwatch.agent", "simulate", "--port", str(port), "--model", "m", "--seed", "6"]
        cmd += ["--control-token", SIM_CONTROL_TOKEN, "--log-level", "warning"]
        sim = SimProc("m", port, stack.enter_context(running(cmd, tmp_path / "sim.log", cwd=ROOT)))
        wait_http(f"{sim.url}/health", proc=sim.proc, timeout_s=60)
        load = [PYTHON, "-m", "inferwatch.agent", "loadgen", "--url", sim.url, "--rate", "4", "--duration", "300"]
        stack.enter_context(running([*load, "--no-progress"], tmp_path / "loadgen.log", cwd=ROOT))
        agent_port = free_port()
        env = {
            "INFERWATCH_ENGINE__METRICS_URL": f"{sim.url}/metrics",
            "INFERWATCH_API__TOKENS": '[{"token": "' + "k" * 24 + '", "scopes": ["read"]}]',
            "INFERWATCH_API__OPEN_PATHS": '["/metrics", "/healthz", "/readyz", "/engines/*"]',  # as the overlay
            "INFERWATCH_SNAPSHOTS__DIR": str(tmp_path / "snap"),
            "INFERWATCH_EVIDENCE__DIR": str(tmp_path / "evidence"),
            "INFERWATCH_EVIDENCE__PY_SPY": "false",
        }
        acmd = [PYTHON, "-m", "inferwatch.agent", "run", "--port", str(agent_port)]
        agent = stack.enter_context(running(acmd, tmp_path / "agent.log", cwd=ROOT, env=env))
        base = f"http://127.0.0.1:{agent_port}"
        wait_http(f"{base}/engines/default/ready", ok=lambda r: r.status_code == 200, proc=agent, timeout_s=90)
        assert _run_probe(base) == 0
        sim.control({"enable": "hang"})
        wait_http(f"{base}/engines/default/ready", ok=lambda r: r.status_code == 503, proc=agent, timeout_s=60)
        assert _run_probe(base) == 1
        sim.control({"disable": "hang"})
        deadline = time.monotonic() + 60
        while _run_probe(base) != 0:
            assert time.monotonic() < deadline, "the probe never passed again after the hang"
            time.sleep(1)
    assert _run_probe(f"http://127.0.0.1:{free_port()}") == 0  # no agent there: fail-open
