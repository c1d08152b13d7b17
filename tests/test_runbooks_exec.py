"""Runbooks executed, not just linted: every ```sh block of every runbook, pasted into bash against a live stack.

The stack: the simulator (vLLM-shaped, ``--debug-profile``), an agent reading it like the compose agent (engine,
probe, runtime_profile, the runtime found by its command line, an API token file), a second agent on a crafted
procfs whose /proc/meminfo is garbage (CollectorFailing), and Prometheus + Alertmanager with the shipped rules and
routes (tests/e2e/harness.py: rules compressed by 60, 1 s intervals). ``$PROM``, ``$NODE``, ``$AGENT``,
``$RUNTIME``, ``$TOKEN``, ``$AM`` and ``$AM_CONFIG`` are set the way the runbooks' first block says.

For each runbook its fault is made active first (a simulator scenario, the crafted procfs, the agent or the engine
stopped), then its blocks run in one bash process, in order, so a block sees what earlier blocks set (``$PID``).
Each block must exit 0, print no ``command not found`` / traceback, and print the evidence its text tells the
reader to look for (``EVIDENCE``). A block preceded by ``<!-- needs: X -->`` (gpu, root, systemd, llama-server,
network) is not run here; the test records it as skipped with that reason (``test_blocks_that_need_what_ci_lacks``
lists them). The runbooks with no shell beyond the variables block are listed in ``PROMQL_ONLY``.
"""

from __future__ import annotations

import contextlib
import os
import re
import subprocess
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path

import httpx
import pytest

from tests.alerting import RUNBOOKS_DIR, alert_names
from tests.conftest import PYTHON, ROOT, free_port
from tests.e2e.harness import Pipeline, Sink, pipeline
from tests.procs import running, stop, wait_http

pytestmark = [pytest.mark.integration, pytest.mark.slow]

BLOCK_RE = re.compile(r"(?:<!-- needs: (?P<needs>[a-z-]+) -->\n[ \t]*)?```(?:sh|bash)\n(?P<body>.*?)```", re.S)
CI_LACKS = {"gpu", "root", "systemd", "llama-server", "network"}
TOKEN = "runbook-exec-operator-token"
CONTROL_TOKEN = "runbook-exec-control-token"
BROKEN_RE = re.compile(
    r"command not found|Traceback \(most recent call last\)|^(?:bash|tr|cat|grep|ldd|readlink|ps): .*|jq: error", re.M
)

# runbook → (simulator scenario active while it runs, or None; what its output must show)
FAULTS: dict[str, str | None] = {
    "StreamSchemaViolation": "stream_usage_only",
    "EngineHungButHealthy": "hang",
    "RuntimeProfileUnavailable": "debug_disabled",
    "RuntimeHardwareMismatch": "hardware_mismatch",
    "EngineErrorRateHigh": "error_burst:rate=1",  # every request fails: the hand-made one too
    "EngineErrorBudgetBurn": "error_burst:rate=1",
    "RuntimeSIMDFallback": "simd_fallback",
}
EVIDENCE: dict[str, list[str]] = {
    "AgentDown": [r"down", r"Connection refused|Failed to connect"],  # run with that agent stopped
    "CollectorFailing": [r"pagecache"],  # the failing collector named, from the crafted procfs
    "CPUFeatureMissing": [r'"kernel_release"'],
    "DebugProfileEnabledInProduction": [r'^\{"', r"agent simulate .*--debug-profile"],  # a real profile, the flag
    "EngineDown": [r"^000 0 bytes"],  # run with the engine stopped
    "EngineErrorBudgetBurn": [r'^http_requests_total\{.*status="5xx"'],
    "EngineErrorRateHigh": [r'^http_requests_total\{.*status="5xx"', r"^HTTP 5\d\d$", r"scenario error_burst"],
    "EngineHungButHealthy": [r"agent simulate"],  # ps found the runtime by the agent's pid
    "LatencyBimodal": [r'"collectors"'],
    "LatencyRegressionAfterNodeChange": [r'"kernel_release"'],
    "PageCachePressureTailLatency": [r"Inactive\(file\)", r"some avg10="],
    "RuntimeHardwareMismatch": [r"every library of /\S+ resolves", r"compatible: True", r'"pid": \d+'],
    "RuntimeProfileUnavailable": [r"^\{\}$"],
    "RuntimeSIMDFallback": [
        r'^simd_features_active \["avx2", "fma"\]',
        r'^inferwatch_runtime_profile_simd_inactive\{.*feature="avx512f".*\} 1\.0',
        r"no ISA override",
    ],  # the empty profile, asked for with the debug header
    "SIMDUnusedWhileServing": [r"^inferwatch_runtime_simd_capable"],
    "StreamSchemaViolation": [r"^VIOLATION choices and usage in one chunk", r"off-schema chunks; terminator present"],
    "TailLatencyRatioHigh": [r'"collectors"'],
    "TTFTErrorBudgetBurn": [],
    "GPUThrottling": [],
    "GPUErrorNeedsDrain": [],
    "GPUDecodeMemoryBound": [],
    "Watchdog": [r'"alertname": "Watchdog"', r"SUCCESS"],
}
# Nothing but the variables block runs here: PromQL only, or every shell block needs what CI lacks.
PROMQL_ONLY = {"TTFTErrorBudgetBurn", "GPUThrottling", "GPUErrorNeedsDrain", "GPUDecodeMemoryBound"}
ORDER_LAST = ("AgentDown", "EngineDown")  # they stop the agent / the engine the others need


