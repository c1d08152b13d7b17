"""docker-compose.yml, checked without a Docker engine.

- ``docker-compose config`` (Debian's docker-compose 1.29) validates the file (and rejects a broken copy);
- the services are the demo stack's, images are pinned, every mounted host path exists;
- the Prometheus, Alertmanager and Collector files it mounts are the ones the end-to-end tests run natively
  (tests/stack.py), promtool accepts the Prometheus configuration, amtool the rendered Alertmanager one;
- every ``host:port`` in the compose file and the mounted configs names a compose service and a port it
  listens on;
- every service has a healthcheck and waits for its dependencies to be healthy; the agent's token reaches
  Prometheus through a named volume; the agent's state lives on a named volume its image user owns;
- the Dockerfile builds the wheel in one stage and installs it (not editable) in the next, from a lock file
  with pinned hashes, as a non-root user; the wheel carries the runbooks the agent serves.

tests/test_compose_processes.py starts the services themselves.
"""

from __future__ import annotations

import json
import os
import re
import shutil
import subprocess
import time
import zipfile
from pathlib import Path
from typing import Any

import httpx
import pytest
import yaml

from inferwatch.dashboards.common import TRACE_URL_DEFAULT
from tests import stack
from tests.compose_local import dockerfile_image, volumes
from tests.conftest import PYTHON, ROOT, free_port
from tests.tools import require

SERVICES = {
    "simulator", "loadgen", "agent", "otelcol", "prometheus", "alertmanager", "grafana", "pagerduty-sink", "runbooks",
    "phoenix",
}  # fmt: skip
# Ports the upstream images listen on by default (their Dockerfiles' EXPOSE).
IMAGE_PORTS = {"prometheus": {9090}, "alertmanager": {9093}, "grafana": {3000}}
_HOSTPORT = re.compile(r"(?<![\w.-])([a-z][a-z0-9-]*):(\d{2,5})(?![\d:.])")  # host:port, not image:1.2 or a:1:2
_LOCAL = {"localhost", "127", "0", "service"}


def _config(env: dict[str, str] | None = None, path: Path = stack.COMPOSE_FILE) -> dict[str, Any]:
    clean = {k: v for k, v in os.environ.items() if not k.startswith(("INFERWATCH_", "PAGERDUTY_", "GRAFANA_"))}
    r = subprocess.run(
        [require("docker-compose"), "-f", str(path), "config"],
        cwd=ROOT,
        capture_output=True,
        text=True,
        timeout=60,
        env={**clean, **(env or {})},
    )
    assert r.returncode == 0, r.stderr
    return yaml.safe_load(r.stdout)


@pytest.fixture(scope="module")
def rendered() -> dict[str, Any]:
    return _config()


def _binds(service: dict[str, Any]) -> list[tuple[Path, str]]:
    out = []
    for v in service.get("volumes", []):
        if isinstance(v, dict):
            if v.get("type") == "bind":
                out.append((Path(v["source"]), v["target"]))
        else:
            src, _, rest = v.partition(":")
            if src.startswith(("/", ".")):
                out.append((Path(src), rest.split(":")[0]))
    return out


def test_docker_compose_config_validates_and_rejects_a_broken_file(tmp_path: Path) -> None:
    compose = require("docker-compose")
    r = subprocess.run([compose, "-f", str(stack.COMPOSE_FILE), "config", "-q"], cwd=ROOT, timeout=60)
    assert r.returncode == 0
    broken = tmp_path / "docker-compose.yml"
    broken.write_text(stack.COMPOSE_FILE.read_text().replace("  prometheus:\n", "  prometheus:\n    bogus_key: 1\n", 1))
    r2 = subprocess.run(
        [compose, "-f", str(broken), "config", "-q"], cwd=ROOT, capture_output=True, text=True, timeout=60
    )
    assert r2.returncode != 0 and "bogus_key" in r2.stderr


def test_services_are_the_demo_stack(rendered: dict[str, Any]) -> None:
    assert set(rendered["services"]) == SERVICES


def test_images_are_pinned(rendered: dict[str, Any]) -> None:
    for name, svc in rendered["services"].items():
        image = svc["image"]
        repo, _, tag = image.rpartition(":")
        assert repo and tag and tag != "latest" and re.match(r"^v?\d+\.\d+\.\d+$", tag), f"{name}: {image}"
    built = {n for n, s in rendered["services"].items() if "build" in s}
    assert built == {"simulator", "loadgen", "agent", "pagerduty-sink", "runbooks", "phoenix"}
    dockerfile = (ROOT / "Dockerfile").read_text()
    assert re.search(r"^FROM python:\d+\.\d+\.\d+-slim-bookworm$", dockerfile, re.M)


def test_every_mounted_host_path_exists(rendered: dict[str, Any]) -> None:
    mounts = [(name, src, dst) for name, svc in rendered["services"].items() for src, dst in _binds(svc)]
    assert len(mounts) >= 8
    missing = [f"{name}: {src}" for name, src, _ in mounts if not src.exists()]
    assert not missing, f"mounted paths that do not exist: {missing}"


