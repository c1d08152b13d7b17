"""A real HAProxy (Debian's) in front of two simulator replicas ejects the hung one on the agent's readiness.

Each replica has its node's agent; HAProxy checks ``GET /engines/default/ready`` on the agent's address and port
(``check addr ... port ...``, fleet-apis.md §3) every second (``inter 1s fall 1 rise 2``) while sending the traffic
itself to the replica. The simulator's ``hang`` on replica 1: its agent turns 503 ``hung`` within ~10 s, HAProxy
marks it DOWN within its check interval of that, sends it **0** requests while it is DOWN (its session counter
does not move) while every request through HAProxy is still answered (by replica 2); the hang cleared, the agent
turns 200 and HAProxy brings the replica back (``rise 2``) and sends it traffic again.
"""

from __future__ import annotations

import contextlib
import shutil
import socket
import subprocess
import threading
import time
from collections.abc import Callable, Iterator
from pathlib import Path

import httpx
import pytest

from tests.conftest import PYTHON, ROOT, free_port
from tests.e2e.test_alert_pipeline import SIM_CONTROL_TOKEN, SimProc
from tests.procs import running, wait_http

pytestmark = [pytest.mark.integration, pytest.mark.slow]
MODEL = "llama-lb"
CHECK_INTER_S = 1.0
DETECT_BUDGET_S = 25.0  # the agent's ~10 s, with room for a loaded test machine
EJECT_BUDGET_S = 5 * CHECK_INTER_S  # one check interval, with room for a loaded test machine
EJECTED_FOR_S = 12.0
CLIENT_TIMEOUT_S = 6.0  # a client whose request sits in the hung replica gives up and sends the next


def haproxy_binary() -> str:
    path = shutil.which("haproxy")
    if path is None:
        pytest.fail("haproxy not found: apt-get install -y --no-install-recommends haproxy (scripts/test.sh does)")
    return path


def haproxy_config(front: int, sock: Path, servers: list[tuple[str, int, int]]) -> str:
    lines = [
        "global",
        f"    stats socket {sock} mode 600 level admin",
        "    maxconn 512",
        "defaults",
        "    mode http",
        "    timeout connect 2s",
        "    timeout client 30s",
        "    timeout server 30s",
        "    timeout check 1s",
        "frontend fe",
        f"    bind 127.0.0.1:{front}",
        "    default_backend engines",
        "backend engines",
        "    balance roundrobin",
        "    option httpchk",
        "    http-check send meth GET uri /engines/default/ready ver HTTP/1.1 hdr Host agent",
        "    http-check expect status 200",
    ]
    for name, port, agent_port in servers:
        inter = f"inter {int(CHECK_INTER_S * 1000)}"
        lines.append(f"    server {name} 127.0.0.1:{port} check addr 127.0.0.1 port {agent_port} {inter} fall 1 rise 2")
    return "\n".join(lines) + "\n"


def test_the_shipped_example_is_valid_and_checks_as_this_test_does() -> None:
    """deploy/haproxy/haproxy.cfg: accepted by HAProxy, with this test's check (path, expectation, timing)."""
    example = ROOT / "deploy" / "haproxy" / "haproxy.cfg"
    text = example.read_text()
    r = subprocess.run([haproxy_binary(), "-c", "-f", str(example)], capture_output=True, text=True, timeout=30)
    assert r.returncode == 0, r.stdout + r.stderr
    ours = haproxy_config(8080, Path("/run/haproxy/admin.sock"), [])
    for line in ours.splitlines():
        if "http-check" in line or "option httpchk" in line:
            assert line.strip().replace("Host agent", "Host inferwatch-agent") in text, line
    assert text.count(f"inter {int(CHECK_INTER_S * 1000 // 1000)}s fall 1 rise 2") == 2


def stat(sock: Path) -> dict[str, dict[str, str]]:
    """``show stat`` over the runtime API: each server's row by name (status, stot = sessions sent to it)."""
    with socket.socket(socket.AF_UNIX, socket.SOCK_STREAM) as s:
        s.settimeout(5)
        s.connect(str(sock))
        s.sendall(b"show stat\n")
        data = b""
        while chunk := s.recv(65536):
            data += chunk
    lines = data.decode().splitlines()
    header = lines[0].lstrip("# ").split(",")
    rows = [dict(zip(header, ln.split(","), strict=False)) for ln in lines[1:] if ln]
    return {r["svname"]: r for r in rows if r.get("pxname") == "engines"}


def wait_until(pred: Callable[[], bool], timeout_s: float, what: str) -> float:
    deadline = time.monotonic() + timeout_s
    while not pred():
        assert time.monotonic() < deadline, f"timed out waiting for {what}"
        time.sleep(0.1)
    return time.monotonic()


def start_sim(stack: contextlib.ExitStack, tmp: Path, tag: str) -> SimProc:
    port = free_port()
    cmd = [PYTHON, "-m", "inferwatch.agent", "simulate", "--port", str(port), "--model", MODEL, "--seed", "6"]
    cmd += ["--control-token", SIM_CONTROL_TOKEN, "--log-level", "warning"]
    proc = stack.enter_context(running(cmd, tmp / f"sim-{tag}.log", cwd=ROOT))
    sim = SimProc(MODEL, port, proc)
    wait_http(f"{sim.url}/health", proc=proc, timeout_s=60)
    return sim


