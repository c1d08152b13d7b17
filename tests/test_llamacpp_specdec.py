"""Speculative decoding, cached prompt tokens and slots on the real llama-server, read through the agent.

Two tiny generated GGUFs with the same vocabulary (tests/llamacpp_model.py, seeds 0 and 1). The server runs the
seed-0 model as target with a draft model (``--model-draft``, ``--spec-type draft-simple``): the same model as
draft (greedy decoding: every draft token is what the target picks, acceptance ~1) and the seed-1 model (random
weights: the target picks other tokens, acceptance ~0). Each completion returns the server's own per-response
draft counters (``timings.draft_n``, ``timings.draft_n_accepted``); the agent's engine collector reads
``llamacpp:spec_decode_*`` from ``/metrics`` (``--metrics``). Their sums over the requests between two agent
collections must be equal, and the acceptance the agent derives (accepted / draft tokens) must be the one the
server reports. Cached prompt tokens (``cache_prompt``) are checked the same way against ``timings.cache_n``.
"""

from __future__ import annotations

from collections.abc import Iterator
from dataclasses import replace
from pathlib import Path

import httpx
import pytest

from inferwatch.agent.common.samples import Sample
from inferwatch.agent.config import Settings
from inferwatch.agent.node.collectors.engine import EngineCollector
from inferwatch.agent.node.runner import run_collection
from inferwatch.agent.node.wiring import collect_context
from tests.llamacpp_model import PRESETS, cached
from tests.llamacpp_server import LlamaServer, llama_server

pytestmark = pytest.mark.integration

PROMPTS = ["hello world", "The quick brown fox jumps over the lazy dog.", "count: 1 2 3 4 5 6 7 8"]
N_PREDICT = 48
SPEC_ARGS = ("--spec-type", "draft-simple", "-td", "1")


@pytest.fixture(scope="module")
def gguf(tmp_path_factory: pytest.TempPathFactory) -> dict[str, Path]:
    directory = tmp_path_factory.mktemp("gguf-spec")
    return {
        "target": cached(directory, PRESETS["tiny"]),
        "other": cached(directory, replace(PRESETS["tiny"], seed=1)),
    }


@pytest.fixture(scope="module")
def same_draft(
    llama_bin: Path, gguf: dict[str, Path], tmp_path_factory: pytest.TempPathFactory
) -> Iterator[LlamaServer]:
    log = tmp_path_factory.mktemp("llama-spec-same") / "server.log"
    with llama_server(llama_bin, gguf["target"], log, args=("-md", str(gguf["target"]), *SPEC_ARGS)) as server:
        yield server


@pytest.fixture(scope="module")
def other_draft(
    llama_bin: Path, gguf: dict[str, Path], tmp_path_factory: pytest.TempPathFactory
) -> Iterator[LlamaServer]:
    log = tmp_path_factory.mktemp("llama-spec-other") / "server.log"
    with llama_server(llama_bin, gguf["target"], log, args=("-md", str(gguf["other"]), *SPEC_ARGS)) as server:
        yield server


def _complete(server: LlamaServer, prompt: str, cache_prompt: bool = False) -> dict[str, float]:
    body = {"prompt": prompt, "n_predict": N_PREDICT, "temperature": 0, "cache_prompt": cache_prompt}
    r = httpx.post(f"{server.url}/completion", json=body, timeout=120)
    r.raise_for_status()
    return dict(r.json()["timings"])


class Agent:
    """The agent's engine collector on the server; :meth:`delta` is the change of a series between collections."""

    def __init__(self, server: LlamaServer) -> None:
        settings = Settings.from_values(dict(engine={"metrics_url": f"{server.url}/metrics", "kind": "llamacpp"}))
        self.collector = EngineCollector(collect_context(settings), settings.engine)
        self.before = self._values()

    def _values(self) -> dict[tuple[str, tuple[tuple[str, str], ...]], float]:
        samples = run_collection(self.collector).samples
        return {(s.name, s.attributes): float(s.value) for s in samples if isinstance(s, Sample)}

    def after(self) -> dict[tuple[str, tuple[tuple[str, str], ...]], float]:
        now = self._values()
        self.collector.close()
        return {k: v - self.before.get(k, 0.0) for k, v in now.items()}