def test_mounted_configs_are_the_files_the_e2e_tests_run(rendered: dict[str, Any]) -> None:
    mounts = {(name, dst): src.resolve() for name, svc in rendered["services"].items() for src, dst in _binds(svc)}
    assert mounts[("prometheus", "/etc/prometheus/prometheus.yml")] == stack.PROMETHEUS_CONFIG
    assert mounts[("prometheus", stack.CONTAINER_RULES_DIR)] == stack.RULES_DIR
    assert mounts[("alertmanager", "/etc/alertmanager/alertmanager.yml")] == stack.ALERTMANAGER_CONFIG
    assert mounts[("otelcol", "/etc/otelcol-contrib/config.yaml")] == stack.OTELCOL_CONFIG
    assert mounts[("grafana", "/etc/grafana/dashboards/inferwatch")] == (ROOT / "dashboards" / "json")
    # The native config keeps everything but targets, intervals and paths: same jobs, same rule files.
    native = stack.native_prometheus_config({"inferwatch-agent": ["127.0.0.1:1"]})
    original = yaml.safe_load(stack.PROMETHEUS_CONFIG.read_text())
    assert [j["job_name"] for j in native["scrape_configs"]] == [j["job_name"] for j in original["scrape_configs"]]
    assert native["global"]["external_labels"] == original["global"]["external_labels"]
    assert native["rule_files"] == [str(stack.RULES_DIR / "*.rules.yml")]
    assert sorted(stack.RULES_DIR.glob("*.rules.yml")), "alerts/*.rules.yml must exist (Prometheus mounts them)"


def test_promtool_accepts_the_prometheus_config_and_its_rules(tmp_path: Path) -> None:
    require("promtool")
    # The compose file as is, but for the token file (promtool checks it exists; in the stack the agent writes it).
    # tests/test_compose_processes.py runs Prometheus on the unchanged file at its container path.
    token = tmp_path / "scrape-token"
    token.write_text("0123456789abcdef0123\n")
    text = stack.PROMETHEUS_CONFIG.read_text()
    assert text.count("/etc/prometheus/inferwatch/scrape-token") == 1
    compose_copy = tmp_path / "compose-prometheus.yml"
    compose_copy.write_text(text.replace("/etc/prometheus/inferwatch/scrape-token", str(token)))
    r = subprocess.run(["promtool", "check", "config", str(compose_copy)], capture_output=True, text=True)
    assert r.returncode == 0, r.stdout + r.stderr
    native = tmp_path / "prometheus.yml"
    native.write_text(yaml.safe_dump(stack.native_prometheus_config({})))
    r = subprocess.run(["promtool", "check", "config", str(native)], capture_output=True, text=True)
    assert r.returncode == 0, r.stdout + r.stderr
    assert "rule files found" in r.stdout and "SUCCESS" in r.stdout


@pytest.mark.parametrize("mode", ["no key (demo sink)", "env key", "secret file"])
def test_alertmanager_entrypoint_renders_a_valid_config(tmp_path: Path, mode: str) -> None:
    require("amtool")
    env = {"PATH": os.environ["PATH"], "ALERTMANAGER_STATE_DIR": str(tmp_path / "state")}
    key = "0123456789abcdef0123456789abcdef"
    if mode == "env key":
        env["PAGERDUTY_ROUTING_KEY"] = key
    elif mode == "secret file":
        (tmp_path / "key").write_text(key + "\n")
        env["PAGERDUTY_ROUTING_KEY_FILE"] = str(tmp_path / "key")
    else:
        env["PAGERDUTY_ROUTING_KEY_FILE"] = str(ROOT / "deploy" / "alertmanager" / "no-routing-key")
    script = ROOT / "deploy" / "alertmanager" / "entrypoint.sh"
    r = subprocess.run(
        ["sh", str(script), str(stack.ALERTMANAGER_CONFIG), "-"], capture_output=True, text=True, env=env, timeout=30
    )
    assert r.returncode == 0, r.stderr
    out = tmp_path / "alertmanager.yml"
    out.write_text(r.stdout)
    check = subprocess.run(["amtool", "check-config", str(out)], capture_output=True, text=True, timeout=30)
    assert check.returncode == 0, check.stdout + check.stderr
    cfg = yaml.safe_load(r.stdout)
    stored_key = (tmp_path / "state" / "pagerduty_routing_key").read_text().strip()
    pd = [c for rc in cfg["receivers"] for c in rc.get("pagerduty_configs", [])]
    assert pd and all(c["routing_key_file"] == str(tmp_path / "state" / "pagerduty_routing_key") for c in pd)
    if mode == "no key (demo sink)":
        assert cfg["global"]["pagerduty_url"] == "http://pagerduty-sink:9099/v2/enqueue"
        assert stored_key == "0" * 32
        assert "no PagerDuty routing key" in r.stderr
    else:
        assert "pagerduty_url" not in cfg["global"]
        assert stored_key == key
    hooks = {rc["name"]: c for rc in cfg["receivers"] for c in rc.get("webhook_configs", [])}
    evidence = hooks.pop("agent-evidence")
    assert evidence["url"] == "http://agent:9435/api/v1/alertmanager"
    assert evidence["http_config"]["authorization"]["credentials_file"] == "/etc/alertmanager/inferwatch/evidence-token"
    assert hooks and all(h["url"].startswith("http://pagerduty-sink:9099/") for h in hooks.values())


