"""What acts on a runtime acts on each discovered engine target's own (agent/node/targets.py): the streaming probe,
the SIMD check, the binary check, py-spy and evidence capture, each on its target's engine and process, its series and
findings carrying the target's identity, one target's failure its own.

Real parts: simulators on 127.0.0.1 as engines (two Python processes, each found as the listener of its port), the
agent in this process with its targets from a ``file_sd`` file.
"""

from __future__ import annotations

import contextlib
import json
import os
import subprocess
import threading
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import httpx
import pytest
import uvicorn
import yaml

from inferwatch.agent.config import DiscoverySettings, Settings
from inferwatch.agent.node.actions import pyspy
from inferwatch.agent.node.actions.runtimes import UnknownTargetError
from inferwatch.agent.node.app import Agent
from inferwatch.agent.node.state import AgentState
from inferwatch.agent.node.wiring import build_deps
from tests import test_engine_targets
from tests.conftest import PYTHON, ROOT, free_port
from tests.e2e.test_alert_pipeline import SIM_CONTROL_TOKEN, SimProc
from tests.fake_nvml import FakeNVML
from tests.procs import running, wait_http
from tests.test_engine_targets import _lines, _wait

sims = test_engine_targets.sims  # the fixture: two simulators on 127.0.0.1, engine A with its runtime profile


def _of(state: AgentState, metric: str, target: str) -> list[str]:
    return [line for line in _lines(state, metric) if f'engine_name="{target}"' in line]


PROBE_SUCCESS = "inferwatch_probe_success"
BINARY_COMPATIBLE = "inferwatch_runtime_binary_compatible"


def _succeeding(state: AgentState, target: str) -> bool:
    lines = _of(state, PROBE_SUCCESS, target)
    return bool(lines) and all(x.endswith(" 1.0") for x in lines)


@contextlib.contextmanager
def _served(app: Any) -> Iterator[str]:
    """``app`` served by uvicorn on 127.0.0.1 (a free port) for the block: its base URL."""
    server = uvicorn.Server(uvicorn.Config(app, host="127.0.0.1", port=0, log_level="error"))
    thread = threading.Thread(target=server.run, daemon=True)
    thread.start()
    try:
        _wait("uvicorn started", lambda: server.started, 30)
        yield f"http://127.0.0.1:{server.servers[0].sockets[0].getsockname()[1]}"
    finally:
        server.should_exit = True
        thread.join(10)


def _targets(tmp_path: Path, ports: list[int]) -> Path:
    path = tmp_path / "targets.yaml"
    groups = [
        {"targets": [f"127.0.0.1:{port}"], "labels": {"__inferwatch_name__": f"gpu{i}"}} for i, port in enumerate(ports)
    ]
    path.write_text(yaml.safe_dump(groups))
    return path


def _agent(tmp_path: Path, ports: list[int], **extra: Any) -> Agent:
    settings = Settings.from_values(
        dict(
            interval_s=1.0,
            discovery=DiscoverySettings(file=_targets(tmp_path, ports)),
            snapshots={"dir": str(tmp_path / "snap")},
            evidence={"dir": str(tmp_path / "ev"), "py_spy": False},
            **extra,
        )
    )
    return Agent(settings, build_deps(settings, nvml=FakeNVML([])))


