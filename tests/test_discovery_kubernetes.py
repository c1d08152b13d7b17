"""Kubernetes discovery (agent/node/discovery/kubernetes.py) against a local server replaying recorded API
conversations.

No kube-apiserver can be installed here (/work/shared/reference/fleet-apis.md §1): tests/k8s_replay.py serves the
conversations of tests/fixtures/k8s/ (SOURCE.md there) over real HTTP on 127.0.0.1, watches chunked and streamed,
and fails any request the conversation does not hold, so the list/watch protocol itself is under test: the field
selector, paging, the resume point moved by every event and bookmark, re-list on a 410 (in-stream ERROR event and
HTTP status), a pod restarted with a new IP and container, a pod deleted and one moved away.
"""

from __future__ import annotations

import importlib.util
import json
import time
from collections.abc import Iterator
from pathlib import Path

import httpx
import pytest

from inferwatch.agent.config import DiscoverySettings
from inferwatch.agent.errors import CollectorError, ConfigError
from inferwatch.agent.node.discovery.combined import Discovery
from inferwatch.agent.node.discovery.kubernetes import ApiServer, PodWatcher, pod_targets
from inferwatch.agent.node.discovery.target import TargetSet
from tests.k8s_replay import FIXTURES, Replay

NODE = "gpu-node-a"


@pytest.fixture
def replay_node() -> Iterator[Replay]:
    r = Replay.from_fixture("watch-node.json")
    yield r
    r.close()


def watcher_for(replay: Replay, namespaces: tuple[str, ...] = (), **kwargs: object) -> PodWatcher:
    return PodWatcher(ApiServer(replay.url), NODE, namespaces, watch_timeout_s=30, **kwargs)  # type: ignore[arg-type]


def test_list_watch_bookmarks_gone_and_relist_follow_the_node(replay_node: Replay) -> None:
    w = watcher_for(replay_node)
    try:
        w.step()  # list: two pages
        t = w.targets()
        assert sorted(t) == ["serving/llama-70b-0/vllm", "serving/qwen-sglang-7f9c/sglang"]
        llama = t["serving/llama-70b-0/vllm"]
        assert llama.kind == "vllm" and llama.metrics_url == "http://10.42.0.11:8000/metrics"
        assert llama.health_url == "http://10.42.0.11:8000/health"
        assert llama.profile_url == "http://10.42.0.11:8000/debug/runtime-profile"
        assert llama.identity.container_id == "a" * 64 and llama.identity.node == NODE
        assert llama.prometheus_labels() == {"namespace": "serving", "pod": "llama-70b-0", "container": "vllm"}
        assert llama.resource_attributes()["k8s.pod.uid"] == "0b4c5d6e-1111-4a2b-9c3d-000000000001"
        qwen = t["serving/qwen-sglang-7f9c/sglang"]  # no annotation: found by its image
        assert qwen.kind == "sglang" and qwen.metrics_url == "http://10.42.0.12:30000/metrics"
        assert w.scopes[0].resource_version == "1000"

        before = w.targets()
        w.step()  # watch from 1000: restart, bookmark, a pod coming up, a pod deleted, a bookmark; then the end
        after = w.targets()
        changes = before.diff(after)
        assert [x.name for x in changes.added] == ["serving/tiny-llamacpp/server"]
        assert [x.name for x in changes.changed] == ["serving/llama-70b-0/vllm"]
        assert changes.changed[0].identity.container_id == "f" * 64  # the restarted container
        assert [x.name for x in changes.removed] == ["serving/qwen-sglang-7f9c/sglang"]
        assert after["serving/tiny-llamacpp/server"].metrics_url == "http://10.42.0.13:8080/metrics"
        assert w.scopes[0].resource_version == "1040" and w.bookmarks == 2  # resumes from the last bookmark

        w.step()  # watch from 1040: ERROR 410 in the stream
        assert w.scopes[0].resource_version is None and w.relists_after_gone == 1
        assert w.targets() == after  # kept until the re-list replaces them
        w.step()  # re-list: llama-70b-0 was recreated meanwhile (new uid, new IP); a Triton pod appeared
        t = w.targets()
        llama = t["serving/llama-70b-0/vllm"]
        assert llama.metrics_url == "http://10.42.0.21:8000/metrics"
        assert llama.identity.pod_uid.endswith("7") and llama.identity.container_id == "2" * 64
        trt = t["serving/trt-ensemble/triton"]
        assert trt.kind == "trtllm" and trt.metrics_url == "http://[fd00:42::15]:8002/metrics"
        assert trt.health_url == "http://[fd00:42::15]:8000/v2/health/ready"

        w.step()  # watch from 2000: HTTP 410
        assert w.relists_after_gone == 2
        w.step()  # re-list at 3000
        w.step()  # watch: llama-70b-0 deleted here (moved to another node)
        assert sorted(w.targets()) == ["serving/tiny-llamacpp/server", "serving/trt-ensemble/triton"]
        assert w.scopes[0].resource_version == "3010"
    finally:
        w.stop()
    assert replay_node.mismatches == [] and replay_node.remaining() == 0
    for path, query, _ in replay_node.requests:
        assert path == "/api/v1/pods" and query["fieldSelector"] == f"spec.nodeName={NODE}"
        if "watch" in query:
            assert query["allowWatchBookmarks"] == "true" and query["timeoutSeconds"] == "30"
    rvs = [q.get("resourceVersion") for _, q, _ in replay_node.requests if "watch" in q]
    assert rvs == ["1000", "1040", "2000", "3000"]


