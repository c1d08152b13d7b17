"""The conformance band on real engines and real agents: three nodes of one hardware type (simulators on the H100
profile, each with the agent as shipped, DMI machine type p5.48xlarge, a fake NVML H100), one of them slowed (every
engine step 4x slower: the simulator's ``simd_fallback`` scenario), scraped by Prometheus running the compressed
matrix rules (inferwatch.agent.alerts.profile, factor 60 at 1 s). NodeOutsideConformanceBand must fire for the slowed
node and never for the two healthy ones, whose P95 comes from real, noisy engine histograms.

tests/test_matrix_conformance.py checks the rule's details (band values, description, likely reason) on exact
inputs; this one checks that the band holds on real data.
"""

from __future__ import annotations

import contextlib
import threading
import time
from collections.abc import Iterator
from typing import Any

import httpx
import pytest

from inferwatch.agent.alerts.profile import render_file
from tests.conftest import PYTHON, ROOT, free_port
from tests.procs import running, wait_http
from tests.test_dashboards_data import _agent_env, _fake_procfs, _fake_sysfs
from tests.tools import require

pytestmark = [pytest.mark.integration, pytest.mark.slow, pytest.mark.cpu_heavy]
ALERT = "NodeOutsideConformanceBand"
MODEL = "meta-llama/Llama-3.1-8B-Instruct"
GPU = "NVIDIA H100 80GB HBM3"
NODES = ("a", "b", "c")
SLOW = "c"
CLIENTS_PER_NODE = 3  # concurrent clients: >= 30 requests per compressed 5m window (5 s) per node
DEADLINE_S = 120.0
QUIET_S = 15.0  # after the alert fires, the healthy nodes must stay quiet this long


def _load(base: str, stop: threading.Event) -> None:
    with httpx.Client(timeout=30) as client:
        while not stop.is_set():
            body = {"model": MODEL, "messages": [{"role": "user", "content": "hello " * 40}], "max_tokens": 4}
            with contextlib.suppress(httpx.HTTPError):
                client.post(f"{base}/v1/chat/completions", json=body)


@pytest.fixture(scope="module")
def fleet(tmp_path_factory: pytest.TempPathFactory) -> Iterator[tuple[str, dict[str, str]]]:
    require("prometheus")  # a failure, not a skip, when the test command did not install it
    tmp = tmp_path_factory.mktemp("conformance-fleet")
    rules = tmp / "matrix.rules.yml"
    rules.write_text(render_file(ROOT / "alerts" / "matrix.rules.yml", 60))
    stop = threading.Event()
    threads: list[threading.Thread] = []
    with contextlib.ExitStack() as ctx:
        instances: dict[str, str] = {}
        for i, name in enumerate(NODES):
            sim_port, agent_port = free_port(), free_port()
            cmd = [PYTHON, "-m", "inferwatch.agent", "simulate", "--host", "127.0.0.1", "--port", str(sim_port)]
            cmd += ["--model", MODEL, "--hardware", "h100", "--seed", str(i)]
            if name == SLOW:
                cmd += ["--scenario", "simd_fallback:factor=4"]
            sim = ctx.enter_context(running(cmd, tmp / f"sim-{name}.log", cwd=ROOT))
            base = f"http://127.0.0.1:{sim_port}"
            env = _agent_env(
                agent_port,
                _fake_sysfs(tmp / f"sys-{name}", "p5.48xlarge"),
                {
                    "INFERWATCH_PATH__PROCFS": str(_fake_procfs(tmp / f"proc-{name}", "x86_amd_epyc_9654_zen4")),
                    "INFERWATCH_ENGINE__METRICS_URL": f"{base}/metrics",
                    "INFERWATCH_RUNTIME__PID": str(sim.pid),
                    "INFERWATCH_RUNTIME__NAME": "simulator",
                    "DASH_FAKE_GPU": GPU,
                },
            )
            agent = ctx.enter_context(
                running([PYTHON, "-m", "tests.node_agent"], tmp / f"agent-{name}.log", cwd=ROOT, env=env)
            )
            wait_http(f"{base}/v1/models", proc=sim, timeout_s=90)
            wait_http(f"http://127.0.0.1:{agent_port}/metrics", proc=agent, timeout_s=90)
            instances[name] = f"127.0.0.1:{agent_port}"
            for _ in range(CLIENTS_PER_NODE):
                threads.append(threading.Thread(target=_load, args=(base, stop), daemon=True))
        from tests import stack

        url = ctx.enter_context(
            stack.prometheus(tmp, {"inferwatch-agent": list(instances.values())}, rule_files=[rules])
        )
        for t in threads:
            t.start()
        try:
            yield url, instances
        finally:
            stop.set()
            for t in threads:
                t.join(timeout=35)


def _alerts(url: str) -> list[dict[str, Any]]:
    alerts = httpx.get(f"{url}/api/v1/alerts", timeout=10).json()["data"]["alerts"]
    return [a for a in alerts if a["labels"]["alertname"] == ALERT]


def _query(url: str, q: str) -> dict[str, float]:
    res = httpx.get(f"{url}/api/v1/query", params={"query": q}, timeout=10).json()["data"]["result"]
    return {f"{x['metric'].get('instance', '')}/{x['metric'].get('quantity', '')}": float(x["value"][1]) for x in res}


def test_the_slowed_node_leaves_the_band_and_its_peers_do_not(
    fleet: tuple[str, dict[str, str]],
) -> None:
    url, instances = fleet
    deadline = time.monotonic() + DEADLINE_S
    seen_healthy: set[str] = set()
    firing: set[str] = set()
    while time.monotonic() < deadline and not firing:
        active = _alerts(url)
        seen_healthy |= {a["labels"]["instance"] for a in active} - {instances[SLOW]}
        firing = {a["labels"]["instance"] for a in active if a["state"] == "firing"}
        time.sleep(1)
    p95 = _query(url, "instance_model:inferwatch_conformance_p95_seconds:rate5m")
    band = _query(url, "model_hardware:inferwatch_conformance_band_upper_seconds:1h")
    assert firing == {instances[SLOW]}, f"firing {firing}; node P95 {p95}; band upper {band}"
    quiet_until = time.monotonic() + QUIET_S
    while time.monotonic() < quiet_until:  # a healthy node must not even go pending
        seen_healthy |= {a["labels"]["instance"] for a in _alerts(url)} - {instances[SLOW]}
        time.sleep(1)
    assert not seen_healthy, f"healthy nodes left the band: {seen_healthy}; node P95 {p95}; band upper {band}"
    slow = p95[f"{instances[SLOW]}/ttft"]  # TTFT includes the frontend and queueing: less than 4x
    healthy = [p95[f"{instances[n]}/ttft"] for n in NODES if n != SLOW]
    assert slow > 1.1 * max(healthy), p95
    print(f"TTFT P95: slowed {slow * 1000:.1f} ms, healthy {[round(h * 1000, 1) for h in healthy]} ms; band {band}")
