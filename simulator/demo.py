"""``inferwatch demo``: the simulator, the load generator and the agent on localhost, until Ctrl-C.

Every child runs in its own process group (session); on SIGINT/SIGTERM (or ``duration_s``) the demo
stops them in reverse order — load generator, agent, simulator — with SIGTERM to the group, then
SIGKILL after a grace period, and returns only when every child has been reaped.
"""

from __future__ import annotations

import contextlib
import os
import secrets
import signal
import socket
import subprocess
import sys
import tempfile
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path

import httpx

STOP_GRACE_S = 10.0
START_TIMEOUT_S = 60.0
LOADGEN_CHUNK_S = 3600.0  # one loadgen run; restarted while the demo lives
USAGE_EXIT = 2  # a child's exit status for arguments it refuses


def port_free(port: int, host: str = "127.0.0.1") -> bool:
    with socket.socket() as s:
        try:
            s.bind((host, port))
        except OSError:
            return False
    return True


def pick_port(preferred: int) -> int:
    """``preferred`` if it is free, else any free port."""
    if preferred and port_free(preferred):
        return preferred
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


@dataclass
class DemoConfig:
    sim_port: int = 8000
    agent_port: int = 9435
    otlp_grpc_port: int = 4317
    otlp_http_port: int = 4318
    hardware: str = "h100"
    model: str = "meta-llama/Llama-3.1-8B-Instruct"
    engines: int = 2
    rate: float = 5.0
    protocol: str = "chat"
    scenarios: tuple[str, ...] = ()
    seed: int = 0
    duration_s: float | None = None
    log_dir: Path | None = None
    python: str = sys.executable
    extra_env: dict[str, str] = field(default_factory=dict)


@dataclass
class Child:
    name: str
    cmd: list[str]
    log: Path
    env: dict[str, str]
    proc: subprocess.Popen[bytes] | None = None

    def start(self, cwd: Path) -> None:
        out = open(self.log, "ab")  # noqa: SIM115 - owned by the child process for its lifetime
        try:
            self.proc = subprocess.Popen(
                self.cmd, cwd=cwd, stdout=out, stderr=subprocess.STDOUT, env={**os.environ, **self.env},
                start_new_session=True,
            )  # fmt: skip
        finally:
            out.close()

    def alive(self) -> bool:
        return self.proc is not None and self.proc.poll() is None

    def stop(self, grace_s: float = STOP_GRACE_S) -> None:
        if self.proc is None:
            return
        if self.proc.poll() is None:
            with contextlib.suppress(ProcessLookupError):
                os.killpg(self.proc.pid, signal.SIGTERM)
            try:
                self.proc.wait(grace_s)
            except subprocess.TimeoutExpired:
                with contextlib.suppress(ProcessLookupError):
                    os.killpg(self.proc.pid, signal.SIGKILL)
                self.proc.wait(5)
        # anything the child left in its group goes too
        with contextlib.suppress(ProcessLookupError, PermissionError):
            os.killpg(self.proc.pid, signal.SIGKILL)

    def tail(self, n: int = 15) -> str:
        try:
            return "\n".join(self.log.read_text(errors="replace").splitlines()[-n:])
        except OSError:
            return ""


def _wait_http(url: str, child: Child, timeout_s: float) -> None:
    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline:
        if not child.alive():
            raise RuntimeError(f"{child.name} exited early; last log lines:\n{child.tail()}")
        try:
            if httpx.get(url, timeout=2.0).status_code == 200:
                return
        except httpx.HTTPError:
            pass
        time.sleep(0.2)
    raise RuntimeError(f"{child.name} did not answer {url} within {timeout_s:.0f} s; log: {child.log}")


