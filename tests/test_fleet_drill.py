"""The fleet drill, short: a few nodes with their own identities, vmagent → VictoriaMetrics ← vmalert → Alertmanager.

The machinery of benchmarks/fleet_drill.py (tests/fleet.py) with the compressed rule profile (every duration
of alerts/*.rules.yml divided by 30, inferwatch.agent.alerts.profile; the end-to-end pipeline test divides by 60) at 2 s
scrape and evaluation. A healthy phase with noise (load steps, a node's clients stopping and resuming) must
deliver nothing; then one fault per node, all at once (two nodes carry two independent faults), and each must
reach its receiver: the state pitfalls (a node booted with arm64.nosve joining, debug profile in production,
hardware mismatch), a hang, the stream schema violation, the availability SLO's fast page (error_burst, read
from the engine's own /metrics, job ``engine``) and the runtime's SIMD fallback. Engine down and the latency
pitfalls (bimodal, tail ratio, page-cache pressure, TTFT burn) run in the benchmark at production timings; the
latency ones need minutes of traffic in the agent's 5-minute windows, which the profile does not compress
(tests/e2e runs them on replayed expositions).

A runtime restart is not part of this healthy phase: its few real seconds without an engine are minutes at the
compressed profile (EngineDown's for: 2m is 4 s here), so it would page here and nowhere else.
"""

from __future__ import annotations

import dataclasses
import time
from pathlib import Path

import httpx
import pytest

from inferwatch.agent.alerts.profile import render_file
from tests.conftest import ROOT
from tests.e2e.harness import Sink
from tests.fleet import CATALOG, Fleet, FleetNode, NoiseEvent, Timings, faults, hardware_types, matrix, run_drill
from tests.tools import require

pytestmark = [pytest.mark.integration, pytest.mark.slow, pytest.mark.cpu_heavy]

NODES = ("p5-h100", "p4d-a100", "m7i-spr", "a3-h100")  # tests/fleet.py CATALOG
NOSVE = "c7g-nosve"  # joins booted with arm64.nosve
ASSIGN = {
    "hang": "p5-h100",
    "stream_usage_only": "p4d-a100",
    "error_burst": "m7i-spr",
    "simd_fallback": "m7i-spr",
    "debug_in_production": "a3-h100",
    "hardware_mismatch": "a3-h100",
    "simd_missing": "c7g-nosve",
}
# Durations / 30 at 2 s scrape and evaluation (the end-to-end test runs / 60 at 1 s). vmalert lets an alert expire in
# Alertmanager about three evaluation intervals after its last evaluation; at 1 s, on the shared 2-core machine
# (load average 60 seen), evaluations arrived 3-4 s apart and firing alerts expired before group_wait ended, so
# nothing was sent (RuntimeHardwareMismatch firing in vmalert for 150 s, never delivered).
FACTOR = 30
# The agent's /metrics waits up to scrape_wait_s (default 2 s) for the collections a scrape pulls, the probe
# included: with a hung engine the probe runs to its 10 s timeout, and at the default every scrape of that agent
# hit vmagent's 2 s timeout (AgentDown instead of EngineHungButHealthy).
TIMINGS = Timings(scrape="2s", agent_interval_s=2.0, probe_interval_s=2.0, profile_interval_s=2.0, scrape_wait_s=0.5)
HEALTHY_S = 40.0  # 20 minutes in the shipped rules' time
DELIVER_TIMEOUT_S = 150.0  # measured 20-75 s on the shared 2-core machine (load average 30-60); tickets wait 30 s
NOISE = [
    NoiseEvent(0.2, "load step on p5-h100: 2 -> 4 req/s", lambda f: f["p5-h100"].start_load(4.0)),
    NoiseEvent(0.4, "load stops on p4d-a100 (clients gone)", lambda f: f["p4d-a100"].stop_load()),
    NoiseEvent(0.6, "load resumes on p4d-a100", lambda f: f["p4d-a100"].start_load(2.0)),
    NoiseEvent(0.7, "load step on p5-h100: 4 -> 2 req/s", lambda f: f["p5-h100"].start_load(2.0)),
]


