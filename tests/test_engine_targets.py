"""Many engines per agent (agent/node/targets.py): a collector set per discovered target, each target's identity on
its series, targets added and removed while the agent runs, one engine's failure its own.

Real parts: simulators on 127.0.0.1 as engines, the agent in this process, its targets from a ``file_sd`` file
rewritten during the test, and for Kubernetes the recorded API conversation (tests/k8s_replay.py) with a recorded
/proc tree (tests/fixtures/k8s/) to find each pod's process by its cgroup.
"""

from __future__ import annotations

import contextlib
import re
import time
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import pytest
import yaml
from prometheus_client import generate_latest
from rich.console import Console

from inferwatch.agent.cli.top import render as top_frame
from inferwatch.agent.common.samples import Collection, Sample
from inferwatch.agent.config import DiscoverySettings, Settings
from inferwatch.agent.node.api.statushtml import render_page
from inferwatch.agent.node.api.statuspage import PageHistory, build_overview
from inferwatch.agent.node.app import Agent
from inferwatch.agent.node.collectors import Schedule
from inferwatch.agent.node.collectors.base import BaseCollector
from inferwatch.agent.node.discovery.combined import Discovery
from inferwatch.agent.node.discovery.kubernetes import ApiServer
from inferwatch.agent.node.runner import Runner
from inferwatch.agent.node.state import AgentState, CollectorHealth
from inferwatch.agent.node.targets import EngineTargets, TargetCollector
from inferwatch.agent.node.wiring import build_deps
from inferwatch.exporters.openmetrics import make_registry
from inferwatch.exporters.prometheus import render
from tests.conftest import PYTHON, ROOT, free_port
from tests.fake_nvml import FakeNVML
from tests.k8s_replay import Replay
from tests.procs import running, wait_http

K8S = Path(__file__).resolve().parent / "fixtures" / "k8s"
NODE = "gpu-node-a"  # the recorded conversations' node


def _wait(what: str, ok: Callable[[], Any], timeout_s: float = 60.0) -> Any:
    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline:
        got = ok()
        if got:
            return got
        time.sleep(0.2)
    pytest.fail(f"never: {what}")


def _lines(state: AgentState, metric: str) -> list[str]:
    return [line for line in render(state).decode().splitlines() if line.startswith(metric + "{")]


def _write(path: Path, groups: list[dict[str, Any]]) -> None:
    tmp = path.with_suffix(".tmp")
    tmp.write_text(yaml.safe_dump(groups))
    tmp.replace(path)  # an atomic rename, as a config-management tool writes it


@pytest.fixture
def sims(tmp_path: Path) -> Iterator[list[tuple[int, Any]]]:
    with contextlib.ExitStack() as stack:
        out = []
        for i, model in enumerate(("model-a", "model-b")):
            port = free_port()
            cmd = [
                PYTHON,
                "-m",
                "inferwatch.agent",
                "simulate",
                "--port",
                str(port),
                "--model",
                model,
                "--seed",
                str(i),
            ]
            cmd += ["--debug-profile"] if i == 0 else []  # engine A also answers its runtime profile
            proc = stack.enter_context(running([*cmd, "--log-level", "warning"], tmp_path / f"sim{i}.log", cwd=ROOT))
            out.append((port, proc))
        for port, proc in out:
            wait_http(f"http://127.0.0.1:{port}/health", proc=proc, timeout_s=90)
        yield out