class Demo:
    def __init__(self, config: DemoConfig, cwd: Path, echo: Callable[[str], None] = print) -> None:
        self.c = config
        self.cwd = cwd
        self.echo = echo
        self.token = secrets.token_urlsafe(12)
        self.log_dir = config.log_dir or Path(tempfile.mkdtemp(prefix="inferwatch-demo-"))
        self.log_dir.mkdir(parents=True, exist_ok=True)
        self.sim_port = pick_port(config.sim_port)
        self.agent_port = pick_port(config.agent_port)
        self.grpc_port = pick_port(config.otlp_grpc_port)
        self.http_port = pick_port(config.otlp_http_port)
        self.children: list[Child] = []
        self._stop = False

    def _children(self) -> tuple[Child, Child, Child]:
        c, py = self.c, self.c.python
        sim_cmd = [
            py, "-m", "inferwatch.agent", "simulate", "--port", str(self.sim_port), "--model", c.model, "--hardware",
            c.hardware,
            "--engines", str(c.engines), "--seed", str(c.seed), "--debug-profile",
            "--otlp-traces-endpoint", f"http://127.0.0.1:{self.grpc_port}",
        ]  # fmt: skip
        for s in c.scenarios:
            sim_cmd += ["--scenario", s]
        sim = Child("simulator", sim_cmd, self.log_dir / "simulator.log", {"INFERWATCH_SIM_CONTROL_TOKEN": self.token})
        agent_env = {
            "INFERWATCH_ENGINE__METRICS_URL": f"http://127.0.0.1:{self.sim_port}/metrics",
            "INFERWATCH_RECEIVER__ENABLED": "true",
            "INFERWATCH_RECEIVER__GRPC_ENDPOINT": f"127.0.0.1:{self.grpc_port}",
            "INFERWATCH_RECEIVER__HTTP_ENDPOINT": f"127.0.0.1:{self.http_port}",
            # Diagnostics: the debug runtime_profile (redacted) and the streaming probe against the simulator.
            "INFERWATCH_RUNTIME_PROFILE__URL": f"http://127.0.0.1:{self.sim_port}/debug/runtime_profile",
            "INFERWATCH_PROBE__URL": f"http://127.0.0.1:{self.sim_port}",
            **c.extra_env,
        }
        agent = Child(
            "agent",
            [py, "-m", "inferwatch.agent", "run", "--port", str(self.agent_port)],
            self.log_dir / "agent.log",
            agent_env,
        )
        load_cmd = [
            py, "-m", "inferwatch.agent", "loadgen", "--url", f"http://127.0.0.1:{self.sim_port}", "--rate",
            str(c.rate),
            "--protocol", c.protocol, "--duration", str(LOADGEN_CHUNK_S), "--prompt-tokens", "lognormal:200:0.6",
            "--output-tokens", "lognormal:120:0.5", "--shared-prefix-tokens", "64", "--seed", str(c.seed),
            "--no-progress",
        ]  # fmt: skip
        load = Child("loadgen", load_cmd, self.log_dir / "loadgen.log", {})
        return sim, agent, load

    def request_stop(self, *_: object) -> None:
        self._stop = True

    def run(self) -> int:
        sim, agent, load = self._children()
        self.children = [sim, agent, load]
        old = {s: signal.signal(s, self.request_stop) for s in (signal.SIGINT, signal.SIGTERM)}
        try:
            sim.start(self.cwd)
            _wait_http(f"http://127.0.0.1:{self.sim_port}/health", sim, START_TIMEOUT_S)
            if sim.proc is not None:  # the runtime the agent watches (process, SIMD, binary check) is the simulator
                agent.env.setdefault("INFERWATCH_RUNTIME__PID", str(sim.proc.pid))
            agent.start(self.cwd)
            _wait_http(f"http://127.0.0.1:{self.agent_port}/healthz", agent, START_TIMEOUT_S)
            load.start(self.cwd)
            self._banner()
            deadline = time.monotonic() + self.c.duration_s if self.c.duration_s else float("inf")
            while not self._stop and time.monotonic() < deadline:
                for child in (sim, agent):
                    if not child.alive():
                        self.echo(f"inferwatch demo: {child.name} exited; last log lines:\n{child.tail()}")
                        return 1
                if not load.alive():
                    if load.proc is not None and load.proc.returncode == USAGE_EXIT:  # restarting cannot help
                        self.echo(f"inferwatch demo: loadgen refused its arguments; last log lines:\n{load.tail()}")
                        return 1
                    load.start(self.cwd)
                time.sleep(0.2)
            return 0
        except RuntimeError as exc:
            self.echo(f"inferwatch demo: {exc}")
            return 1
        finally:
            self.shutdown()
            for s, handler in old.items():
                signal.signal(s, handler)

    def shutdown(self) -> None:
        for child in reversed(self.children):
            child.stop()
        self.echo(
            "inferwatch demo: stopped " + ", ".join(f"{c.name} (pid {c.proc.pid})" for c in self.children if c.proc)
        )

    def _banner(self) -> None:
        s, a = f"http://127.0.0.1:{self.sim_port}", f"http://127.0.0.1:{self.agent_port}"
        pids = " ".join(f"{c.name}={c.proc.pid}" for c in self.children if c.proc)
        self.echo(
            f"inferwatch demo is running — open the node status page: {a}/   (Ctrl-C stops everything)\n"
            f"  terminal    inferwatch top --agent {a}\n"
            f"  agent       {a}/api/v1/status   {a}/metrics\n"
            f"  simulator   {s}/v1/chat/completions   {s}/metrics (vLLM)   {s}/debug/runtime_profile\n"
            f"  load        {self.c.protocol} at {self.c.rate:g} req/s (Poisson), log {self.log_dir}/loadgen.log\n"
            f"  spans       simulator -> OTLP gRPC 127.0.0.1:{self.grpc_port} (agent receiver)\n"
            f"  faults      curl -H 'Authorization: Bearer {self.token}' -d '{{\"enable\": \"simd_fallback\"}}' "
            f"{s}/control/scenario\n"
            f"  logs        {self.log_dir}\n"
            f"  children    {pids}",
        )