def _listening_ports(rendered: dict[str, Any]) -> dict[str, set[int]]:
    ports: dict[str, set[int]] = {name: set(IMAGE_PORTS.get(name, set())) for name in rendered["services"]}
    for name, svc in rendered["services"].items():
        words = [str(w) for w in (svc.get("command") or [])]
        text = " ".join(words)
        ports[name] |= {int(p) for p in re.findall(r"--port[ =](\d+)", text)}
        ports[name] |= {
            int(p) for p in re.findall(r"0\.0\.0\.0:(\d+)", " ".join(map(str, svc.get("environment", {}).values())))
        }
    otelcol = yaml.safe_load(stack.OTELCOL_CONFIG.read_text())
    ports["otelcol"] |= {int(p) for p in re.findall(r"0\.0\.0\.0:(\d+)", yaml.safe_dump(otelcol))}
    return ports


def _references(rendered: dict[str, Any]) -> list[tuple[str, str, int]]:
    services = {n: {k: v for k, v in s.items() if k != "image"} for n, s in rendered["services"].items()}
    texts = {"docker-compose.yml": yaml.safe_dump(services)}
    for path in (
        stack.PROMETHEUS_CONFIG,
        stack.OTELCOL_CONFIG,
        ROOT / "deploy" / "grafana" / "provisioning" / "datasources" / "inferwatch.yaml",
        ROOT / "deploy" / "alertmanager" / "entrypoint.sh",
    ):
        texts[str(path.relative_to(ROOT))] = "\n".join(
            line for line in path.read_text().splitlines() if not line.lstrip().startswith("#")
        )
    out = []
    for where, text in texts.items():
        for host, port in _HOSTPORT.findall(text):
            if host not in _LOCAL and not host.startswith(("http", "https")):
                out.append((where, host, int(port)))
    return out


def test_every_host_and_port_in_the_configs_is_a_service_port(rendered: dict[str, Any]) -> None:
    ports = _listening_ports(rendered)
    refs = _references(rendered)
    names = {h for _, h, _ in refs}
    # The wiring this stack depends on is all there:
    assert {"simulator", "agent", "otelcol", "prometheus", "alertmanager", "pagerduty-sink"} <= names
    bad = [f"{where}: {h}:{p}" for where, h, p in refs if h not in ports or p not in ports[h]]
    assert not bad, f"references to unknown services or ports: {bad}"
    for name, svc in rendered["services"].items():
        for p in svc.get("ports", []):
            target = int(p["target"]) if isinstance(p, dict) else int(str(p).rsplit(":", 1)[-1].split("/")[0])
            assert target in ports[name], f"{name} publishes {target} but listens on {sorted(ports[name])}"


def test_prometheus_scrapes_the_collector_where_it_exports() -> None:
    prom = yaml.safe_load(stack.PROMETHEUS_CONFIG.read_text())
    otel = yaml.safe_load(stack.OTELCOL_CONFIG.read_text())
    jobs = {j["job_name"]: j for j in prom["scrape_configs"]}
    assert {"inferwatch-agent", "engine", "otelcol"} <= set(jobs)
    assert jobs["otelcol"]["honor_labels"] is True
    exporter_port = otel["exporters"]["prometheus"]["endpoint"].rsplit(":", 1)[1]
    assert jobs["otelcol"]["static_configs"][0]["targets"] == [f"otelcol:{exporter_port}"]
    for pipeline in otel["service"]["pipelines"].values():
        for kind in ("receivers", "processors", "exporters"):
            assert set(pipeline.get(kind, [])) <= set(otel.get(kind, {})), f"undefined {kind} in a pipeline"
    assert "otlp" in otel["service"]["pipelines"]["metrics"]["receivers"]


def test_runbook_links_point_at_the_runbooks_service_not_the_agent(rendered: dict[str, Any]) -> None:
    """Issue 15: AgentDown's link pointed at the agent that was down. Prometheus's runbook_base is the runbooks
    service's published address, and that service runs the runbook server alone (no agent, no dependency)."""
    prom = yaml.safe_load(stack.PROMETHEUS_CONFIG.read_text())
    base = prom["global"]["external_labels"]["runbook_base"]
    svc = rendered["services"]["runbooks"]
    published = {(ip, int(port)) for ip, port, _ in (str(p).split(":") for p in svc["ports"])}
    m = re.fullmatch(r"http://localhost:(\d+)/runbooks", base)
    assert m and ("127.0.0.1", int(m.group(1))) in published, (base, published)
    assert svc["entrypoint"] == ["python", "/app/deploy/runbook_server.py"] and not svc.get("depends_on")
    assert rendered["services"]["agent"]["environment"]["INFERWATCH_RUNBOOKS__BASE_URL"] == base
    assert "runbooks" in rendered["services"]["prometheus"]["depends_on"]


