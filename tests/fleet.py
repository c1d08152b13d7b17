"""A fleet on one machine: simulated nodes, each with its own identity, scraped into the remote-write path.

Each node is a simulator (``python -m inferwatch.agent simulate`` with the node's ``--hardware`` profile and model), the
agent as shipped (tests/node_agent.py: ``inferwatch run`` with a fake NVML device named like the node's GPU),
its own procfs tree (the recorded cpuinfo and meminfo of tests/fixtures, a kernel command line) and sysfs tree
(DMI product_name = the node's machine type), and open-loop load from ``python -m inferwatch.agent loadgen``. vmagent
scrapes every agent (job ``inferwatch-agent``) and every simulator's own /metrics (job ``engine``, as
deploy/prometheus.yml does) and remote-writes to VictoriaMetrics; vmalert evaluates the rule files against it
and notifies Alertmanager with the shipped alertmanager.yml (receivers at a local :class:`Sink`).

Used by benchmarks/fleet_drill.py (shipped rules, production timings) and tests/test_fleet_drill.py (the
compressed rule profile, short timings). The drill itself — a healthy phase with noise, then one fault per
node, then recovery — is :func:`run_drill`; the faults are :data:`FAULTS`.
"""

from __future__ import annotations

import contextlib
import dataclasses
import json
import os
import shutil
import subprocess
import time
from collections.abc import Callable, Iterator, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import httpx
import yaml

from tests.conftest import FIXTURES, PYTHON, ROOT, free_port
from tests.e2e.harness import Delivery, Sink, alertmanager
from tests.e2e.test_alert_pipeline import HEALTHY_MEMINFO, LOW_PAGECACHE_MEMINFO, SVE_TOKENS, _procfs
from tests.procs import running, wait_http
from tests.stack import native_prometheus_config
from tests.test_dashboards_data import _fake_sysfs
from tests.vmstack import reload_vmagent, victoria_metrics, vmagent, vmalert

CONTROL_TOKEN = "fleet-drill-control-token"
# The Graviton3 profile (6 TFLOP/s) cannot serve 512-token prompts at 2 req/s within the TTFT SLO's 500 ms
# (first production attempt: P50 0.45 s, P95 2.2 s, 23 % of requests over 500 ms, the 14.4x burn pending within
# 4 minutes): a CPU pool takes shorter prompts at a lower rate, as a capacity plan would give it.
GRAVITON_LOAD: dict[str, Any] = {"prompt_tokens": "lognormal:128:0.5", "rate": 1.0}
NOSVE_CMDLINE = "BOOT_IMAGE=/vmlinuz ro quiet arm64.nosve\n"
MEMORY_PRESSURE = (  # memory PSI in the kernel's format: some avg60 12.4 %, over the rule's 5 %
    "some avg10=18.20 avg60=12.40 avg300=4.10 total=91833411\nfull avg10=6.10 avg60=3.90 avg300=1.20 total=29114067\n"
)
NO_PRESSURE = "some avg10=0.00 avg60=0.00 avg300=0.00 total=1204\nfull avg10=0.00 avg60=0.00 avg300=0.00 total=311\n"
# The runtime's cgroup on a node where the agent finds the runtime (NodeSpec.runtime_process): a systemd unit, as a
# vLLM service on a bare host runs, with its cgroup v2 memory files in the node's sysfs tree.
RUNTIME_CGROUP = "system.slice/vllm.service"
RUNTIME_MEMORY_STAT = (  # a runtime cgroup's memory.stat (the fields the agent reads; bytes and event counts)
    "anon 2147483648\nfile 17179869184\nactive_file 12884901888\ninactive_file 4294967296\n"
    "workingset_refault_anon 0\nworkingset_refault_file 1200\nworkingset_activate_file 300\npgmajfault 52\n"
)


@dataclass(frozen=True)
class NodeSpec:
    """One node's identity: what the simulator, the agent's procfs/sysfs trees and the fake NVML say it is."""

    name: str
    hardware: str  # simulator --hardware profile
    machine_type: str  # DMI product_name
    cpuinfo: str  # recorded /proc/cpuinfo under tests/fixtures/cpuinfo/
    gpu: str | None  # NVML device name; None for a CPU-only node
    model: str
    environment: str = "production"
    sim_args: tuple[str, ...] = ()  # e.g. --debug-profile, --scenario debug_disabled
    runtime_profile: bool = False  # the agent fetches the simulator's /debug/runtime_profile
    no_sve: bool = False  # booted with arm64.nosve: the recorded cpuinfo without its SVE hwcaps
    rate: float = 2.0  # requests/s from loadgen
    prompt_tokens: str | None = None  # loadgen's --prompt-tokens; None: the drill's (Timings.prompt_tokens)
    spans: bool = False  # the simulator exports a span per request to the agent's OTLP receiver (bimodality)
    load_args: tuple[str, ...] = ()  # more loadgen flags, e.g. a shared system prompt
    # The agent finds the simulator as its runtime (runtime.cmdline_pattern), as it finds vLLM on a real node: the
    # node's procfs holds the simulator's pid, whose files are the simulator's own but for its cgroup (RUNTIME_CGROUP,
    # with its memory files in the node's sysfs). The process and SIMD collectors then read it.
    runtime_process: bool = False


@dataclass(frozen=True)
class Timings:
    """Every interval the drill runs at. ``production`` is the shipped one; the test suite compresses it."""

    scrape: str = "15s"  # vmagent scrape and vmalert evaluation
    agent_interval_s: float = 15.0
    probe_interval_s: float = 30.0  # the agent's defaults (agent/config/sections.py)
    profile_interval_s: float = 60.0
    prompt_tokens: str = "lognormal:512:0.6"
    output_tokens: str = "32"
    # How long the agent's /metrics waits for the collections it pulls (agent default 2 s); it must stay under the
    # scraper's timeout, which the compressed profile makes 2 s.
    scrape_wait_s: float | None = None


