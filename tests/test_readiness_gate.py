"""The readiness gate on Kubernetes: the agent sets its pod condition; the Service's EndpointSlice drops the hung pod.

**Real**: the agent's own code — discovery's list and watch (:class:`PodWatcher`), the readiness verdict from the agent
state (filled as the runner fills it: a collector health and a collection, with the hang finding), the composition
root's setter (:func:`inferwatch.agent.node.app.pod_conditions`) sending its PATCH over HTTP to a server on 127.0.0.1 —
and the manifests (``overlays/readiness-gate/`` rendered by kubectl kustomize; the example engine's ``readinessGates``
validated against the Kubernetes schemas).

**Replayed**: the API server (tests/k8s_replay.py) with the conversation tests/fixtures/k8s/readiness-gate.json,
*constructed* to the documented API, not captured from a cluster (none can run here: SOURCE.md). It fails any PATCH
that is not the one it expects next (path, content type, the condition's type, status and reason) and answers with
the pod as patched. After each PATCH it holds the pod as the **kubelet** then publishes it and the Service's
EndpointSlice as the **endpointslice controller** then publishes it; the test reads both as ``kubectl get`` would.

No kubelet or endpoints controller runs here, so what the test proves is the agent's part (the right PATCH at each
verdict change, and none in between) and that the recorded controller answers follow from that PATCH by the
controllers' own rules, ported below: kubelet ``pkg/kubelet/status/generate.go`` (Ready is False with reason
``ReadinessGatesNotReady`` while a gate's condition is not "True") and the endpointslice controller's
``podToEndpoint`` (``serving`` = pod Ready, ``ready`` = serving and not terminating).
"""

from __future__ import annotations

import json
import time
from collections.abc import Iterator
from typing import Any

import httpx
import kubernetes_validate
import pytest
import yaml

from inferwatch.agent.common.samples import Collection, Finding
from inferwatch.agent.config import Settings
from inferwatch.agent.node.api.readinessgate import pod_conditions
from inferwatch.agent.node.discovery.kubernetes import ApiServer, PodWatcher
from inferwatch.agent.node.discovery.podcondition import PodConditions, condition_patch, verdict_of
from inferwatch.agent.node.discovery.target import EngineTarget, TargetIdentity
from inferwatch.agent.node.state import AgentState, CollectorHealth, next_health
from tests.conftest import ROOT
from tests.k8s_replay import FIXTURES, Replay
from tests.test_kubernetes import K8S_VERSION, render

CONVERSATION = json.loads((FIXTURES / "readiness-gate.json").read_text())
GATE = CONVERSATION["gate"]
NODE = CONVERSATION["node"]
TARGET = "serving/vllm-7b-0/vllm"
POD = "/api/v1/namespaces/serving/pods/vllm-7b-0"
SLICES = "/apis/discovery.k8s.io/v1/namespaces/serving/endpointslices"
EXAMPLE = ROOT / "deploy" / "kubernetes" / "overlays" / "readiness-gate" / "example-engine.yaml"


# -- the controllers' rules, ported (see the module docstring) ---------------------------------------------------


def kubelet_ready(pod: dict[str, Any]) -> dict[str, str]:
    """The Ready condition the kubelet generates for a running pod whose containers are ready (generate.go
    ``GeneratePodReadyCondition``: each readiness gate's condition must be "True")."""
    conditions = {c["type"]: c for c in pod["status"].get("conditions", [])}
    unready = []
    for gate in pod["spec"].get("readinessGates", []):
        kind = gate["conditionType"]
        c = conditions.get(kind)
        if c is None:
            unready.append(f'corresponding condition of pod readiness gate "{kind}" does not exist.')
        elif c["status"] != "True":
            unready.append(f'the status of pod readiness gate "{kind}" is not "True", but {c["status"]}')
    if unready:
        return {"status": "False", "reason": "ReadinessGatesNotReady", "message": ", ".join(unready)}
    return {"status": "True"}