def test_grafana_provisioning_points_at_the_mounted_dashboards(rendered: dict[str, Any]) -> None:
    prov = ROOT / "deploy" / "grafana" / "provisioning"
    dash = yaml.safe_load((prov / "dashboards" / "inferwatch.yaml").read_text())
    ds = yaml.safe_load((prov / "datasources" / "inferwatch.yaml").read_text())
    graf = rendered["services"]["grafana"]
    mounts = {dst: src for src, dst in _binds(graf)}
    path = dash["providers"][0]["options"]["path"]
    assert mounts[path].resolve() == ROOT / "dashboards" / "json"
    home = graf["environment"]["GF_DASHBOARDS_DEFAULT_HOME_DASHBOARD_PATH"]
    assert (ROOT / "dashboards" / "json" / Path(home).name).exists() and home.startswith(path)
    assert graf["environment"]["GF_AUTH_ANONYMOUS_ENABLED"] == "true"
    assert graf["environment"]["GF_AUTH_ANONYMOUS_ORG_ROLE"] == "Viewer"
    assert [d["type"] for d in ds["datasources"]] == ["prometheus", "alertmanager"]
    assert ds["datasources"][0]["isDefault"] is True


def test_agent_shares_the_runtime_pid_namespace_with_ptrace(rendered: dict[str, Any]) -> None:
    agent = rendered["services"]["agent"]
    assert agent["pid"] == "service:simulator"
    assert "SYS_PTRACE" in agent["cap_add"]
    assert agent["environment"]["INFERWATCH_ENGINE__METRICS_URL"] == "http://simulator:8000/metrics"


@pytest.mark.parametrize("scenario", ["", "page_cache_pressure"])
def test_scenario_is_selected_by_environment(scenario: str) -> None:
    cfg = _config({"INFERWATCH_SCENARIO": scenario} if scenario else {})
    sim = cfg["services"]["simulator"]
    assert sim["environment"]["INFERWATCH_SCENARIO"] == scenario
    # Run the container's shell command natively, printing the argv instead of starting the simulator.
    # docker-compose config keeps $$ escaped (its output is a compose file); the container sees $.
    script = sim["command"][0].replace("$$", "$").replace("exec python -m inferwatch.agent simulate", "printf '%s\\n'")
    r = subprocess.run(
        ["sh", "-c", script], capture_output=True, text=True, env={"PATH": os.environ["PATH"], **sim["environment"]}
    )
    argv = r.stdout.split("\n")
    assert "--hardware" in argv and argv[argv.index("--hardware") + 1] == "h100"
    if scenario:
        assert argv[argv.index("--scenario") + 1] == scenario
    else:
        assert "--scenario" not in argv
    from inferwatch.simulator.scenarios import DEFAULTS

    if scenario:
        assert scenario in DEFAULTS


def test_demo_pages_reach_the_local_sink(tmp_path: Path) -> None:
    """The compose Alertmanager path without a key, run natively: entrypoint → Alertmanager → sink."""
    binary = require("prometheus-alertmanager")
    from tests.procs import running, wait_http

    sink_port, am_port = free_port(), free_port()
    sink_url = f"http://127.0.0.1:{sink_port}"
    am_url = f"http://127.0.0.1:{am_port}"
    env = {
        "ALERTMANAGER_BIN": binary,
        "ALERTMANAGER_STATE_DIR": str(tmp_path / "state"),
        "PAGERDUTY_SINK_URL": sink_url,
        "PAGERDUTY_ROUTING_KEY_FILE": str(ROOT / "deploy" / "alertmanager" / "no-routing-key"),
    }
    script = ROOT / "deploy" / "alertmanager" / "entrypoint.sh"
    am_cmd = [
        "sh",
        str(script),
        str(stack.ALERTMANAGER_CONFIG),
        str(tmp_path / "alertmanager.yml"),
        f"--web.listen-address=127.0.0.1:{am_port}",
        f"--web.external-url={am_url}",
        "--cluster.listen-address=",
    ]
    sink_cmd = [PYTHON, "deploy/alert_sink.py", "--port", str(sink_port)]
    with (
        running(sink_cmd, tmp_path / "sink.log", cwd=ROOT) as sink,
        running(am_cmd, tmp_path / "am.log", env=env) as am,
    ):
        wait_http(sink_url, proc=sink)
        wait_http(f"{am_url}/-/ready", proc=am, timeout_s=60)
        alert = {
            "labels": {"alertname": "EngineDown", "severity": "critical", "instance": "agent:9435"},
            "annotations": {"summary": "demo page", "runbook_url": "http://localhost:9436/runbooks/EngineDown"},
        }
        assert httpx.post(f"{am_url}/api/v2/alerts", json=[alert], timeout=10).status_code == 200
        deadline = time.monotonic() + 60
        events: list[dict[str, Any]] = []
        while time.monotonic() < deadline and not events:
            events = [e for e in httpx.get(sink_url, timeout=5).json() if e["path"] == "/v2/enqueue"]
            time.sleep(0.5)
    assert events, (tmp_path / "am.log").read_text()[-2000:]
    body = events[0]["body"]
    assert body["event_action"] == "trigger" and body["routing_key"] == "0" * 32
    assert "EngineDown" in body["payload"]["summary"]
    assert any(link["href"] == "http://localhost:9436/runbooks/EngineDown" for link in body.get("links", []))