def start_agent(stack: contextlib.ExitStack, tmp: Path, sim: SimProc, tag: str) -> int:
    port = free_port()
    env = {
        "INFERWATCH_ENGINE__METRICS_URL": f"{sim.url}/metrics",
        "INFERWATCH_SNAPSHOTS__DIR": str(tmp / f"snap-{tag}"),
        "INFERWATCH_EVIDENCE__DIR": str(tmp / f"evidence-{tag}"),
        "INFERWATCH_EVIDENCE__PY_SPY": "false",
    }
    cmd = [PYTHON, "-m", "inferwatch.agent", "run", "--port", str(port)]
    proc = stack.enter_context(running(cmd, tmp / f"agent-{tag}.log", cwd=ROOT, env=env))
    wait_http(f"http://127.0.0.1:{port}/metrics", ok=lambda r: r.status_code == 200, proc=proc, timeout_s=60)
    return port


@contextlib.contextmanager
def traffic(url: str, workers: int = 8) -> Iterator[dict[str, int]]:
    """``workers`` clients sending completions through HAProxy back to back; counts answers by outcome."""
    counts = {"ok": 0, "failed": 0}
    lock = threading.Lock()
    stop = threading.Event()

    def work() -> None:
        with httpx.Client(timeout=CLIENT_TIMEOUT_S) as c:
            while not stop.is_set():
                try:
                    r = c.post(f"{url}/v1/completions", json={"model": MODEL, "prompt": "hi", "max_tokens": 48})
                    outcome = "ok" if r.status_code == 200 else "failed"
                except httpx.HTTPError:
                    outcome = "failed"
                with lock:
                    counts[outcome] += 1

    threads = [threading.Thread(target=work, daemon=True) for _ in range(workers)]
    for t in threads:
        t.start()
    try:
        yield counts
    finally:
        stop.set()
        for t in threads:
            t.join(CLIENT_TIMEOUT_S + 10)


def ready(agent_port: int) -> httpx.Response:
    return httpx.get(f"http://127.0.0.1:{agent_port}/engines/default/ready", timeout=5)


def test_haproxy_ejects_the_hung_replica_and_returns_it(tmp_path: Path) -> None:
    binary = haproxy_binary()
    with contextlib.ExitStack() as stack:
        sims = [start_sim(stack, tmp_path, t) for t in ("1", "2")]
        agents = [start_agent(stack, tmp_path, s, t) for s, t in zip(sims, ("1", "2"), strict=True)]
        front, sock = free_port(), tmp_path / "haproxy.sock"
        cfg = tmp_path / "haproxy.cfg"
        cfg.write_text(haproxy_config(front, sock, [("s1", sims[0].port, agents[0]), ("s2", sims[1].port, agents[1])]))
        check = subprocess.run([binary, "-c", "-f", str(cfg)], capture_output=True, text=True, timeout=30, check=False)
        assert check.returncode == 0, check.stdout + check.stderr
        stack.enter_context(running([binary, "-db", "-f", str(cfg)], tmp_path / "haproxy.log"))
        wait_until(lambda: sock.exists(), 30, "the HAProxy stats socket")
        wait_until(lambda: all(stat(sock)[s]["status"] == "UP" for s in ("s1", "s2")), 60, "both servers UP")

        counts = stack.enter_context(traffic(f"http://127.0.0.1:{front}"))
        wait_until(lambda: all(int(stat(sock)[s]["stot"]) > 20 for s in ("s1", "s2")), 60, "traffic on both")
        latencies = []
        with httpx.Client(timeout=5) as c:  # one connection, as a load balancer's checks keep
            for _ in range(50):  # served from the state: no engine call on the way
                t = time.perf_counter()
                assert c.get(f"http://127.0.0.1:{agents[0]}/engines/default/ready").status_code == 200
                latencies.append(time.perf_counter() - t)
        print(f"ready answered in {sorted(latencies)[25] * 1e3:.2f} ms (median over HTTP on loopback)")

        sims[0].control({"enable": "hang"})
        t_hang = time.monotonic()
        t_unready = wait_until(lambda: ready(agents[0]).status_code == 503, 60, "the agent's 503")
        body = ready(agents[0]).json()
        assert body["reason"] == "hung" and body["ready"] is False, body
        assert ready(agents[1]).status_code == 200
        t_down = wait_until(lambda: stat(sock)["s1"]["status"] == "DOWN", 30, "s1 DOWN")
        print(f"agent 503 after {t_unready - t_hang:.1f}s, HAProxy DOWN {t_down - t_unready:.1f}s later")
        assert t_unready - t_hang <= DETECT_BUDGET_S
        assert t_down - t_unready <= EJECT_BUDGET_S

        sent_before = int(stat(sock)["s1"]["stot"])
        ok_before = counts["ok"]
        time.sleep(EJECTED_FOR_S)
        assert stat(sock)["s1"]["status"] == "DOWN"
        assert int(stat(sock)["s1"]["stot"]) == sent_before, "HAProxy sent requests to the ejected replica"
        assert counts["ok"] - ok_before > 10  # the other replica answers the traffic meanwhile

        sims[0].control({"disable": "hang"})
        wait_until(lambda: ready(agents[0]).status_code == 200, 60, "the agent's 200 after the hang")
        wait_until(lambda: stat(sock)["s1"]["status"] == "UP", 30, "s1 UP again")
        wait_until(lambda: int(stat(sock)["s1"]["stot"]) > sent_before, 30, "traffic on s1 again")
