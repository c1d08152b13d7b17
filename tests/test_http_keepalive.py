"""The keep-alive race against a real uvicorn server (issue 31): agent/common/httpclient.py.

uvicorn closes a connection idle for ``timeout_keep_alive``; a request sent on it as it closes fails with no
answer. Where the race must happen, the tests make it happen: httpcore's ``trace`` extension holds the request
on a reused connection, after the pool handed the connection out and before its bytes are written, until the
server has closed it — the close crossing the request in flight that the pool cannot see. The same steering
on the old client (httpx's defaults, no retry) fails, so these tests can fail. The last test runs the engine
collector as the agent builds it against uvicorn at shrunk timings (keep-alive 1 s, a collection every 1 s),
without steering, and asserts that no collection failed.
"""

from __future__ import annotations

import socket
import threading
import time
from collections.abc import Callable, Iterator
from typing import Any

import httpx
import pytest
import uvicorn
from prometheus_client import generate_latest

from inferwatch.agent.common.httpclient import KEEPALIVE_EXPIRY_S, STALE_CONNECTION_ERRORS, RetryCounts, http_client
from inferwatch.agent.config import Settings
from inferwatch.agent.node.app import Agent
from inferwatch.agent.node.collectors.engine import EngineCollector
from inferwatch.agent.node.wiring import build_deps, collect_context
from tests.conftest import FIXTURES
from tests.fake_nvml import FakeNVML

VLLM = (FIXTURES / "engines" / "vllm-v1-dp2-synthetic.prom").read_bytes()
KEEP_ALIVE_S = 1  # uvicorn's timeout_keep_alive here (its default, and vLLM's, is 5 s)


class Uvicorn:
    """uvicorn on 127.0.0.1 serving the vLLM exposition on any path; ``ports``: the client port of each request
    for /metrics (one port per connection), ``paths``: every request's path."""

    def __init__(self, keep_alive_s: int = KEEP_ALIVE_S) -> None:
        self.ports: list[int] = []
        self.paths: list[str] = []
        config = uvicorn.Config(
            self.app, host="127.0.0.1", port=0, timeout_keep_alive=keep_alive_s, log_level="error", interface="asgi3"
        )
        self.server = uvicorn.Server(config)
        self.thread = threading.Thread(target=self.server.run, daemon=True)

    async def app(self, scope: dict[str, Any], receive: Any, send: Any) -> None:
        if scope["type"] != "http":
            return
        self.paths.append(scope["path"])
        if scope["path"] == "/metrics":
            self.ports.append(scope["client"][1])
        await send({"type": "http.response.start", "status": 200, "headers": [(b"content-type", b"text/plain")]})
        await send({"type": "http.response.body", "body": VLLM})

    def __enter__(self) -> str:
        self.thread.start()
        deadline = time.monotonic() + 30
        while not self.server.started:
            assert time.monotonic() < deadline, "uvicorn did not start"
            time.sleep(0.02)
        port = self.server.servers[0].sockets[0].getsockname()[1]
        return f"http://127.0.0.1:{port}/metrics"

    def __exit__(self, *exc: object) -> None:
        self.server.should_exit = True
        self.thread.join(10)


@pytest.fixture
def server() -> Iterator[tuple[Uvicorn, str]]:
    srv = Uvicorn()
    with srv as url:
        yield srv, url


def hold_reused(hold_s: float) -> Callable[[str, dict[str, Any]], None]:
    """A ``trace`` extension that holds a request on a reused connection for ``hold_s`` before it is written."""
    opened = False

    def trace(name: str, info: dict[str, Any]) -> None:
        nonlocal opened
        if name == "connection.connect_tcp.started":
            opened = True
        elif name == "http11.send_request_headers.started" and not opened:
            opened = True  # once per request: its second try (if any) is not held
            time.sleep(hold_s)

    return trace


HOLD_S = KEEP_ALIVE_S + 1.0  # past uvicorn's keep-alive: the server closes the connection under the request


@pytest.mark.integration
def test_the_old_client_fails_on_a_connection_closed_under_its_request(server: tuple[Uvicorn, str]) -> None:
    _, url = server
    with httpx.Client(trust_env=False) as old:  # the engine's client before issue 31: 5 s expiry, no retry
        assert old.get(url).status_code == 200
        with pytest.raises(STALE_CONNECTION_ERRORS):
            old.get(url, extensions={"trace": hold_reused(HOLD_S)})


@pytest.mark.integration
def test_a_get_on_a_connection_closed_under_it_is_sent_again_on_a_new_one_and_counted(
    server: tuple[Uvicorn, str],
) -> None:
    srv, url = server
    counts = RetryCounts()
    with http_client("engine", counts, keepalive_expiry_s=30.0) as client:  # reused after the server's 1 s
        assert client.get(url).status_code == 200
        assert counts.count("engine") == 0
        r = client.get(url, extensions={"trace": hold_reused(HOLD_S)})
        assert r.status_code == 200 and r.content == VLLM
        assert counts.count("engine") == 1
        assert len(srv.ports) == 2 and srv.ports[0] != srv.ports[1]  # the answer came on a second connection
        assert [(s.name, s.value, s.attributes) for s in counts.samples()] == [
            ("inferwatch.http.retries", 1, (("source", "engine"),))
        ]