# --- health, token and state ------------------------------------------------------------------------------------


def test_every_service_has_a_healthcheck_and_waits_for_healthy_dependencies(rendered: dict[str, Any]) -> None:
    for name, svc in rendered["services"].items():
        test = svc.get("healthcheck", {}).get("test")
        assert test and test[0] in ("CMD", "CMD-SHELL") and len(test) > 1, f"{name}: no healthcheck"
        deps = svc.get("depends_on", {})
        assert isinstance(deps, dict), f"{name}: depends_on without conditions"
        bad = {d: c for d, c in deps.items() if c.get("condition") != "service_healthy"}
        assert not bad, f"{name} starts before these are healthy: {bad}"
    order = {n: set(s.get("depends_on", {})) for n, s in rendered["services"].items()}
    assert order["agent"] >= {"simulator"} and order["prometheus"] >= {"agent", "alertmanager"}
    assert order["alertmanager"] == {"pagerduty-sink"} and order["grafana"] == {"prometheus"}


def test_healthchecks_of_upstream_images_use_what_the_image_has(rendered: dict[str, Any]) -> None:
    # prom/* and grafana ship busybox wget, not curl; the Collector image is its binary alone (FROM scratch).
    for name in ("prometheus", "alertmanager", "grafana"):
        assert rendered["services"][name]["healthcheck"]["test"][1] == "wget"
    assert rendered["services"]["otelcol"]["healthcheck"]["test"][1:3] == ["/otelcol-contrib", "validate"]
    built = [n for n, s in rendered["services"].items() if "build" in s]
    for name in built:
        test = rendered["services"][name]["healthcheck"]["test"]
        assert test[1:3] == ["python", "/app/deploy/healthcheck.py"], name


def _named(svc: dict[str, Any]) -> dict[str, tuple[str, bool]]:
    """target → (volume name, read-only) of a service's named volumes."""
    return {target: (src, ro) for src, target, ro, named in volumes(svc) if named}


def test_agent_token_is_generated_on_a_volume_that_prometheus_reads(rendered: dict[str, Any]) -> None:
    agent, prom = rendered["services"]["agent"], rendered["services"]["prometheus"]
    assert agent["entrypoint"][:3] == ["python", "/app/deploy/agent_entrypoint.py", "/run/inferwatch"]
    assert agent["entrypoint"][3:] == ["python", "-m", "inferwatch.agent"]
    assert agent["command"][:3] == ["run", "--listen-address", "0.0.0.0"]
    assert agent["environment"]["INFERWATCH_API__TOKENS_FILE"] == "/run/inferwatch/tokens"
    assert agent["environment"]["INFERWATCH_API_TOKEN"] == ""  # from the user's environment or .env, else generated
    volume, ro = _named(agent)["/run/inferwatch"]
    assert not ro and volume in rendered["volumes"]
    prom_mounts = {v: (t, r) for t, (v, r) in _named(prom).items()}
    target, ro = prom_mounts[volume]
    assert ro, "Prometheus must not be able to change the agent's tokens"
    job = next(
        j
        for j in yaml.safe_load(stack.PROMETHEUS_CONFIG.read_text())["scrape_configs"]
        if j["job_name"] == "inferwatch-agent"
    )
    assert job["authorization"]["credentials_file"] == f"{target}/scrape-token"
    configured = _config({"INFERWATCH_API_TOKEN": "a-token-of-my-own-choosing"})["services"]["agent"]
    assert configured["environment"]["INFERWATCH_API_TOKEN"] == "a-token-of-my-own-choosing"


def test_agent_state_lives_on_a_named_volume_its_user_owns(rendered: dict[str, Any]) -> None:
    image = dockerfile_image((ROOT / "Dockerfile").read_text())
    snapshots = Path(image.env["INFERWATCH_SNAPSHOTS__DIR"])
    agent = _named(rendered["services"]["agent"])
    assert str(snapshots.parent) in agent and not agent[str(snapshots.parent)][1]
    user = image.user
    # Docker copies the image directory's ownership into a fresh named volume: the image must own both.
    for target in agent:
        assert image.owned_dirs.get(target) == user, f"{target} is not created for {user} in the Dockerfile"
    assert image.owned_dirs.get(image.env["HOME"]) == user, "HOME must be the image user's own"
    for name in ("prometheus", "alertmanager", "grafana"):
        assert _named(rendered["services"][name]), f"{name} keeps its data in the container"


