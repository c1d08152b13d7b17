"""What acts on a runtime acts on each discovered engine target's own (agent/node/targets.py): the streaming probe,
the SIMD check, the binary check, py-spy and evidence capture, each on its target's engine and process, its series and
findings carrying the target's identity, one target's failure its own.

Real parts: simulators on 127.0.0.1 as engines (two Python processes, each found as the listener of its port), the
agent in this process with its targets from a ``file_sd`` file.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest
import yaml

from inferwatch.agent.config import DiscoverySettings, Settings
from inferwatch.agent.node.app import Agent
from inferwatch.agent.node.state import AgentState
from inferwatch.agent.node.wiring import build_deps
from tests import test_engine_targets
from tests.fake_nvml import FakeNVML
from tests.test_engine_targets import _lines, _wait

sims = test_engine_targets.sims  # the fixture: two simulators on 127.0.0.1, engine A with its runtime profile


def _of(state: AgentState, metric: str, target: str) -> list[str]:
    return [line for line in _lines(state, metric) if f'engine_name="{target}"' in line]


PROBE_SUCCESS = "inferwatch_probe_success"


def _succeeding(state: AgentState, target: str) -> bool:
    lines = _of(state, PROBE_SUCCESS, target)
    return bool(lines) and all(x.endswith(" 1.0") for x in lines)


def _targets(tmp_path: Path, ports: list[int]) -> Path:
    path = tmp_path / "targets.yaml"
    groups = [
        {"targets": [f"127.0.0.1:{port}"], "labels": {"__inferwatch_name__": f"gpu{i}"}} for i, port in enumerate(ports)
    ]
    path.write_text(yaml.safe_dump(groups))
    return path


def _agent(tmp_path: Path, ports: list[int], **extra: Any) -> Agent:
    settings = Settings(
        interval_s=1.0,
        discovery=DiscoverySettings(file=_targets(tmp_path, ports)),
        snapshots={"dir": str(tmp_path / "snap")},
        evidence={"dir": str(tmp_path / "ev"), "py_spy": False},
        **extra,
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