@pytest.mark.integration
def test_each_engine_has_its_own_collectors_identity_and_failure(tmp_path: Path, sims: list[tuple[int, Any]]) -> None:
    (port_a, proc_a), (port_b, proc_b) = sims
    targets = tmp_path / "targets.yaml"
    labels_a = {"__inferwatch_name__": "gpu0", "namespace": "serving", "pod": "vllm-0", "container": "vllm"}
    labels_a["__inferwatch_profile_path__"] = "/debug/runtime_profile"
    gpu0 = {"targets": [f"127.0.0.1:{port_a}"], "labels": labels_a}
    gpu1 = {"targets": [f"127.0.0.1:{port_b}"], "labels": {"__inferwatch_name__": "gpu1"}}
    _write(targets, [gpu0, gpu1])
    settings = Settings.from_values(
        dict(
            interval_s=1.0,
            discovery=DiscoverySettings(file=targets),
            snapshots={"dir": str(tmp_path / "snap")},
            evidence={"dir": str(tmp_path / "ev"), "py_spy": False},
        )
    )
    agent = Agent(settings, build_deps(settings, nvml=FakeNVML([])))
    assert "engine" not in [c.name for c in agent.runner.collectors]  # only the discovered engines
    agent.start()
    try:
        # the two engines' series in the order their collections first published (either may read first)
        by_engine = lambda lines: sorted(lines, key=lambda x: x.split('engine_name="')[1])  # noqa: E731
        ups = _wait("both engines up", lambda: (u := _lines(agent.state, "inferwatch_engine_up")) and len(u) == 2 and u)
        assert by_engine(ups) == [
            'inferwatch_engine_up{container="vllm",engine="vllm",engine_name="gpu0",namespace="serving",'
            'pod="vllm-0"} 1.0',
            'inferwatch_engine_up{container="",engine="vllm",engine_name="gpu1",namespace="",pod=""} 1.0',
        ]
        info = _wait(
            "both engines' models", lambda: (i := _lines(agent.state, "inferwatch_engine_info")) and len(i) == 2 and i
        )
        info = by_engine(info)
        assert 'engine_name="gpu0"' in info[0] and 'gen_ai_request_model="model-a"' in info[0]
        assert 'engine_name="gpu1"' in info[1] and 'gen_ai_request_model="model-b"' in info[1]
        # each engine's process, told apart by the port it listens on (no pod identity here, both on loopback)
        names = lambda: {c.name: c for c in agent.runner.collectors}  # noqa: E731
        _wait("both processes", lambda: {"process:gpu0", "process:gpu1"} <= set(names()))
        assert names()["process:gpu0"].inner.locator.settings.pid == proc_a.pid
        assert names()["process:gpu1"].inner.locator.settings.pid == proc_b.pid
        # engine A's runtime profile: read by a reader of its own, its snapshot stored with the engine's identity
        profile = "inferwatch_runtime_profile_available"
        _wait("gpu0's profile", lambda: any('engine_name="gpu0"' in x and x.endswith(" 1.0")
                                            for x in _lines(agent.state, profile)))  # fmt: skip
        stored = _wait("a snapshot", lambda: list((tmp_path / "snap").rglob("*.json")))
        assert '"engine_name": "gpu0"' not in stored[0].read_text()  # attributes, not Prometheus labels
        assert '"inferwatch.engine.name": "gpu0"' in stored[0].read_text()
        # the targets' identity comes with the discovery's collection, recorded when its run ends (at CI's load
        # the engines it started can be read, and a snapshot stored, before that)
        overview = _wait(
            "the overview's identities",
            lambda: (
                (o := build_overview(agent.state, PageHistory()))
                and any(e["pod"] == "vllm-0" for e in o["engines"])
                and o
            ),
        )
        shown = {e["name"]: e for e in overview["engines"]}
        assert shown["gpu0"]["pod"] == "vllm-0" and shown["gpu0"]["models"] == ["model-a"] and shown["gpu0"]["up"] == 1
        assert shown["gpu1"]["namespace"] == "" and shown["gpu1"]["models"] == ["model-b"]
        page = render_page(overview)  # the status page and `inferwatch top` show each engine
        assert '<tr class="engine" data-name="gpu0"' in page and "serving/vllm-0/vllm" in page
        assert '<tr class="engine" data-name="gpu1"' in page
        console = Console(width=160, record=True)
        console.print(top_frame(overview, "http://agent"))
        frame = console.export_text()
        assert "Engines" in frame and "serving/vllm-0/vllm" in frame and "model-b" in frame

        # engine B goes away: its failure is its own; engine A keeps being read
        proc_b.terminate()
        proc_b.wait(30)
        _wait("gpu1 down", lambda: agent.state.health_of("engine:gpu1").state == "failed")
        runs_a = agent.state.health_of("engine:gpu0").runs
        _wait("gpu0 still read", lambda: agent.state.health_of("engine:gpu0").runs >= runs_a + 2)
        assert agent.state.health_of("engine:gpu0").state == "ok"
        assert 'engine_name="gpu0",namespace="serving",pod="vllm-0"} 1.0' in "\n".join(
            _lines(agent.state, "inferwatch_engine_up")
        )

        # one write of the file: gpu0 removed, gpu2 added (engine A under another name), gpu1 kept
        gpu2 = {"targets": [f"127.0.0.1:{port_a}"], "labels": {"__inferwatch_name__": "gpu2"}}
        _write(targets, [gpu1, gpu2])
        _wait("gpu2 up", lambda: any('engine_name="gpu2"' in u and u.endswith(" 1.0")
                                     for u in _lines(agent.state, "inferwatch_engine_up")))  # fmt: skip
        health = agent.state.health()
        assert "engine:gpu0" not in health and "engine:gpu1" in health and "engine:gpu2" in health
        assert 'engine_name="gpu0"' not in render(agent.state).decode()  # none of its series outlive it
        assert all(c.name != "engine:gpu0" for c in agent.runner.collectors)
    finally:
        agent.stop()
    # the fast text format is byte for byte what prometheus_client writes, target labels included
    assert render(agent.state) == generate_latest(make_registry(agent.state))