def test_receiver_forwards_with_the_collectors_protocol_on_that_port(rendered: dict[str, Any]) -> None:
    # An http(s):// endpoint is OTLP/HTTP (agent/config/sections.py ReceiverSettings), served on the Collector's http
    # port.
    forward = rendered["services"]["agent"]["environment"]["INFERWATCH_RECEIVER__FORWARD_ENDPOINT"]
    protocols = yaml.safe_load(stack.OTELCOL_CONFIG.read_text())["receivers"]["otlp"]["protocols"]
    port = forward.rsplit(":", 1)[1].split("/")[0]
    kind = "http" if forward.startswith(("http://", "https://")) else "grpc"
    assert protocols[kind]["endpoint"].endswith(f":{port}"), f"{forward} is {kind}, the Collector's {kind} is elsewhere"


def test_the_collector_sends_every_trace_to_the_stacks_trace_store(rendered: dict[str, Any]) -> None:
    """Phoenix is the trace store compose ships and the one tests/test_trace_store.py runs (same pin, same command)."""
    otelcol = yaml.safe_load(stack.OTELCOL_CONFIG.read_text())
    assert otelcol["service"]["pipelines"]["traces"]["exporters"] == ["otlphttp/phoenix"]
    assert otelcol["exporters"]["otlphttp/phoenix"]["endpoint"] == "http://phoenix:6006"
    phoenix = rendered["services"]["phoenix"]
    assert phoenix["build"]["target"] == "phoenix"
    assert [str(p).removesuffix("/tcp") for p in phoenix["ports"]] == ["127.0.0.1:6006:6006"]
    assert TRACE_URL_DEFAULT.startswith("http://localhost:6006/"), "dashboards open traces where compose publishes them"
    stage = next(st for st in _stages() if st.startswith("FROM python:") and " AS phoenix\n" in st)
    assert "RUN pip install -r /tmp/phoenix-requirements.txt" in stage
    assert "COPY deploy/phoenix/requirements.txt /tmp/phoenix-requirements.txt" in stage
    assert "-r deploy/phoenix/requirements.txt" in (ROOT / "scripts" / "test.sh").read_text()


# --- the image recipe -------------------------------------------------------------------------------------------


def _stages() -> list[str]:
    text = (ROOT / "Dockerfile").read_text()
    stages = re.split(r"^(?=FROM )", text, flags=re.M)
    return [s for s in stages if s.startswith("FROM ")]


def test_dockerfile_builds_the_wheel_and_installs_it_not_editable() -> None:
    build, final = _stages()[0], _stages()[-1]
    assert re.match(r"FROM python:\d+\.\d+\.\d+-slim-bookworm AS build\n", build)
    assert re.search(r"^RUN pip install --require-hashes --no-deps -r requirements-build.lock$", build, re.M)
    assert re.search(r"^RUN pip wheel --no-deps --no-build-isolation --wheel-dir /wheels \.$", build, re.M)
    text = (ROOT / "Dockerfile").read_text()
    assert not re.search(r"pip install[^\n]*(\s-e\s|--editable)", text), "the image must not install editable"
    assert "COPY --from=build /wheels /tmp/wheels" in final
    assert re.search(r"pip install --require-hashes --no-deps -r /tmp/requirements.lock", final)
    assert re.search(r"pip install --no-deps --no-index /tmp/wheels/inferwatch-\*\.whl .*&& pip check", final)
    # The final stage has no source tree: only the wheel and the demo's helper scripts reach it.
    copies = re.findall(r"^COPY (?!--from)(.+)$", final, re.M)
    assert copies == [
        "requirements.lock /tmp/requirements.lock",
        "deploy/agent_entrypoint.py deploy/healthcheck.py deploy/alert_sink.py deploy/runbook_server.py"
        " deploy/small_http.py /app/deploy/",
    ]


COMPILERS = re.compile(r"\b(gcc|g\+\+|clang|cc|build-essential|libc6-dev|make|python3-dev)\b")


def test_the_compiler_stays_in_the_build_stage() -> None:
    """gcc builds the C extension in the build stage; the image that runs holds no compiler or headers: it installs
    nothing from apt, and takes only the wheel from the build stage."""
    stages = _stages()
    build, final = stages[0], stages[-1]
    build_apt = re.search(r"apt-get install[^\n]*", build.replace("\\\n", " "))
    assert build_apt is not None and COMPILERS.search(build_apt.group(0)), "the build stage installs the compiler"
    for stage in stages[1:]:
        runs = " ".join(re.findall(r"^RUN (.+(?:\\\n.+)*)", stage, re.M))
        assert "apt-get" not in runs and not COMPILERS.search(runs), f"a compiler or apt install in: {stage[:60]}"
    assert re.findall(r"^COPY --from=(\S+) (\S+)", final, re.M) == [("build", "/wheels")]


