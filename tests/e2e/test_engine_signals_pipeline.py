"""Engine-signal faults (issue 18) → simulator → agent → Prometheus → Alertmanager → the ticket receiver.

One simulator per fault (vLLM's own feature flags: ``--num-speculative-tokens``, ``--max-loras``,
``--kv-connector``), each under open-loop load from ``inferwatch loadgen`` and read by its own agent; one
Prometheus/Alertmanager pair with the shipped rules compressed by 60 and the shipped routes (tests/e2e/harness.py).
After a healthy phase every fault is switched on through the simulator's control endpoint, all at once:

| fault (scenario) | simulator flags / load | alert |
|---|---|---|
| kv_saturation (1 % of KV blocks left) | 256 output tokens | KVCacheSaturatedWithPreemptions |
| prefix_cache_collapse | 512-token shared system prompt | PrefixCacheHitRatioCollapsed |
| spec_decode_collapse | --num-speculative-tokens 3 | SpecDecodeAcceptanceCollapsed |
| lora_slot_exhaustion (8 adapters) | --max-loras 2, 256 output tokens | LoRARequestsWaitingForAdapterSlot |
| slow_kv_transfer (×50) | --kv-connector, 2048-token prompts | KVTransferSlow |

PrefixCacheHitRatioCollapsed compares with the same model a day ago (``offset 1d``, 24 minutes here): that history
(a hit ratio of 0.6) is backfilled with promtool before Prometheus starts, as tests/test_runbooks_exec.py does.
The healthy phase must not notify any of the five; each must reach the ticket receiver (warnings) for its own node
after injection. Times from injection to delivery are printed, not asserted (Alertmanager's shipped 30 s
group_wait for warnings is most of them).
"""

from __future__ import annotations

import contextlib
import json
import time
from dataclasses import dataclass
from pathlib import Path

import pytest

from tests.conftest import PYTHON, ROOT
from tests.e2e.harness import Delivery, Sink, backfill_day_ago, pipeline
from tests.e2e.test_alert_pipeline import (
    SimProc,
    _procfs,
    _simulators_ready,
    _start_agent,
    _start_simulator,
    _wait_generation_tokens,
)
from tests.procs import running, wait_http

pytestmark = [pytest.mark.integration, pytest.mark.slow, pytest.mark.cpu_heavy]

HEALTHY_S = 12.0  # healthy phase: several 5s (compressed 5m) windows of normal signals
# Bounded wait for every notification: in a fresh suite run under its own load SpecDecodeAcceptanceCollapsed was
# firing but not yet delivered at 120 s, the others at 36-42 s; in a cached run at 5639c0b KVTransferSlow at 180 s,
# the others at 34-35 s (the timings to page are benchmarks, not this test: this bounds a hang).
WAIT_S = 360.0
YESTERDAY_HIT_RATIO = 0.6


@dataclass(frozen=True)
class Fault:
    name: str  # the simulator's model name and the scenario's key here
    scenario: dict[str, object]
    alert: str
    flags: tuple[str, ...] = ()
    load: tuple[str, ...] = ()


FAULTS = (
    Fault(
        "kv-sat",
        {"name": "kv_saturation", "params": {"fraction": 0.01}},
        "KVCacheSaturatedWithPreemptions",
        load=("--output-tokens", "256"),
    ),
    Fault(
        "prefix",
        {"name": "prefix_cache_collapse", "params": {"fraction": 1.0}},
        "PrefixCacheHitRatioCollapsed",
        load=("--shared-prefix-tokens", "512"),
    ),
    Fault(
        "spec",
        {"name": "spec_decode_collapse", "params": {"acceptance": 0.05}},
        "SpecDecodeAcceptanceCollapsed",
        flags=("--num-speculative-tokens", "3"),
    ),
    Fault(
        "lora",
        {"name": "lora_slot_exhaustion", "params": {"adapters": 8}},
        "LoRARequestsWaitingForAdapterSlot",
        flags=("--max-loras", "2"),
        load=("--output-tokens", "256"),
    ),
    Fault(
        "pd-decode",
        {"name": "slow_kv_transfer", "params": {"factor": 50}},
        "KVTransferSlow",  # named for its cause; it inhibits the GoodputBelowTarget it causes (alertmanager.yml)
        flags=("--kv-connector",),
        load=("--prompt-tokens", "2048"),
    ),
)
ALERTS = {f.alert for f in FAULTS}


def _backfill_prefix_history(out: Path, instance: str, model: str) -> None:
    """TSDB blocks: the prefix-cache hit ratio record of ``instance`` was YESTERDAY_HIT_RATIO a day ago and (for the
    rules compressed by 60, ``offset 1d`` = 24 min) 24 minutes ago, ending 5.5 minutes before now (Prometheus
    appends nothing older than its newest block) and covering the rules' look-back for the next 23 minutes."""
    name = "instance_model:inferwatch_engine_prefix_cache_hit:ratio_rate5m"
    labels = f'gen_ai_request_model="{model}",instance="{instance}",job="inferwatch-agent"'
    backfill_day_ago(out, {name: [(labels, YESTERDAY_HIT_RATIO)]})


