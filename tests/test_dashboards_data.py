"""Every dashboard panel is proven against real data.

Several simulated nodes (``inferwatch simulate`` on different hardware profiles, several models), one real
agent per node (engine collector pointed at its simulator, OTLP span receiver, probe, runtime process, a
sysfs root whose DMI product_name is the node's machine type) and Debian's Prometheus running
deploy/prometheus.yml natively (tests/stack.py). Load comes from streaming clients in this process. Then
every panel query of every dashboard runs through Prometheus's HTTP API with the template variables
resolved as Grafana resolves them (dashboards/prove.py); the test fails on any query that errors or returns
no data. The same stack checks ``inferwatch matrix``: its per-hardware TTFT P95 ordering must match the
simulator's hardware profiles.
"""

from __future__ import annotations

import contextlib
import json
import os
import subprocess
import threading
import time
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path

import httpx
import pytest

from inferwatch.dashboards import load_all
from inferwatch.dashboards.prove import Outcome, Prover
from tests import stack
from tests.conftest import FIXTURES, PYTHON, ROOT, free_port
from tests.procs import running, wait_http
from tests.test_cpu import machine_of
from tests.tools import require

pytestmark = [pytest.mark.integration, pytest.mark.slow, pytest.mark.cpu_heavy]


MODELS = ("meta-llama/Llama-3.1-8B-Instruct", "Qwen/Qwen2.5-7B-Instruct")
PROMPT_WORDS = 600  # long prompts make prefill (compute-bound) dominate TTFT, so hardware differences show
MAX_TOKENS = 12
DEADLINE_S = 150.0  # bounded wait for every panel to have data
MIN_LONG_REQUESTS = 15  # completed long-prompt requests per node before the matrix is read


@dataclass(frozen=True)
class Node:
    hardware: str  # simulator profile
    machine_type: str  # DMI product_name (an AWS instance type carrying that hardware)
    cpuinfo: str  # recorded /proc/cpuinfo in tests/fixtures/cpuinfo/ (the node's CPU)
    gpu: str | None  # NVML device name, None for CPU-only
    scenarios: tuple[str, ...] = ()
    flags: tuple[str, ...] = ()  # simulator feature flags (vLLM's own), for the engine-signal panels (issue 18)


# stream_usage_only gives the probe schema violations to count, error_burst HTTP errors (before the engine,
# so TTFT is unaffected); both leave the timing model alone.
NODES = (
    # The decode side of a P/D pair with speculative decoding and two LoRA slots: the engine-signal panels' data.
    Node(
        "h100",
        "p5.48xlarge",
        "x86_amd_epyc_9654_zen4",
        "NVIDIA H100 80GB HBM3",
        flags=("--num-speculative-tokens", "3", "--max-loras", "2", "--kv-connector"),
    ),
    Node(
        "a100", "p4d.24xlarge", "x86_cascadelake_xeon_platinum_8260m", "NVIDIA A100-SXM4-80GB", ("stream_usage_only",)
    ),
    Node("l40s", "g6e.2xlarge", "x86_amd_epyc_9654_zen4", "NVIDIA L40S", ("error_burst:rate=0.3",)),
    Node("sapphirerapids-cpu", "m7i.48xlarge", "x86_sapphirerapids_xeon_platinum_8480plus", None),
)


# --- the harness ---------------------------------------------------------------------------------------------


def _agent_env(port: int, sysfs: Path, extra: dict[str, str]) -> dict[str, str]:
    return {
        "INFERWATCH_LISTEN_ADDRESS": "127.0.0.1",
        "INFERWATCH_LISTEN_PORT": str(port),
        "INFERWATCH_INTERVAL_S": "1",
        "INFERWATCH_PATH__SYSFS": str(sysfs),
        "INFERWATCH_NODE__ENVIRONMENT": "test",
        **extra,
    }


def _fake_sysfs(root: Path, machine_type: str) -> Path:
    dmi = root / "class" / "dmi" / "id"
    dmi.mkdir(parents=True, exist_ok=True)
    (dmi / "product_name").write_text(machine_type + "\n")
    return root