def test_image_runs_as_a_non_root_user_with_its_own_home() -> None:
    image = dockerfile_image((ROOT / "Dockerfile").read_text())
    uid, _, gid = image.user.partition(":")
    assert int(uid) >= 1000 and int(gid) >= 1000
    assert image.env["HOME"] == "/home/inferwatch" and image.owned_dirs["/home/inferwatch"] == image.user
    assert image.entrypoint == ["python", "-m", "inferwatch.agent"]


def _lock(path: Path) -> dict[str, tuple[str, list[str]]]:
    """name → (version, hashes) of a pip requirements file with hashes."""
    joined = re.sub(r"\\\n\s*", " ", path.read_text())
    out = {}
    for line in joined.splitlines():
        line = line.split("#", 1)[0].strip()
        if not line:
            continue
        m = re.match(r"^([A-Za-z0-9._-]+)==(\S+)((?:\s+--hash=sha256:[0-9a-f]{64})+)\s*$", line)
        assert m, f"{path.name}: not an exact pin with hashes: {line[:120]}"
        out[m.group(1).lower().replace("_", "-").replace(".", "-")] = (
            m.group(2),
            re.findall(r"[0-9a-f]{64}", m.group(3)),
        )
    return out


@pytest.mark.parametrize(
    ("lock", "key"),
    [("requirements.lock", ("project", "dependencies")), ("requirements-build.lock", ("build-system", "requires"))],
)
def test_lock_pins_every_requirement_with_hashes(lock: str, key: tuple[str, str]) -> None:
    import tomllib  # Python 3.11, as the image and the test command
    from packaging.requirements import Requirement

    pins = _lock(ROOT / lock)
    assert "scripts/lock.sh" in (ROOT / lock).read_text().splitlines()[1], "the header names the generating command"
    declared = tomllib.loads((ROOT / "pyproject.toml").read_text())[key[0]][key[1]]
    for spec in map(Requirement, declared):
        name = spec.name.lower().replace("_", "-").replace(".", "-")
        assert name in pins, f"{lock} has no pin for {spec}: run scripts/lock.sh"
        assert spec.specifier.contains(pins[name][0], prereleases=True), (
            f"{lock}: {name}=={pins[name][0]} is not {spec}"
        )
    assert all(hashes for _, hashes in pins.values())
    assert "inferwatch" not in pins  # the wheel is built, not locked


def test_the_wheel_carries_the_runbooks_and_the_installed_agent_reads_them(tmp_path: Path) -> None:
    """Depends on the package carrying its assets (issue 12, branch assets): fails until then, by design."""
    src = tmp_path / "src"
    # .venv*: scripts/test.sh's three virtual environments (~760 MB) are no part of what the wheel is built from
    shutil.copytree(
        ROOT,
        src,
        ignore=shutil.ignore_patterns(
            ".git", ".venv*", "build", "dist", "*.egg-info", "__pycache__", ".*_cache", "tmp"
        ),
    )
    wheels = tmp_path / "wheels"
    r = subprocess.run(
        [PYTHON, "-m", "pip", "wheel", "--no-deps", "--wheel-dir", str(wheels), str(src)],
        capture_output=True,
        text=True,
        timeout=300,
    )
    assert r.returncode == 0, r.stdout[-2000:] + r.stderr[-2000:]
    (wheel,) = wheels.glob("inferwatch-*.whl")
    names = zipfile.ZipFile(wheel).namelist()
    expected = sorted(p.name for p in (ROOT / "runbooks").glob("*.md"))
    carried = sorted(Path(n).name for n in names if Path(n).parent.name == "runbooks" and n.endswith(".md"))
    assert carried == expected, f"runbooks in {wheel.name}: {carried[:5]}... (expected {len(expected)})"
    # Installed as the image installs it (not editable), outside the checkout: the agent's runbooks come from it.
    site = tmp_path / "site"
    r = subprocess.run(
        [PYTHON, "-m", "pip", "install", "--no-deps", "--no-index", "--target", str(site), str(wheel)],
        capture_output=True,
        text=True,
        timeout=300,
    )
    assert r.returncode == 0, r.stderr[-2000:]
    probe = (
        "import json, inferwatch.agent as agent; from inferwatch.agent.common.runbooks import Runbooks; "
        "r = Runbooks.load(); "
        "print(json.dumps([agent.__file__, r.names(), r.read(r.names()[0]) if r.names() else None]))"
    )
    r = subprocess.run(
        [PYTHON, "-I", "-c", f"import sys; sys.path.insert(0, {str(site)!r}); {probe}"],
        cwd=tmp_path,
        capture_output=True,
        text=True,
        timeout=60,
    )
    assert r.returncode == 0, r.stderr[-2000:]
    agent_file, served, first = json.loads(r.stdout)
    assert Path(agent_file).is_relative_to(site), f"agent imported from {agent_file}, not the installed wheel"
    # runbooks/README.md is the folder's index, shipped but not a runbook the agent serves.
    runbooks = [n for n in expected if n != "README.md"]
    assert [f"{n}.md" for n in served] == runbooks, "the installed agent does not find the wheel's runbooks"
    assert first == (ROOT / "runbooks" / runbooks[0]).read_text()