@pytest.mark.integration
def test_each_target_has_its_own_probe_and_simd_check(tmp_path: Path, sims: list[tuple[int, Any]]) -> None:
    (port_a, proc_a), (port_b, proc_b) = sims
    agent = _agent(
        tmp_path,
        [port_a, port_b],
        probe={"targets": True, "timeout_s": 20},
        collectors={"probe": {"interval_s": 1.0}, "simd": {"interval_s": 1.0, "timeout_s": 60}},
    )
    assert "probe" not in [c.name for c in agent.runner.collectors]  # no probe.url: no probe of a configured engine
    agent.start()
    try:
        for target in ("gpu0", "gpu1"):  # each engine streamed to, at its own port, its own model
            _wait(f"{target}'s probe", lambda t=target: _succeeding(agent.state, t))  # type: ignore[misc]
        details = {c.name: c for c in agent.runner.collectors}
        assert details["probe:gpu0"].inner.cfg.url == f"http://127.0.0.1:{port_a}"
        assert details["probe:gpu1"].inner.cfg.url == f"http://127.0.0.1:{port_b}"
        findings = {f.id + "@" + str(f.evidence.get("inferwatch.engine.name")) for f in agent.state.findings()}
        assert {"probe.openai@gpu0", "probe.openai@gpu1"} <= findings

        # the SIMD check on each engine's own process (the listener of its port), labelled with its target
        _wait("both SIMD checks", lambda: {"simd:gpu0", "simd:gpu1"} <= {c.name for c in agent.runner.collectors})
        for target, proc in (("gpu0", proc_a), ("gpu1", proc_b)):
            _wait(f"{target}'s SIMD series", lambda t=target: _of(agent.state, "inferwatch_runtime_simd_capable", t))  # type: ignore[misc]
            assert agent.state.collections()[f"simd:{target}"].details["pid"] == proc.pid
        simd = {c.name: c.inner for c in agent.runner.collectors if c.name.startswith("simd:")}
        assert simd["simd:gpu0"]._cache is simd["simd:gpu1"]._cache  # a library two engines map is scanned once
        assert agent.state.health_of("simd").state == "absent"  # no runtime.*: the node's own check has nothing

        # engine B stops: its probe fails, engine A's keeps succeeding
        proc_b.terminate()
        proc_b.wait(30)
        _wait("gpu1's probe failing", lambda: _of(agent.state, PROBE_SUCCESS, "gpu1")[0].endswith(" 0.0"))
        runs = agent.state.health_of("probe:gpu0").runs
        _wait("gpu0 probed again", lambda: agent.state.health_of("probe:gpu0").runs >= runs + 2)
        assert _succeeding(agent.state, "gpu0")
        errors = [f for f in agent.state.findings() if f.id == "probe.openai.error"]
        assert errors and all(f.evidence["inferwatch.engine.name"] == "gpu1" for f in errors)
        assert all(f.summary.startswith("gpu1: ") for f in errors)
    finally:
        agent.stop()


@pytest.fixture
def controlled(tmp_path: Path) -> Iterator[list[SimProc]]:
    """Two simulators whose faults the test switches (``/control/scenario``), each under light load, so that a hang
    is one engine's requests stopping while the other's keep going."""
    with contextlib.ExitStack() as stack:
        sims = []
        for i, model in enumerate(("model-a", "model-b")):
            port = free_port()
            cmd = [PYTHON, "-m", "inferwatch.agent", "simulate", "--port", str(port), "--model", model]
            cmd += ["--seed", str(10 + i), "--control-token", SIM_CONTROL_TOKEN, "--log-level", "warning"]
            sims.append(SimProc(model, port, stack.enter_context(running(cmd, tmp_path / f"sim{i}.log", cwd=ROOT))))
        for sim in sims:
            wait_http(f"{sim.url}/health", proc=sim.proc, timeout_s=90)
            load = [PYTHON, "-m", "inferwatch.agent", "loadgen", "--url", sim.url, "--rate", "3", "--duration", "600"]
            stack.enter_context(running([*load, "--no-progress"], tmp_path / f"load-{sim.model}.log", cwd=ROOT))
        yield sims