H100, A100, L40S = "NVIDIA H100 80GB HBM3", "NVIDIA A100-SXM4-80GB", "NVIDIA L40S"
LLAMA, QWEN7, MISTRAL, QWEN05 = (
    "meta-llama/Llama-3.1-8B-Instruct",
    "Qwen/Qwen2.5-7B-Instruct",
    "mistralai/Mistral-7B-Instruct-v0.3",
    "Qwen/Qwen2.5-0.5B-Instruct",
)
PROFILE = ("--debug-profile",)
# Every node the drills know, by name (docs/benchmarks.md, "Fleet drill at production timings", has the table).
# There is no Graviton4 simulator profile: r8g-graviton4 is the Graviton4 CPU (recorded cpuinfo) on graviton3-cpu.
CATALOG: dict[str, NodeSpec] = {
    n.name: n
    for n in (
        NodeSpec("p5-h100", "h100", "p5.48xlarge", "x86_amd_epyc_9654_zen4", H100, LLAMA, spans=True),
        NodeSpec("p4d-a100", "a100", "p4d.24xlarge", "x86_cascadelake_xeon_platinum_8260m", A100, LLAMA),
        NodeSpec("g6e-l40s", "l40s", "g6e.2xlarge", "x86_amd_epyc_9654_zen4", L40S, QWEN7),
        NodeSpec("p5e-h100", "h100", "p5e.48xlarge", "x86_amd_epyc_9654_zen4", H100, MISTRAL),
        NodeSpec(
            "m7i-spr",
            "sapphirerapids-cpu",
            "m7i.48xlarge",
            "x86_sapphirerapids_xeon_platinum_8480plus",
            None,
            QWEN05,
            environment="staging",  # a debug profile outside production: RuntimeSIMDFallback's input, no page
            sim_args=PROFILE,
            runtime_profile=True,
        ),
        NodeSpec(
            "c7g-graviton3", "graviton3-cpu", "c7g.16xlarge", "graviton3_neoverse_v1", None, QWEN05, **GRAVITON_LOAD
        ),
        NodeSpec(
            "r8g-graviton4",
            "graviton3-cpu",
            "r8g.16xlarge",
            "neoverse_v2_likely_graviton4",
            None,
            QWEN05,
            **GRAVITON_LOAD,
        ),
        NodeSpec(
            "a3-h100",
            "h100",
            "a3-highgpu-8g",
            "x86_sapphirerapids_xeon_platinum_8480plus",
            H100,
            LLAMA,
            sim_args=(*PROFILE, "--scenario", "debug_disabled"),  # debug_in_production switches debug_disabled off
            runtime_profile=True,
        ),
        # issue 33: one engine feature per node (compose's load, its own model so a model-level alert names the node)
        NodeSpec(  # a chat app's shared system prompt: the prefix cache does real work before the fault
            "p5-prefix",
            "h100",
            "p5.48xlarge",
            "x86_amd_epyc_9654_zen4",
            H100,
            "acme/prefix-8B-Instruct",
            load_args=("--shared-prefix-tokens", "256"),
        ),
        NodeSpec(
            "p5-spec",
            "h100",
            "p5.48xlarge",
            "x86_amd_epyc_9654_zen4",
            H100,
            "acme/spec-8B-Instruct",
            sim_args=("--num-speculative-tokens", "3"),
        ),
        NodeSpec("p5-kv", "h100", "p5.48xlarge", "x86_amd_epyc_9654_zen4", H100, "acme/kv-8B-Instruct"),
        NodeSpec(
            "p5-lora",
            "h100",
            "p5.48xlarge",
            "x86_amd_epyc_9654_zen4",
            H100,
            "acme/lora-8B-Instruct",
            sim_args=("--max-loras", "1", "--lora-adapters", "1"),  # 8 adapters under the fault: 1 slot contended
        ),
        NodeSpec(
            "p5-pd",
            "h100",
            "p5.48xlarge",
            "x86_amd_epyc_9654_zen4",
            H100,
            "acme/pd-8B-Instruct",
            sim_args=("--kv-connector",),
        ),
        NodeSpec(
            "p5-dp",
            "h100",
            "p5.48xlarge",
            "x86_amd_epyc_9654_zen4",
            H100,
            "acme/dp-8B-Instruct",
            sim_args=("--engines", "2"),
        ),
        NodeSpec(  # the runtime found by the agent (its process, its cgroup): a restart is seen, its SIMD view read
            "p5-simd",
            "h100",
            "p5.48xlarge",
            "x86_amd_epyc_9654_zen4",
            H100,
            "acme/simd-8B-Instruct",
            runtime_process=True,
        ),
        NodeSpec(
            "p5-cgroup",
            "h100",
            "p5.48xlarge",
            "x86_amd_epyc_9654_zen4",
            H100,
            "acme/cgroup-8B-Instruct",
            runtime_process=True,
        ),
        NodeSpec("p5-frontend", "h100", "p5.48xlarge", "x86_amd_epyc_9654_zen4", H100, "acme/frontend-8B-Instruct"),
        NodeSpec("p5-hang", "h100", "p5.48xlarge", "x86_amd_epyc_9654_zen4", H100, "acme/hang-8B-Instruct"),
        NodeSpec("c7g-joiner", "graviton3-cpu", "c7g.8xlarge", "graviton3_neoverse_v1", None, QWEN05, **GRAVITON_LOAD),
        NodeSpec(
            "c7g-nosve",
            "graviton3-cpu",
            "c7g.4xlarge",
            "graviton3_neoverse_v1",
            None,
            QWEN05,
            no_sve=True,
            **GRAVITON_LOAD,
        ),
    )
}


