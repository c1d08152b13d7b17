"""The keep-alive race at production timings: engine_up drops of a plain httpx client beside the agent's.

A real uvicorn server (``timeout_keep_alive`` 5 s, uvicorn's default and vLLM's) serves a vLLM exposition
(tests/fixtures/engines/vllm-v1-dp2-synthetic.prom). Three arms of ``--agents`` agents each, run at the same time
against it, every agent the real runner (:class:`inferwatch.agent.node.runner.Runner`) running the real engine collector
every ``--interval`` seconds (5 s, the agent's default) on a phase of its own:

- ``old``: the baseline, a plain client (``httpx.Client(follow_redirects=False, trust_env=False)``: idle
  connections kept 5 s, httpx's default, as long as the server keeps them; no retry);
- ``retry_only``: :func:`inferwatch.agent.common.httpclient.http_client` with httpx's 5 s expiry (the retry alone);
- ``new``: :func:`inferwatch.agent.common.httpclient.http_client` as the agent builds it (``KEEPALIVE_EXPIRY_S`` and the
retry).

For each arm: collections, failed collections (each one a collection with ``engine_up`` 0 on a healthy engine)
by message, requests sent again (``inferwatch_http_retries_total``), the requests the server answered and the
connections the clients opened (httpcore's ``connection.connect_tcp`` trace events, counted under the retry by
the network transport, which is the one each arm's client would build itself). Raw results go to ``--out``.

    .venv/bin/python benchmarks/keepalive_race.py --minutes 10 [--agents 8] [--out PATH.json]
"""

from __future__ import annotations

import argparse
import json
import logging
import platform
import random
import sys
import threading
import time
from collections import Counter
from pathlib import Path
from typing import Any

import httpx
import uvicorn

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from inferwatch.agent.common.httpclient import KEEPALIVE_EXPIRY_S, RetryCounts, http_client
from inferwatch.agent.common.samples import Collection
from inferwatch.agent.config import Settings
from inferwatch.agent.node.collectors import Schedule
from inferwatch.agent.node.collectors.engine import EngineCollector
from inferwatch.agent.node.runner import Runner
from inferwatch.agent.node.state import AgentState
from inferwatch.agent.node.wiring import collect_context

ROOT = Path(__file__).resolve().parents[1]
EXPOSITION = ROOT / "tests" / "fixtures" / "engines" / "vllm-v1-dp2-synthetic.prom"
ARMS = ("old", "retry_only", "new")
RUN_TIMEOUT_S = 2.0  # the runner's default collector timeout (inferwatch.agent.config.DEFAULT_TIMEOUT_S)


class Server:
    """uvicorn on 127.0.0.1 serving the exposition; counts the requests it answers per arm."""

    def __init__(self, body: bytes, keep_alive_s: int) -> None:
        self.body = body
        self.lock = threading.Lock()
        self.requests: Counter[str] = Counter()
        config = uvicorn.Config(
            self.app, host="127.0.0.1", port=0, timeout_keep_alive=keep_alive_s, log_level="error", interface="asgi3"
        )
        self.server = uvicorn.Server(config)
        self.thread = threading.Thread(target=self.server.run, name="uvicorn", daemon=True)

    async def app(self, scope: dict[str, Any], receive: Any, send: Any) -> None:
        if scope["type"] != "http":
            return
        arm = scope["query_string"].decode().partition("arm=")[2].split("&")[0]
        with self.lock:
            self.requests[f"{arm} {scope['path']}"] += 1
        headers = [(b"content-type", b"text/plain; version=0.0.4; charset=utf-8")]
        await send({"type": "http.response.start", "status": 200, "headers": headers})
        await send({"type": "http.response.body", "body": self.body})

    def start(self) -> int:
        self.thread.start()
        deadline = time.monotonic() + 30
        while not self.server.started:
            if time.monotonic() > deadline:
                raise RuntimeError("uvicorn did not start")
            time.sleep(0.05)
        return int(self.server.servers[0].sockets[0].getsockname()[1])

    def stop(self) -> None:
        self.server.should_exit = True
        self.thread.join(10)


class Recording(EngineCollector):
    """The engine collector, noting each failed collection's message (the runner logs only the first)."""

    def __init__(self, *args: Any, **kwargs: Any) -> None:
        super().__init__(*args, **kwargs)
        self.failures: list[str] = []

    def collect(self) -> Collection:
        try:
            return super().collect()
        except Exception as exc:
            self.failures.append(str(exc).split(" (reason:")[0].split(": ", 1)[-1])
            raise


class Connections(httpx.HTTPTransport):
    """httpx's network transport, counting the connections it opens (thread-safe)."""

    def __init__(self, keepalive_expiry_s: float) -> None:
        super().__init__(limits=httpx.Limits(keepalive_expiry=keepalive_expiry_s), trust_env=False)
        self.lock = threading.Lock()
        self.opened = 0

    def handle_request(self, request: httpx.Request) -> httpx.Response:
        chained = request.extensions.get("trace")

        def trace(name: str, info: dict[str, Any]) -> None:
            if name == "connection.connect_tcp.started":
                with self.lock:
                    self.opened += 1
            if chained is not None:
                chained(name, info)

        request.extensions["trace"] = trace
        return super().handle_request(request)


