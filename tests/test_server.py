"""The agent as a real process: /metrics, /healthz, /readyz and /api/v1/status over HTTP."""

from __future__ import annotations

import httpx
from prometheus_client.parser import text_string_to_metric_families

from tests.conftest import FIXTURES, PYTHON, ROOT, free_port
from tests.procs import running, wait_http


def test_agent_serves_metrics_on_this_host(tmp_path) -> None:
    port = free_port()
    cmd = [PYTHON, "-m", "inferwatch.agent", "run", "--port", str(port), "--interval", "0.5"]
    with running(cmd, tmp_path / "agent.log", cwd=ROOT) as proc:
        base = f"http://127.0.0.1:{port}"
        wait_http(f"{base}/readyz", ok=lambda r: r.status_code == 200, proc=proc)
        assert httpx.get(f"{base}/healthz").json() == {"status": "alive"}
        r = httpx.get(f"{base}/metrics")
        assert r.status_code == 200 and r.headers["content-type"].startswith("text/plain")
        names = {f.name for f in text_string_to_metric_families(r.text)}
        assert {
            "system_memory_limit_bytes",
            "inferwatch_memory_file_lru_bytes",
            "inferwatch_collector_success",
        } <= names
        status = httpx.get(f"{base}/api/v1/status").json()
        assert {c["name"] for c in status["collectors"]} >= {"pagecache"}
        assert status["node"]["os.type"] == "linux"


def test_readyz_waits_for_first_run_and_bad_procfs_does_not_kill_agent(tmp_path) -> None:
    port = free_port()
    cmd = [PYTHON, "-m", "inferwatch.agent", "run", "--port", str(port), "--path.procfs", str(tmp_path / "none")]
    (tmp_path / "none").mkdir()
    with running(cmd, tmp_path / "agent.log", cwd=ROOT) as proc:
        base = f"http://127.0.0.1:{port}"
        wait_http(f"{base}/readyz", ok=lambda r: r.status_code == 200, proc=proc)
        status = httpx.get(f"{base}/api/v1/status").json()
        pc = next(c for c in status["collectors"] if c["name"] == "pagecache")
        assert pc["state"] == "absent" and "--path.procfs" in pc["hint"]
        assert httpx.get(f"{base}/metrics").status_code == 200
    assert FIXTURES.is_dir()


def test_metrics_endpoint_honours_auth_head_and_date(tmp_path) -> None:
    """/metrics is served ahead of FastAPI's routing; the auth middleware and HTTP basics still hold."""
    token = "metrics-token-0123456789abcdef"
    port = free_port()
    env = {
        "INFERWATCH_API__TOKENS": f'[{{"token": "{token}", "scopes": ["read"]}}]',
        "INFERWATCH_API__OPEN_PATHS": '["/healthz"]',  # /metrics needs a token on this node
    }
    cmd = [PYTHON, "-m", "inferwatch.agent", "run", "--port", str(port), "--interval", "0.5"]
    with running(cmd, tmp_path / "agent.log", cwd=ROOT, env=env) as proc:
        base = f"http://127.0.0.1:{port}"
        wait_http(f"{base}/healthz", proc=proc)
        assert httpx.get(f"{base}/metrics").status_code == 401
        auth = {"Authorization": f"Bearer {token}"}
        r = httpx.get(f"{base}/metrics", headers=auth)
        assert r.status_code == 200 and r.headers["content-type"] == "text/plain; version=0.0.4; charset=utf-8"
        assert int(r.headers["content-length"]) == len(r.content) and "inferwatch_agent_info" in r.text
        assert r.headers["date"].endswith(" GMT")  # stamped per response now that the server has no tick
        head = httpx.head(f"{base}/metrics", headers=auth)
        assert head.status_code == 200 and head.content == b""
        assert httpx.post(f"{base}/metrics", headers=auth).status_code == 405


def test_the_bound_listening_socket_gives_connections_tcp_nodelay() -> None:
    """``quietserver.bind`` makes the socket uvicorn serves on; asyncio turns Nagle off only on sockets whose
    proto is TCP, and an accepted socket takes the listening one's. With proto 0 every /metrics answer waited for
    the client's delayed ACK (~40 ms back to back, 1.2 ms with TCP_NODELAY)."""
    import asyncio
    import socket as socketlib

    from inferwatch.agent.node import quietserver

    sock = quietserver.bind("127.0.0.1", 0)
    port = sock.getsockname()[1]
    seen: list[int] = []

    class Probe(asyncio.Protocol):
        def connection_made(self, transport: asyncio.BaseTransport) -> None:
            accepted = transport.get_extra_info("socket")
            seen.append(accepted.getsockopt(socketlib.IPPROTO_TCP, socketlib.TCP_NODELAY))
            transport.close()

    async def main() -> None:
        server = await asyncio.get_running_loop().create_server(Probe, sock=sock)
        async with server:
            _, writer = await asyncio.open_connection("127.0.0.1", port)
            for _ in range(200):
                if seen:
                    break
                await asyncio.sleep(0.01)
            writer.close()

    asyncio.run(main())
    assert seen and seen[0] != 0
