"""deploy/kubernetes/: rendered by kubectl kustomize, validated against the Kubernetes and prometheus-operator
schemas, scanned by checkov, and its generated manifests equal to a fresh generation from alerts/ and dashboards/.

No cluster here: every check is static, with the real tools. kubernetes-validate carries the Kubernetes API
schemas (:data:`K8S_VERSION`); the prometheus-operator CRDs are vendored in tests/fixtures/crds/ (SOURCE there),
and validated strictly: a field the CRD does not declare fails, as the API server's strict field validation
(``kubectl apply``'s default) rejects it instead of pruning it. checkov runs once over every rendering (plus a
planted privileged DaemonSet it must flag); a failed check fails the test, and a skip must be one of
:data:`EXPECTED_SKIPS` with its reason in the manifest.
"""

from __future__ import annotations

import copy
import json
import os
import re
import subprocess
from functools import cache
from pathlib import Path
from typing import Any

import httpx
import jsonschema
import kubernetes_validate
import pytest
import yaml

from deploy.kubernetes import generate
from inferwatch.agent.config import ApiSettings, load_settings
from inferwatch.exporters.otlp import build_resource
from tests.conftest import free_port
from tests.procs import running, wait_http
from tests.tools import require

ROOT = Path(__file__).resolve().parents[1]
KDIR = ROOT / "deploy" / "kubernetes"
CRD_DIR = ROOT / "tests" / "fixtures" / "crds"
K8S_VERSION = "1.37.0"  # the newest Kubernetes kubernetes-validate 1.37 ships schemas for
OVERLAYS = (
    "base",
    "kube-prometheus-stack",
    "plain-prometheus",
    "otlp-gateway",
    "profiling",
    "engine-readiness",
    "discovery",
    "readiness-gate",
)
OPERATOR_GROUP = "monitoring.coreos.com"
MEASURED_RSS_BYTES = 71.8e6  # docs/benchmarks.md, agent at a 5 s interval
BASE_SKIPS = {"CKV_K8S_43", "CKV_K8S_15"}  # image digest, pull policy: reasons in base/daemonset.yaml
EXPECTED_SKIPS = {o: BASE_SKIPS for o in OVERLAYS} | {"profiling": BASE_SKIPS | {"CKV_K8S_17", "CKV_K8S_25"}}


class _Loader(yaml.SafeLoader):
    """kustomize writes ``matchType: =`` unquoted; YAML 1.1 tags a bare ``=`` as a "value", Kubernetes a string."""


_Loader.add_constructor("tag:yaml.org,2002:value", lambda loader, node: loader.construct_scalar(node))


def _overlay_dir(name: str) -> Path:
    return KDIR / "base" if name == "base" else KDIR / "overlays" / name


@cache
def render(name: str) -> tuple[dict[str, Any], ...]:
    kubectl = require("kubectl")
    proc = subprocess.run(
        [kubectl, "kustomize", str(_overlay_dir(name))], capture_output=True, text=True, timeout=120, check=False
    )
    assert proc.returncode == 0, f"kubectl kustomize {name}: {proc.stderr}"
    return tuple(d for d in yaml.load_all(proc.stdout, Loader=_Loader) if d)


def _one(docs: tuple[dict[str, Any], ...], kind: str, name: str | None = None) -> dict[str, Any]:
    found = [d for d in docs if d["kind"] == kind and (name is None or d["metadata"]["name"] == name)]
    assert len(found) == 1, f"{len(found)} {kind} {name or ''}"
    return found[0]


def _agent(docs: tuple[dict[str, Any], ...]) -> dict[str, Any]:
    return _one(docs, "DaemonSet", "inferwatch-agent")["spec"]["template"]["spec"]  # type: ignore[no-any-return]


def _env(pod: dict[str, Any]) -> dict[str, str]:
    return {e["name"]: e.get("value", "") for e in pod["containers"][0]["env"]}


# -- schemas ------------------------------------------------------------------------------------------------------


def _strict(schema: Any) -> Any:
    """The CRD schema with unknown properties rejected wherever the CRD lists properties and keeps no others."""
    if isinstance(schema, list):
        return [_strict(s) for s in schema]
    if not isinstance(schema, dict):
        return schema
    out = {k: _strict(v) for k, v in schema.items()}
    declared = "properties" in schema and "additionalProperties" not in schema
    if declared and not schema.get("x-kubernetes-preserve-unknown-fields"):
        out["additionalProperties"] = False
    return out


