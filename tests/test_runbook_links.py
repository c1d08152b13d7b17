"""Runbook links resolve when their subject is down: ``runbook_base`` pointed at deploy/runbook_server.py.

The default ``runbook_base`` is the agent's own /runbooks, so AgentDown's link pointed at the agent that was down
(issue 15). The static runbook server is a separate process that reads only the runbook directory. Tested: every
alert's link with no agent running at all (the subject of every agent-self alert stopped), and the links of
AgentDown and EngineDown as Prometheus renders them while the agent, or the engine, is actually stopped.
"""

from __future__ import annotations

import contextlib
import time
from collections.abc import Iterator
from pathlib import Path

import httpx
import pytest

from tests.alerting import alert_names, load_rules
from tests.conftest import PYTHON, ROOT, free_port
from tests.e2e.harness import Sink, pipeline
from tests.procs import running, stop, wait_http

pytestmark = [pytest.mark.integration]

SERVER = ROOT / "deploy" / "runbook_server.py"


@contextlib.contextmanager
def runbook_server(tmp: Path) -> Iterator[str]:
    port = free_port()
    cmd = [PYTHON, str(SERVER), "--port", str(port), "--dir", str(ROOT / "runbooks")]
    with running(cmd, tmp / "runbooks.log", cwd=tmp) as proc:
        wait_http(f"http://127.0.0.1:{port}/healthz", proc=proc)
        yield f"http://127.0.0.1:{port}/runbooks"


def test_every_alert_link_resolves_with_no_agent_running(tmp_path) -> None:
    with runbook_server(tmp_path) as base:
        for rule in load_rules():
            if "alert" not in rule:
                continue
            name = rule["alert"]
            template = rule["annotations"]["runbook_url"]
            assert template.startswith("{{ with $externalLabels.runbook_base }}{{ . }}{{ else }}"), name
            url = f"{base}/{template.rsplit('/', 1)[1]}"  # what Prometheus renders with runbook_base set
            r = httpx.get(url, timeout=5)
            assert r.status_code == 200 and f"<h1>{name}</h1>" in r.text, (name, r.status_code)
            assert r.headers["content-type"].startswith("text/html")
        md = httpx.get(f"{base}/AgentDown?format=md", timeout=5)
        assert md.headers["content-type"].startswith("text/markdown") and md.text.startswith("# AgentDown\n")
        index = httpx.get(base, timeout=5).json()["runbooks"]
        assert {e["alert"] for e in index} == alert_names()
        for bad in ("../README", "agentdown", "AgentDown.md", "..%2FREADME"):
            assert httpx.get(f"{base}/{bad}", timeout=5).status_code == 404, bad


@pytest.mark.slow
def test_agent_down_and_engine_down_links_resolve_with_their_subject_stopped(tmp_path) -> None:
    with contextlib.ExitStack() as es:
        base = es.enter_context(runbook_server(tmp_path))
        sink = es.enter_context(Sink())
        down_port, engine_port = free_port(), free_port()
        # the agent whose engine is gone: an engine URL where nothing listens
        engine_agent = [PYTHON, "-m", "inferwatch.agent", "run", "--port", str(engine_port), "--interval", "0.5"]
        env = {"PATH": "/usr/bin:/bin", "INFERWATCH_ENGINE__METRICS_URL": f"http://127.0.0.1:{free_port()}/metrics"}
        es.enter_context(running(engine_agent, tmp_path / "engine-agent.log", cwd=ROOT, env=env))
        # the agent that goes down: started, scraped, stopped
        agent = es.enter_context(
            running(
                [PYTHON, "-m", "inferwatch.agent", "run", "--port", str(down_port)],
                tmp_path / "agent.log",
                cwd=ROOT,
                env=env,
            )
        )
        wait_http(f"http://127.0.0.1:{down_port}/healthz", proc=agent, timeout_s=60)
        pl = es.enter_context(pipeline(tmp_path / "pipeline", sink, [down_port, engine_port], base))
        stop(agent)
        links: dict[str, str] = {}
        deadline = time.monotonic() + 90
        while time.monotonic() < deadline and len(links) < 2:
            for a in httpx.get(f"{pl.prometheus_url}/api/v1/alerts", timeout=5).json()["data"]["alerts"]:
                name = a["labels"]["alertname"]
                if a["state"] == "firing" and name in ("AgentDown", "EngineDown"):
                    links[name] = a["annotations"]["runbook_url"]
            time.sleep(0.5)
        assert set(links) == {"AgentDown", "EngineDown"}, links
        for name, url in links.items():
            assert url == f"{base}/{name}"
            r = httpx.get(url, timeout=5)
            assert r.status_code == 200 and f"<h1>{name}</h1>" in r.text, (name, url, r.status_code)
        with pytest.raises(httpx.ConnectError):  # the subject really is down: its own /runbooks does not answer
            httpx.get(f"http://127.0.0.1:{down_port}/runbooks/AgentDown", timeout=5)
