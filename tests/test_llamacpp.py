"""llama.cpp's real llama-server on a generated GGUF model: the generator, the fixtures, the server's contract."""

from __future__ import annotations

import hashlib
from dataclasses import replace
from pathlib import Path

import httpx
import pytest

from tests.llamacpp_model import EOS_ID, PRESETS, cached, generate
from tests.llamacpp_server import LlamaServer, llama_server

pytestmark = pytest.mark.integration


def _sha(path: Path) -> str:
    return hashlib.sha256(path.read_bytes()).hexdigest()


def test_generator_is_deterministic_under_a_seed(tmp_path: Path) -> None:
    a = generate(tmp_path / "a.gguf", PRESETS["tiny"])
    b = generate(tmp_path / "b.gguf", PRESETS["tiny"])
    c = generate(tmp_path / "c.gguf", replace(PRESETS["tiny"], seed=1))
    assert _sha(a) == _sha(b) != _sha(c)
    assert cached(tmp_path, PRESETS["tiny"]) == cached(tmp_path, PRESETS["tiny"])


def test_generated_model_reads_back_with_gguf(tmp_path: Path) -> None:
    import gguf

    path = generate(tmp_path / "m.gguf", PRESETS["tiny"])
    reader = gguf.GGUFReader(str(path))
    names = {t.name for t in reader.tensors}
    assert {"token_embd.weight", "output.weight", "blk.1.ffn_down.weight"} <= names
    assert reader.fields["general.architecture"].contents() == "llama"


def test_server_serves_printable_completions_with_timings(llama_tiny: LlamaServer) -> None:
    body = llama_tiny.complete("Hello there", max_tokens=24)
    text = body["choices"][0]["text"]  # type: ignore[index]
    assert len(text) > 0 and all(32 <= ord(ch) < 127 for ch in text), repr(text)
    timings = body["timings"]
    assert isinstance(timings, dict)
    assert timings["predicted_n"] == 24 and timings["prompt_n"] > 0
    assert timings["prompt_ms"] > 0 and timings["predicted_ms"] > 0


def test_logit_bias_forces_an_immediate_stop(llama_tiny: LlamaServer) -> None:
    body = llama_tiny.complete("Hello", max_tokens=24, logit_bias={str(EOS_ID): 100})
    assert body["choices"][0]["finish_reason"] == "stop"  # type: ignore[index]
    assert body["timings"]["predicted_n"] <= 1  # type: ignore[index]


def test_chat_template_and_metrics_and_slots(llama_tiny: LlamaServer) -> None:
    r = httpx.post(
        f"{llama_tiny.url}/v1/chat/completions",
        json={"messages": [{"role": "user", "content": "hi"}], "max_tokens": 8},
        timeout=60,
    )
    r.raise_for_status()
    assert r.json()["choices"][0]["message"]["content"]
    metrics = httpx.get(f"{llama_tiny.url}/metrics", timeout=10)
    assert metrics.status_code == 200
    for family in (
        "llamacpp:prompt_tokens_total",
        "llamacpp:tokens_predicted_seconds_total",
        "llamacpp:n_decode_total",
    ):
        assert f"\n{family} " in metrics.text
    slots = httpx.get(f"{llama_tiny.url}/slots", timeout=10).json()
    assert len(slots) == 2 and "is_processing" in slots[0]


def test_server_fixture_always_stops_the_process(
    llama_bin: Path, llama_models: dict[str, Path], tmp_path: Path
) -> None:
    with llama_server(llama_bin, llama_models["tiny"], tmp_path / "s.log") as server:
        pid = server.pid
        assert httpx.get(f"{server.url}/health", timeout=10).status_code == 200
    assert server.proc.poll() is not None
    assert not Path(f"/proc/{pid}/status").exists() or "zombie" in Path(f"/proc/{pid}/status").read_text()