def test_a_single_configured_engine_is_as_before() -> None:
    settings = Settings.from_values(dict(engine={"metrics_url": "http://127.0.0.1:9/metrics"}))
    agent = Agent(settings, build_deps(settings, nvml=FakeNVML([])))
    names = [c.name for c in agent.runner.collectors]
    assert "engine" in names and "discovery" not in names and agent.targets is None


def test_kubernetes_targets_get_their_identity_and_their_process_by_cgroup() -> None:
    """Each discovered pod gets an engine collector of its own, stamped with the ENGINE's namespace, pod and
    container, and a process collector on the process its container's cgroup names (recorded /proc tree)."""
    replay = Replay.from_fixture("watch-namespaces.json")
    settings = Settings.from_values(
        dict(
            path={"procfs": str(K8S / "proc-v2-systemd-containerd")},
            discovery=DiscoverySettings(
                kubernetes=True, node_name=NODE, namespaces=["serving", "research"], watch_timeout_s=30
            ),
        )
    )
    deps = build_deps(settings, nvml=FakeNVML([]))
    ctx = deps.collect_context()
    runner = Runner(deps.state, [], {})
    targets = EngineTargets(settings, ctx, deps.state, runner, Discovery(settings.discovery, api=ApiServer(replay.url)))
    targets.start()
    try:
        _wait("two targets", lambda: len(targets.collect().details["targets"]) == 2, timeout_s=30)
        by_name = {c.name: c for c in runner.collectors}
        assert sorted(by_name) == [
            "engine:research/qwen-sglang-7f9c/sglang",
            "engine:serving/llama-70b-0/vllm",
            "process:research/qwen-sglang-7f9c/sglang",
            "process:serving/llama-70b-0/vllm",
            "runtime_profile:serving/llama-70b-0/vllm",  # its pod names a profile path
            "simd:research/qwen-sglang-7f9c/sglang",  # the SIMD check on each pod's own process
            "simd:serving/llama-70b-0/vllm",
        ]
        a = by_name["process:serving/llama-70b-0/vllm"]
        b = by_name["process:research/qwen-sglang-7f9c/sglang"]
        assert isinstance(a, TargetCollector) and isinstance(b, TargetCollector)
        assert a.inner.ctx.locator.settings.pid == 4100 and b.inner.ctx.locator.settings.pid == 5100
        simd_a, simd_b = by_name["simd:serving/llama-70b-0/vllm"], by_name["simd:research/qwen-sglang-7f9c/sglang"]
        assert simd_a.inner.ctx.locator.settings.pid == 4100 and simd_b.inner.ctx.locator.settings.pid == 5100
        engine = by_name["engine:serving/llama-70b-0/vllm"]
        assert isinstance(engine, TargetCollector)
        errors = [dict(s.attributes) for s in engine.status_samples() if s.name == "inferwatch.engine.scrape.errors"]
        assert errors and all(
            e["k8s.namespace.name"] == "serving"
            and e["k8s.pod.name"] == "llama-70b-0"
            and e["k8s.container.name"] == "vllm"
            and e["inferwatch.engine.name"] == "serving/llama-70b-0/vllm"
            for e in errors
        )
        assert re.match(r"http://10\.\d+\.\d+\.\d+:8000/metrics", engine.inner.cfg.metrics_url or "")
    finally:
        targets.close()
        runner.stop()
        replay.close()