def _fake_procfs(root: Path, cpuinfo: str) -> Path:
    """This host's /proc (every entry a symlink, so meminfo, PSI and /proc/<pid> are real) with the node's
    recorded cpuinfo: the CPU collector then sees that node's CPU model and SIMD flags."""
    root.mkdir(parents=True, exist_ok=True)
    for entry in os.listdir("/proc"):
        if entry not in ("cpuinfo", "sys"):
            with contextlib.suppress(OSError):
                (root / entry).symlink_to(Path("/proc") / entry)
    # /proc/sys likewise, except sys/kernel/arch: the recorded node's kernel architecture, not this host's.
    for sub in ("", "kernel"):
        (root / "sys" / sub).mkdir(parents=True, exist_ok=True)
        for entry in os.listdir(Path("/proc/sys") / sub):
            if entry not in ("kernel", "arch"):
                with contextlib.suppress(OSError):
                    (root / "sys" / sub / entry).symlink_to(Path("/proc/sys") / sub / entry)
    text = (FIXTURES / "cpuinfo" / f"{cpuinfo}.txt").read_text()
    (root / "cpuinfo").write_text(text)
    (root / "sys" / "kernel" / "arch").write_text(machine_of(text) + "\n")
    return root


def _prove_until(prom_url: str, dashboards: dict, deadline_s: float) -> list[Outcome]:
    """Prove every panel; retry the failing ones until they pass or time runs out. Returns the failures."""
    prover = Prover(prom_url, rate_interval="10s", range_="3m")
    try:
        deadline = time.monotonic() + deadline_s
        pending = dict(dashboards)
        failures: list[Outcome] = []
        while True:
            failures = []
            for uid, dash in list(pending.items()):
                bad = [o for o in prover.prove(dash) if not o.ok]
                failures += bad
                if not bad:
                    del pending[uid]
            if not failures or time.monotonic() > deadline:
                return failures
            time.sleep(3)
    finally:
        prover.close()


def _report(failures: list[Outcome]) -> str:
    return "\n".join(
        f"{o.query.dashboard} / {o.query.panel} [{o.query.ref_id}]: {o.error or 'no data'}\n    {o.resolved}"
        for o in failures
    )


# --- always: the harness and the prover against what the agent measures on this host ---------------------------


def test_prover_against_real_prometheus_and_agent(tmp_path: Path) -> None:
    require("prometheus")
    port = free_port()
    env = _agent_env(port, _fake_sysfs(tmp_path / "sys", "test-machine"), {})
    with running([PYTHON, "-m", "inferwatch.agent", "run"], tmp_path / "agent.log", cwd=ROOT, env=env) as agent:
        wait_http(f"http://127.0.0.1:{port}/metrics", proc=agent, timeout_s=60)
        with stack.prometheus(tmp_path, {"inferwatch-agent": [f"127.0.0.1:{port}"]}) as prom:
            node = load_all()["inferwatch-node"]
            page_cache = [p for p in node["panels"] if p.get("title") in _PAGE_CACHE_PANELS]
            assert len(page_cache) == len(_PAGE_CACHE_PANELS)
            subset = {**node, "panels": page_cache}
            failures = _prove_until(prom, {"inferwatch-node": subset}, 60)
            assert not failures, _report(failures)
            # Negative controls: the prover reports absent data and query errors.
            prover = Prover(prom, rate_interval="10s", range_="3m")
            try:
                values = prover.resolve_variables(node)
                assert values["instance"] == f"127\\\\.0\\\\.0\\\\.1:{port}"
                assert values["job"] == "inferwatch-agent"
                from inferwatch.dashboards.prove import PanelQuery

                absent = prover.run(PanelQuery("x", "absent", "A", "inferwatch_gpu_power_watts", False), values)
                assert absent.series == 0 and not absent.ok
                broken = prover.run(PanelQuery("x", "broken", "A", "sum(rate(up[1m])", True), values)
                assert broken.error and not broken.ok
            finally:
                prover.close()
            # The same check as a command against any Prometheus: here GPU and engine panels have no data.
            r = subprocess.run(
                [
                    PYTHON,
                    "-m",
                    "inferwatch.dashboards.prove",
                    "--prometheus",
                    prom,
                    "--rate-interval",
                    "10s",
                    "--range",
                    "3m",
                ],
                cwd=ROOT,
                capture_output=True,
                text=True,
                timeout=120,
            )
            assert r.returncode == 1
            assert "ok   inferwatch-node / Inactive(file) vs threshold [A]" in r.stdout
            assert "FAIL inferwatch-node / GPU utilisation [A]" in r.stdout