@cache
def crd_schemas() -> dict[tuple[str, str], dict[str, Any]]:
    """(apiVersion, kind) → the strict openAPIV3Schema of every served version of the vendored CRDs."""
    out = {}
    for path in sorted(CRD_DIR.glob("*.yaml")):
        crd = yaml.load(path.read_text(encoding="utf-8"), Loader=_Loader)
        for version in crd["spec"]["versions"]:
            if version["served"]:
                key = (f"{crd['spec']['group']}/{version['name']}", crd["spec"]["names"]["kind"])
                out[key] = _strict(version["schema"]["openAPIV3Schema"])
    return out


def validate(doc: dict[str, Any]) -> None:
    api, kind = doc["apiVersion"], doc["kind"]
    if api.startswith(OPERATOR_GROUP + "/"):
        schema = crd_schemas().get((api, kind))
        assert schema is not None, f"no vendored CRD for {api} {kind} (tests/fixtures/crds/SOURCE)"
        jsonschema.Draft7Validator(schema).validate(doc)
        if kind == "AlertmanagerConfig":
            # The CRD keeps child routes as unknown fields (the operator parses them as routes at reconcile time),
            # so check each against the route schema, as the operator does.
            route_schema = schema["properties"]["spec"]["properties"]["route"]
            pending = list(doc["spec"]["route"].get("routes", []))
            while pending:
                route = pending.pop()
                jsonschema.Draft7Validator(route_schema).validate(route)
                pending.extend(route.get("routes", []))
    else:
        kubernetes_validate.validate(doc, K8S_VERSION, strict=True)


@pytest.mark.parametrize("overlay", OVERLAYS)
def test_every_object_validates(overlay: str) -> None:
    docs = render(overlay)
    assert docs
    for doc in docs:
        try:
            validate(doc)
        except (kubernetes_validate.ValidationError, jsonschema.ValidationError) as exc:
            pytest.fail(f"{overlay}: {doc['kind']}/{doc['metadata']['name']}: {exc}")


LAST_APPLIED_MAX_BYTES = 262_144  # the API server's limit on all annotations of an object (256 KiB)


@pytest.mark.parametrize("overlay", OVERLAYS)
def test_every_object_fits_client_side_apply(overlay: str) -> None:
    """``kubectl apply`` copies each object into its last-applied-configuration annotation: a dashboard past 256 KiB
    would need ``--server-side``. Half the limit: the warning comes while a dashboard can still grow."""
    for doc in render(overlay):
        size = len(json.dumps(doc, separators=(",", ":")))
        assert size < LAST_APPLIED_MAX_BYTES // 2, f"{doc['kind']}/{doc['metadata']['name']}: {size} bytes"


def test_validation_rejects_a_misspelt_field() -> None:
    """Both validators are strict: a typo in a core object or a CRD is an error, not a pruned field."""
    docs = render("kube-prometheus-stack")
    ds = copy.deepcopy(_one(docs, "DaemonSet"))
    ds["spec"]["template"]["spec"]["containers"][0]["securityContext"]["readOnlyRootFileSystem"] = True
    with pytest.raises(kubernetes_validate.ValidationError):
        validate(ds)
    sm = copy.deepcopy(_one(docs, "ServiceMonitor"))
    sm["spec"]["endpoints"][0]["intervall"] = "15s"
    with pytest.raises(jsonschema.ValidationError):
        validate(sm)
    for where in ("top", "child"):
        amc = copy.deepcopy(_one(docs, "AlertmanagerConfig"))
        route = amc["spec"]["route"] if where == "top" else amc["spec"]["route"]["routes"][0]
        route["group_wait"] = "10s"  # alertmanager.yml's spelling, not the CRD's
        with pytest.raises(jsonschema.ValidationError):
            validate(amc)


def test_crd_sources_are_recorded() -> None:
    source = (CRD_DIR / "SOURCE").read_text(encoding="utf-8")
    assert re.search(r"\b[0-9a-f]{40}\b", source), "SOURCE names the commit"
    for path in CRD_DIR.glob("*.yaml"):
        assert path.name in source