def test_only_the_named_namespaces_are_listed_and_watched() -> None:
    r = Replay.from_fixture("watch-namespaces.json")
    w = watcher_for(r, ("serving", "research"))
    try:
        w.step()  # a list in each namespace
        assert sorted(w.targets()) == ["research/qwen-sglang-7f9c/sglang", "serving/llama-70b-0/vllm"]
        w.step()  # a watch in each: the research pod changed IP
        assert w.targets()["research/qwen-sglang-7f9c/sglang"].metrics_url == "http://10.42.0.31:30000/metrics"
        assert [s.resource_version for s in w.scopes] == ["1001", "1110"]
    finally:
        w.stop()
        r.close()
    assert r.mismatches == [] and r.remaining() == 0
    assert {p for p, _, _ in r.requests} == {"/api/v1/namespaces/serving/pods", "/api/v1/namespaces/research/pods"}


def test_the_running_watcher_sees_changes_without_being_stepped() -> None:
    """start(): threads list and watch by themselves; a change arrives while the caller only reads targets()."""
    r = Replay.from_fixture("watch-namespaces.json", idle_watch_s=20.0)
    w = watcher_for(r, ("serving", "research"))
    w.start()
    try:
        deadline = time.monotonic() + 30
        while time.monotonic() < deadline:
            t = w.targets()
            if t.get("research/qwen-sglang-7f9c/sglang") and t["research/qwen-sglang-7f9c/sglang"].metrics_url.endswith(
                ".31:30000/metrics"
            ):
                break
            time.sleep(0.05)
        else:
            pytest.fail(f"the IP change never arrived: {w.targets()!r}, errors {w.errors}")
        assert "serving/llama-70b-0/vllm" in w.targets()
    finally:
        threads = list(w._threads)
        w.stop()  # the server holds both watches open (idle_watch_s); stop() must end them, not wait 20 s
        alive = [t.name for t in threads if t.is_alive()]
        r.close()
    assert threads and not alive
    assert r.mismatches == []


def test_a_refused_list_says_which_rbac_is_missing() -> None:
    conv = {
        "exchanges": [
            {
                "request": {"path": "/api/v1/pods", "query": {"fieldSelector": f"spec.nodeName={NODE}"}},
                "response": {"status": 403, "body": {"kind": "Status", "code": 403, "reason": "Forbidden"}},
            }
        ]
    }
    r = Replay(conv)
    w = watcher_for(r)
    try:
        with pytest.raises(CollectorError, match=r"refused \(403\).*rbac\.yaml"):
            w.step()
    finally:
        w.stop()
        r.close()