_PAGE_CACHE_PANELS = ("Inactive(file) vs threshold", "Memory pressure (PSI)", "Page-cache refaults and major faults")


# --- the full stack: simulators on several hardware profiles ------------------------------------------------------


@dataclass
class Stack:
    prometheus: str
    nodes: dict[str, Node]  # agent instance → node
    sims: list[str]
    completed: dict[str, int]  # simulator base URL → long-prompt requests of MODELS[0] completed


def _client_load(base: str, stop: threading.Event, errors: list[str], completed: dict[str, int]) -> None:
    """Sequential streaming chat requests alternating models; every 5th is abandoned after the first chunk."""
    prompt = " ".join(["observability"] * PROMPT_WORDS)
    n = 0
    with httpx.Client(timeout=60) as client:
        while not stop.is_set():
            n += 1
            body = {
                "model": MODELS[n % len(MODELS)],
                "messages": [{"role": "user", "content": prompt}],
                "max_tokens": MAX_TOKENS,
                "stream": True,
            }
            try:
                with client.stream("POST", f"{base}/v1/chat/completions", json=body) as r:
                    for i, _ in enumerate(r.iter_lines()):
                        if n % 5 == 0 and i >= 1:
                            break  # client gives up: the engine records an abort
                    else:
                        if body["model"] == MODELS[0] and r.status_code == 200:
                            completed[base] = completed.get(base, 0) + 1
            except httpx.HTTPError as exc:
                errors.append(str(exc))
                stop.wait(0.5)


@pytest.fixture(scope="module")
def full_stack(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Stack]:
    require("prometheus")
    tmp = tmp_path_factory.mktemp("stack")
    stop = threading.Event()
    errors: list[str] = []
    completed: dict[str, int] = {}
    with contextlib.ExitStack() as es:
        nodes: dict[str, Node] = {}
        sims: list[str] = []
        for i, node in enumerate(NODES):
            sim_port, agent_port, grpc_port, http_port = free_port(), free_port(), free_port(), free_port()
            cmd = [PYTHON, "-m", "inferwatch.agent", "simulate", "--host", "127.0.0.1", "--port", str(sim_port)]
            for m in MODELS:
                cmd += ["--model", m]
            cmd += ["--hardware", node.hardware, "--seed", str(i), "--debug-profile"]
            cmd += ["--otlp-traces-endpoint", f"http://127.0.0.1:{http_port}/v1/traces"]
            for s in node.scenarios:
                cmd += ["--scenario", s]
            cmd += node.flags
            sim = es.enter_context(running(cmd, tmp / f"sim-{node.hardware}.log", cwd=ROOT))
            base = f"http://127.0.0.1:{sim_port}"
            env = _agent_env(
                agent_port,
                _fake_sysfs(tmp / f"sys-{node.hardware}", node.machine_type),
                {
                    "INFERWATCH_PATH__PROCFS": str(_fake_procfs(tmp / f"proc-{node.hardware}", node.cpuinfo)),
                    "INFERWATCH_ENGINE__METRICS_URL": f"{base}/metrics",
                    "INFERWATCH_RUNTIME__PID": str(sim.pid),
                    "INFERWATCH_RUNTIME__NAME": "simulator",
                    "INFERWATCH_RECEIVER__ENABLED": "true",
                    "INFERWATCH_RECEIVER__GRPC_ENDPOINT": f"127.0.0.1:{grpc_port}",
                    "INFERWATCH_RECEIVER__HTTP_ENDPOINT": f"127.0.0.1:{http_port}",
                    "INFERWATCH_PROBE__URL": base,
                    "INFERWATCH_PROBE__INTERVAL_S": "5",
                    "INFERWATCH_RUNTIME_PROFILE__URL": f"{base}/debug/runtime_profile",
                    **({"DASH_FAKE_GPU": node.gpu} if node.gpu else {}),
                },
            )
            agent = es.enter_context(
                running([PYTHON, "-m", "tests.node_agent"], tmp / f"agent-{node.hardware}.log", cwd=ROOT, env=env)
            )
            wait_http(f"{base}/v1/models", proc=sim, timeout_s=90)
            wait_http(f"http://127.0.0.1:{agent_port}/metrics", proc=agent, timeout_s=90)
            nodes[f"127.0.0.1:{agent_port}"] = node
            sims.append(base)
        targets = {"inferwatch-agent": list(nodes), "engine": [s.removeprefix("http://") for s in sims]}
        # The price rules the matrix dashboard's cost panels read, from the example price file (its machine types
        # cover NODES'): what `inferwatch prices FILE --rules` writes for a fleet's Prometheus.
        from inferwatch.agent.fleet.prices import load_prices, price_rules

        prices = tmp / "prices.rules.yml"
        prices.write_text(price_rules(load_prices(ROOT / "deploy" / "prices.example.yml")))
        prom = es.enter_context(stack.prometheus(tmp, targets, extra_rule_files=[prices]))
        threads = [
            threading.Thread(target=_client_load, args=(base, stop, errors, completed), daemon=True)
            for base in sims
            for _ in (0, 1)
        ]
        for t in threads:
            t.start()
        try:
            yield Stack(prom, nodes, sims, completed)
        finally:
            stop.set()
            for t in threads:
                t.join(timeout=70)