def test_fleet_drill_pages_each_fault_and_nothing_while_healthy(tmp_path: Path) -> None:
    binaries = {b: require(b) for b in ("victoria-metrics", "vmagent", "vmalert", "prometheus-alertmanager")}
    rules_dir = tmp_path / "rules"
    rules_dir.mkdir()
    for path in sorted((ROOT / "alerts").glob("*.rules.yml")):
        (rules_dir / path.name).write_text(render_file(path, FACTOR))
    rules = sorted(rules_dir.glob("*.rules.yml"))
    started = time.monotonic()
    with Sink() as sink:
        # no spans: the faults here read none, and LatencyBimodal needs minutes of them (the benchmark runs it)
        specs = [dataclasses.replace(CATALOG[n], spans=False) for n in (*NODES, NOSVE)]
        fleet = Fleet(tmp_path, sink, TIMINGS, specs)
        with fleet.running(NODES, rules, binaries):
            result = run_drill(fleet, HEALTHY_S, NOISE, faults(ASSIGN), DELIVER_TIMEOUT_S, 0.0, 0.0)
            seen = hardware_types(matrix(fleet.vm, "5m", recorded=False))
    print(f"fleet drill (compressed) took {time.monotonic() - started:.0f}s")
    for r in result.faults:
        print(f"  {r.fault:<20} {r.node:<10} {r.alertname} -> {r.receiver}: {r.delivered_s}s {r.other_deliveries}")
    assert result.healthy_deliveries == [], f"the healthy phase paged: {result.healthy_deliveries}"
    missed = {r.fault: (r.alertname, r.receiver) for r in result.faults if r.delivered_s is None}
    assert not missed, f"never reached their receivers: {missed}; delivered: {result.fault_phase_deliveries}"
    assert seen >= {CATALOG[n].machine_type for n in (*NODES, NOSVE)}, seen


def _series(node: FleetNode, prefix: str) -> dict[str, float]:
    text = httpx.get(f"http://{node.instance}/metrics", timeout=30).text
    return {ln.rsplit(" ", 1)[0]: float(ln.rsplit(" ", 1)[1]) for ln in text.splitlines() if ln.startswith(prefix)}


def _wait_series(node: FleetNode, name: str, want: float, timeout_s: float = 90.0) -> dict[str, float]:
    deadline = time.monotonic() + timeout_s
    while True:
        got = _series(node, "inferwatch_runtime_")
        if got.get(name) == want or time.monotonic() > deadline:
            return got
        time.sleep(1)


def test_runtime_node_gives_the_agent_its_runtime_process_and_cgroup(tmp_path: Path) -> None:
    """A drill node with runtime_process: the agent finds the simulator as its runtime (process collector up, the
    SIMD collector's capable view from the node's cpuinfo, the runtime cgroup's memory PSI from the node's sysfs),
    sees the cgroup squeezed, and counts a restart into a new image as a runtime restart (the inputs of
    RuntimePageCacheThrashing and RuntimeSlowerAfterRestart)."""
    node = FleetNode(CATALOG["p5-cgroup"], tmp_path, dataclasses.replace(TIMINGS, agent_interval_s=1.0), 0)
    try:
        node.start_sim()
        node.start_agent()
        got = _wait_series(node, 'inferwatch_runtime_up{runtime="vllm"}', 1.0)
        assert got.get('inferwatch_runtime_up{runtime="vllm"}') == 1.0, got
        got = _wait_series(node, 'inferwatch_runtime_simd_capable{feature="avx512"}', 1.0)
        assert got.get('inferwatch_runtime_simd_capable{feature="avx512"}') == 1.0, got  # the recorded Zen 4 cpuinfo
        psi = 'inferwatch_runtime_cgroup_pressure_memory_avg_ratio{kind="some",window="60s"}'
        assert _wait_series(node, psi, 0.0).get(psi) == 0.0
        node.cgroup_pressure(True)
        assert _wait_series(node, psi, 0.124).get(psi) == 0.124
        node.stop_sim()
        node.start_sim(None, "--scenario", "simd_fallback")
        restarts = 'inferwatch_runtime_restarts_total{runtime="vllm"}'
        assert _wait_series(node, restarts, 1.0).get(restarts) == 1.0
    finally:
        node.close()