# --- the demo's helper scripts (deploy/) ------------------------------------------------------------------------


def _entrypoint(directory: Path, token: str | None) -> subprocess.CompletedProcess[str]:
    env = {k: v for k, v in os.environ.items() if k != "INFERWATCH_API_TOKEN"}
    if token is not None:
        env["INFERWATCH_API_TOKEN"] = token
    script = ROOT / "deploy" / "agent_entrypoint.py"
    # The command it execs prints its argv: the agent would be started with exactly these arguments.
    cmd = [PYTHON, str(script), str(directory), PYTHON, "-c", "import sys; print(sys.argv[1:])", "run", "--x"]
    return subprocess.run(cmd, capture_output=True, text=True, env=env, timeout=60)


def test_agent_entrypoint_generates_keeps_and_accepts_a_configured_token(tmp_path: Path) -> None:
    from inferwatch.agent.node.api.auth import read_tokens_file

    first = _entrypoint(tmp_path / "tokens", None)
    assert first.returncode == 0, first.stderr
    assert first.stdout.strip() == "['run', '--x']"
    token = (tmp_path / "tokens" / "token").read_text().strip()
    scrape = (tmp_path / "tokens" / "scrape-token").read_text().strip()
    assert len(token) >= 40 and len(scrape) >= 40 and token != scrape
    assert token not in first.stderr  # the log says where the token is, never the token
    modes = {p.name: p.stat().st_mode & 0o777 for p in (tmp_path / "tokens").iterdir()}
    assert modes == {"token": 0o600, "scrape-token": 0o644, "evidence-token": 0o644, "tokens": 0o600}
    creds = {c.name: c for c in read_tokens_file(tmp_path / "tokens" / "tokens")}  # the agent's own parser
    assert creds["operator"].token.decode() == token
    assert creds["operator"].scopes == {"read", "snapshots", "profile", "evidence"}
    assert creds["alertmanager"].scopes == {"evidence"}  # the webhook can capture, not read the status
    assert creds["prometheus"].token.decode() == scrape and creds["prometheus"].scopes == {"read"}
    assert _entrypoint(tmp_path / "tokens", None).returncode == 0  # a restart keeps both
    assert (tmp_path / "tokens" / "token").read_text().strip() == token
    assert (tmp_path / "tokens" / "scrape-token").read_text().strip() == scrape
    assert _entrypoint(tmp_path / "tokens", "my-own-token-0123456789").returncode == 0
    assert (tmp_path / "tokens" / "token").read_text().strip() == "my-own-token-0123456789"
    assert (tmp_path / "tokens" / "scrape-token").read_text().strip() == scrape
    short = _entrypoint(tmp_path / "tokens", "short")
    assert short.returncode == 2 and "at least 16" in short.stderr and short.stdout == ""


def test_healthcheck_script_needs_2xx_from_every_url_with_the_token(tmp_path: Path) -> None:
    import http.server
    import threading

    class Handler(http.server.BaseHTTPRequestHandler):
        def do_GET(self) -> None:
            ok = self.path == "/ok" or (self.path == "/auth" and self.headers.get("Authorization") == "Bearer t0k3n")
            self.send_response(200 if ok else 401 if self.path == "/auth" else 503)
            self.end_headers()

        def log_message(self, *args: Any) -> None:
            pass

    server = http.server.ThreadingHTTPServer(("127.0.0.1", 0), Handler)
    threading.Thread(target=server.serve_forever, daemon=True).start()
    base = f"http://127.0.0.1:{server.server_address[1]}"
    (tmp_path / "token").write_text("t0k3n\n")
    script = str(ROOT / "deploy" / "healthcheck.py")

    def check(*args: str) -> subprocess.CompletedProcess[str]:
        return subprocess.run([PYTHON, script, *args], capture_output=True, text=True, timeout=30)

    try:
        assert check(f"{base}/ok").returncode == 0
        assert check("--bearer-file", str(tmp_path / "token"), f"{base}/ok", f"{base}/auth").returncode == 0
        refused = check(f"{base}/ok", f"{base}/auth")
        assert refused.returncode == 1 and "HTTP 401" in refused.stderr
        assert "HTTP 503" in check(f"{base}/down").stderr
        port = free_port()
        assert check(f"http://127.0.0.1:{port}/").returncode == 1  # nothing listening
        assert check("--bearer-file", str(tmp_path / "missing"), f"{base}/ok").returncode == 1
    finally:
        server.shutdown()
        server.server_close()