# -- the agent's pod ----------------------------------------------------------------------------------------------


def test_agent_pod_is_locked_down() -> None:
    pod = _agent(render("base"))
    assert pod["automountServiceAccountToken"] is False
    assert not pod.get("hostPID") and not pod.get("hostNetwork") and not pod.get("hostIPC")
    assert pod["securityContext"]["runAsNonRoot"] is True
    assert pod["securityContext"]["seccompProfile"] == {"type": "RuntimeDefault"}
    (container,) = pod["containers"]
    sc = container["securityContext"]
    assert sc["readOnlyRootFilesystem"] is True and sc["allowPrivilegeEscalation"] is False
    assert sc["capabilities"] == {"drop": ["ALL"]}
    assert {"key": "nvidia.com/gpu", "operator": "Exists"} in pod["tolerations"]
    sa = _one(render("base"), "ServiceAccount", pod["serviceAccountName"])
    assert sa["automountServiceAccountToken"] is False
    assert not [d for d in render("kube-prometheus-stack") if d["kind"] in {"Role", "ClusterRole", "RoleBinding"}]


def test_host_paths_are_read_only_at_the_agents_procfs_and_sysfs() -> None:
    pod = _agent(render("base"))
    env = _env(pod)
    volumes = {v["name"]: v for v in pod["volumes"]}
    mounts = {m["mountPath"]: m for m in pod["containers"][0]["volumeMounts"]}
    for var, host in (("INFERWATCH_PATH__PROCFS", "/proc"), ("INFERWATCH_PATH__SYSFS", "/sys")):
        mount = mounts[env[var]]
        assert mount.get("readOnly") is True
        assert volumes[mount["name"]]["hostPath"]["path"] == host
    # Every writable path is an emptyDir (the root filesystem is read-only): state, HOME, TMPDIR.
    for path in (env["INFERWATCH_SNAPSHOTS__DIR"], env["HOME"], env["TMPDIR"]):
        owner = max((m for m in mounts if path == m or path.startswith(m + "/")), key=len)
        assert "emptyDir" in volumes[mounts[owner]["name"]], path