def endpoint_conditions(pod: dict[str, Any]) -> dict[str, bool]:
    """``podToEndpoint``: serving = the pod's Ready; ready = serving and not terminating (publishNotReadyAddresses
    unset)."""
    ready = any(c["type"] == "Ready" and c["status"] == "True" for c in pod["status"].get("conditions", []))
    terminating = pod["metadata"].get("deletionTimestamp") is not None
    return {"ready": ready and not terminating, "serving": ready, "terminating": terminating}


# -- the agent state, filled as the runner fills it ---------------------------------------------------------------


def _record(state: AgentState, hung: bool = False) -> None:
    name = "engine:" + TARGET
    prev = state.health().get(name) or CollectorHealth(name, 2.0, 2.0)
    findings = [Finding("engine_hung", "fail", "engine rank 0 of m: no token for 7s", {"model": "m", "rank": "0"})]
    ranks = [{"model": "m", "rank": "0", "running": 4, "waiting": 0, "stall_s": 7.0 if hung else 0.0}]
    collection = Collection([], findings if hung else [], {"hang": ranks})
    state.record(name, next_health(prev, "ok", 0.01, time.time()), collection)


def _wait(pred: Any, timeout: float = 30.0) -> bool:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if pred():
            return True
        time.sleep(0.05)
    return False


@pytest.fixture
def replay() -> Iterator[Replay]:
    r = Replay(CONVERSATION)
    try:
        yield r
    finally:
        r.close()


def test_a_hung_engine_pod_leaves_its_service_endpoints_and_comes_back(replay: Replay) -> None:
    watcher = PodWatcher(ApiServer(replay.url), NODE, (), watch_timeout_s=30)
    state = AgentState()
    settings = Settings()
    assert settings.readiness.pod_condition == GATE  # the default is the condition the example engine declares
    gate = pod_conditions(settings.readiness, settings.engine, state, watcher)
    observer = httpx.Client(base_url=replay.url, timeout=10)
    watcher.start()
    try:
        assert _wait(lambda: TARGET in watcher.snapshot()[0]), replay.mismatches
        assert watcher.snapshot()[0][TARGET].readiness_gates == (GATE,)
        seen: list[tuple[str, bool]] = []
        for step in ("pending", "serving", "hung", "serving"):
            if step == "pending":
                state.register(CollectorHealth("engine:" + TARGET, 2.0, 2.0))  # its collector has not run yet
            else:
                _record(state, hung=step == "hung")
            sent = gate.step()
            assert len(sent) == 1, (step, sent, replay.mismatches)
            assert gate.step() == []  # the same verdict again: no PATCH (the conversation holds none)
            assert not replay.mismatches, replay.mismatches
            path, body = replay.bodies[-1]
            assert path == POD + "/status"
            (condition,) = body["status"]["conditions"]
            assert condition["type"] == GATE and condition["status"] == ("True" if step == "serving" else "False")
            patched = {c["type"]: c for c in _last_patch_answer(replay)["status"]["conditions"]}
            assert patched[GATE]["status"] == condition["status"]
            # what the kubelet and the endpointslice controller then publish (replayed), and that it follows from it
            pod = observer.get(POD).json()
            (ready,) = [c for c in pod["status"]["conditions"] if c["type"] == "Ready"]
            expected = kubelet_ready(_last_patch_answer(replay))
            assert {k: ready.get(k) for k in expected} == expected
            (endpoint,) = observer.get(SLICES, params={"labelSelector": "kubernetes.io/service-name=vllm-7b"}).json()[
                "items"
            ][0]["endpoints"]
            assert endpoint["conditions"] == endpoint_conditions(pod)
            assert endpoint["targetRef"]["name"] == "vllm-7b-0"
            seen.append((ready["status"] + "/" + ready.get("reason", ""), endpoint["conditions"]["ready"]))
        assert seen == [
            ("False/ReadinessGatesNotReady", False),
            ("True/", True),
            ("False/ReadinessGatesNotReady", False),  # the hung pod is out of the Service's endpoints
            ("True/", True),
        ]
        assert [b["status"]["conditions"][0]["reason"] for _p, b in replay.bodies] == [
            "EnginePending",
            "EngineServing",
            "EngineHung",
            "EngineServing",
        ]
        assert replay.remaining() == 0 and not replay.mismatches
    finally:
        observer.close()
        gate.stop()
        watcher.stop()