@dataclass(frozen=True)
class Block:
    runbook: str
    index: int
    needs: str | None
    body: str


def blocks(name: str) -> list[Block]:
    text = (RUNBOOKS_DIR / f"{name}.md").read_text(encoding="utf-8")
    return [
        Block(name, i, m.group("needs"), re.sub(r"^   ", "", m.group("body"), flags=re.M))
        for i, m in enumerate(BLOCK_RE.finditer(text))
    ]


def test_every_runbook_has_evidence_and_its_blocks_are_classified() -> None:
    assert set(EVIDENCE) == alert_names(), "a runbook without expected evidence (or evidence for no runbook)"
    for name in EVIDENCE:
        bs = blocks(name)
        assert bs and "PROM=${PROM:-" in bs[0].body, f"{name}: the first block must set the variables"
        for b in bs:
            assert b.needs is None or b.needs in CI_LACKS, f"{name} block {b.index}: unknown need {b.needs}"
        runnable = [b for b in bs[1:] if b.needs is None]
        assert bool(runnable) != (name in PROMQL_ONLY), f"{name}: runnable blocks {len(runnable)}"


def test_blocks_that_need_what_ci_lacks() -> None:
    """The blocks this test does not run, with the reason: the list the report names."""
    skipped = {(b.runbook, b.index, b.needs) for n in EVIDENCE for b in blocks(n) if b.needs}
    reasons = {needs for _, _, needs in skipped}
    assert reasons <= CI_LACKS
    assert ("EngineHungButHealthy", 2, "root") in skipped  # py-spy dump: ptrace


def run_blocks(name: str, env: dict[str, str], workdir: Path) -> list[tuple[Block, int, str]]:
    """The runbook's runnable blocks in one bash, in order; (block, exit status, output) each."""
    runnable = [b for b in blocks(name) if b.needs is None]
    script = ""
    for b in runnable:
        script += f"echo '@@begin {b.index}'\n{b.body}\necho \"@@end {b.index} $?\"\n"
    path = workdir / f"{name}.sh"
    path.write_text(script)
    r = subprocess.run(["bash", str(path)], env=env, capture_output=True, text=True, timeout=120, cwd=workdir)
    out = r.stdout + r.stderr
    results = []
    for b in runnable:
        m = re.search(rf"^@@begin {b.index}\n(.*?)^@@end {b.index} (\d+)$", r.stdout, re.S | re.M)
        assert m, f"{name} block {b.index} did not finish:\n{out[-3000:]}"
        results.append((b, int(m.group(2)), m.group(1)))
    # stderr is not interleaved with the markers: attribute it to the runbook as a whole
    if r.stderr.strip():
        results.append((Block(name, -1, None, "stderr"), 0, r.stderr))
    return results