class _Counting(BaseCollector):
    name = "counting"

    def __init__(self, ctx: Any, name: str) -> None:
        super().__init__(ctx)
        self.name = name  # type: ignore[misc]
        self.calls = 0

    def collect(self) -> Collection:
        self.calls += 1
        return Collection()


def test_the_runner_adds_and_removes_collectors_while_it_runs() -> None:
    settings = Settings(interval_s=0.2)
    deps = build_deps(settings, nvml=FakeNVML([]))
    runner = Runner(deps.state, [], {})
    runner.start()
    try:
        late = _Counting(deps.collect_context(), "late")
        runner.add(late, Schedule(0.2, 1.0, "late"))
        with pytest.raises(ValueError, match="already running"):
            runner.add(late, Schedule(0.2, 1.0, "late"))
        _wait("the added collector runs", lambda: deps.state.health_of("late").runs >= 3, timeout_s=30)
        assert runner.remove("late") is late and runner.remove("late") is None
        deps.state.forget("late")
        calls = late.calls
        time.sleep(1.0)  # five intervals: a removed collector is not called again
        assert late.calls <= calls + 1 and "late" not in deps.state.health()  # one call may have been under way
    finally:
        runner.stop()


@pytest.mark.integration
def test_otlp_carries_each_targets_identity(tmp_path: Path, sims: list[tuple[int, Any]]) -> None:
    """Over OTLP the target's identity is the engine's k8s.* and inferwatch.engine.name attributes on its points."""
    from tests.otlp_receiver import http_receiver
    from tests.test_otlp_export import decode

    (port_a, _), _b = sims
    targets = tmp_path / "targets.yaml"
    labels = {"__inferwatch_name__": "gpu0", "namespace": "serving", "pod": "vllm-0", "container": "vllm"}
    _write(targets, [{"targets": [f"127.0.0.1:{port_a}"], "labels": labels}])
    otlp_port, api_port = free_port(), free_port()
    env = {
        "OTEL_EXPORTER_OTLP_ENDPOINT": f"http://127.0.0.1:{otlp_port}",
        "OTEL_EXPORTER_OTLP_PROTOCOL": "http/protobuf",
        "OTEL_METRIC_EXPORT_INTERVAL": "500",
        "INFERWATCH_DISCOVERY__FILE": str(targets),
        "INFERWATCH_SNAPSHOTS__DIR": str(tmp_path / "snap"),
        "INFERWATCH_EVIDENCE__DIR": str(tmp_path / "ev"),
    }
    agent = [PYTHON, "-m", "inferwatch.agent", "run", "--port", str(api_port), "--interval", "1"]
    with http_receiver(otlp_port) as received, running(agent, tmp_path / "agent.log", cwd=ROOT, env=env) as proc:
        wait_http(f"http://127.0.0.1:{api_port}/healthz", proc=proc, timeout_s=90)

        def up_points() -> dict[Any, Any]:
            return decode(received.snapshot())[1].get("inferwatch.engine.up", {}).get("values", {})

        points = _wait("engine up over OTLP", lambda: {k: v for k, v in up_points().items() if v == 1})
    (attributes,) = points
    assert dict(attributes) == {
        "engine": "vllm",
        "inferwatch.engine.name": "gpu0",
        "k8s.namespace.name": "serving",
        "k8s.pod.name": "vllm-0",
        "k8s.container.name": "vllm",
    }


def test_a_target_is_named_in_the_overview_before_the_discovery_is_recorded() -> None:
    """The discovery's collection (the targets' identity) is recorded when its run ends; the engine collectors it
    started may publish first. The overview names each by its collector (``engine:<name>``) meanwhile."""
    state = AgentState()
    collection = Collection([Sample("inferwatch.engine.up", 1.0, (("inferwatch.engine.name", "gpu0"),))])
    state.record("engine:gpu0", CollectorHealth("engine:gpu0", 1.0, 1.0, runs=1, state="ok"), collection)
    engines = build_overview(state, PageHistory())["engines"]
    assert [(e["name"], e["collector"], e["pod"], e["up"]) for e in engines] == [("gpu0", "engine:gpu0", "", 1.0)]