def _load(stack: contextlib.ExitStack, tmp: Path, sim: SimProc, extra: tuple[str, ...]) -> None:
    cmd = [PYTHON, "-m", "inferwatch.agent", "loadgen", "--url", sim.url, "--rate", "8", "--duration", "600"]
    cmd += ["--timeout", "600", "--seed", "6", "--no-progress", "--output-tokens", "32", *extra]
    stack.enter_context(running(cmd, tmp / f"loadgen-{sim.model}.log", cwd=ROOT))


def test_engine_signal_faults_notify_through_the_pipeline(tmp_path: Path) -> None:
    with contextlib.ExitStack() as stack:
        sink = stack.enter_context(Sink())
        sims: dict[str, SimProc] = {}
        agents = {}
        for f in FAULTS:
            sims[f.name] = _start_simulator(stack, tmp_path, f.name, *f.flags)
        _simulators_ready(stack, tmp_path, list(sims.values()))
        for f in FAULTS:
            _load(stack, tmp_path, sims[f.name], f.load)
            env = {"INFERWATCH_ENGINE__METRICS_URL": f"{sims[f.name].url}/metrics"}
            agents[f.name] = _start_agent(stack, tmp_path, f.name, _procfs(tmp_path / f"proc-{f.name}"), env=env)
        workdir = tmp_path / "pipeline"
        _backfill_prefix_history(workdir / "prom", agents["prefix"].instance, "prefix")
        ports = [a.port for a in agents.values()]
        pl = stack.enter_context(pipeline(workdir, sink, ports, f"http://127.0.0.1:{ports[0]}/runbooks"))
        for f in FAULTS:
            wait_http(f"{agents[f.name].url}/metrics", proc=agents[f.name].proc, timeout_s=60)
            _wait_generation_tokens(sims[f.name].url, 60)
        # every node's engine series reach Prometheus, then a healthy phase
        deadline = time.monotonic() + 60
        while len(pl.query('count by (instance) (inferwatch_engine_tokens_total{type="generation"})')) < len(FAULTS):
            assert time.monotonic() < deadline, "the agents' engine series never reached Prometheus"
            time.sleep(1)
        time.sleep(HEALTHY_S)
        signals = {
            "prefix hit ratio": pl.query("instance_model:inferwatch_engine_prefix_cache_hit:ratio_rate5m"),
            "spec acceptance": pl.query("instance_model:inferwatch_engine_spec_decode_acceptance:ratio_rate5m"),
            "goodput upper": pl.query("instance_model:inferwatch_goodput:ratio_upper_rate5m"),
            "lora slots": pl.query("inferwatch_engine_lora_max_adapters"),
        }
        early = [d for d in sink.snapshot() if d.alertname in ALERTS]
        assert not early, f"notified while healthy: {[(d.alertname, d.instance) for d in early]}\n{signals}"
        injected = time.monotonic()
        for f in FAULTS:
            sims[f.name].control({"enable": f.scenario})
        found: dict[str, Delivery | None] = {}
        for f in FAULTS:
            instance = agents[f.name].instance

            def pred(d: Delivery, f: Fault = f, instance: str = instance) -> bool:
                return d.alertname == f.alert and d.instance == instance and d.receiver == "ticket"

            found[f.name] = sink.wait_for(pred, max(1.0, WAIT_S - (time.monotonic() - injected)))
        report = {k: (round(d.t - injected, 1) if d else None) for k, d in found.items()}
        print(json.dumps({"time_to_notification_s": report}))
        missing = [f.alert for f in FAULTS if found[f.name] is None]
        alerts = pl.query("ALERTS")
        assert not missing, f"never notified: {missing}\n{report}\nALERTS: {alerts}\nhealthy signals: {signals}"
        # each notification is about its own node only, and its description carries the evidence
        for f in FAULTS:
            d = found[f.name]
            assert d is not None
            assert d.alert["labels"]["gen_ai_request_model"] == f.name
            assert agents[f.name].instance in d.alert["annotations"]["description"]
            assert d.alert["annotations"]["runbook_url"].endswith(f"/runbooks/{f.alert}")
        # GoodputBelowTarget is a symptom: KV saturation, LoRA slot waits, a collapsed prefix cache (more prefill) and
        # a collapsed acceptance (slower decode) all push requests past the TTFT/TPOT targets, so it may also reach
        # the other faulted nodes (seen for one of them on a loaded machine). The healthy phase above proves it
        # does not fire without a fault; the cause alerts must name only their own node.
        wrong = [
            (d.alertname, d.instance)
            for d in sink.snapshot()
            if d.alertname in ALERTS - {"GoodputBelowTarget"}
            and d.instance != next(agents[f.name].instance for f in FAULTS if f.alert == d.alertname)
        ]
        assert not wrong, f"notified for the wrong node: {wrong}"
        # No fault here delays the front end: a backlog's gap (the kv-sat node's queue) is not FrontendDelayHigh.
        frontend = [d.instance for d in sink.snapshot() if d.alertname == "FrontendDelayHigh"]
        assert not frontend, f"FrontendDelayHigh without a front-end fault: {frontend}"