@pytest.mark.integration
@pytest.mark.slow
def test_actions_act_on_the_named_targets_process_and_a_hang_captures_its_own(
    tmp_path: Path, controlled: list[SimProc]
) -> None:
    a, b = controlled
    agent = _agent(tmp_path, [a.port, b.port], profiling={"enabled": True})
    runtimes = agent.deps.runtimes
    agent.start()
    try:
        _wait("both targets' processes", lambda: runtimes.names() == ["gpu0", "gpu1"])
        assert runtimes.get("gpu0").pids()[0] == a.proc.pid and runtimes.get("gpu1").pids()[0] == b.proc.pid
        with pytest.raises(UnknownTargetError, match=r"'gpu7'.*known: gpu0, gpu1"):
            runtimes.get("gpu7")

        # py-spy's scope: a request for gpu1 may profile gpu1's process, not gpu0's, nor the configured runtime's
        profiles = agent.deps.profiles
        assert profiles.scope_of("gpu1").check(b.proc.pid) == b.proc.pid
        with pytest.raises(pyspy.PySpyError) as refused:
            profiles.scope_of("gpu1").check(a.proc.pid)
        assert refused.value.kind == "not_runtime"
        with pytest.raises(UnknownTargetError):
            profiles.start(a.proc.pid, pyspy.RecordOptions(), target="gpu7")

        # the binary check of each engine's own executable, labelled with its target
        for target in ("gpu0", "gpu1"):
            _wait(f"{target}'s binary check", lambda t=target: _of(agent.state, BINARY_COMPATIBLE, t))  # type: ignore[misc]
            report = agent.state.collections()[f"binary:{target}"].details
            assert report["pid"] == (a if target == "gpu0" else b).proc.pid

        # evidence on request for a named target: that engine's process and scrapes (a bundle of gpu0 now does not
        # hold back gpu1's below: the rate limit is per process)
        _wait("gpu0 scraped", lambda: agent.deps.evidence.scrapes("gpu0"))
        meta = agent.deps.evidence.capture("api", "asked", target="gpu0")
        bundle = agent.deps.evidence.get(meta.id)
        assert bundle is not None and bundle["meta"]["target"] == "gpu0"
        assert bundle["meta"]["identity"]["inferwatch.engine.name"] == "gpu0"
        assert [p["pid"] for p in bundle["processes"]] == [a.proc.pid]
        assert bundle["engine"]["scrapes"] and "absent" in bundle["runtime_profile"]
        with pytest.raises(UnknownTargetError):
            agent.deps.evidence.capture("api", "asked", target="gpu7")

        # engine B hangs (its /health still 200): the hang of gpu1 captures gpu1's process, never gpu0's
        b.control({"enable": "hang"})
        hung = _wait(
            "a bundle of gpu1's hang", lambda: [m for m in agent.deps.evidence.list() if m.trigger == "hang"], 120
        )
        agent.deps.evidence.wait()
        bundle = agent.deps.evidence.get(hung[0].id)
        assert bundle is not None and bundle["meta"]["target"] == "gpu1"
        assert [p["pid"] for p in bundle["processes"]] == [b.proc.pid]
        assert bundle["meta"]["finding"]["inferwatch.engine.name"] == "gpu1"
        assert all(s["engine"] == bundle["engine"]["scrapes"][0]["engine"] for s in bundle["engine"]["scrapes"])
        assert agent.state.health_of("engine:gpu0").state == "ok"
        assert not [f for f in agent.state.findings() if f.id == "engine_hung" and "gpu0" in f.summary]

        # a page about one engine (its engine_name label) is that engine's: each answered with its own bundle here
        def page(*engines: str) -> dict[str, Any]:
            labels = [{"alertname": "EngineDown", "severity": "critical", "engine_name": e} for e in engines]
            return agent.deps.evidence.on_alerts({"alerts": [{"status": "firing", "labels": x} for x in labels]})

        assert page("gpu1") == {"captured": None, "rate_limited": True, "latest": hung[0].id, "targets": {
            "gpu1": {"captured": None, "rate_limited": True, "latest": hung[0].id}}}  # fmt: skip
        assert page("gpu0")["latest"] == meta.id  # gpu0's bundle (the API's, above), not gpu1's
        assert page("gpu9") == {"captured": None, "reason": "engine targets not watched by this agent: gpu9"}
        assert page("gpu0", "gpu9")["not_watched"] == ["gpu9"]

        # gpu1 removed from the targets: its process, binary check and kept scrapes go; gpu0's stay
        _targets(tmp_path, [a.port])
        _wait("gpu1 gone", lambda: runtimes.names() == ["gpu0"])
        _wait(
            "gpu1's binary check stopped",
            lambda: not [t for t in threading.enumerate() if t.name == "binary:gpu1-check"],
        )
        assert "binary:gpu1" not in agent.state.health() and "binary:gpu0" in agent.state.health()
        assert agent.deps.evidence.scrapes("gpu1") == [] and agent.deps.evidence.scrapes("gpu0")
        with pytest.raises(UnknownTargetError):
            agent.deps.evidence.capture("api", "asked", target="gpu1")
    finally:
        agent.stop()
    # the targets' binary checks stopped with the agent
    assert not [t for t in threading.enumerate() if t.name.startswith("binary:gpu")]


