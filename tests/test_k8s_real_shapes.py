"""Kubernetes discovery and the readiness gate against REAL API output, and our constructed conversations checked
field by field against it.

The replayed conversations of tests/fixtures/k8s/ (watch-node.json, watch-namespaces.json, readiness-gate.json) are
constructed by our own scripts: no kube-apiserver can run here. tests/fixtures/k8s/real/ holds what real API servers
and the Kubernetes serializer wrote (SOURCE.md there says where each comes from and how faithfully it is copied):

- real traffic quoted from public sources (``captures.json``): two in-stream 410 ``ERROR`` events (the watch cache's
  message and the storage's ``too old resource version: N (M)``), a pod-watch ``BOOKMARK``, an EndpointSlice endpoint
  of a not-ready pod, and pod ``status.conditions`` with readiness gates as ``kubectl get -o yaml`` printed them;
- ``api-testdata-HEAD-*.json``: kubernetes/api's compatibility data, a Pod, an EndpointSlice and a Status with every
  field filled, written by the API types' own JSON serializer (real names, types and nesting; placeholder values).

Part 1 runs our code on the real objects: the real ERROR and BOOKMARK lines are served by the replay server inside a
watch and the real :class:`PodWatcher` handles them; the real Pod is read by :func:`pod_targets`; the real readiness
conditions are read by the kubelet rule the readiness-gate test ports. Part 2 fails when a field our constructed
conversations rely on has a name, JSON type or nesting the real objects do not have, or a value the real captures
pin (the 410 Status, the BOOKMARK, the kubelet's Ready reason and messages, the endpoint conditions).
"""

from __future__ import annotations

import copy
import json
import re
from collections.abc import Iterator
from typing import Any

import pytest
import yaml

from inferwatch.agent.node.discovery.kubernetes import ApiServer, PodWatcher, pod_targets
from inferwatch.agent.node.discovery.podcondition import condition_patch, verdict_of
from tests.k8s_replay import FIXTURES, Replay
from tests.test_readiness_gate import kubelet_ready

REAL = FIXTURES / "real"
CAPTURES: dict[str, Any] = json.loads((REAL / "captures.json").read_text())
API_POD: dict[str, Any] = json.loads((REAL / "api-testdata-HEAD-core.v1.Pod.json").read_text())
API_SLICE: dict[str, Any] = json.loads((REAL / "api-testdata-HEAD-discovery.k8s.io.v1.EndpointSlice.json").read_text())
API_STATUS: dict[str, Any] = json.loads((REAL / "api-testdata-HEAD-core.v1.Status.json").read_text())
CONVERSATIONS = ("watch-node.json", "watch-namespaces.json", "readiness-gate.json")
CONSTRUCTED = {name: json.loads((FIXTURES / name).read_text()) for name in CONVERSATIONS}
NODE = "gpu-node-a"
SELECTOR = f"spec.nodeName={NODE}"
GONE_EVENTS = ("watch-error-410-cacher", "watch-error-410-too-old")
GATE_STATUSES = ("pod-status-gate-set-false", "pod-status-custom-gate")


def real_event(name: str) -> dict[str, Any]:
    return dict(json.loads(CAPTURES[name]["raw"]))


def real_conditions(name: str) -> list[dict[str, Any]]:
    return list(yaml.safe_load(CAPTURES[name]["yaml"])["status"]["conditions"])


# -- part 1: our code on the real objects ---------------------------------------------------------------------


def _pod(rv: str, ip: str) -> dict[str, Any]:
    """The one pod of these conversations: the real serializer's Pod with only what discovery keys on set to a
    running, opted-in engine pod on this node (every other field keeps its real name, type and nesting)."""
    p = copy.deepcopy(API_POD)
    annotations = {"inferwatch.io/scrape": "true", "inferwatch.io/port": "8000"}
    p["metadata"].update(namespace="serving", name="vllm-0", resourceVersion=rv, annotations=annotations)
    p["metadata"].pop("deletionTimestamp", None)
    p["spec"]["nodeName"] = NODE
    p["status"].update(phase="Running", podIP=ip, podIPs=[{"ip": ip}])
    return p


def _list(rv: str, ip: str) -> dict[str, Any]:
    return {"kind": "PodList", "apiVersion": "v1", "metadata": {"resourceVersion": rv}, "items": [_pod(rv, ip)]}


def _list_req() -> dict[str, Any]:
    return {"path": "/api/v1/pods", "query": {"fieldSelector": SELECTOR, "limit": "500"}}


