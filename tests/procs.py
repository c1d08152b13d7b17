"""Start and always stop real processes in tests (bounded waits, process-group kill)."""

from __future__ import annotations

import contextlib
import os
import signal
import subprocess
import time
from collections.abc import Callable, Iterator, Sequence
from pathlib import Path

import httpx


def wait_http(
    url: str,
    timeout_s: float = 120.0,
    ok: Callable[[httpx.Response], bool] | None = None,
    proc: subprocess.Popen[bytes] | None = None,
) -> httpx.Response:
    """Poll ``url`` until it answers (and ``ok`` accepts it) or time runs out.

    The default bounds a hang, not a start-up time: on the suite's 2-core machine at load 10-17 a Python server's
    imports alone take ten seconds and more. A process that exits fails the wait at once (``proc``).

    One client for the whole wait: ``httpx.get`` builds a client, and with it a TLS context (~25 ms of CPU), per call,
    which at one poll every 0.1 s kept a fifth of a core busy for as long as a server took to start."""
    deadline = time.monotonic() + timeout_s
    last: Exception | None = None
    with httpx.Client(timeout=2.0) as client:
        while time.monotonic() < deadline:
            if proc is not None and proc.poll() is not None:
                raise RuntimeError(f"process exited with {proc.returncode} before {url} answered")
            try:
                r = client.get(url)
                if ok is None or ok(r):
                    return r
            except httpx.HTTPError as exc:
                last = exc
            time.sleep(0.1)
    raise TimeoutError(f"{url} did not answer within {timeout_s}s (last error: {last})")


def stop(proc: subprocess.Popen[bytes], timeout_s: float = 10.0) -> None:
    """SIGTERM the process group, then SIGKILL after ``timeout_s``."""
    if proc.poll() is not None:
        return
    with contextlib.suppress(ProcessLookupError):
        os.killpg(proc.pid, signal.SIGTERM)
    try:
        proc.wait(timeout_s)
    except subprocess.TimeoutExpired:
        with contextlib.suppress(ProcessLookupError):
            os.killpg(proc.pid, signal.SIGKILL)
        proc.wait(5)


@contextlib.contextmanager
def running(
    cmd: Sequence[str], log: Path, cwd: Path | None = None, env: dict[str, str] | None = None
) -> Iterator[subprocess.Popen[bytes]]:
    """Run ``cmd`` in its own process group with output to ``log``; always stopped on exit."""
    with open(log, "wb") as out:
        proc = subprocess.Popen(
            list(cmd),
            stdout=out,
            stderr=subprocess.STDOUT,
            cwd=cwd,
            env={**os.environ, **(env or {})},
            start_new_session=True,
        )
        try:
            yield proc
        finally:
            stop(proc)


@contextlib.contextmanager
def agent_beside_simulator(
    tmp_path: Path, sim_args: Sequence[str], agent_env: dict[str, str] | None = None
) -> Iterator[tuple[str, int, str]]:
    """A real agent receiving spans over OTLP/HTTP and a real simulator sending its spans there, both on 127.0.0.1
    and answering: yields the agent's base URL, the simulator's port and the span endpoint (for client spans too).
    ``sim_args`` are the simulator's flags past its port and endpoint; ``agent_env`` adds to the agent's settings."""
    from tests.conftest import PYTHON, ROOT, free_port

    sim_port, agent_port, spans_port = free_port(), free_port(), free_port()
    endpoint = f"http://127.0.0.1:{spans_port}/v1/traces"
    env = {
        "INFERWATCH_RECEIVER__ENABLED": "true",
        "INFERWATCH_RECEIVER__GRPC_ENDPOINT": "",
        "INFERWATCH_RECEIVER__HTTP_ENDPOINT": f"127.0.0.1:{spans_port}",
        "INFERWATCH_SNAPSHOTS__DIR": str(tmp_path / "snap"),
        "INFERWATCH_EVIDENCE__DIR": str(tmp_path / "evidence"),
        **{k: v.format(sim_port=sim_port) for k, v in (agent_env or {}).items()},
    }
    sim_cmd = [PYTHON, "-m", "inferwatch.agent", "simulate", "--port", str(sim_port), *sim_args]
    sim_cmd += ["--otlp-traces-endpoint", endpoint]
    agent_cmd = [PYTHON, "-m", "inferwatch.agent", "run", "--port", str(agent_port)]
    with (
        running(agent_cmd, tmp_path / "agent.log", cwd=ROOT, env=env) as agent,
        running(sim_cmd, tmp_path / "sim.log", cwd=ROOT, env={"OTEL_BSP_SCHEDULE_DELAY": "100"}) as sim,
    ):
        base = f"http://127.0.0.1:{agent_port}"
        wait_http(f"{base}/healthz", proc=agent)
        wait_http(f"http://127.0.0.1:{sim_port}/health", proc=sim)
        yield base, sim_port, endpoint
