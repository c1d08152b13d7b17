"""docker-compose.yml started for real, without a Docker engine: every service as the process its container runs.

tests/compose_local.py runs as PID 1 of private network, mount and PID namespaces and starts each service from
``docker-compose config``'s rendering: the image's entrypoint and command (or compose's), the image's ENV
then compose's environment, the image's user and workdir, the bind mounts and named volumes at their
container paths (an overlay root, chrooted), the service names resolving to the one loopback. A service
starts once its dependencies are healthy by their own compose healthchecks. Debian's Prometheus and
Alertmanager stand in for the images' binaries; the OpenTelemetry Collector and Grafana have no binary on
this machine, so they are not started (tests/test_compose.py checks their configuration statically) and their
names resolve to an unroutable address, as a stopped container would.

One run of the stack (about 30 s) serves every test here; everything is stopped at the end, and the
namespaces die with their PID 1, so nothing can outlive the run.
"""

from __future__ import annotations

import json
import os
import re
import shutil
import subprocess
from typing import Any

import pytest
import yaml

from tests import stack
from tests.compose_local import UPSTREAM, dockerfile_image, image_of
from tests.conftest import PYTHON, ROOT
from tests.tools import require

pytestmark = [pytest.mark.integration, pytest.mark.slow]

DOCKERFILE = (ROOT / "Dockerfile").read_text()

DEADLINE_S = 150.0  # for the whole stack to come up; each service also has its healthcheck's own budget
# Started here: every service whose binary exists on a machine the test command set up.
STARTED = {"simulator", "loadgen", "agent", "pagerduty-sink", "runbooks", "alertmanager", "prometheus"}
# service → the binary this machine lacks (Phoenix is installed in .venv-phoenix, not on PATH: tests/test_trace_store.py
# runs the service's command with it)
NOT_STARTABLE = {"otelcol": "otelcol-contrib", "grafana": "grafana", "phoenix": "phoenix"}
TOKEN_DIR = "/run/inferwatch"


@pytest.fixture(scope="module")
def rendered() -> dict[str, Any]:
    compose = require("docker-compose")
    clean = {k: v for k, v in os.environ.items() if not k.startswith(("INFERWATCH_", "PAGERDUTY_", "GRAFANA_"))}
    r = subprocess.run(
        [compose, "-f", str(stack.COMPOSE_FILE), "config"],
        cwd=ROOT,
        capture_output=True,
        text=True,
        timeout=60,
        env=clean,
    )
    assert r.returncode == 0, r.stderr
    cfg: dict[str, Any] = yaml.safe_load(r.stdout)
    return cfg


@pytest.fixture(scope="module")
def report(rendered: dict[str, Any], tmp_path_factory: pytest.TempPathFactory) -> dict[str, Any]:
    if os.geteuid() != 0:
        pytest.skip("needs root: private namespaces, an overlay root and the images' users (10001, 65534)")
    require("prometheus")
    require("prometheus-alertmanager")
    unshare = require("unshare")
    work = tmp_path_factory.mktemp("compose")
    plan = work / "plan.json"
    plan.write_text(
        json.dumps({"rendered": rendered, "root": str(ROOT), "work": str(work / "run"), "deadline_s": DEADLINE_S})
    )
    out = work / "report.json"
    r = subprocess.run(
        [
            unshare,
            "--net",
            "--mount",
            "--pid",
            "--fork",
            "--kill-child",
            PYTHON,
            "-m",
            "tests.compose_local",
            str(plan),
            str(out),
        ],
        cwd=ROOT,
        capture_output=True,
        text=True,
        timeout=DEADLINE_S + 120,
    )
    assert r.returncode == 0 and out.exists(), r.stdout[-3000:] + r.stderr[-3000:]
    result: dict[str, Any] = json.loads(out.read_text())
    assert "error" not in result, result["error"] + "\n" + json.dumps(result.get("services"), indent=1)[-6000:]
    return result


def _logs(report: dict[str, Any], name: str) -> str:
    return str(report["services"].get(name, {}).get("log_tail", ""))[-2500:]


def test_every_service_is_started_or_lacks_its_binary_here(rendered: dict[str, Any], report: dict[str, Any]) -> None:
    assert set(report["not_started"]) == set(NOT_STARTABLE), report["not_started"]
    for name, binary in NOT_STARTABLE.items():
        assert shutil.which(binary) is None  # the day it exists, the stack starts it and this test says so
        assert binary in report["not_started"][name]
        image = image_of(rendered["services"][name], dockerfile_image(DOCKERFILE), DOCKERFILE)
        assert image is not None and binary in image.binaries.values()
    assert set(report["services"]) == STARTED == set(rendered["services"]) - set(NOT_STARTABLE)


@pytest.mark.parametrize("name", sorted(STARTED))
def test_service_comes_up_healthy_by_its_own_healthcheck(
    rendered: dict[str, Any], report: dict[str, Any], name: str
) -> None:
    entry = report["services"][name]
    assert entry["started"], entry
    assert entry["healthy"], f"{name}: last healthcheck: {entry['last_health']}\n{_logs(report, name)}"
    assert entry["healthy_after_s"] < DEADLINE_S
    test = rendered["services"][name]["healthcheck"]["test"]
    assert entry["health"] == [w.replace("$$", "$") for w in test[1:]]
    # Stopped by SIGTERM at the end (or SIGKILL after 10 s, as `docker compose stop` would).
    assert entry["exit"] is not None