class FleetNode:
    """A node's processes (simulator, agent, loadgen), each startable and stoppable on its own."""

    def __init__(self, spec: NodeSpec, tmp: Path, timings: Timings, seed: int) -> None:
        self.spec, self.timings, self.seed = spec, timings, seed
        self.dir = tmp / spec.name
        self.dir.mkdir(parents=True)
        self.sim_port, self.agent_port, self.span_port = free_port(), free_port(), free_port()
        self.model = spec.model
        self.rate = spec.rate
        self._sim: contextlib.ExitStack | None = None
        self._agent: contextlib.ExitStack | None = None
        self._load: contextlib.ExitStack | None = None
        self._starts = 0
        self.procfs = self.dir / "proc"
        self.sysfs = _fake_sysfs(self.dir / "sys", spec.machine_type)
        # Where the agent pushes its critical findings (alertmanager.urls), as docker-compose.yml wires it: the
        # Alertmanager and the labels the rule path gives the same alerts (set by Fleet.running before the start).
        self.push_to: str | None = None
        self.push_labels: dict[str, str] = {}
        self.write_procfs(no_sve=spec.no_sve)
        if spec.runtime_process:
            self.cgroup = self.sysfs / "fs" / "cgroup" / RUNTIME_CGROUP
            self.cgroup.mkdir(parents=True)
            (self.cgroup / "memory.stat").write_text(RUNTIME_MEMORY_STAT)
            self.cgroup_pressure(False)

    # identity --------------------------------------------------------------------------------------------------

    def write_procfs(self, no_sve: bool) -> None:
        """The node's procfs tree: recorded cpuinfo (without SVE when booted with arm64.nosve) and meminfo."""
        text = (FIXTURES / "cpuinfo" / f"{self.spec.cpuinfo}.txt").read_text()
        if self.procfs.exists():
            for p in sorted(self.procfs.rglob("*"), reverse=True):
                p.rmdir() if p.is_dir() else p.unlink()
            self.procfs.rmdir()
        if no_sve:
            _procfs(self.procfs, SVE_TOKENS.sub("", text), NOSVE_CMDLINE)
        else:
            _procfs(self.procfs, text)

    def memory_pressure(self, on: bool) -> None:
        """Low Inactive(file) (the recorded 142 MiB) and memory PSI at 12 %, or the healthy recording back."""
        (self.procfs / "meminfo").write_text((LOW_PAGECACHE_MEMINFO if on else HEALTHY_MEMINFO).read_text())
        psi = self.procfs / "pressure" / "memory"
        if on:
            psi.parent.mkdir(exist_ok=True)
            psi.write_text(MEMORY_PRESSURE)
        elif psi.exists():
            psi.unlink()

    def cgroup_pressure(self, on: bool) -> None:
        """The runtime cgroup's memory PSI at 12 % (its memory.max squeezes its page cache), or none."""
        (self.cgroup / "memory.pressure").write_text(MEMORY_PRESSURE if on else NO_PRESSURE)

    def link_runtime(self, pid: int) -> None:
        """Put the runtime ``pid`` (the simulator) in the node's procfs: a directory of links to the process's own
        /proc files (psutil, the SIMD collector's maps, threads and arch_status read them), but for its cgroup, which
        names RUNTIME_CGROUP; the previous runtime's directory goes (it exited). psutil reads the boot time from
        ``stat``: its btime line is the host's."""
        for old in self.procfs.iterdir():
            if old.name.isdigit():
                shutil.rmtree(old)
        btime = next(ln for ln in Path("/proc/stat").read_text().splitlines() if ln.startswith("btime "))
        (self.procfs / "stat").write_text(btime + "\n")
        own = self.procfs / str(pid)
        own.mkdir()
        for name in os.listdir(f"/proc/{pid}"):
            if name != "cgroup":
                (own / name).symlink_to(f"/proc/{pid}/{name}")
        (own / "cgroup").write_text(f"0::/{RUNTIME_CGROUP}\n")

    @property
    def sim_url(self) -> str:
        return f"http://127.0.0.1:{self.sim_port}"

    @property
    def instance(self) -> str:
        return f"127.0.0.1:{self.agent_port}"

    @property
    def engine_instance(self) -> str:
        return f"127.0.0.1:{self.sim_port}"

    # processes -------------------------------------------------------------------------------------------------

    def start_sim(self, model: str | None = None, *extra: str) -> None:
        self.model = model or self.model
        self._starts += 1
        cmd = [PYTHON, "-m", "inferwatch.agent", "simulate", "--host", "127.0.0.1", "--port", str(self.sim_port)]
        cmd += ["--model", self.model, "--hardware", self.spec.hardware, "--seed", str(self.seed)]
        cmd += ["--control-token", CONTROL_TOKEN, "--log-level", "warning", *self.spec.sim_args, *extra]
        env = None
        if self.spec.spans:
            cmd += ["--otlp-traces-endpoint", f"http://127.0.0.1:{self.span_port}/v1/traces"]
            env = {"OTEL_RESOURCE_ATTRIBUTES": f"gen_ai.request.model={self.model}"}  # as one vLLM process would
        es = contextlib.ExitStack()
        proc = es.enter_context(running(cmd, self.dir / f"sim-{self._starts}.log", cwd=ROOT, env=env))
        self._sim = es
        wait_http(f"{self.sim_url}/health", proc=proc, timeout_s=90, ok=lambda r: r.status_code == 200)
        if self.spec.runtime_process:
            self.link_runtime(proc.pid)

    def stop_sim(self) -> None:
        if self._sim is not None:
            self._sim.close()
            self._sim = None

    def start_agent(self) -> None:
        env = {
            "INFERWATCH_LISTEN_ADDRESS": "127.0.0.1",
            "INFERWATCH_LISTEN_PORT": str(self.agent_port),
            "INFERWATCH_INTERVAL_S": str(self.timings.agent_interval_s),
            "INFERWATCH_PATH__PROCFS": str(self.procfs),
            "INFERWATCH_PATH__SYSFS": str(self.sysfs),
            "INFERWATCH_NODE__ENVIRONMENT": self.spec.environment,
            "INFERWATCH_ENGINE__METRICS_URL": f"{self.sim_url}/metrics",
            "INFERWATCH_PROBE__URL": self.sim_url,
            "INFERWATCH_PROBE__INTERVAL_S": str(self.timings.probe_interval_s),
            "DASH_FAKE_GPU": self.spec.gpu or "",
        }
        if self.push_to:  # docker-compose.yml: INFERWATCH_ALERTMANAGER__* (docs/alerts.md, "Pushed by the agent")
            env["INFERWATCH_ALERTMANAGER__URLS"] = json.dumps([self.push_to])
            env["INFERWATCH_ALERTMANAGER__INSTANCE"] = self.instance
            env["INFERWATCH_ALERTMANAGER__LABELS"] = json.dumps(self.push_labels)
        if self.spec.spans:  # bimodality is computed from spans only (agent/node/analytics/latency.py)
            env["INFERWATCH_RECEIVER__ENABLED"] = "true"
            env["INFERWATCH_RECEIVER__GRPC_ENDPOINT"] = ""
            env["INFERWATCH_RECEIVER__HTTP_ENDPOINT"] = f"127.0.0.1:{self.span_port}"
        if self.timings.scrape_wait_s is not None:
            env["INFERWATCH_SCRAPE_WAIT_S"] = str(self.timings.scrape_wait_s)
        if self.spec.runtime_process:  # the simulator's own command line, as 'vllm serve' finds vLLM
            env["INFERWATCH_RUNTIME__NAME"] = "vllm"
            env["INFERWATCH_RUNTIME__CMDLINE_PATTERN"] = f"inferwatch.agent simulate .*--port {self.sim_port} "
        if self.spec.runtime_profile:
            env["INFERWATCH_RUNTIME_PROFILE__URL"] = f"{self.sim_url}/debug/runtime_profile"
            env["INFERWATCH_RUNTIME_PROFILE__INTERVAL_S"] = str(self.timings.profile_interval_s)
        es = contextlib.ExitStack()
        log = self.dir / f"agent-{time.monotonic_ns()}.log"
        proc = es.enter_context(running([PYTHON, "-m", "tests.node_agent"], log, cwd=ROOT, env=env))
        self._agent = es
        wait_http(f"http://{self.instance}/metrics", proc=proc, timeout_s=90, ok=lambda r: r.status_code == 200)

    def stop_agent(self) -> None:
        if self._agent is not None:
            self._agent.close()
            self._agent = None

    def start_load(self, rate: float | None = None) -> None:
        self.stop_load()
        self.rate = rate or self.rate
        cmd = [PYTHON, "-m", "inferwatch.agent", "loadgen", "--url", self.sim_url, "--rate", str(self.rate)]
        cmd += ["--duration", "86400", "--timeout", "900", "--seed", str(self.seed), "--no-progress"]
        prompt = self.spec.prompt_tokens or self.timings.prompt_tokens
        cmd += ["--prompt-tokens", prompt, "--output-tokens", self.timings.output_tokens, *self.spec.load_args]
        es = contextlib.ExitStack()
        es.enter_context(running(cmd, self.dir / f"loadgen-{time.monotonic_ns()}.log", cwd=ROOT))
        self._load = es

    def stop_load(self) -> None:
        if self._load is not None:
            self._load.close()
            self._load = None

    def start(self) -> None:
        self.start_sim()
        self.start_agent()
        self.start_load()

    def close(self) -> None:
        self.stop_load()
        self.stop_agent()
        self.stop_sim()

    def control(self, body: dict[str, Any]) -> None:
        """Switch the simulator's fault scenarios (its control endpoint)."""
        headers = {"Authorization": f"Bearer {CONTROL_TOKEN}"}
        r = httpx.post(f"{self.sim_url}/control/scenario", json=body, headers=headers, timeout=10)
        r.raise_for_status()

    def generation_tokens(self) -> float:
        """The simulator's vllm:generation_tokens_total (0 while nothing was served, or when it is down)."""
        try:
            lines = httpx.get(f"{self.sim_url}/metrics", timeout=5).text.splitlines()
        except httpx.HTTPError:
            return 0.0
        return sum(float(ln.split()[-1]) for ln in lines if ln.startswith("vllm:generation_tokens_total{"))