def _watch_req(rv: str) -> dict[str, Any]:
    query = {"fieldSelector": SELECTOR, "watch": "1", "allowWatchBookmarks": "true", "resourceVersion": rv}
    return {"path": "/api/v1/pods", "query": query}


@pytest.fixture(params=GONE_EVENTS)
def gone_replay(request: pytest.FixtureRequest) -> Iterator[Replay]:
    """List; a watch streaming the real BOOKMARK then a real in-stream 410 (as a real server answers a watch from a
    too-old resourceVersion: HTTP 200, the Status in the stream); the re-list; a quiet watch from the new point."""
    conversation = {
        "exchanges": [
            {"request": _list_req(), "response": {"status": 200, "body": _list("100", "10.42.0.5")}},
            {"request": _watch_req("100"), "response": {"status": 200, "watch": [real_event("watch-bookmark-pod")]}},
            {"request": _watch_req("3845"), "response": {"status": 200, "watch": [real_event(request.param)]}},
            {"request": _list_req(), "response": {"status": 200, "body": _list("4000", "10.42.0.9")}},
            {"request": _watch_req("4000"), "response": {"status": 200, "watch": []}},
        ]
    }
    r = Replay(conversation)
    yield r
    r.close()


def test_the_watcher_resumes_from_a_real_bookmark_and_relists_on_a_real_410(gone_replay: Replay) -> None:
    w = PodWatcher(ApiServer(gone_replay.url), NODE, (), watch_timeout_s=30)
    try:
        w.step()  # list
        before = w.targets()
        assert sorted(before) == ["serving/vllm-0/nameValue"]
        assert before["serving/vllm-0/nameValue"].metrics_url == "http://10.42.0.5:8000/metrics"
        w.step()  # watch: the real BOOKMARK (spec.containers null, status {}) moves the resume point, nothing else
        assert w.bookmarks == 1 and w.scopes[0].resource_version == "3845" and w.targets() == before
        w.step()  # watch from 3845: the real ERROR 410 line
        assert w.relists_after_gone == 1 and w.scopes[0].resource_version is None
        assert w.targets() == before  # kept until the re-list replaces them
        w.step()  # re-list: the pod came back with a new IP
        assert w.targets()["serving/vllm-0/nameValue"].metrics_url == "http://10.42.0.9:8000/metrics"
        assert w.scopes[0].resource_version == "4000"
        w.step()  # the quiet watch from the new point
    finally:
        w.stop()
    assert gone_replay.mismatches == [] and gone_replay.remaining() == 0


def test_the_real_serializers_pod_reads_as_discovery_expects() -> None:
    """Every field of v1.Pod as the serializer writes it: not Running (phase ``phaseValue``): no target, no error;
    running and opted in: one target whose identity and readiness gates come from the real nesting."""
    assert pod_targets(API_POD) == ([], None)
    (target,), problem = pod_targets(_pod("1", "10.42.0.5"))
    assert problem is None
    container, status = API_POD["spec"]["containers"][0], API_POD["status"]["containerStatuses"][0]
    assert target.identity.container == container["name"] == status["name"]
    assert target.identity.container_id == status["containerID"]  # "containerIDValue": no "runtime://" prefix
    assert target.identity.pod_uid == API_POD["metadata"]["uid"]
    assert target.readiness_gates == tuple(g["conditionType"] for g in API_POD["spec"]["readinessGates"])


def test_the_kubelet_rule_reads_real_readiness_conditions() -> None:
    """The kubelet rule the readiness-gate test uses, on real conditions: a gate set False must give Ready False
    with the kubelet's reason and message as a real cluster printed them (issue #86485's wording)."""
    for name, gate in zip(GATE_STATUSES, ("zte.com.cn/huang", "custom-readiness-gate"), strict=True):
        conditions = real_conditions(name)
        assert {c["type"]: c["status"] for c in conditions}[gate] == "False"
        pod = {"spec": {"readinessGates": [{"conditionType": gate}]}, "status": {"conditions": conditions}}
        message = f'the status of pod readiness gate "{gate}" is not "True", but False'
        assert kubelet_ready(pod) == {"status": "False", "reason": "ReadinessGatesNotReady", "message": message}
    real = CAPTURES["pod-ready-gate-false"]["fields"]
    pod = {
        "spec": {"readinessGates": [{"conditionType": "szwadron/kuro"}]},
        "status": {"conditions": [{"type": "szwadron/kuro", "status": "False"}]},
    }
    got = kubelet_ready(pod)
    assert got == {k: real[k] for k in ("status", "reason", "message")}
    got = kubelet_ready({"spec": {"readinessGates": [{"conditionType": "zte.com.cn/huang"}]}, "status": {}})
    assert got["message"] == real_conditions("pod-status-gate-set-false")[1]["message"]  # the "does not exist." text