def client_for(arm: str, counts: RetryCounts) -> tuple[httpx.Client, Connections]:
    if arm == "old":  # httpx.Client(follow_redirects=False, trust_env=False): its transport, 5 s expiry, no retry
        net = Connections(5.0)
        return httpx.Client(follow_redirects=False, trust_env=False, transport=net), net
    net = Connections(5.0 if arm == "retry_only" else KEEPALIVE_EXPIRY_S)
    return http_client("engine", counts, transport=net), net


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--minutes", type=float, default=10.0)
    ap.add_argument("--agents", type=int, default=8, help="agents per arm")
    ap.add_argument("--interval", type=float, default=5.0, help="collection interval, seconds")
    ap.add_argument("--keep-alive", type=int, default=5, help="uvicorn timeout_keep_alive, seconds")
    ap.add_argument("--seed", type=int, default=31)
    ap.add_argument("--out", type=Path, default=ROOT / "benchmarks" / "results" / "keepalive_race.json")
    args = ap.parse_args()
    logging.basicConfig(level=logging.WARNING, format="%(asctime)s %(name)s %(levelname)s %(message)s")
    logging.getLogger("inferwatch.agent.node.runner").setLevel(
        logging.CRITICAL
    )  # the failures are counted below, not printed

    server = Server(EXPOSITION.read_bytes(), args.keep_alive)
    port = server.start()
    rng = random.Random(args.seed)
    plan = Schedule(args.interval, min(RUN_TIMEOUT_S, args.interval), "engine")
    agents: list[tuple[str, Runner, Recording, AgentState, httpx.Client]] = []
    nets: dict[str, list[Connections]] = {arm: [] for arm in ARMS}
    counts = {arm: RetryCounts() for arm in ARMS}
    for i in range(args.agents):
        for arm in ARMS:
            url = f"http://127.0.0.1:{port}/metrics?arm={arm}&agent={i}"
            settings = Settings.from_values(
                dict(interval_s=args.interval, engine={"metrics_url": url, "max_model_len": 4096})
            )
            client, net = client_for(arm, counts[arm])
            nets[arm].append(net)
            collector = Recording(collect_context(settings, engine_http=client), settings.engine)
            state = AgentState()
            phase = rng.uniform(0, args.interval)  # agents on different nodes are not in step
            runner = Runner(state, [collector], {"engine": plan}, clock=lambda p=phase: time.monotonic() + p)
            agents.append((arm, runner, collector, state, client))
    started_at = time.time()
    t0 = time.monotonic()
    for _, runner, *_ in agents:
        runner.start()
    end = t0 + args.minutes * 60
    while time.monotonic() < end:
        time.sleep(min(30.0, max(0.0, end - time.monotonic())))
        done = {arm: sum(s.health()["engine"].runs for a, _, _, s, _ in agents if a == arm) for arm in ARMS}
        failed = {arm: sum(s.health()["engine"].errors for a, _, _, s, _ in agents if a == arm) for arm in ARMS}
        print(f"{time.monotonic() - t0:6.0f}s runs {done} failed {failed}", flush=True)
    for _, runner, _, _, client in agents:
        runner.stop()
        client.close()
    server.stop()

    arms: dict[str, Any] = {}
    for arm in ARMS:
        mine = [(c, s) for a, _, c, s, _ in agents if a == arm]
        runs = sum(s.health()["engine"].runs for _, s in mine)
        failed = sum(s.health()["engine"].errors for _, s in mine)
        messages = Counter(msg for c, _ in mine for msg in c.failures)
        arms[arm] = {
            "collections": runs,
            "failed_collections": failed,  # each one engine_up 0 on a healthy engine
            "failures_per_hour_per_agent": round(failed / (args.agents * args.minutes / 60), 2),
            "failure_messages": dict(messages.most_common()),
            "retries": counts[arm].count("engine"),
            "server_requests": {k.split(" ", 1)[1]: n for k, n in server.requests.items() if k.split(" ")[0] == arm},
            "connections_opened": sum(net.opened for net in nets[arm]),
        }
    result = {
        "benchmark": "keepalive_race",
        "command": " ".join(["benchmarks/keepalive_race.py", *sys.argv[1:]]),
        "started_at_utc": time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime(started_at)),
        "minutes": args.minutes,
        "agents_per_arm": args.agents,
        "interval_s": args.interval,
        "run_timeout_s": plan.timeout_s,
        "uvicorn_timeout_keep_alive_s": args.keep_alive,
        "uvicorn": uvicorn.__version__,
        "httpx": httpx.__version__,
        "python": platform.python_version(),
        "exposition": str(EXPOSITION.relative_to(ROOT)),
        "arms": {
            "old": {"keepalive_expiry_s": 5.0, "retry": False, **arms["old"]},
            "retry_only": {"keepalive_expiry_s": 5.0, "retry": True, **arms["retry_only"]},
            "new": {"keepalive_expiry_s": KEEPALIVE_EXPIRY_S, "retry": True, **arms["new"]},
        },
    }
    args.out.parent.mkdir(parents=True, exist_ok=True)
    args.out.write_text(json.dumps(result, indent=2) + "\n")
    print(json.dumps(result["arms"], indent=2))
    return 0


if __name__ == "__main__":
    sys.exit(main())