@dataclass
class Stack:
    sim_url: str
    sim: subprocess.Popen[bytes]
    agent_url: str
    agent: subprocess.Popen[bytes]
    broken_url: str
    broken: subprocess.Popen[bytes]
    pl: Pipeline
    am_config: Path
    tmp: Path

    def scenario(self, name: str | None) -> None:
        body = {"scenarios": [name] if name else []}  # NAME or NAME:key=value,... as the simulator reads it
        auth = {"Authorization": f"Bearer {CONTROL_TOKEN}"}
        httpx.post(f"{self.sim_url}/control/scenario", json=body, headers=auth, timeout=10).raise_for_status()


def _agent_env(tokens: Path, sim_url: str | None = None) -> dict[str, str]:
    env = {k: v for k, v in os.environ.items() if not k.startswith(("INFERWATCH_", "OTEL_"))}
    env["INFERWATCH_API__TOKENS_FILE"] = str(tokens)
    if sim_url:
        env |= {
            "INFERWATCH_ENGINE__METRICS_URL": f"{sim_url}/metrics",
            "INFERWATCH_PROBE__URL": sim_url,
            "INFERWATCH_PROBE__INTERVAL_S": "1",
            "INFERWATCH_RUNTIME_PROFILE__URL": f"{sim_url}/debug/runtime_profile",
            "INFERWATCH_RUNTIME_PROFILE__INTERVAL_S": "1",
            "INFERWATCH_RUNTIME__CMDLINE_PATTERN": rf"-m agent simulate --port {sim_url.rsplit(':', 1)[1]} ",
            "INFERWATCH_RUNTIME__NAME": "simulator",
        }
    return env


@pytest.fixture(scope="module")
def stack(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Stack]:
    tmp = tmp_path_factory.mktemp("runbooks-exec")
    tokens = tmp / "tokens"
    tokens.write_text(f"{TOKEN} read,snapshots,profile,evidence operator\n")
    tokens.chmod(0o600)
    broken_procfs = tmp / "procfs"
    broken_procfs.mkdir()
    (broken_procfs / "meminfo").write_text("this is not /proc/meminfo\n")
    (broken_procfs / "cmdline").write_text("BOOT_IMAGE=/vmlinuz ro quiet\n")
    with contextlib.ExitStack() as es:
        sink = es.enter_context(Sink())
        sim_port = free_port()
        sim_url = f"http://127.0.0.1:{sim_port}"
        sim_cmd = [PYTHON, "-m", "agent", "simulate", "--port", str(sim_port), "--seed", "6", "--debug-profile"]
        sim_cmd += [
            "--hardware",
            "sapphirerapids-cpu",
        ]  # a CPU node: its profile lists SIMD features (RuntimeSIMDFallback)
        sim_cmd += ["--control-token", CONTROL_TOKEN, "--log-level", "warning"]
        sim = es.enter_context(running(sim_cmd, tmp / "sim.log", cwd=ROOT))
        agent_port, broken_port = free_port(), free_port()
        agent_cmd = [PYTHON, "-m", "agent", "run", "--port", str(agent_port), "--interval", "0.5"]
        agent = es.enter_context(
            running([*agent_cmd, "--environment", "demo"], tmp / "agent.log", cwd=ROOT, env=_agent_env(tokens, sim_url))
        )
        broken_cmd = [PYTHON, "-m", "agent", "run", "--port", str(broken_port), "--interval", "0.5"]
        broken = es.enter_context(
            running(
                [*broken_cmd, "--path.procfs", str(broken_procfs)], tmp / "broken.log", cwd=ROOT, env=_agent_env(tokens)
            )
        )
        wait_http(f"{sim_url}/health", proc=sim, timeout_s=60)
        loadgen = [PYTHON, "-m", "agent", "loadgen", "--url", sim_url, "--rate", "2", "--duration", "600"]
        loadgen += ["--output-tokens", "16", "--timeout", "600", "--no-progress"]
        es.enter_context(running(loadgen, tmp / "loadgen.log", cwd=ROOT))
        for url, proc in ((f"http://127.0.0.1:{agent_port}", agent), (f"http://127.0.0.1:{broken_port}", broken)):
            wait_http(f"{url}/readyz", ok=lambda r: r.status_code == 200, proc=proc, timeout_s=90)
        runbook_base = f"http://127.0.0.1:{agent_port}/runbooks"
        pl = es.enter_context(pipeline(tmp / "pipeline", sink, [agent_port, broken_port], runbook_base))
        _wait(lambda: len(pl.query('up{job="inferwatch-agent"} == 1')) == 2)  # both scraped: $PROM has data
        yield Stack(
            sim_url,
            sim,
            f"http://127.0.0.1:{agent_port}",
            agent,
            f"http://127.0.0.1:{broken_port}",
            broken,
            pl,
            tmp / "pipeline" / "alertmanager.yml",
            tmp,
        )