def test_services_run_as_their_images_users(report: dict[str, Any]) -> None:
    uids = {n: s["uid"] for n, s in report["services"].items()}
    assert uids == {
        "simulator": 10001,
        "loadgen": 10001,
        "agent": 10001,
        "pagerduty-sink": 10001,
        "runbooks": 10001,
        "alertmanager": 65534,
        "prometheus": 65534,
    }


def test_agent_serves_metrics_with_the_scrape_token(report: dict[str, Any]) -> None:
    code, body = report["probe"]["metrics_with_scrape_token"]
    assert code == 200
    assert 'inferwatch_runtime_binary_compatible{runtime="simulator"} 1.0' in body
    assert "inferwatch_runtime_profile_available 1.0" in body


def test_api_needs_the_token_and_each_token_has_its_scopes(report: dict[str, Any]) -> None:
    p = report["probe"]
    assert p["status_without_token"] == 401
    assert p["status_with_scrape_token"] == 200 and p["status_with_operator_token"] == 200
    assert p["snapshot_with_scrape_token"] == 403  # Prometheus' token reads, nothing more
    assert p["snapshot_with_operator_token"][0] == 201, p["snapshot_with_operator_token"]


def test_token_files_on_the_volume(report: dict[str, Any]) -> None:
    files = report["probe"]["token_files"]
    assert files == {
        "token": {"mode": "0o600", "uid": 10001},
        "scrape-token": {"mode": "0o644", "uid": 10001},  # Prometheus (user 65534) reads it
        "evidence-token": {"mode": "0o644", "uid": 10001},  # Alertmanager (user 65534) sends the webhook with it
        "tokens": {"mode": "0o600", "uid": 10001},
    }


def test_agent_state_is_written_by_its_user_on_the_named_volume(report: dict[str, Any]) -> None:
    files = report["probe"]["state_files"]
    snapshots = [
        f for f in files if f["path"].startswith("/var/lib/inferwatch/snapshots/") and f["path"].endswith(".json")
    ]
    assert snapshots, files  # the agent's own snapshot and the one the operator's token asked for
    assert all(f["uid"] == 10001 for f in files)
    collectors = {c["name"]: c for c in report["probe"]["status"]["collectors"]}
    assert collectors["runtime_profile"]["state"] == "ok", collectors["runtime_profile"]


def test_agent_serves_the_runbooks(report: dict[str, Any]) -> None:
    from tests.alerting import alert_names

    index = [r["alert"] for r in report["probe"]["runbook_index"]["runbooks"]]
    assert index == sorted(alert_names())  # runbooks/README.md is not a runbook
    assert report["probe"]["runbooks"]
    for name, (code, text) in report["probe"]["runbooks"].items():  # the page, rendered from the Markdown
        assert code == 200 and f"<h1>{name}</h1>" in text, (name, code, text[:300])


def test_every_alert_link_resolves_with_the_agent_stopped(report: dict[str, Any]) -> None:
    """Issue 15: every alert's runbook link, from Prometheus's own runbook_base and rules, answers 200 with its
    runbook while the agent is stopped (AgentDown's subject)."""
    from tests.alerting import alert_names

    stopped = report["links_agent_stopped"]
    assert stopped["agent_answers"] is False
    assert stopped["runbook_base"] == "http://localhost:9436/runbooks"
    assert set(stopped["links"]) == alert_names()
    for name, (code, text) in stopped["links"].items():
        assert code == 200 and f"<h1>{name}</h1>" in text, (name, code, text[:300])


def test_runtime_pattern_matches_the_simulators_real_command_line(
    rendered: dict[str, Any], report: dict[str, Any]
) -> None:
    pattern = re.compile(rendered["services"]["agent"]["environment"]["INFERWATCH_RUNTIME__CMDLINE_PATTERN"])
    cmdlines = report["probe"]["cmdlines"]
    assert pattern.search(cmdlines["simulator"]), cmdlines["simulator"]
    others = {n: c for n, c in cmdlines.items() if n != "simulator" and pattern.search(c)}
    assert not others, f"the runtime pattern also matches {others}"
    collectors = {c["name"]: c for c in report["probe"]["status"]["collectors"]}
    assert collectors["binary"]["state"] == "ok" and collectors["simd"]["state"] == "ok"
    assert f'"pid": {report["probe"]["pids"]["simulator"]}' in json.dumps(report["probe"]["binary"])


def test_prometheus_scrapes_the_agent_with_its_token_and_the_engine(report: dict[str, Any]) -> None:
    targets = {t["job"]: t for t in report["probe"]["prometheus_targets"]}
    assert targets["inferwatch-agent"]["health"] == "up", targets["inferwatch-agent"]["error"]
    assert targets["engine"]["health"] == "up", targets["engine"]["error"]
    assert targets["otelcol"]["health"] == "down"  # not started here: its name leads nowhere


def test_loadgen_drives_the_simulator(report: dict[str, Any]) -> None:
    # The agent's synthetic probe makes one request per 30 s; the rest are the load generator's.
    assert report["probe"]["simulator_requests"] >= 3, _logs(report, "loadgen")


def test_the_run_is_bounded(report: dict[str, Any]) -> None:
    assert report["elapsed_s"] < DEADLINE_S + 60


def test_upstream_image_facts_cover_every_image(rendered: dict[str, Any]) -> None:
    images = {s["image"].rsplit(":", 1)[0] for s in rendered["services"].values() if "build" not in s}
    assert images == set(UPSTREAM)