class Fleet:
    """The nodes and the storage/alerting path: vmagent → VictoriaMetrics ← vmalert → Alertmanager → sink."""

    def __init__(self, tmp: Path, sink: Sink, timings: Timings, nodes: Sequence[NodeSpec]) -> None:
        self.tmp, self.sink, self.timings = tmp, sink, timings
        self.nodes = {spec.name: FleetNode(spec, tmp / "nodes", timings, seed) for seed, spec in enumerate(nodes)}
        self.members: list[str] = []  # nodes vmagent scrapes now
        self.ever: set[str] = set()  # nodes vmagent has scraped at some point
        self.vm = self.vmagent = self.vmalert = self.alertmanager = ""
        self.backend = "vm"  # or "prometheus": one Prometheus scrapes, stores and evaluates (compose's stack)
        self.push = True  # agents push critical findings to Alertmanager (alertmanager.urls), as compose sets it
        self._prom_rules: list[str] = []

    def __getitem__(self, name: str) -> FleetNode:
        return self.nodes[name]

    def targets(self) -> dict[str, list[str]]:
        members = [self.nodes[n] for n in self.members]
        return {"inferwatch-agent": [n.instance for n in members], "engine": [n.engine_instance for n in members]}

    def join(self, name: str) -> None:
        """A node boots and enters service discovery: its processes start, then vmagent scrapes it."""
        self.nodes[name].start()
        self.members.append(name)
        self.ever.add(name)
        self._reload()

    def _reload(self) -> None:
        if self.backend == "prometheus":
            self._write_prometheus_config()
            httpx.post(f"{self.vm}/-/reload", timeout=30).raise_for_status()
        else:
            reload_vmagent(self.tmp, self.vmagent, self.targets(), self.timings.scrape)

    def _write_prometheus_config(self) -> Path:
        """deploy/prometheus.yml (tests/stack.py's native rendering) with this fleet's targets, the drill's interval
        for scrape and evaluation, the rule files and this Alertmanager."""
        cfg = native_prometheus_config(
            self.targets(), interval=self.timings.scrape, alertmanager=self.alertmanager.removeprefix("http://")
        )
        cfg["rule_files"] = self._prom_rules
        for job in cfg["scrape_configs"]:  # the shipped timeout (10 s default), not the interval
            job.pop("scrape_timeout", None)
        path = self.tmp / "prometheus.yml"
        path.write_text(yaml.safe_dump(cfg))
        return path

    @contextlib.contextmanager
    def _prometheus(self, rule_files: Sequence[Path]) -> Iterator[str]:
        self._prom_rules = [str(p) for p in rule_files]
        port = free_port()
        url = f"http://127.0.0.1:{port}"
        path = self._write_prometheus_config()
        check = subprocess.run(["promtool", "check", "config", str(path)], capture_output=True, text=True, timeout=60)
        if check.returncode != 0:
            raise RuntimeError(f"promtool rejected the drill's Prometheus config: {check.stdout}{check.stderr}")
        cmd = [
            "prometheus",
            f"--config.file={path}",
            f"--storage.tsdb.path={self.tmp / 'prom-data'}",
            f"--web.listen-address=127.0.0.1:{port}",
            f"--web.external-url={url}",
            "--web.enable-lifecycle",
        ]
        with running(cmd, self.tmp / "prometheus.log") as proc:
            wait_http(f"{url}/-/ready", timeout_s=60, proc=proc, ok=lambda r: r.status_code == 200)
            yield url

    def leave(self, name: str) -> None:
        """A node is drained: it leaves service discovery first, then its processes stop."""
        self.members.remove(name)
        self._reload()
        self.nodes[name].close()

    @contextlib.contextmanager
    def running(self, members: Sequence[str], rule_files: Sequence[Path], binaries: dict[str, str]) -> Iterator[Fleet]:
        """Start ``members`` and the storage/alerting path; stop everything on exit (also on Ctrl-C)."""
        with contextlib.ExitStack() as es:
            for node in self.nodes.values():
                es.callback(node.close)
            # Alertmanager first: the agents push their critical findings to it from their start, with the labels
            # the rule path's alerts carry (the storage's external labels), as compose wires them.
            self.alertmanager = es.enter_context(alertmanager(self.tmp / "alertmanager", self.sink))
            if self.backend == "prometheus":
                labels = dict(native_prometheus_config({})["global"].get("external_labels", {}))
            else:
                labels = {"runbook_base": f"http://{self.nodes[members[0]].instance}/runbooks"}
            for node in self.nodes.values():
                node.push_to = self.alertmanager if self.push else None
                node.push_labels = labels
            for name in members:
                self.nodes[name].start()
                self.members.append(name)
                self.ever.add(name)
            if self.backend == "prometheus":
                self.vm = self.vmalert = es.enter_context(self._prometheus(rule_files))
                yield self
                return
            self.vm = es.enter_context(victoria_metrics(self.tmp, binaries["victoria-metrics"]))
            self.vmagent = es.enter_context(
                vmagent(self.tmp, binaries["vmagent"], self.targets(), [f"{self.vm}/api/v1/write"], self.timings.scrape)
            )
            self.vmalert = es.enter_context(
                vmalert(
                    self.tmp,
                    binaries["vmalert"],
                    rule_files,
                    self.vm,
                    self.alertmanager,
                    labels,
                    self.timings.scrape,
                )
            )
            yield self