# -- part 2: our constructed conversations against the real shapes --------------------------------------------

# Free-form maps (any key): their keys are not field names.
MAPS = {"metadata.annotations", "metadata.labels", "spec.nodeSelector"}
TIMES = re.compile(r"(Timestamp|Time|startedAt|finishedAt)$")


def shape(obj: Any, path: str = "", out: dict[str, set[str]] | None = None) -> dict[str, set[str]]:
    """Every field path of a JSON value (``a.b[].c``) with the JSON types seen there."""
    out = {} if out is None else out
    kind = "null" if obj is None else type(obj).__name__
    if path:
        out.setdefault(path, set()).add(kind)
    if isinstance(obj, dict):
        for k, v in obj.items():
            sub = f"{path}.*" if path in MAPS else (f"{path}.{k}" if path else k)
            shape(v, sub, out)
    elif isinstance(obj, list):
        for v in obj:
            shape(v, f"{path}[]", out)
    return out


def divergent(ours: Any, *real: Any) -> list[str]:
    """The fields of ``ours`` whose path or JSON type no real object has. A time the serializer wrote as ``null``
    (Go's zero ``metav1.Time``) also admits a string: the same field, set."""
    reference: dict[str, set[str]] = {}
    for r in real:
        for p, kinds in shape(r).items():
            reference.setdefault(p, set()).update(kinds)
    wrong = []
    for p, kinds in shape(ours).items():
        allowed = set(reference.get(p, ()))
        if "null" in allowed and TIMES.search(p):
            allowed.add("str")
        if "str" in allowed and TIMES.search(p):
            allowed.add("null")  # kubectl prints lastProbeTime: null for a set condition (issues #72311, #122002)
        if not kinds <= allowed:
            wrong.append(f"{p}: ours {sorted(kinds)}, real {sorted(allowed) or 'absent'}")
    return wrong


def constructed_events() -> Iterator[tuple[str, dict[str, Any]]]:
    for name, conv in CONSTRUCTED.items():
        for i, ex in enumerate(conv["exchanges"]):
            for event in ex["response"].get("watch", []):
                yield f"{name} exchange {i}", event


def constructed_pods() -> Iterator[tuple[str, dict[str, Any]]]:
    for name, conv in CONSTRUCTED.items():
        for i, ex in enumerate(conv["exchanges"]):
            body = ex["response"].get("body") or {}
            if body.get("kind") == "PodList":
                yield from ((f"{name} exchange {i}", p) for p in body["items"])
            elif body.get("kind") == "Pod":
                yield f"{name} exchange {i}", body
    for where, event in constructed_events():
        if event["type"] in ("ADDED", "MODIFIED", "DELETED"):
            yield where, event["object"]


def constructed_gone() -> Iterator[tuple[str, dict[str, Any]]]:
    for name, conv in CONSTRUCTED.items():
        for i, ex in enumerate(conv["exchanges"]):
            body = ex["response"].get("body") or {}
            if body.get("kind") == "Status":
                yield f"{name} exchange {i} (HTTP {ex['response']['status']})", body
    for where, event in constructed_events():
        if event["type"] == "ERROR":
            yield where, event["object"]


def test_the_shape_check_fails_on_a_field_the_api_does_not_have() -> None:
    """The check itself: a renamed field, a string where the API has a list, and a flattened nesting all fail."""
    ok = copy.deepcopy(next(p for _, p in constructed_pods()))
    assert divergent(ok, API_POD) == []
    renamed, retyped, flattened = copy.deepcopy(ok), copy.deepcopy(ok), copy.deepcopy(ok)
    renamed["status"]["podIp"] = renamed["status"].pop("podIP")
    retyped["status"]["podIPs"] = retyped["status"]["podIP"]
    flattened["status"]["containerID"] = flattened["status"]["containerStatuses"][0].pop("containerID", "x")
    assert divergent(renamed, API_POD) == ["status.podIp: ours ['str'], real absent"]
    assert divergent(retyped, API_POD) == ["status.podIPs: ours ['str'], real ['list']"]
    assert divergent(flattened, API_POD) == ["status.containerID: ours ['str'], real absent"]


