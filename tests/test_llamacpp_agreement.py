"""The agent's llama.cpp prefill/decode derivation against the server's own per-request ``timings``.

llama-server exposes no histograms; the engine collector derives mean prefill seconds per prompt token
(Δ prompt_seconds_total / Δ prompt_tokens_total) and mean decode seconds per generated token
(Δ tokens_predicted_seconds_total / Δ tokens_predicted_total) over a window. Every completion also carries
``timings`` (prompt_ms, prompt_n, predicted_ms, predicted_n). The window here is two agent collections
around a batch of requests, each taken with every slot idle (/slots), so no request straddles an edge.

What each side measures (llama.cpp b11434, tools/server/server-context.cpp):
- decode: ``tokens_predicted_seconds_total`` adds each finished slot's own generation time
  (``metrics_on_prediction``: ``slot.stats.t_gen_us()``), the same value ``timings.predicted_ms`` reports,
  so Σ predicted_ms / Σ predicted_n must equal the agent's decode figure, sequential or concurrent.
- prefill: ``prompt_seconds_total`` is the server's wall time of batches holding prompt tokens, counted
  once per batch (``metrics_flush_prompt``), while ``timings.prompt_ms`` is per slot. With one request at a
  time they are the same time; with concurrent requests whose prompts share a batch, the batch counts once
  in the counter and once per request in the timings, so the agent's figure (engine time per prompt token)
  is lower than Σ prompt_ms / Σ prompt_n (request-experienced time per prompt token) — by at most the
  number of slots.

Tolerance: 1% relative where the two must agree. They add up the same clock readings; what differs is float
formatting (/metrics prints seconds with ~6 significant digits) and, for prefill, the few microseconds
between a slot's start and the decode call that starts the batch (measured: 0.02% over a mixed batch). A
derivation error (wrong counter pair, a per-request mean instead of a per-token mean, ms/s) is off by far
more: with the mixed prompt lengths below the per-request mean differs from the per-token mean by > 10%.
"""

from __future__ import annotations

import json
import threading
import time
from pathlib import Path

import httpx
import pytest

from inferwatch.agent.config import Settings
from inferwatch.agent.node.collectors.engine import EngineCollector
from inferwatch.agent.node.runner import run_collection
from inferwatch.agent.node.wiring import collect_context
from tests.llamacpp_server import LlamaServer, llama_server

pytestmark = pytest.mark.integration
TOLERANCE = 0.01
PROMPTS = ["hi", "The quick brown fox jumps over the lazy dog. " * 6, "count: " + " ".join(map(str, range(60)))]


def _stream(server: LlamaServer, prompt: str, n: int) -> dict[str, float]:
    body = {"prompt": prompt, "n_predict": n, "stream": True, "cache_prompt": False}
    with httpx.stream("POST", f"{server.url}/completion", json=body, timeout=120) as r:
        r.raise_for_status()
        for line in r.iter_lines():
            if line.startswith("data: "):
                chunk = json.loads(line[6:])
                if chunk.get("stop"):
                    return dict(chunk["timings"])
    raise AssertionError("stream ended without a final chunk")


def _drive(server: LlamaServer, requests: int, clients: int) -> list[dict[str, float]]:
    timings: list[dict[str, float]] = []
    lock = threading.Lock()

    def client(k: int) -> None:
        for i in range(requests // clients):
            prompt, n = PROMPTS[(i + k) % len(PROMPTS)], 8 + 16 * ((i + k) % 3)
            if i % 3 == 0:
                t = _stream(server, prompt, n)
            else:
                body = server.complete(prompt, max_tokens=n)
                t = dict(body["timings"])  # type: ignore[arg-type]
            with lock:
                timings.append(t)

    threads = [threading.Thread(target=client, args=(k,)) for k in range(clients)]
    for t in threads:
        t.start()
    for t in threads:
        t.join(300)
    return timings


def _idle(server: LlamaServer, timeout_s: float = 30.0) -> None:
    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline:
        if not any(s.get("is_processing") for s in httpx.get(f"{server.url}/slots", timeout=10).json()):
            return
        time.sleep(0.05)
    raise TimeoutError("slots still processing")


def _token_time(samples: list, phase: str) -> float:
    (value,) = [
        s.value
        for s in samples
        if s.name == "inferwatch.engine.token_time"
        and ("phase", phase) in s.attributes
        and ("window", "1m") in s.attributes
    ]
    return float(value)


def _measure(server: LlamaServer, requests: int, clients: int) -> tuple[list[dict[str, float]], list]:
    settings = Settings.from_values(dict(engine={"metrics_url": f"{server.url}/metrics", "kind": "llamacpp"}))
    collector = EngineCollector(collect_context(settings), settings.engine)
    try:
        _idle(server)
        run_collection(collector)
        timings = _drive(server, requests, clients)
        _idle(server)
        result = run_collection(collector)
    finally:
        collector.close()
    assert len(timings) == requests
    return timings, list(result.samples)


def _server_side(timings: list[dict[str, float]]) -> tuple[float, float]:
    prefill = sum(t["prompt_ms"] for t in timings) / 1e3 / sum(t["prompt_n"] for t in timings)
    decode = sum(t["predicted_ms"] for t in timings) / 1e3 / sum(t["predicted_n"] for t in timings)
    return prefill, decode


def test_sequential_prefill_and_decode_agree_with_server_timings(
    llama_bin: Path, llama_models: dict[str, Path], tmp_path: Path
) -> None:
    with llama_server(llama_bin, llama_models["small"], tmp_path / "s.log", parallel=2) as server:
        server.complete("warm up", max_tokens=4)
        timings, samples = _measure(server, requests=9, clients=1)
    server_prefill, server_decode = _server_side(timings)
    agent_prefill, agent_decode = _token_time(samples, "prefill"), _token_time(samples, "decode")
    print(f"sequential prefill s/token: agent {agent_prefill:.6e} server {server_prefill:.6e}")
    print(f"sequential decode  s/token: agent {agent_decode:.6e} server {server_decode:.6e}")
    assert agent_prefill == pytest.approx(server_prefill, rel=TOLERANCE)
    assert agent_decode == pytest.approx(server_decode, rel=TOLERANCE)
    # the check can fail: the per-request mean of the same timings is a different (wrong) figure
    per_request = sum(t["prompt_ms"] / t["prompt_n"] for t in timings) / 1e3 / len(timings)
    assert per_request != pytest.approx(server_prefill, rel=TOLERANCE)


def test_concurrent_decode_agrees_and_prefill_counts_shared_batches_once(
    llama_bin: Path, llama_models: dict[str, Path], tmp_path: Path
) -> None:
    slots = 2
    with llama_server(llama_bin, llama_models["small"], tmp_path / "s.log", parallel=slots) as server:
        server.complete("warm up", max_tokens=4)
        timings, samples = _measure(server, requests=12, clients=slots)
    server_prefill, server_decode = _server_side(timings)
    agent_prefill, agent_decode = _token_time(samples, "prefill"), _token_time(samples, "decode")
    print(f"concurrent prefill s/token: agent {agent_prefill:.6e} server {server_prefill:.6e}")
    print(f"concurrent decode  s/token: agent {agent_decode:.6e} server {server_decode:.6e}")
    assert agent_decode == pytest.approx(server_decode, rel=TOLERANCE)
    assert server_prefill / slots * (1 - TOLERANCE) <= agent_prefill <= server_prefill * (1 + TOLERANCE)