# --- faults ------------------------------------------------------------------------------------------------------


@dataclass(frozen=True)
class Fault:
    """A pitfall injected on one node, the page it must cause, and how the node recovers."""

    name: str
    node: str
    alertname: str
    receiver: str  # pagerduty | ticket
    target_s: float  # the target at production timings
    inject: Callable[[Fleet], None]
    recover: Callable[[Fleet], None]
    # which delivered alert is this fault's: by default the alert's instance is the node's agent
    instance: Callable[[Fleet], str] = lambda fleet: ""
    model_label: bool = False  # fleet-level (SLO) alert: matched by the node's model, not by instance

    def matches(self, d: Delivery, fleet: Fleet) -> bool:
        if d.alertname != self.alertname or d.receiver != self.receiver:
            return False
        if self.model_label:
            labels = d.body.get("payload", {}).get("custom_details", {}).get("labels", "")
            model = d.alert.get("labels", {}).get("gen_ai_request_model", "")
            return f"gen_ai_request_model={fleet[self.node].model} " in labels or model == fleet[self.node].model
        return d.instance == (self.instance(fleet) or fleet[self.node].instance)


STATE_S, HANG_S, OTHER_S = 90.0, 120.0, 240.0  # issue 16's targets


def _scenario(node: str, spec: str) -> tuple[Callable[[Fleet], None], Callable[[Fleet], None]]:
    name = spec.split(":", 1)[0]
    return (lambda f: f[node].control({"enable": spec})), (lambda f: f[node].control({"disable": name}))


def _pagecache(node: str, spec: str, cgroup: bool = False) -> tuple[Callable[[Fleet], None], Callable[[Fleet], None]]:
    """Requests stall (``spec``) while page cache is squeezed: the host's (low Inactive(file), memory PSI 12 %), or
    with ``cgroup`` the runtime cgroup's own (PSI 12 % in its memory.pressure; the host's cache above its floor)."""
    on, off = _scenario(node, spec)

    def squeeze(f: Fleet, how: bool) -> None:
        (f[node].cgroup_pressure if cgroup else f[node].memory_pressure)(how)

    def inject(f: Fleet) -> None:
        squeeze(f, True)
        on(f)

    def recover(f: Fleet) -> None:
        off(f)
        squeeze(f, False)

    return inject, recover


def _restart_into(node: str, spec: str) -> tuple[Callable[[Fleet], None], Callable[[Fleet], None]]:
    """The runtime restarts into a new image that carries the fault (``--scenario spec`` from its start); recovery is
    a restart onto the old image. Both are runtime restarts the agent sees (a new pid of its runtime)."""

    def inject(f: Fleet) -> None:
        f[node].stop_sim()
        f[node].start_sim(None, "--scenario", spec)

    def recover(f: Fleet) -> None:
        f[node].stop_sim()
        f[node].start_sim()

    return inject, recover


def _engine_down(node: str) -> tuple[Callable[[Fleet], None], Callable[[Fleet], None]]:
    return (lambda f: f[node].stop_sim()), (lambda f: f[node].start_sim())


def _nosve_join(node: str) -> tuple[Callable[[Fleet], None], Callable[[Fleet], None]]:
    """A node booted with arm64.nosve joins; recovery is a reboot without it (the agent restarts on the fixed
    tree: /proc/cpuinfo cannot change while a kernel runs)."""

    def recover(f: Fleet) -> None:
        n = f[node]
        n.stop_agent()
        n.write_procfs(no_sve=False)
        n.start_agent()

    return (lambda f: f.join(node)), recover


def _debug_on(node: str) -> tuple[Callable[[Fleet], None], Callable[[Fleet], None]]:
    """The runtime is redeployed with debug mode on (the simulator's profile endpoint starts answering)."""
    return (lambda f: f[node].control({"disable": "debug_disabled"})), (
        lambda f: f[node].control({"enable": "debug_disabled"})
    )