def _env(stack: Stack, agent_url: str) -> dict[str, str]:
    env = {k: v for k, v in os.environ.items() if not k.startswith("INFERWATCH_")}
    env["PATH"] = f"{Path(PYTHON).parent}:{env.get('PATH', '/usr/bin:/bin')}"
    node = agent_url.removeprefix("http://")
    env |= {
        "PROM": stack.pl.prometheus_url,
        "NODE": node,
        "AGENT": agent_url,
        "RUNTIME": stack.sim_url,
        "TOKEN": TOKEN,
        "AM": stack.pl.alertmanager_url,
        "AM_CONFIG": str(stack.am_config),
    }
    return env


def _wait(pred, timeout_s: float = 60.0) -> None:  # type: ignore[no-untyped-def]
    import time

    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline:
        with contextlib.suppress(httpx.HTTPError, KeyError, ValueError):
            if pred():
                return
        time.sleep(0.5)
    raise AssertionError("condition not reached in time")


def _status(url: str) -> dict:  # type: ignore[type-arg]
    return httpx.get(f"{url}/api/v1/status", headers={"Authorization": f"Bearer {TOKEN}"}, timeout=5).json()


ORDERED = sorted(n for n in EVIDENCE if n not in ORDER_LAST) + list(ORDER_LAST)


@pytest.mark.parametrize("name", ORDERED)
def test_runbook_blocks_run_and_show_the_evidence(stack: Stack, name: str) -> None:
    agent_url = stack.agent_url
    stack.scenario(FAULTS.get(name))
    if name in FAULTS:
        # the agent has seen the fault: a probe / profile / engine collection after the switch
        import time

        time.sleep(3)
    if name == "CollectorFailing":
        agent_url = stack.broken_url
        _wait(lambda: any(c["state"] == "failed" for c in _status(agent_url)["collectors"]))
    if name == "AgentDown":
        agent_url = stack.broken_url
        stop(stack.broken)
        _wait(lambda: any(t["health"] == "down" for t in _targets(stack.pl.prometheus_url)))
    if name == "EngineDown":
        stop(stack.sim)
    if name == "RuntimeHardwareMismatch":
        _wait(lambda: "hardware_mismatch" in httpx.get(f"{stack.agent_url}/metrics", timeout=5).text)
    results = run_blocks(name, _env(stack, agent_url), stack.tmp)
    output = "\n".join(out for _, _, out in results)
    for block, rc, out in results:
        assert rc == 0, f"{name} block {block.index} exited {rc}:\n{out[-2000:]}"
        hit = BROKEN_RE.search(out)
        assert hit is None, f"{name} block {block.index}: {hit.group(0) if hit else ''}\n{out[-2000:]}"
    for pattern in EVIDENCE[name]:
        assert re.search(pattern, output, re.M), f"{name}: no {pattern!r} in the output:\n{output[-3000:]}"


def _targets(prom: str) -> list[dict]:  # type: ignore[type-arg]
    r = httpx.get(f"{prom}/api/v1/targets", timeout=5)
    return list(r.json()["data"]["activeTargets"])