def test_a_list_that_is_not_a_pod_list_is_a_format_error() -> None:
    req = {"path": "/api/v1/pods", "query": {"fieldSelector": f"spec.nodeName={NODE}"}}
    r = Replay({"exchanges": [{"request": req, "response": {"status": 200, "body": ["not", "a", "list"]}}]})
    w = watcher_for(r)
    try:
        with pytest.raises(CollectorError, match="is not a PodList"):
            w.step()
        assert w.scopes[0].resource_version is None and w.targets() == TargetSet()
    finally:
        w.stop()
        r.close()


def test_a_watch_stream_that_is_not_json_is_a_format_error() -> None:
    conv = json.loads((FIXTURES / "watch-namespaces.json").read_text())
    surprise = {
        "request": {"path": "/api/v1/namespaces/serving/pods", "query": {"watch": "1"}},
        "response": {"status": 200, "watch": [{"type": "SURPRISE", "object": {}}]},
    }
    conv["exchanges"] = [conv["exchanges"][0], surprise]
    r = Replay(conv)
    w = watcher_for(r, ("serving",))
    try:
        w.step()
        with pytest.raises(CollectorError, match="unknown watch event type 'SURPRISE'"):
            w.step()
        assert sorted(w.targets()) == ["serving/llama-70b-0/vllm"]  # a bad event keeps what was known
    finally:
        w.stop()
        r.close()


def test_the_token_is_sent_and_reread(tmp_path: Path) -> None:
    token = tmp_path / "token"
    token.write_text("first\n")
    r = Replay.from_fixture("watch-namespaces.json")
    w = PodWatcher(ApiServer(r.url, token_file=token), NODE, ("serving", "research"), watch_timeout_s=30)
    try:
        w.scopes[0].relist()
        token.write_text("rotated")
        w.scopes[1].relist()
    finally:
        w.stop()
        r.close()
    assert [h.get("Authorization") for _, _, h in r.requests] == ["Bearer first", "Bearer rotated"]


def test_in_cluster_config_needs_the_service_host_and_a_token(tmp_path: Path) -> None:
    with pytest.raises(ConfigError, match="KUBERNETES_SERVICE_HOST"):
        ApiServer.in_cluster({}, tmp_path)
    with pytest.raises(ConfigError, match="no service account token"):
        ApiServer.in_cluster({"KUBERNETES_SERVICE_HOST": "10.96.0.1"}, tmp_path)
    (tmp_path / "token").write_text("t")
    api = ApiServer.in_cluster({"KUBERNETES_SERVICE_HOST": "fd00::1", "KUBERNETES_SERVICE_PORT": "6443"}, tmp_path)
    assert api.base_url == "https://[fd00::1]:6443" and api.ca_file == tmp_path / "ca.crt"
    with pytest.raises(ConfigError, match="node_name"):
        PodWatcher(api, "", client=httpx.Client())


# -- pod_targets: annotations and the image fallback ---------------------------------------------------------


def _pod(annotations: dict[str, str] | None = None, containers: list[dict[str, object]] | None = None) -> dict:
    return {
        "metadata": {"namespace": "ns", "name": "p", "uid": "u", "annotations": annotations or {}},
        "spec": {"nodeName": NODE, "containers": containers or [{"name": "c", "image": "vllm/vllm-openai:v0.11.0"}]},
        "status": {"phase": "Running", "podIP": "10.0.0.9", "containerStatuses": [{"name": "c"}]},
    }


def test_annotations_choose_engine_port_path_and_container() -> None:
    containers = [
        {"name": "sidecar", "image": "busybox"},
        {"name": "engine", "image": "registry.example.com/our-llm:3", "ports": [{"name": "m", "containerPort": 9100}]},
    ]
    ann = {
        "inferwatch.io/scrape": "true",
        "inferwatch.io/container": "engine",
        "inferwatch.io/engine": "tgi",
        "inferwatch.io/port": "m",
        "inferwatch.io/path": "prom",
    }
    (t,), problem = pod_targets(_pod(ann, containers))
    assert problem is None
    assert (t.name, t.kind, t.metrics_url, t.health_url) == ("ns/p/engine", "tgi", "http://10.0.0.9:9100/prom", None)