@pytest.mark.integration
@pytest.mark.slow
def test_each_engines_spans_are_analysed_apart(tmp_path: Path) -> None:
    """Two engines on one node send spans to one receiver, each naming its pod in its resource (the Downward API's
    ``OTEL_RESOURCE_ATTRIBUTES``): each target's latency series hold its own requests under its own model, none in the
    node's; a pod the agent does not watch is no target's (its spans stay the node's)."""
    grpc = free_port()
    with contextlib.ExitStack() as stack:
        ports = []
        for i, model in enumerate(("model-a", "model-b")):
            port = free_port()
            cmd = [PYTHON, "-m", "inferwatch.agent", "simulate", "--port", str(port), "--model", model]
            cmd += [
                "--seed",
                str(20 + i),
                "--otlp-traces-endpoint",
                f"http://127.0.0.1:{grpc}",
                "--log-level",
                "warning",
            ]
            env = {"OTEL_RESOURCE_ATTRIBUTES": f"k8s.namespace.name=serving,k8s.pod.name=vllm-{i}"}
            sim = stack.enter_context(running(cmd, tmp_path / f"sim{i}.log", cwd=ROOT, env=env))
            wait_http(f"http://127.0.0.1:{port}/health", proc=sim, timeout_s=90)
            ports.append(port)
        path = tmp_path / "targets.yaml"
        groups = [
            {"targets": [f"127.0.0.1:{port}"], "labels": {"__inferwatch_name__": f"gpu{i}", "namespace": "serving",
                                                          "pod": f"vllm-{i}"}}
            for i, port in enumerate(ports)
        ]  # fmt: skip
        path.write_text(yaml.safe_dump(groups))
        settings = Settings.from_values(
            dict(
                interval_s=1.0,
                discovery=DiscoverySettings(file=path),
                receiver={"enabled": True, "grpc_endpoint": f"127.0.0.1:{grpc}", "http_endpoint": None},
                snapshots={"dir": str(tmp_path / "snap")},
                evidence={"dir": str(tmp_path / "ev"), "py_spy": False},
            )
        )
        agent = Agent(settings, build_deps(settings, nvml=FakeNVML([])))
        agent.start()
        try:
            for port in ports:
                load = [PYTHON, "-m", "inferwatch.agent", "loadgen", "--url", f"http://127.0.0.1:{port}"]
                load += ["--rate", "4", "--duration", "600", "--no-progress"]
                stack.enter_context(running(load, tmp_path / f"load-{port}.log", cwd=ROOT))
            for target, model in (("gpu0", "model-a"), ("gpu1", "model-b")):
                lines = _wait(
                    f"{target}'s span latency",
                    lambda t=target: [x for x in _lines(agent.state, "inferwatch_engine_latency_seconds")  # type: ignore[misc]
                                      if f'engine_name="{t}"' in x and 'source="spans"' in x],
                    120,
                )  # fmt: skip
                assert all(f'gen_ai_request_model="{model}"' in x for x in lines), lines  # its engine's one model
            spans = agent.spans
            assert spans.engine_of((("k8s.namespace.name", "serving"), ("k8s.pod.name", "vllm-1"))) == "gpu1"
            assert spans.engine_of((("k8s.namespace.name", "other"), ("k8s.pod.name", "vllm-1"))) is None
            assert agent.analytics.models() == []  # the node's own analytics got none of the two engines' requests

            # the tail explainer of one engine, through the API served on 127.0.0.1
            with _served(agent.asgi()) as base:
                _wait("gpu1's explainer", lambda: spans.explainer("gpu1").records.models(), 60)
                r = httpx.get(f"{base}/api/v1/explain?target=gpu1&model=model-b&window=1m", timeout=30)
                assert r.status_code == 200, r.text
                assert r.json()["model"] == "model-b"
                r = httpx.get(f"{base}/api/v1/explain?target=gpu9&model=model-b", timeout=30)
                assert r.status_code == 404 and r.json()["known"] == ["gpu0", "gpu1"]
                r = httpx.get(f"{base}/api/v1/explain?model=model-b&window=1m", timeout=30)  # not the node's: apart
                assert r.status_code == 404 and "give target=" in r.json()["message"]
                cli = [PYTHON, "-m", "inferwatch.agent", "explain", "--agent", base, "--window", "1m", "--json"]
                done = subprocess.run([*cli, "--target", "gpu0"], capture_output=True, text=True, timeout=120)
                assert done.returncode == 0, done.stderr
                assert json.loads(done.stdout)["model"] == "model-a"  # gpu0's one model, without --model
                bad = subprocess.run([*cli, "--target", "gpu9"], capture_output=True, text=True, timeout=120)
                assert bad.returncode == 1 and "gpu9" in bad.stderr
        finally:
            agent.stop()