def test_every_constructed_pod_has_the_real_pods_fields() -> None:
    pods = list(constructed_pods())
    assert len(pods) > 20
    problems = {where + " " + p["metadata"]["name"]: divergent(p, API_POD) for where, p in pods}
    assert {k: v for k, v in problems.items() if v} == {}
    # the readiness gate's pods: the conditions' fields as a real kubectl printed them too
    real_pod_statuses = [{"status": {"conditions": real_conditions(n)}} for n in GATE_STATUSES]
    gated = [p for _, p in pods if p["spec"].get("readinessGates")]
    assert gated
    for p in gated:
        assert divergent({"status": {"conditions": p["status"]["conditions"]}}, API_POD, *real_pod_statuses) == []


def test_the_constructed_bookmarks_are_the_real_bookmarks_fields() -> None:
    real = real_event("watch-bookmark-pod")
    bookmarks = [e for _, e in constructed_events() if e["type"] == "BOOKMARK"]
    assert len(bookmarks) >= 5
    for e in bookmarks:
        assert divergent(e, real) == []
        assert e["object"]["kind"] == real["object"]["kind"] and e["object"]["apiVersion"] == "v1"
        assert isinstance(e["object"]["metadata"]["resourceVersion"], str)
    assert {e["type"] for _, e in constructed_events()} <= {"ADDED", "MODIFIED", "DELETED", "BOOKMARK", "ERROR"}


def test_the_constructed_410s_are_the_real_status() -> None:
    reals = [real_event(n)["object"] for n in GONE_EVENTS]
    gone = list(constructed_gone())
    assert len(gone) == 2  # the in-stream ERROR and the HTTP 410 answer of watch-node.json
    for where, status in gone:
        assert divergent(status, API_STATUS, *reals) == [], where
        for real in reals:  # the values a client keys on, as real servers wrote them
            keys = ("kind", "apiVersion", "status", "reason", "code")
            assert {k: status[k] for k in keys} == {k: real[k] for k in keys}, where
        # the storage's wording, as the real etcd-backed answer has it: "too old resource version: N (M)"
        pattern = re.sub(r"\d+", r"\\d+", re.escape(real_event("watch-error-410-too-old")["object"]["message"]))
        assert re.fullmatch(pattern, status["message"]), where
    for where, event in constructed_events():
        if event["type"] == "ERROR":
            assert divergent(event, *(real_event(n) for n in GONE_EVENTS)) == [], where


def test_the_constructed_endpointslices_are_the_real_slices_fields() -> None:
    conv = CONSTRUCTED["readiness-gate.json"]
    lists = [ex["response"]["body"] for ex in conv["exchanges"] if "endpointslices" in ex["request"]["path"]]
    assert len(lists) == 4
    real_endpoint = json.loads(CAPTURES["endpointslice-not-ready-endpoint"]["raw"])
    for body in lists:
        for item in body["items"]:
            assert divergent(item, API_SLICE) == []
            for endpoint in item["endpoints"]:
                assert divergent({"conditions": endpoint["conditions"]}, real_endpoint) == []
                assert set(endpoint["conditions"]) == set(real_endpoint["conditions"])  # ready, serving, terminating
    hung = [e for b in lists for i in b["items"] for e in i["endpoints"] if not e["conditions"]["serving"]]
    assert [e["conditions"] for e in hung] == [real_endpoint["conditions"]] * 2  # a not-ready pod, as a cluster showed


def test_the_constructed_kubelet_answers_carry_the_real_ready_reason_and_messages() -> None:
    real_absent = real_conditions("pod-status-gate-set-false")[1]["message"]
    real_false = CAPTURES["pod-ready-gate-false"]["fields"]["message"]
    absent = re.escape(real_absent).replace(re.escape("zte.com.cn/huang"), '[^"]+')
    false = re.escape(real_false).replace(re.escape("szwadron/kuro"), '[^"]+')
    seen = set()
    for _, p in constructed_pods():
        for c in p["status"].get("conditions", []):
            if c["type"] == "Ready" and c["status"] == "False":
                assert c["reason"] == "ReadinessGatesNotReady"
                assert re.fullmatch(absent, c["message"]) or re.fullmatch(false, c["message"]), c["message"]
                seen.add("absent" if re.fullmatch(absent, c["message"]) else "false")
    assert seen == {"absent", "false"}


def test_the_agents_patch_has_the_real_conditions_fields() -> None:
    """The body the agent PATCHes to pods/status: every field where a real pod status has it."""
    real = [{"status": {"conditions": real_conditions(n)}} for n in GATE_STATUSES]
    for status, body in ((503, {"reason": "hung", "detail": "no token in 60 s"}), (200, {"ready": True})):
        patch = condition_patch("inferwatch.io/engine-serving", verdict_of(status, body), 1e9)
        assert divergent(patch, API_POD, *real) == []