def test_the_agent_accepts_the_pods_settings(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """The ConfigMap and the container's environment, loaded by the agent's own settings model."""
    docs = render("profiling")
    pod = _agent(docs)
    config = _one(docs, "ConfigMap", "inferwatch-agent-config")["data"]["config.yaml"]
    (tmp_path / "config.yaml").write_text(config, encoding="utf-8")
    (tmp_path / "tokens").write_text("a" * 24 + " read\n", encoding="utf-8")
    for key in [k for k in os.environ if k.startswith(("INFERWATCH_", "OTEL_"))]:
        monkeypatch.delenv(key)
    for name, value in _env(pod).items():
        if name.startswith("INFERWATCH_"):
            monkeypatch.setenv(name, value.replace("$(HOST_IP)", "10.0.0.1"))
    monkeypatch.setenv("INFERWATCH_CONFIG", str(tmp_path / "config.yaml"))
    monkeypatch.setenv("INFERWATCH_API__TOKENS_FILE", str(tmp_path / "tokens"))
    settings = load_settings(overrides={"listen_address": "0.0.0.0"})
    assert str(settings.path.procfs) == "/host/proc" and str(settings.path.sysfs) == "/host/sys"
    assert settings.profiling.enabled is True
    assert settings.engine.metrics_url == "http://10.0.0.1:8000/metrics"


@pytest.mark.integration
def test_the_pods_command_and_environment_serve_the_probes(tmp_path: Path) -> None:
    """The container's args and env (the base's), run here: probes answer without a token, the scrape token reads.

    Only what a node provides differs: the host's /proc and /sys are this machine's, HOST_IP is 127.0.0.1 (no
    engine there: the engine collector reports it), the emptyDir is a temporary directory, and the agent binds
    127.0.0.1 on a free port instead of the pod IP.
    """
    pod = _agent(render("base"))
    (container,) = pod["containers"]
    port = free_port()
    operator, scrape = "o" * 32, "s" * 32
    (tmp_path / "tokens").write_text(f"{operator} read,snapshots,profile operator\n{scrape} read prometheus\n")
    (tmp_path / "config.yaml").write_text(_one(render("base"), "ConfigMap")["data"]["config.yaml"])
    node = {"NODE_NAME": "gpu-node-1", "POD_NAME": "inferwatch-agent-x", "POD_NAMESPACE": "inferwatch"}
    where = {"HOST_IP": "127.0.0.1", **node}
    env = {k: v for k, v in os.environ.items() if not k.startswith(("INFERWATCH_", "OTEL_"))}
    for name, value in _env(pod).items():
        env[name] = re.sub(r"\$\((\w+)\)", lambda m: where[m.group(1)], value) if name not in where else where[name]
    env |= {
        "INFERWATCH_PATH__PROCFS": "/proc",
        "INFERWATCH_PATH__SYSFS": "/sys",
        "INFERWATCH_CONFIG": str(tmp_path / "config.yaml"),
        "INFERWATCH_API__TOKENS_FILE": str(tmp_path / "tokens"),
        "INFERWATCH_SNAPSHOTS__DIR": str(tmp_path / "state" / "snapshots"),
        "HOME": str(tmp_path / "state"),
        "TMPDIR": str(tmp_path),
        # the span receiver is on in the pod (0.0.0.0:4317/4318 there); here on free ports of 127.0.0.1
        "INFERWATCH_RECEIVER__GRPC_ENDPOINT": f"127.0.0.1:{free_port()}",
        "INFERWATCH_RECEIVER__HTTP_ENDPOINT": f"127.0.0.1:{free_port()}",
    }
    assert env["INFERWATCH_RECEIVER__ENABLED"] == "true"
    args = [a if a != "0.0.0.0" else "127.0.0.1" for a in container["args"]]
    args[args.index("--port") + 1] = str(port)
    base = f"http://127.0.0.1:{port}"
    with running(
        [str(ROOT / ".venv" / "bin" / "python"), "-m", "inferwatch.agent", *args], tmp_path / "agent.log", env=env
    ) as p:
        assert wait_http(base + container["livenessProbe"]["httpGet"]["path"], proc=p).status_code == 200
        ready = wait_http(base + container["readinessProbe"]["httpGet"]["path"], ok=lambda r: r.status_code == 200)
        assert ready.json()["ready"] is True
        read = {"Authorization": f"Bearer {scrape}"}
        assert httpx.get(base + "/metrics", headers=read).status_code == 200
        assert httpx.get(base + "/api/v1/status").status_code == 401
        assert httpx.get(base + "/api/v1/status", headers=read).status_code == 200
        assert httpx.post(base + "/api/v1/snapshots", headers=read).status_code == 403
        # The operator's token holds the scope (no 401/403); the base configures no debug endpoint to snapshot.
        answer = httpx.post(base + "/api/v1/snapshots", headers={"Authorization": f"Bearer {operator}"})
        assert answer.status_code == 409 and answer.json()["error"] == "not_configured", answer.text


def test_probes_and_resources() -> None:
    container = _agent(render("base"))["containers"][0]
    assert container["livenessProbe"]["httpGet"]["path"] == "/healthz"
    assert container["readinessProbe"]["httpGet"]["path"] == "/readyz"
    server = (ROOT / "agent" / "node" / "api" / "server.py").read_text(encoding="utf-8")
    assert 'route(app, "GET", "/healthz")' in server and 'route(app, "GET", "/readyz")' in server
    open_paths = ApiSettings().open_paths
    assert "/healthz" in open_paths and "/readyz" in open_paths  # the kubelet sends no token
    mem = container["resources"]
    assert _mebibytes(mem["requests"]["memory"]) * 2**20 > MEASURED_RSS_BYTES
    assert _mebibytes(mem["limits"]["memory"]) >= 2 * _mebibytes(mem["requests"]["memory"])


def _mebibytes(quantity: str) -> int:
    assert quantity.endswith("Mi"), quantity
    return int(quantity[:-2])


def test_node_and_pod_identity_reach_the_resource_attributes() -> None:
    pod = _agent(render("otlp-gateway"))
    refs = {e["name"]: e["valueFrom"]["fieldRef"]["fieldPath"] for e in pod["containers"][0]["env"] if "valueFrom" in e}
    assert refs == {
        "NODE_NAME": "spec.nodeName",
        "POD_NAME": "metadata.name",
        "POD_NAMESPACE": "metadata.namespace",
        "HOST_IP": "status.hostIP",
    }
    names = [e["name"] for e in pod["containers"][0]["env"]]
    attrs = dict(kv.split("=", 1) for kv in _env(pod)["OTEL_RESOURCE_ATTRIBUTES"].split(","))
    assert attrs["k8s.node.name"] == attrs["host.name"] == attrs["service.instance.id"] == "$(NODE_NAME)"
    assert attrs["k8s.pod.name"] == "$(POD_NAME)" and attrs["k8s.namespace.name"] == "$(POD_NAMESPACE)"
    # $(VAR) expands only for variables defined earlier in the list.
    assert names.index("NODE_NAME") < names.index("OTEL_RESOURCE_ATTRIBUTES")
    assert _env(pod)["OTEL_EXPORTER_OTLP_ENDPOINT"].startswith("http://")


def test_the_otlp_resource_names_the_node_not_the_pod(monkeypatch: pytest.MonkeyPatch) -> None:
    """The agent's own resource builder, given the pod's OTEL_RESOURCE_ATTRIBUTES as the kubelet expands them."""
    where = {"NODE_NAME": "gpu-node-1", "POD_NAME": "inferwatch-agent-x7k2p", "POD_NAMESPACE": "inferwatch"}
    attrs = _env(_agent(render("otlp-gateway")))["OTEL_RESOURCE_ATTRIBUTES"]
    monkeypatch.setenv("OTEL_RESOURCE_ATTRIBUTES", re.sub(r"\$\((\w+)\)", lambda m: where[m.group(1)], attrs))
    monkeypatch.delenv("OTEL_SERVICE_NAME", raising=False)
    resource = build_resource({"host.name": "inferwatch-agent-x7k2p", "host.type": "p5.48xlarge"}, "production")
    got = dict(resource.attributes)
    assert got["host.name"] == got["k8s.node.name"] == got["service.instance.id"] == "gpu-node-1"
    assert got["k8s.pod.name"] == "inferwatch-agent-x7k2p" and got["k8s.namespace.name"] == "inferwatch"
    assert got["host.type"] == "p5.48xlarge"  # what the agent reads itself stays


# -- overlays -----------------------------------------------------------------------------------------------------


def test_only_the_profiling_overlay_has_host_pid_and_ptrace() -> None:
    for overlay in OVERLAYS:
        pod = _agent(render(overlay))
        caps = pod["containers"][0]["securityContext"]["capabilities"]
        if overlay == "profiling":
            assert pod["hostPID"] is True and caps == {"add": ["SYS_PTRACE"], "drop": ["ALL"]}
        else:
            assert not pod.get("hostPID") and "add" not in caps, overlay


def test_kube_prometheus_stack_objects_carry_the_release_label() -> None:
    docs = render("kube-prometheus-stack")
    operator = [d for d in docs if d["apiVersion"].startswith(OPERATOR_GROUP)]
    kinds = sorted({d["kind"] for d in operator})
    assert kinds == ["AlertmanagerConfig", "PodMonitor", "PrometheusRule", "ServiceMonitor"]
    for doc in operator:
        assert doc["metadata"]["labels"]["release"] == "kube-prometheus-stack", doc["metadata"]["name"]
    ds = _one(docs, "DaemonSet")
    assert "release" not in ds["spec"]["selector"]["matchLabels"] and "release" not in ds["metadata"]["labels"]
    engines = {d["spec"]["selector"]["matchLabels"]["inferwatch.io/engine"] for d in docs if d["kind"] == "PodMonitor"}
    assert engines == {"vllm", "sglang"}
    sm = _one(docs, "ServiceMonitor")
    selected = [
        d["metadata"]["name"]
        for d in docs
        if d["kind"] == "Service" and sm["spec"]["selector"]["matchLabels"].items() <= d["metadata"]["labels"].items()
    ]
    assert selected == ["inferwatch-agent"]  # job="inferwatch-agent" (AgentDown); not the span receiver's Service
    dashboards = [d for d in docs if d["kind"] == "ConfigMap" and d["metadata"]["labels"].get("grafana_dashboard")]
    assert {d["metadata"]["labels"]["grafana_dashboard"] for d in dashboards} == {"1"}
    assert len(dashboards) == len(list((ROOT / "dashboards" / "json").glob("*.json")))


def test_plain_prometheus_needs_no_crds() -> None:
    docs = render("plain-prometheus")
    assert not [d for d in docs if d["apiVersion"].startswith(OPERATOR_GROUP)]
    annotations = _one(docs, "DaemonSet")["spec"]["template"]["metadata"]["annotations"]
    port = _agent(docs)["containers"][0]["ports"][0]["containerPort"]
    assert annotations["prometheus.io/scrape"] == "true" and annotations["prometheus.io/port"] == str(port)


def test_network_policy_covers_the_api_port() -> None:
    docs = render("base")
    policy = _one(docs, "NetworkPolicy")
    assert policy["spec"]["podSelector"]["matchLabels"] == _one(docs, "DaemonSet")["spec"]["selector"]["matchLabels"]
    api, otlp = policy["spec"]["ingress"]
    assert [p["port"] for p in api["ports"]] == ["http-metrics"]
    assert otlp["from"] == [{"namespaceSelector": {}}]  # engines send spans from their own namespaces
    assert [p["port"] for p in otlp["ports"]] == ["otlp-grpc", "otlp-http"]


def test_the_span_receiver_is_on_behind_a_node_local_service() -> None:
    docs = render("base")
    container = _agent(docs)["containers"][0]
    env = _env(_agent(docs))
    ports = {p["name"]: p["containerPort"] for p in container["ports"]}
    assert env["INFERWATCH_RECEIVER__ENABLED"] == "true"
    assert env["INFERWATCH_RECEIVER__GRPC_ENDPOINT"] == f"0.0.0.0:{ports['otlp-grpc']}"
    assert env["INFERWATCH_RECEIVER__HTTP_ENDPOINT"] == f"0.0.0.0:{ports['otlp-http']}"
    service = _one(docs, "Service", "inferwatch-otlp")
    assert service["spec"]["internalTrafficPolicy"] == "Local"
    assert service["spec"]["selector"] == _one(docs, "DaemonSet")["spec"]["selector"]["matchLabels"]
    assert {p["targetPort"] for p in service["spec"]["ports"]} == {"otlp-grpc", "otlp-http"}


def test_discovery_grants_read_only_pods_and_a_token_without_automount() -> None:
    docs = render("discovery")
    role = _one(docs, "ClusterRole", "inferwatch-agent-pods")
    assert role["rules"] == [{"apiGroups": [""], "resources": ["pods"], "verbs": ["get", "list", "watch"]}]
    binding = _one(docs, "ClusterRoleBinding", "inferwatch-agent-pods")
    assert binding["roleRef"]["name"] == role["metadata"]["name"]
    pod = _agent(docs)
    assert binding["subjects"] == [
        {"kind": "ServiceAccount", "name": pod["serviceAccountName"], "namespace": "inferwatch"}
    ]
    assert pod["automountServiceAccountToken"] is False  # the token is mounted explicitly, for this container only
    sources = {v["name"]: v for v in pod["volumes"]}["kube-api-access"]["projected"]["sources"]
    assert sources[0]["serviceAccountToken"]["expirationSeconds"] <= 3600
    mounts = {m["name"]: m for m in pod["containers"][0]["volumeMounts"]}
    assert mounts["kube-api-access"]["mountPath"] == "/var/run/secrets/kubernetes.io/serviceaccount"
    assert mounts["kube-api-access"]["readOnly"] is True
    refs = {e["name"]: e["valueFrom"]["fieldRef"]["fieldPath"] for e in pod["containers"][0]["env"] if "valueFrom" in e}
    assert refs["NODE_NAME"] == "spec.nodeName"  # the field selector's node
    others = [o for o in OVERLAYS if o not in ("discovery", "readiness-gate")]  # readiness-gate: discovery + its own
    assert not [o for o in others if any(d["kind"] in {"Role", "ClusterRole"} for d in render(o))]


def test_the_service_monitor_leaves_the_engines_identity_to_the_series() -> None:
    sm = _one(render("kube-prometheus-stack"), "ServiceMonitor")
    (endpoint,) = sm["spec"]["endpoints"]
    assert endpoint["honorLabels"] is True  # an engine series' own namespace/pod/container win
    drops = [r["regex"] for r in endpoint["relabelings"] if r.get("action") == "labeldrop"]
    assert drops == ["pod|container"]  # the agent's pod and container are not stamped on what it re-exports


# -- generated manifests ------------------------------------------------------------------------------------------


def test_generated_manifests_are_fresh() -> None:
    for path, text in generate.outputs().items():
        assert path.read_text(encoding="utf-8") == text, f"{path}: run python -m deploy.kubernetes.generate"
        assert text.startswith("# DO NOT EDIT")


def test_check_mode_fails_on_drift(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    stale = tmp_path / "prometheusrules.yaml"
    stale.write_text(generate.RULES_OUT.read_text(encoding="utf-8").replace("for: 5m", "for: 6m", 1))
    monkeypatch.setattr(generate, "RULES_OUT", stale)
    assert generate.main(["--check"]) == 1


def test_prometheus_rules_are_the_rule_files() -> None:
    rules = {
        d["metadata"]["name"]: d["spec"]["groups"]
        for d in render("kube-prometheus-stack")
        if d["kind"] == "PrometheusRule"
    }
    expected = {}
    for path in sorted((ROOT / "alerts").glob("*.rules.yml")):
        expected[generate._k8s_name(path.name.removesuffix(".rules.yml"))] = yaml.safe_load(path.read_text())["groups"]
    assert rules == expected


def test_alertmanager_config_is_alertmanager_yml() -> None:
    src = yaml.safe_load((ROOT / "alerts" / "alertmanager.yml").read_text(encoding="utf-8"))
    spec = _one(render("kube-prometheus-stack"), "AlertmanagerConfig")["spec"]
    assert [r["name"] for r in spec["receivers"]] == [r["name"] for r in src["receivers"]]
    assert [r["receiver"] for r in spec["route"]["routes"]] == [r["receiver"] for r in src["route"]["routes"]]
    assert spec["route"]["groupBy"] == src["route"]["group_by"]
    for got, want in zip(spec["route"]["routes"], src["route"]["routes"], strict=True):
        assert [f'{m["name"]}{m["matchType"]}"{m["value"]}"' for m in got["matchers"]] == want["matchers"]
        assert (got["groupWait"], got["repeatInterval"]) == (want["group_wait"], want["repeat_interval"])
    assert len(spec["inhibitRules"]) == len(src["inhibit_rules"])
    for got, want in zip(spec["inhibitRules"], src["inhibit_rules"], strict=True):
        assert got["equal"] == want["equal"]
        assert [f'{m["name"]}{m["matchType"]}"{m["value"]}"' for m in got["targetMatch"]] == want["target_matchers"]
    pd = next(r for r in spec["receivers"] if r["name"] == "pagerduty")["pagerdutyConfigs"][0]
    assert pd["routingKey"] == generate.PAGERDUTY_SECRET
    src_pd = next(r for r in src["receivers"] if r["name"] == "pagerduty")["pagerduty_configs"][0]
    assert {d["key"]: d["value"] for d in pd["details"]} == src_pd["details"]


def test_an_untranslatable_alertmanager_key_fails_the_generator(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    src = yaml.safe_load((ROOT / "alerts" / "alertmanager.yml").read_text(encoding="utf-8"))
    src["receivers"][1]["pagerduty_configs"][0]["timeout"] = "10s"  # Alertmanager 0.26+: not translated yet
    path = tmp_path / "alertmanager.yml"
    path.write_text(yaml.safe_dump(src), encoding="utf-8")
    monkeypatch.setattr(generate.assets, "alertmanager_config", lambda: path)
    assert generate.main(["--check"]) == 2


def test_dashboard_configmaps_hold_the_dashboards_byte_for_byte() -> None:
    docs = [
        d
        for d in render("kube-prometheus-stack")
        if d["kind"] == "ConfigMap" and "grafana_dashboard" in d["metadata"]["labels"]
    ]
    got = {k: v for d in docs for k, v in d["data"].items()}
    want = {p.name: p.read_text(encoding="utf-8") for p in (ROOT / "dashboards" / "json").glob("*.json")}
    assert got == want


# -- kustomize v2 (Debian's kubectl 1.20) and current --------------------------------------------------------------


def test_kustomizations_use_no_fields_kustomize_v2_lacks() -> None:
    """scripts/test.sh installs Debian's kubectl 1.20 (kustomize v2.0.3) where none is present: no newer fields."""
    newer = {"components", "replacements", "labels", "patches", "sortOptions", "helmCharts", "openapi"}
    for path in KDIR.rglob("kustomization.yaml"):
        keys = set(yaml.safe_load(path.read_text(encoding="utf-8")))
        assert not keys & newer, f"{path}: {keys & newer}"
        for ref in yaml.safe_load(path.read_text(encoding="utf-8")).get("resources", []):
            assert (path.parent / ref).is_file(), f"{path}: kustomize v2 takes files in resources, dirs in bases"


# -- checkov ------------------------------------------------------------------------------------------------------


@cache
def checkov_report(tmp: Path) -> dict[str, Any]:
    checkov = require("checkov")
    for overlay in (*OVERLAYS, "planted"):
        (tmp / overlay).mkdir()
    for overlay in OVERLAYS:
        for i, doc in enumerate(render(overlay)):
            (tmp / overlay / f"{i:02d}-{doc['kind']}-{doc['metadata']['name']}.yaml").write_text(yaml.safe_dump(doc))
    # A DaemonSet checkov must flag: the base's, privileged, without its skips.
    planted = copy.deepcopy(_one(render("base"), "DaemonSet"))
    planted["metadata"].pop("annotations")
    planted["spec"]["template"]["spec"]["containers"][0]["securityContext"]["privileged"] = True
    (tmp / "planted" / "daemonset.yaml").write_text(yaml.safe_dump(planted))
    env = {**os.environ, "BC_SKIP_MAPPING": "TRUE"}  # no network: skip the guideline download
    proc = subprocess.run(
        [checkov, "-d", str(tmp), "--framework", "kubernetes", "--skip-download", "-o", "json", "--soft-fail"],
        capture_output=True,
        text=True,
        timeout=600,
        env=env,
        check=False,
    )
    assert proc.returncode == 0, proc.stderr[-2000:]
    report = json.loads(proc.stdout)
    return report if isinstance(report, dict) else report[0]  # type: ignore[no-any-return]


@pytest.fixture(scope="module")
def checkov_results(tmp_path_factory: pytest.TempPathFactory) -> dict[str, Any]:
    return checkov_report(tmp_path_factory.mktemp("checkov"))


def _by_overlay(checks: list[dict[str, Any]]) -> dict[str, list[dict[str, Any]]]:
    out: dict[str, list[dict[str, Any]]] = {}
    for c in checks:
        out.setdefault(c["file_path"].strip("/").split("/")[0], []).append(c)
    return out


def test_checkov_fails_nothing_and_every_skip_is_expected_and_explained(checkov_results: dict[str, Any]) -> None:
    summary, results = checkov_results["summary"], checkov_results["results"]
    assert summary["parsing_errors"] == 0
    failed = _by_overlay(results["failed_checks"])
    assert {c["check_id"] for c in failed.pop("planted", [])} >= {"CKV_K8S_16"}  # checkov does look
    assert not failed, {o: sorted({(c["check_id"], c["resource"]) for c in cs}) for o, cs in failed.items()}
    skipped = _by_overlay(results["skipped_checks"])
    for overlay in OVERLAYS:
        checks = skipped.get(overlay, [])
        assert {c["check_id"] for c in checks} == EXPECTED_SKIPS[overlay], overlay
        for c in checks:
            assert len(c["check_result"].get("suppress_comment", "")) > 40, (overlay, c["check_id"])
    passed = _by_overlay(results["passed_checks"])
    assert all(len(passed.get(o, [])) > 50 for o in OVERLAYS), {o: len(passed.get(o, [])) for o in OVERLAYS}


def test_docs_name_every_overlay_and_skip() -> None:
    text = (ROOT / "docs" / "kubernetes.md").read_text(encoding="utf-8")
    for overlay in OVERLAYS:
        assert f"`{'base/' if overlay == 'base' else f'overlays/{overlay}/'}`" in text, overlay
    for check in set().union(*EXPECTED_SKIPS.values()):
        assert check in text, check