def _one(values: dict[tuple[str, tuple[tuple[str, str], ...]], float], name: str, **extra: str) -> float:
    got = [v for (n, a), v in values.items() if n == name and all((k, x) in a for k, x in extra.items())]
    assert len(got) == 1, (name, extra, got)
    return got[0]


def _spec(server: LlamaServer) -> tuple[float, float, dict[tuple[str, tuple[tuple[str, str], ...]], float]]:
    """(Σ draft_n, Σ draft_n_accepted) of the server's responses, and the agent's deltas over the same requests."""
    agent = Agent(server)
    timings = [_complete(server, p) for p in PROMPTS for _ in range(2)]
    delta = agent.after()
    assert all(t["predicted_n"] == N_PREDICT for t in timings)
    return sum(t["draft_n"] for t in timings), sum(t["draft_n_accepted"] for t in timings), delta


def _agrees(drafted: float, accepted: float, delta: dict[tuple[str, tuple[tuple[str, str], ...]], float]) -> float:
    agent_drafted = _one(delta, "inferwatch.engine.spec_decode.draft_tokens")
    agent_accepted = _one(delta, "inferwatch.engine.spec_decode.accepted_tokens")
    assert drafted > 0 and (agent_drafted, agent_accepted) == (drafted, accepted)
    by_position = [v for (n, _), v in delta.items() if n == "inferwatch.engine.spec_decode.accepted_by_position"]
    assert len(by_position) == 3 and sum(by_position) == agent_accepted  # --spec-draft-n-max 3 (default)
    assert _one(delta, "inferwatch.engine.spec_decode.drafts") > 0
    return agent_accepted / agent_drafted


def test_same_model_as_draft_accepts_nearly_every_token_and_the_agent_agrees(same_draft: LlamaServer) -> None:
    drafted, accepted, delta = _spec(same_draft)
    acceptance = _agrees(drafted, accepted, delta)
    assert acceptance == accepted / drafted >= 0.95
    drafts = _one(delta, "inferwatch.engine.spec_decode.drafts")
    assert 1 + accepted / drafts > 2.0  # mean acceptance length: most steps take more than one token


def test_a_different_random_model_as_draft_is_rejected_and_the_agent_agrees(other_draft: LlamaServer) -> None:
    drafted, accepted, delta = _spec(other_draft)
    acceptance = _agrees(drafted, accepted, delta)
    assert acceptance == accepted / drafted <= 0.2


def test_cached_prompt_tokens_and_slots_as_the_server_reports_them(same_draft: LlamaServer) -> None:
    agent = Agent(same_draft)
    prompt = "count: " + " ".join(map(str, range(40)))
    first = _complete(same_draft, prompt, cache_prompt=True)
    second = _complete(same_draft, prompt, cache_prompt=True)
    delta = agent.after()
    assert second["cache_n"] > 0  # the second request reuses the slot's KV cache
    assert _one(delta, "inferwatch.engine.tokens", type="cached") == first["cache_n"] + second["cache_n"]
    assert _one(delta, "inferwatch.engine.tokens", type="prompt") == first["prompt_n"] + second["prompt_n"]
    # KV usage: this llama-server exports no KV gauge (kv_cache_usage_ratio was removed upstream), so the agent's
    # KV-usage series is absent, never a made-up 0
    assert not any(n == "inferwatch.engine.kv_cache.usage" for n, _ in delta)
    assert "kv_cache" not in httpx.get(f"{same_draft.url}/metrics", timeout=10).text
    slots = httpx.get(f"{same_draft.url}/slots", timeout=10).json()
    assert len(slots) == 2 and all(s["speculative"] and s["n_ctx"] == 512 for s in slots)  # -np 2, -c 1024
    assert _one(delta, "inferwatch.engine.requests.running") == 0  # requests_processing, idle again