def _fault(name: str, node: str, alertname: str, receiver: str, target_s: float, pair: Any, **kw: Any) -> Fault:
    inject, recover = pair
    return Fault(name, node, alertname, receiver, target_s, inject, recover, **kw)


def faults(assign: dict[str, str]) -> list[Fault]:
    """Every pitfall, each on the node ``assign`` names for it (pitfalls not in ``assign`` are left out)."""
    catalog = {
        "simd_missing": lambda n: _fault("simd_missing", n, "CPUFeatureMissing", "pagerduty", STATE_S, _nosve_join(n)),
        "hardware_mismatch": lambda n: _fault(
            "hardware_mismatch", n, "RuntimeHardwareMismatch", "pagerduty", STATE_S, _scenario(n, "hardware_mismatch")
        ),
        "debug_in_production": lambda n: _fault(
            "debug_in_production", n, "DebugProfileEnabledInProduction", "pagerduty", STATE_S, _debug_on(n)
        ),
        "engine_down": lambda n: _fault("engine_down", n, "EngineDown", "pagerduty", STATE_S, _engine_down(n)),
        "hang": lambda n: _fault("hang", n, "EngineHungButHealthy", "pagerduty", HANG_S, _scenario(n, "hang")),
        "page_cache_pressure": lambda n: _fault(
            "page_cache_pressure",
            n,
            "PageCachePressureTailLatency",
            "ticket",
            OTHER_S,
            _pagecache(n, "page_cache_pressure:fraction=0.2,extra_s=0.3"),
        ),
        # 20 % of requests 0.3 s late: two modes, no TTFT over the SLO's 500 ms
        "bimodal": lambda n: _fault(
            "bimodal",
            n,
            "LatencyBimodal",
            "ticket",
            OTHER_S,
            _scenario(n, "page_cache_pressure:fraction=0.2,extra_s=0.3"),
        ),
        # 3 % of requests 1 s late: a tail (under the bimodality detector's 5 % minor mode), no second mode
        "tail_ratio": lambda n: _fault(
            "tail_ratio",
            n,
            "TailLatencyRatioHigh",
            "ticket",
            OTHER_S,
            _scenario(n, "page_cache_pressure:fraction=0.03,extra_s=1.0"),
        ),
        "stream_usage_only": lambda n: _fault(
            "stream_usage_only", n, "StreamSchemaViolation", "ticket", OTHER_S, _scenario(n, "stream_usage_only")
        ),
        # every engine step 20x slower (a degraded device): most TTFTs over 500 ms, the node's model burns its SLO
        # (2.0 min to the page, 2026-12-07). At 30x a full chunked-prefill step takes over 6 s: no token for 6 s
        # with 60 requests running is the hang detector's fast path, and EngineHangRecovering then held the SLO page
        # back (alertmanager.yml); a device that slow is a hang to the detector, not this scenario.
        "ttft_burn": lambda n: _fault(
            "ttft_burn",
            n,
            "TTFTErrorBudgetBurn",
            "pagerduty",
            OTHER_S,
            _scenario(n, "simd_fallback:factor=20"),
            model_label=True,
        ),
        "error_burst": lambda n: _fault(
            "error_burst",
            n,
            "EngineErrorRateHigh",
            "pagerduty",
            OTHER_S,
            _scenario(n, "error_burst:rate=0.3"),
            instance=lambda f, n=n: f[n].engine_instance,
        ),
        "simd_fallback": lambda n: _fault(
            "simd_fallback", n, "RuntimeSIMDFallback", "ticket", OTHER_S, _scenario(n, "simd_fallback")
        ),
        # issue 33: the engine signals and the named causes, each on a node with the engine feature it needs
        "prefix_cache_collapse": lambda n: _fault(
            "prefix_cache_collapse",
            n,
            "PrefixCacheHitRatioCollapsed",
            "ticket",
            OTHER_S,
            _scenario(n, "prefix_cache_collapse"),
        ),
        "spec_decode_collapse": lambda n: _fault(
            "spec_decode_collapse",
            n,
            "SpecDecodeAcceptanceCollapsed",
            "ticket",
            OTHER_S,
            _scenario(n, "spec_decode_collapse"),
        ),
        "kv_saturation": lambda n: _fault(
            "kv_saturation", n, "KVCacheSaturatedWithPreemptions", "ticket", OTHER_S, _scenario(n, "kv_saturation")
        ),
        "lora_slot_exhaustion": lambda n: _fault(
            "lora_slot_exhaustion",
            n,
            "LoRARequestsWaitingForAdapterSlot",
            "ticket",
            OTHER_S,
            _scenario(n, "lora_slot_exhaustion"),
        ),
        "slow_kv_transfer": lambda n: _fault(
            "slow_kv_transfer", n, "KVTransferSlow", "ticket", OTHER_S, _scenario(n, "slow_kv_transfer")
        ),
        "slow_rank": lambda n: _fault(
            "slow_rank",
            n,
            "DataParallelRankSlow",
            "ticket",
            OTHER_S,
            _scenario(n, "slow_rank"),
            instance=lambda f, n=n: f[n].engine_instance,
        ),
        # a GPU node's runtime restarted into an image whose kernels fall back to a narrower SIMD path (every step
        # 1.22x), no debug profile: only the engine's own time per token against its node's, tied to the SIMD view
        "simd_fallback_restart": lambda n: _fault(
            "simd_fallback_restart",
            n,
            "RuntimeSlowerAfterRestart",
            "ticket",
            OTHER_S,
            _restart_into(n, "simd_fallback"),
        ),
        "cgroup_thrashing": lambda n: _fault(
            "cgroup_thrashing",
            n,
            "RuntimePageCacheThrashing",
            "ticket",
            OTHER_S,
            _pagecache(n, "page_cache_pressure:fraction=0.2,extra_s=0.3", cgroup=True),
        ),
        "frontend_delay": lambda n: _fault(
            "frontend_delay", n, "FrontendDelayHigh", "ticket", OTHER_S, _scenario(n, "frontend_delay")
        ),
    }
    return [catalog[name](node) for name, node in assign.items()]