def test_every_panel_has_data(full_stack: Stack) -> None:
    failures = _prove_until(full_stack.prometheus, load_all(), DEADLINE_S)
    assert not failures, f"{len(failures)} panel queries failed:\n{_report(failures)}"


def test_matrix_ttft_ordering_matches_the_hardware_profiles(full_stack: Stack) -> None:
    from inferwatch.simulator.profiles import PROFILES  # type: ignore[import-not-found, unused-ignore]

    # Prefill time of a prompt on each profile from the simulator's own roofline parameters: the order the
    # matrix must reproduce. Pairs closer than 1.5x (A100 vs L40S) are not ordered: noise can swap them.
    def prefill_s(hw: str) -> float:
        p = PROFILES[hw]
        return 2 * 8e9 * PROMPT_WORDS / (p.peak_flops * p.compute_efficiency)

    by_machine = {n.machine_type: n.hardware for n in full_stack.nodes.values()}
    deadline = time.monotonic() + DEADLINE_S
    # The agent's probe also sends short prompts (fast TTFT) to MODELS[0]: wait for enough long-prompt
    # requests on every node that P95 reflects them (they are then well over 5 % of the window).
    while time.monotonic() < deadline and not all(
        full_stack.completed.get(b, 0) >= MIN_LONG_REQUESTS for b in full_stack.sims
    ):
        time.sleep(2)
    assert all(full_stack.completed.get(b, 0) >= MIN_LONG_REQUESTS for b in full_stack.sims), full_stack.completed
    cells: dict[str, float] = {}
    while time.monotonic() < deadline:
        r = subprocess.run(
            [
                PYTHON,
                "-m",
                "inferwatch.agent",
                "matrix",
                "--prometheus",
                full_stack.prometheus,
                "--window",
                "3m",
                "--format",
                "json",
            ],
            cwd=ROOT,
            capture_output=True,
            text=True,
            timeout=60,
        )
        if r.returncode == 0:
            data = json.loads(r.stdout)
            model = MODELS[0]
            cells = {
                c["hardware"]["machine_type"]: c["ttft_p95_seconds"]
                for c in data["cells"]
                if c["model"] == model and c["ttft_p95_seconds"] is not None
            }
            if set(cells) == set(by_machine) and len(data["models"]) == len(MODELS):
                break
        time.sleep(3)
    assert set(cells) == set(by_machine), f"matrix cells {cells} (stderr: {r.stderr})"
    measured = sorted(cells, key=cells.__getitem__)
    print("TTFT P95 by hardware:", {by_machine[m]: round(cells[m], 4) for m in measured})
    for a in cells:
        for b in cells:
            ha, hb = by_machine[a], by_machine[b]
            if prefill_s(ha) * 1.5 < prefill_s(hb):
                assert cells[a] < cells[b], f"{ha} ({cells[a]:.3f}s) should be faster than {hb} ({cells[b]:.3f}s)"
    gpu_models = {c["hardware"]["gpu_model"] for c in data["cells"]}
    assert {"NVIDIA H100 80GB HBM3", "none"} <= gpu_models
    table = subprocess.run(
        [PYTHON, "-m", "inferwatch.agent", "matrix", "--prometheus", full_stack.prometheus, "--window", "3m"],
        cwd=ROOT,
        capture_output=True,
        text=True,
        timeout=60,
    )
    print(table.stdout)
    assert table.returncode == 0 and "p5.48xlarge" in table.stdout and MODELS[0] in table.stdout