def _last_patch_answer(replay: Replay) -> dict[str, Any]:
    """The API server's (replayed) answer to the last PATCH: the pod with the gate's condition as patched."""
    patches = [i for i, ex in enumerate(replay.exchanges) if ex["request"].get("method") == "PATCH" and replay.used[i]]
    body: dict[str, Any] = replay.exchanges[patches[-1]]["response"]["body"]
    return body


def test_the_patch_is_a_strategic_merge_of_one_condition_with_its_transition_time() -> None:
    body = condition_patch(GATE, verdict_of(503, {"reason": "hung", "detail": "x" * 5000}), 1_765_000_000.7)
    (c,) = body["status"]["conditions"]
    assert c == {
        "type": GATE,
        "status": "False",
        "reason": "EngineHung",
        "message": "x" * 1024,
        "lastTransitionTime": "2025-12-06T05:46:40Z",
    }
    assert verdict_of(404, {"error": "unknown_engine"}).reason == "pending"  # its collector not started yet
    assert verdict_of(200, {"ready": True, "reason": "serving"}).ready


def test_a_refused_patch_names_the_grant_and_is_retried_not_every_pass() -> None:
    calls: list[str] = []

    def handler(request: httpx.Request) -> httpx.Response:
        calls.append(request.headers["content-type"])
        return httpx.Response(403, json={"kind": "Status", "code": 403, "reason": "Forbidden"})

    identity = TargetIdentity("serving", "vllm-7b-0", "vllm", "u1")
    target = EngineTarget(TARGET, "vllm", "http://10.0.0.1:8000/metrics", identity=identity, readiness_gates=(GATE,))
    clock = [1000.0]
    gate = PodConditions(
        ApiServer("http://api.invalid"),
        GATE,
        lambda: [target],
        lambda _name: verdict_of(200, {"reason": "serving"}),
        clock=lambda: clock[0],
        client=httpx.Client(base_url="http://api.invalid", transport=httpx.MockTransport(handler)),
    )
    assert len(gate.step()) == 1 and "pods/status" in gate._failing[TARGET]
    assert gate.step() == []  # not again at once
    clock[0] += 5.0
    assert len(gate.step()) == 1  # retried after RETRY_S
    assert calls == ["application/strategic-merge-patch+json"] * 2
    gate.stop()


def test_the_overlay_grants_patch_on_pod_status_only_and_the_example_declares_the_gate() -> None:
    docs = render("readiness-gate")
    roles = {d["metadata"]["name"]: d for d in docs if d["kind"] == "ClusterRole"}
    status_rules = roles["inferwatch-agent-pod-status"]["rules"]
    assert status_rules == [{"apiGroups": [""], "resources": ["pods/status"], "verbs": ["patch"]}]
    assert roles["inferwatch-agent-pods"]["rules"][0]["verbs"] == ["get", "list", "watch"]  # discovery's, unchanged
    bindings = [d for d in docs if d["kind"] == "ClusterRoleBinding"]
    binding = next(b for b in bindings if b["roleRef"]["name"] == "inferwatch-agent-pod-status")
    assert binding["subjects"] == [{"kind": "ServiceAccount", "name": "inferwatch-agent", "namespace": "inferwatch"}]
    example = [d for d in yaml.safe_load_all(EXAMPLE.read_text()) if d]
    for doc in example:
        kubernetes_validate.validate(doc, K8S_VERSION, strict=True)
    deployment = next(d for d in example if d["kind"] == "Deployment")
    pod = deployment["spec"]["template"]["spec"]
    assert pod["readinessGates"] == [{"conditionType": Settings().readiness.pod_condition}]
    (engine,) = pod["containers"]
    assert engine["livenessProbe"]["httpGet"]["path"] == "/health"  # a hang drains the pod, it never restarts it
    assert "host" not in engine["livenessProbe"]["httpGet"] and "exec" not in engine.get("readinessProbe", {})
    assert not any(pod.get(k) for k in ("hostNetwork", "hostPID", "hostIPC"))
    service = next(d for d in example if d["kind"] == "Service")
    assert service["spec"]["selector"].items() <= deployment["spec"]["template"]["metadata"]["labels"].items()