@pytest.mark.integration
@pytest.mark.slow
def test_the_api_takes_the_target_name(tmp_path: Path, sims: list[tuple[int, Any]]) -> None:
    """The agent as it runs (its own process, its HTTP API): py-spy, evidence and the binary check of a named engine
    target act on that engine's process; an unknown name is a 404 that lists the known ones."""
    (port_a, proc_a), (port_b, proc_b) = sims
    token = "prof-token-0123456789abcdef"
    (tmp_path / "tokens").write_text(f"{token} profile,read,evidence ops\n")
    agent_port = free_port()
    env = {
        "INFERWATCH_API__TOKENS_FILE": str(tmp_path / "tokens"),
        "INFERWATCH_PROFILING__ENABLED": "true",
        "INFERWATCH_DISCOVERY__FILE": str(_targets(tmp_path, [port_a, port_b])),
        "INFERWATCH_ENGINE__METRICS_URL": "",
        "INFERWATCH_SNAPSHOTS__DIR": str(tmp_path / "snap"),
        "INFERWATCH_EVIDENCE__DIR": str(tmp_path / "ev"),
        "INFERWATCH_EVIDENCE__PY_SPY": "false",
    }
    cmd = [PYTHON, "-m", "inferwatch.agent", "run", "--port", str(agent_port), "--interval", "1"]
    auth = {"Authorization": f"Bearer {token}"}
    with running(cmd, tmp_path / "agent.log", cwd=ROOT, env=env) as agent:
        base = f"http://127.0.0.1:{agent_port}"
        wait_http(f"{base}/healthz", proc=agent, timeout_s=90)
        binary = _wait(
            "gpu1's binary check", lambda: (r := httpx.get(f"{base}/api/v1/binary?target=gpu1", headers=auth))
            .status_code == 200 and r.json(), 120,
        )  # fmt: skip
        assert binary["report"]["pid"] == proc_b.pid
        missing = httpx.post(f"{base}/api/v1/binary?target=gpu7", headers=auth)
        assert missing.status_code == 404 and missing.json()["known"] == ["gpu0", "gpu1"]

        r = httpx.post(f"{base}/api/v1/evidence?target=gpu0", headers=auth, timeout=60)
        assert r.status_code == 201, r.text
        bundle = httpx.get(base + r.json()["url"], headers=auth).json()
        assert bundle["meta"]["target"] == "gpu0" and [p["pid"] for p in bundle["processes"]] == [proc_a.pid]
        assert httpx.post(f"{base}/api/v1/evidence?target=gpu7", headers=auth).json()["error"] == "unknown_target"

        r = httpx.post(f"{base}/api/v1/profiles", json={"target": "gpu1", "duration_s": 1}, headers=auth)
        assert r.status_code == 202, r.text
        job = r.json()
        assert job["pid"] == proc_b.pid and job["target"] == "gpu1"
        done = _wait(
            "gpu1's profile", lambda: (s := httpx.get(base + job["status_url"], headers=auth).json())["state"]
            != "running" and s, 90,
        )  # fmt: skip
        assert done["state"] == "done", done
        other = httpx.post(f"{base}/api/v1/profiles", json={"target": "gpu1", "pid": proc_a.pid}, headers=auth)
        assert other.json()["error"] == "not_runtime"  # gpu0's process is not gpu1's to profile
        unknown = httpx.post(f"{base}/api/v1/profiles", json={"target": "gpu7"}, headers=auth)
        assert unknown.status_code == 404 and unknown.json()["error"] == "unknown_target"

    # the CLI, with no agent: the target found from the same discovery settings, its process by its port
    cli = [PYTHON, "-m", "inferwatch.agent", "profile", "--duration", "1", "-o", str(tmp_path / "gpu0.json")]
    env_cli = {**os.environ, "INFERWATCH_DISCOVERY__FILE": env["INFERWATCH_DISCOVERY__FILE"]}
    done_cli = subprocess.run([*cli, "--target", "gpu0"], env=env_cli, capture_output=True, text=True, timeout=120)
    assert done_cli.returncode == 0, done_cli.stderr
    assert f"recording pid {proc_a.pid} " in done_cli.stderr and (tmp_path / "gpu0.json").stat().st_size > 0
    bad = subprocess.run([*cli, "--target", "gpu7"], env=env_cli, capture_output=True, text=True, timeout=120)
    assert bad.returncode == 2 and "'gpu7'" in bad.stderr and "gpu0, gpu1" in bad.stderr