@pytest.mark.parametrize(
    ("ann", "message"),
    [
        ({"inferwatch.io/scrape": "ture"}, "scrape is 'ture'"),
        ({"inferwatch.io/scrape": "true", "inferwatch.io/port": "nope"}, "port 'nope'"),
        ({"inferwatch.io/scrape": "true", "inferwatch.io/engine": "vlm"}, "engine 'vlm'"),
        ({"inferwatch.io/scrape": "true", "inferwatch.io/container": "x"}, "container 'x'"),
    ],
)
def test_a_misspelt_annotation_is_reported_not_guessed(ann: dict[str, str], message: str) -> None:
    targets, problem = pod_targets(_pod(ann))
    assert targets == [] and problem is not None and message in problem


def test_unknown_images_need_a_port_and_opt_out_wins() -> None:
    unknown = [{"name": "c", "image": "example/llm:1"}]
    assert pod_targets(_pod(None, unknown)) == ([], None)  # not an engine image: ignored
    targets, problem = pod_targets(_pod({"inferwatch.io/scrape": "true"}, unknown))
    assert targets == [] and problem is not None and "set inferwatch.io/port" in problem
    assert pod_targets(_pod({"inferwatch.io/scrape": "false"})) == ([], None)
    assert pod_targets(_pod(), image_fallback=False) == ([], None)
    tgi_image = "ghcr.io/huggingface/text-generation-inference:3.3"
    tgi = [{"name": "c", "image": tgi_image, "ports": [{"containerPort": 3000}]}]
    (t,), _ = pod_targets(_pod(None, tgi))
    assert t.metrics_url == "http://10.0.0.9:3000/metrics"  # the declared one of TGI's two ports


def test_watcher_snapshot_reports_the_problem_pods(replay_node: Replay) -> None:
    w = watcher_for(replay_node)
    try:
        w.step()
        with w.lock:
            pod = dict(w.scopes[0].pods["serving/llama-70b-0"])
            pod["metadata"] = {**pod["metadata"], "annotations": {"inferwatch.io/scrape": "yes please"}}
            w.scopes[0].pods["serving/llama-70b-0"] = pod
        targets, problems = w.snapshot()
        assert isinstance(targets, TargetSet) and "serving/llama-70b-0/vllm" not in targets
        assert "yes please" in problems["serving/llama-70b-0"]
    finally:
        w.stop()


def test_discovery_runs_the_pod_watcher_from_settings() -> None:
    r = Replay.from_fixture("watch-namespaces.json")
    settings = DiscoverySettings(
        kubernetes=True, node_name=NODE, namespaces=["serving", "research"], watch_timeout_s=30
    )
    d = Discovery(settings, api=ApiServer(r.url))
    d.start()
    try:
        deadline = time.monotonic() + 30
        while time.monotonic() < deadline:
            polled = d.poll()
            if len(polled.targets) == 2:
                break
            time.sleep(0.05)
        assert sorted(polled.targets) == ["research/qwen-sglang-7f9c/sglang", "serving/llama-70b-0/vllm"]
        assert polled.targets["serving/llama-70b-0/vllm"].source == "kubernetes" and not polled.errors
    finally:
        d.stop()
        r.close()


def test_the_conversations_are_what_their_generator_writes() -> None:
    spec = importlib.util.spec_from_file_location("make_conversations", FIXTURES / "make_conversations.py")
    assert spec is not None and spec.loader is not None
    gen = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(gen)
    assert json.loads((FIXTURES / "watch-node.json").read_text()) == gen.node_conversation()
    assert json.loads((FIXTURES / "watch-namespaces.json").read_text()) == gen.namespaces_conversation()