@pytest.mark.integration
def test_a_post_is_never_sent_twice(server: tuple[Uvicorn, str]) -> None:
    _, url = server
    counts = RetryCounts()
    with http_client("engine", counts, keepalive_expiry_s=30.0) as client:
        assert client.get(url).status_code == 200
        with pytest.raises(STALE_CONNECTION_ERRORS):
            client.post(url, content=b"x", extensions={"trace": hold_reused(HOLD_S)})
    assert counts.count("engine") == 0


@pytest.mark.integration
def test_a_new_connection_closed_without_an_answer_is_not_retried() -> None:
    """A server that takes the connection and closes it unanswered is answering: not sent again."""
    accepted: list[int] = []
    with socket.create_server(("127.0.0.1", 0)) as listener:
        listener.settimeout(10)
        port = listener.getsockname()[1]

        def serve() -> None:
            for _ in range(2):  # at most two connections: a second one would be a retry
                try:
                    conn, (_, peer) = listener.accept()
                except OSError:
                    return
                accepted.append(peer)
                conn.recv(65536)
                conn.close()

        t = threading.Thread(target=serve, daemon=True)
        t.start()
        counts = RetryCounts()
        with http_client("engine", counts) as client, pytest.raises(httpx.RemoteProtocolError):
            client.get(f"http://127.0.0.1:{port}/metrics", timeout=5)
        listener.close()
        t.join(15)
    assert len(accepted) == 1 and counts.count("engine") == 0


@pytest.mark.integration
def test_idle_connections_are_let_go_below_the_common_server_keep_alives() -> None:
    """Idle longer than KEEPALIVE_EXPIRY_S, the next request opens a new connection: the client lets go first."""
    assert KEEPALIVE_EXPIRY_S <= 4.0  # uvicorn (vLLM, SGLang), Node, Apache and llama.cpp's server: 5 s
    srv = Uvicorn(keep_alive_s=30)  # the server keeps it: only the client can have let it go
    with srv as url, http_client("engine", RetryCounts()) as client:
        client.get(url)
        client.get(url)  # at once: the same connection
        time.sleep(KEEPALIVE_EXPIRY_S + 0.5)
        client.get(url)
    assert srv.ports[0] == srv.ports[1] != srv.ports[2]


class CountingTransport(httpx.HTTPTransport):
    """The network transport under the retry, counting the requests that failed on it (here, on a healthy
    server: only a connection closed under a request)."""

    def __init__(self) -> None:
        super().__init__(limits=httpx.Limits(keepalive_expiry=KEEPALIVE_EXPIRY_S), trust_env=False)
        self.failed = 0

    def handle_request(self, request: httpx.Request) -> httpx.Response:
        try:
            return super().handle_request(request)
        except httpx.TransportError:
            self.failed += 1
            raise


ROUNDS = 40


@pytest.mark.integration
@pytest.mark.slow
def test_the_engine_collector_at_shrunk_timings_never_fails(server: tuple[Uvicorn, str]) -> None:
    """uvicorn keep-alive 1 s, a collection every 1 s (the agent's 5 s and 5 s, shrunk), no steering: the engine
    client keeps idle connections 4 s, so it meets the server's close; 0 failed collections, and every request
    that failed under them was sent again and counted."""
    srv, url = server
    settings = Settings.from_values(dict(engine={"metrics_url": url, "max_model_len": 4096}))
    transports = [CountingTransport() for _ in range(3)]
    counts = [RetryCounts() for _ in transports]
    collectors = [
        EngineCollector(collect_context(settings, engine_http=http_client("engine", n, transport=t)), settings.engine)
        for t, n in zip(transports, counts, strict=True)
    ]
    failures: list[str] = []
    lock = threading.Lock()

    def poll(c: EngineCollector, phase: float, rounds: int) -> None:
        due = time.monotonic() + phase
        for _ in range(rounds):
            time.sleep(max(0.0, due - time.monotonic()))
            try:
                c.collect()
            except Exception as exc:
                with lock:
                    failures.append(f"{type(exc).__name__}: {exc}")
            due += 1.0

    threads = [threading.Thread(target=poll, args=(c, i / 3, ROUNDS)) for i, c in enumerate(collectors)]
    try:
        for t in threads:
            t.start()
        for t in threads:
            t.join(120)
    finally:
        for c in collectors:
            c.close()
    assert not any(t.is_alive() for t in threads)
    assert failures == []
    assert len(srv.ports) == 3 * ROUNDS, set(srv.paths)  # every collection answered once
    for c, t, n in zip(collectors, transports, counts, strict=True):
        assert [s.value for s in c.status_samples() if s.name == "inferwatch.engine.up"] == [1]
        assert n.count("engine") == t.failed  # each failure under a collection was sent again, and counted


@pytest.mark.integration
def test_the_agent_exports_the_retries_of_its_engine_client() -> None:
    settings = Settings.from_values(dict(engine={"metrics_url": "http://127.0.0.1:9/metrics"}))
    agent = Agent(settings, build_deps(settings, nvml=FakeNVML([])))
    text = generate_latest(agent.registry).decode()
    assert 'inferwatch_http_retries_total{source="engine"} 0.0' in text