# --- the drill ---------------------------------------------------------------------------------------------------


@dataclass(frozen=True)
class NoiseEvent:
    """Something a healthy fleet does, at ``at`` (fraction of the healthy phase)."""

    at: float
    what: str
    action: Callable[[Fleet], None]


def noise(names: dict[str, str]) -> list[NoiseEvent]:
    """The healthy phase's noise on the nodes ``names`` maps roles to (load_a, load_b, restart, redeploy, joiner)."""
    events: list[NoiseEvent] = []
    if "load_a" in names:
        a = names["load_a"]
        events += [
            NoiseEvent(0.12, f"load step on {a}: rate x2", lambda f: f[a].start_load(2 * f[a].spec.rate)),
            NoiseEvent(0.40, f"load step on {a}: rate back", lambda f: f[a].start_load(f[a].spec.rate)),
        ]
    if "load_b" in names:
        b = names["load_b"]
        events += [
            NoiseEvent(0.62, f"load step on {b}: rate /2", lambda f: f[b].start_load(f[b].spec.rate / 2)),
            NoiseEvent(0.85, f"load step on {b}: rate back", lambda f: f[b].start_load(f[b].spec.rate)),
        ]
    if "restart" in names:
        r = names["restart"]
        events.append(NoiseEvent(0.25, f"runtime restart on {r}", lambda f: (f[r].stop_sim(), f[r].start_sim())))
    if "redeploy" in names:
        d = names["redeploy"]

        def redeploy(f: Fleet) -> None:
            node = f[d]
            node.stop_sim()
            node.start_sim(node.model + "-v2")  # a new model revision: new model label, same size from the name

        events.append(NoiseEvent(0.45, f"model redeploy on {d}", redeploy))
    if "joiner" in names:
        j = names["joiner"]
        events += [
            NoiseEvent(0.50, f"node {j} joins", lambda f: f.join(j)),
            NoiseEvent(0.80, f"node {j} leaves", lambda f: f.leave(j)),
        ]
    return sorted(events, key=lambda e: e.at)


@dataclass
class FaultResult:
    fault: str
    node: str
    machine_type: str
    alertname: str
    receiver: str
    target_s: float
    injected_at: float = 0.0  # monotonic
    delivered_s: float | None = None  # injection → first firing delivery at the receiver
    recovered_at: float | None = None
    resolved_s: float | None = None  # recovery → resolved delivery
    other_deliveries: list[str] = field(default_factory=list)  # other alerts delivered about this node
    repeats: int = 0  # incidents its own alert opened after the first (fleet.incidents)
    baseline: str | None = None  # the delivered alert's `baseline` label: what a history-comparing rule compared with


def _model_of(d: Delivery) -> str:
    """The delivered alert's model label (webhook: the alert's labels; PagerDuty: custom_details.labels)."""
    model = (d.alert.get("labels") or {}).get("gen_ai_request_model", "")
    if not model:
        pairs = d.body.get("payload", {}).get("custom_details", {}).get("labels", "").split()
        model = dict(p.split("=", 1) for p in pairs if "=" in p).get("gen_ai_request_model", "")
    return model


def _fired(d: Delivery) -> bool:
    return d.action in ("trigger", "firing")


def _resolved(d: Delivery) -> bool:
    return d.action in ("resolve", "resolved")


def _describe(d: Delivery, t0: float) -> dict[str, Any]:
    labels = d.alert.get("labels") or {}
    if not labels:
        pairs = d.body.get("payload", {}).get("custom_details", {}).get("labels", "").split()
        labels = dict(p.split("=", 1) for p in pairs if "=" in p)
    keep = ("instance", "gen_ai_request_model", "slo", "burn_rate", "feature", "collector", "quantity", "baseline")
    return {
        "t_s": round(d.t - t0, 1),
        "receiver": d.receiver,
        "alertname": d.alertname,
        "action": d.action,
        "labels": {k: v for k, v in labels.items() if k in keep},
    }


def incidents(descs: Sequence[dict[str, Any]]) -> int:
    """How many times the described deliveries (of one alert at one receiver, :func:`_describe`'s form) opened a new
    incident for a person: one notification (the deliveries of one arrival: a webhook carries every alert of its
    Alertmanager group, a PagerDuty event one) opens its group's incident when none is open; a notification with none
    of its alerts firing closes it. A renotification of an open group (a group_interval tick after another alert
    joined it, or the agent's pushed copy and the rule's flipping its state) is an update of the same PagerDuty
    incident (same dedup key) or ticket, not a new one. The group is the route's: the alert's name, or its SLO for
    the SLO pages (one group per SLO), its instance and its model."""
    notes: dict[tuple[float, str], list[dict[str, Any]]] = {}
    for d in descs:
        notes.setdefault((d["t_s"], d["receiver"]), []).append(d)
    opened, open_groups = 0, set()
    for (_, receiver), group in sorted(notes.items()):
        for key in {_group_of(d, receiver) for d in group}:
            firing = any(_group_of(d, receiver) == key and d["action"] in ("trigger", "firing") for d in group)
            if firing and key not in open_groups:
                open_groups.add(key)
                opened += 1
            elif not firing:
                open_groups.discard(key)
    return opened


def _group_of(d: dict[str, Any], receiver: str) -> tuple[str, ...]:
    labels = d.get("labels", {})
    return (
        receiver,
        labels.get("slo") or d["alertname"],
        labels.get("instance", ""),
        labels.get("gen_ai_request_model", ""),
    )


@dataclass
class DrillResult:
    healthy_s: float
    noise: list[dict[str, Any]]
    healthy_deliveries: list[dict[str, Any]]
    faults: list[FaultResult]
    fault_phase_deliveries: list[dict[str, Any]]
    watchdog_s: float | None


