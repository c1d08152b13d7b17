"""docker-compose.yml, checked without a Docker engine.

- ``docker-compose config`` (Debian's docker-compose 1.29) validates the file (and rejects a broken copy);
- the services are the demo stack's, images are pinned, every mounted host path exists;
- the Prometheus, Alertmanager and Collector files it mounts are the ones the end-to-end tests run natively
  (tests/stack.py), promtool accepts the Prometheus configuration, amtool the rendered Alertmanager one;
- every ``host:port`` in the compose file and the mounted configs names a compose service and a port it
  listens on.
"""

from __future__ import annotations

import os
import re
import shutil
import subprocess
import time
from pathlib import Path
from typing import Any

import httpx
import pytest
import yaml

from tests import stack
from tests.conftest import PYTHON, ROOT, free_port

SERVICES = {"simulator", "loadgen", "agent", "otelcol", "prometheus", "alertmanager", "grafana", "pagerduty-sink"}
DOCKER_COMPOSE = shutil.which("docker-compose")
needs_compose = pytest.mark.skipif(DOCKER_COMPOSE is None, reason="docker-compose not installed (scripts/test.sh)")
# Ports the upstream images listen on by default (their Dockerfiles' EXPOSE).
IMAGE_PORTS = {"prometheus": {9090}, "alertmanager": {9093}, "grafana": {3000}}
_HOSTPORT = re.compile(r"(?<![\w.-])([a-z][a-z0-9-]*):(\d{2,5})(?![\d:.])")  # host:port, not image:1.2 or a:1:2
_LOCAL = {"localhost", "127", "0", "service"}


def _config(env: dict[str, str] | None = None, path: Path = stack.COMPOSE_FILE) -> dict[str, Any]:
    assert DOCKER_COMPOSE is not None
    clean = {k: v for k, v in os.environ.items() if not k.startswith(("INFERWATCH_", "PAGERDUTY_", "GRAFANA_"))}
    r = subprocess.run(
        [DOCKER_COMPOSE, "-f", str(path), "config"],
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
    if DOCKER_COMPOSE is None:
        pytest.skip("docker-compose not installed (scripts/test.sh installs it)")
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


@needs_compose
def test_docker_compose_config_validates_and_rejects_a_broken_file(tmp_path: Path) -> None:
    r = subprocess.run([DOCKER_COMPOSE or "", "-f", str(stack.COMPOSE_FILE), "config", "-q"], cwd=ROOT, timeout=60)
    assert r.returncode == 0
    broken = tmp_path / "docker-compose.yml"
    broken.write_text(stack.COMPOSE_FILE.read_text().replace("  prometheus:\n", "  prometheus:\n    bogus_key: 1\n", 1))
    r2 = subprocess.run(
        [DOCKER_COMPOSE or "", "-f", str(broken), "config", "-q"], cwd=ROOT, capture_output=True, text=True, timeout=60
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
    assert built == {"simulator", "loadgen", "agent", "pagerduty-sink"}
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
    if shutil.which("promtool") is None:
        pytest.skip("promtool not installed (scripts/test.sh installs prometheus)")
    r = subprocess.run(["promtool", "check", "config", str(stack.PROMETHEUS_CONFIG)], capture_output=True, text=True)
    assert r.returncode == 0, r.stdout + r.stderr
    native = tmp_path / "prometheus.yml"
    native.write_text(yaml.safe_dump(stack.native_prometheus_config({})))
    r = subprocess.run(["promtool", "check", "config", str(native)], capture_output=True, text=True)
    assert r.returncode == 0, r.stdout + r.stderr
    assert "rule files found" in r.stdout and "SUCCESS" in r.stdout


@pytest.mark.parametrize("mode", ["no key (demo sink)", "env key", "secret file"])
def test_alertmanager_entrypoint_renders_a_valid_config(tmp_path: Path, mode: str) -> None:
    if shutil.which("amtool") is None:
        pytest.skip("amtool not installed (scripts/test.sh installs prometheus-alertmanager)")
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
    hooks = [c["url"] for rc in cfg["receivers"] for c in rc.get("webhook_configs", [])]
    assert hooks and all(h.startswith("http://pagerduty-sink:9099/") for h in hooks)


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


@needs_compose
@pytest.mark.parametrize("scenario", ["", "page_cache_pressure"])
def test_scenario_is_selected_by_environment(scenario: str) -> None:
    cfg = _config({"INFERWATCH_SCENARIO": scenario} if scenario else {})
    sim = cfg["services"]["simulator"]
    assert sim["environment"]["INFERWATCH_SCENARIO"] == scenario
    # Run the container's shell command natively, printing the argv instead of starting the simulator.
    # docker-compose config keeps $$ escaped (its output is a compose file); the container sees $.
    script = sim["command"][0].replace("$$", "$").replace("exec python -m agent simulate", "printf '%s\\n'")
    r = subprocess.run(
        ["sh", "-c", script], capture_output=True, text=True, env={"PATH": os.environ["PATH"], **sim["environment"]}
    )
    argv = r.stdout.split("\n")
    assert "--hardware" in argv and argv[argv.index("--hardware") + 1] == "h100"
    if scenario:
        assert argv[argv.index("--scenario") + 1] == scenario
    else:
        assert "--scenario" not in argv
    names = _scenario_names()
    if names is not None and scenario:
        assert scenario in names


def _scenario_names() -> set[str] | None:
    try:
        from simulator.scenarios import DEFAULTS  # type: ignore[import-not-found, unused-ignore]
    except ImportError:
        return None
    return set(DEFAULTS)


def test_demo_pages_reach_the_local_sink(tmp_path: Path) -> None:
    """The compose Alertmanager path without a key, run natively: entrypoint → Alertmanager → sink."""
    binary = shutil.which("prometheus-alertmanager")
    if binary is None:
        pytest.skip("prometheus-alertmanager not installed (scripts/test.sh installs it)")
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
            "annotations": {"summary": "demo page", "runbook_url": "http://localhost:9435/runbooks/EngineDown"},
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
    assert any(link["href"] == "http://localhost:9435/runbooks/EngineDown" for link in body.get("links", []))