def run_drill(
    fleet: Fleet,
    healthy_s: float,
    events: Sequence[NoiseEvent],
    fault_list: Sequence[Fault],
    deliver_timeout_s: float,
    resolve_timeout_s: float,
    hold_s: float,
    log: Callable[[str], None] = print,
    settle_s: float = 0.0,
) -> DrillResult:
    """Healthy phase (``events`` at their times), then every fault injected at once, each on its own node; each
    fault recovers ``hold_s`` after its page arrived (or at ``deliver_timeout_s``), and its resolution is
    awaited up to ``resolve_timeout_s``; then ``settle_s`` more of watching, so that what a recovered node delivers
    later (a symptom whose inhibiting cause resolved first, a backlog's page) is counted as collateral too."""
    sink = fleet.sink
    start = time.monotonic()
    watchdog = sink.wait_for(lambda d: d.alertname == "Watchdog", 120)
    if watchdog is None:
        raise RuntimeError("Watchdog never reached the dead-man's switch: the vmalert → Alertmanager path is down")
    t0 = time.monotonic()
    log(f"pipeline live (Watchdog after {watchdog.t - start:.1f}s); healthy phase {healthy_s:.0f}s")
    done_noise: list[dict[str, Any]] = []
    for ev in events:
        wait = t0 + ev.at * healthy_s - time.monotonic()
        if wait > 0:
            time.sleep(wait)
        log(f"noise +{time.monotonic() - t0:.0f}s: {ev.what}")
        ev.action(fleet)
        done_noise.append({"t_s": round(time.monotonic() - t0, 1), "what": ev.what})
    left = t0 + healthy_s - time.monotonic()
    if left > 0:
        time.sleep(left)
    t_fault = time.monotonic()
    healthy = [_describe(d, t0) for d in sink.snapshot() if d.alertname != "Watchdog" and d.t < t_fault]
    log(f"healthy phase over after {t_fault - t0:.0f}s: {len(healthy)} deliveries")

    results: dict[str, FaultResult] = {}
    for fault in fault_list:
        node = fleet[fault.node]
        if fault.name == "hang":  # a hang is of an engine that was serving
            deadline = time.monotonic() + 60
            while node.generation_tokens() == 0 and time.monotonic() < deadline:
                time.sleep(1)
        fault.inject(fleet)
        results[fault.name] = FaultResult(
            fault.name,
            fault.node,
            node.spec.machine_type,
            fault.alertname,
            fault.receiver,
            fault.target_s,
            injected_at=time.monotonic(),
        )
        log(f"injected {fault.name} on {fault.node}")

    pending = {f.name: f for f in fault_list}
    while pending:
        now = time.monotonic()
        snap = sink.snapshot()
        for name, fault in list(pending.items()):
            res = results[name]
            if res.recovered_at is None:
                hit = next((d for d in snap if d.t >= res.injected_at and _fired(d) and fault.matches(d, fleet)), None)
                if hit is not None and res.delivered_s is None:
                    res.delivered_s = round(hit.t - res.injected_at, 1)
                    res.baseline = _describe(hit, 0.0)["labels"].get("baseline")
                    log(f"{name}: {fault.alertname} at {fault.receiver} after {res.delivered_s}s")
                since = (hit.t + hold_s) if hit is not None else (res.injected_at + deliver_timeout_s)
                if now >= since:
                    fault.recover(fleet)
                    res.recovered_at = time.monotonic()
                    log(f"recovered {name}" + ("" if hit else " (no page arrived)"))
                    if hit is None:
                        del pending[name]
            else:
                back = next(
                    (d for d in snap if d.t >= res.recovered_at and _resolved(d) and fault.matches(d, fleet)), None
                )
                if back is not None:
                    res.resolved_s = round(back.t - res.recovered_at, 1)
                    log(f"{name}: resolved after {res.resolved_s}s")
                    del pending[name]
                elif now > res.recovered_at + resolve_timeout_s:
                    log(f"{name}: not resolved within {resolve_timeout_s:.0f}s")
                    del pending[name]
        time.sleep(1)
    if settle_s > 0:
        log(f"every fault recovered; watching {settle_s:.0f}s more for late deliveries")
        time.sleep(settle_s)

    snap = sink.snapshot()
    expected = [(f, fleet[f.node]) for f in fault_list]
    fault_phase = [_describe(d, t0) for d in snap if d.t >= t_fault and d.alertname != "Watchdog"]
    for fault, node in expected:
        own = {(fault.alertname, fault.receiver)}
        others = {
            f"{d.alertname}@{d.receiver}"
            for d in snap
            if d.t >= t_fault
            # its node's alerts, and a model's alerts that carry no instance (the SLO pages): another node that
            # serves the same model is another node
            and (d.instance in (node.instance, node.engine_instance) or (not d.instance and _model_of(d) == node.model))
            and (d.alertname, d.receiver) not in own
            and d.receiver != "agent-evidence"  # the agent's evidence capture (critical alerts), not a person
            and _fired(d)
        }
        results[fault.name].other_deliveries = sorted(others)
        mine = [_describe(d, t0) for d in snap if d.t >= results[fault.name].injected_at and fault.matches(d, fleet)]
        results[fault.name].repeats = max(0, incidents(mine) - 1)  # a new incident again within the same episode
    return DrillResult(
        healthy_s, done_noise, healthy, list(results.values()), fault_phase, round(watchdog.t - start, 1)
    )


def matrix(prometheus: str, window: str, recorded: bool) -> dict[str, Any]:
    """``inferwatch matrix`` against the fleet storage, as JSON."""
    cmd = [
        PYTHON,
        "-m",
        "inferwatch.agent",
        "matrix",
        "--prometheus",
        prometheus,
        "--window",
        window,
        "--format",
        "json",
    ]
    r = subprocess.run(
        [*cmd, *(["--recorded"] if recorded else [])], cwd=ROOT, capture_output=True, text=True, timeout=120
    )
    if r.returncode != 0:
        return {"error": (r.stderr or r.stdout)[-2000:]}
    return dict(json.loads(r.stdout))


def hardware_types(data: dict[str, Any]) -> set[str]:
    return {c["hardware"]["machine_type"] for c in data.get("cells", [])}


def result_json(result: DrillResult) -> dict[str, Any]:
    return {
        "healthy_phase_s": result.healthy_s,
        "watchdog_s_from_start": result.watchdog_s,
        "noise": result.noise,
        "healthy_deliveries": result.healthy_deliveries,
        "faults": [
            {k: v for k, v in dataclasses.asdict(r).items() if k not in ("injected_at", "recovered_at")}
            for r in result.faults
        ],
        "fault_phase_deliveries": result.fault_phase_deliveries,
    }
