"""``inferwatch drift`` (agent/fleet/drift.py, issue 21): the comparison on built answers, then real engines — the
native and AVX2-only llama-server builds on the same generated model (and a differently seeded model, which must be
flagged), and two simulators over both the OpenAI and the Anthropic API (deterministic: no drift)."""

from __future__ import annotations

import contextlib
import dataclasses
import json
import subprocess
from collections.abc import Iterator
from pathlib import Path

import pytest

from inferwatch.agent.errors import ConfigError
from inferwatch.agent.fleet.drift import (
    Answer,
    Answers,
    TopLogprob,
    compare,
    load_answers,
    load_prompts,
    parse_endpoint,
    sha256,
)
from tests.conftest import PYTHON, ROOT, free_port
from tests.llamacpp_model import PRESETS, cached
from tests.llamacpp_server import find_avx2_binary, llama_server
from tests.procs import running, wait_http

AVX512 = "avx512f" in Path("/proc/cpuinfo").read_text()
SECRET = "Tell me about the quarterly numbers of project bluebird."  # must never leave the process unasked


def _answers(name: str, answers: list[Answer], model: str = "m") -> Answers:
    return Answers(name, "http://x", "openai", model, 8, 1, 2, tuple(answers))


def _tok(pid: str, tokens: list[str], lps: list[float], tops: list[list[tuple[str, float]]] | None = None) -> Answer:
    top = tuple(tuple(TopLogprob(t, lp) for t, lp in row) for row in (tops or []))
    return Answer(pid, sha256(pid), "".join(tokens), tuple(tokens), tuple(lps), top)


def test_compare_tokens_logprobs_and_near_ties() -> None:
    ref = _answers(
        "ref",
        [
            _tok("same", ["a", "b", "c"], [-0.1, -0.2, -0.3]),
            _tok("flip", ["a", "b", "c"], [-0.1, -0.2, -0.69], [[], [], [("c", -0.69), ("d", -0.70)]]),
            _tok("short", ["a", "b"], [-0.1, -0.2]),
        ],
    )
    cand = _answers(
        "cand",
        [
            _tok("same", ["a", "b", "c"], [-0.1, -0.2005, -0.3]),
            _tok("flip", ["a", "b", "d"], [-0.1, -0.25, -0.69]),
            _tok("short", ["a", "b", "e"], [-0.1, -0.2, -1.0]),
        ],
    )
    r = compare(ref, cand, max_logprob_delta=0.01)
    same, flip, short = r.prompts
    assert (same.diverged_at, same.unit) == (None, "token")
    assert same.max_abs_logprob_delta == pytest.approx(0.0005)
    assert flip.diverged_at == 2 and (flip.reference_token, flip.candidate_token) == ("c", "d")
    assert flip.reference_top2_gap == pytest.approx(0.01) and flip.candidate_token_in_reference_top is True
    assert flip.max_abs_logprob_delta == pytest.approx(0.05)  # token 1, before the divergence
    assert short.diverged_at == 2 and short.reference_token is None  # a prefix: diverges at its end
    assert r.flagged and len(r.diverged) == 2 and [p.prompt_id for p in r.logprob_moved] == ["flip"]
    quiet = compare(ref, _answers("c2", [ref.answers[0]]), 0.01)
    assert not quiet.flagged and len(quiet.prompts) == 1
    other_model = compare(ref, _answers("c3", [ref.answers[0]], model="n"), 0.01)
    assert other_model.flagged and other_model.settings_mismatch == ("model: 'm' vs 'n'",)


def test_compare_text_only_answers() -> None:
    ref = _answers("r", [Answer("p", sha256("p"), "hello world")])
    cand = _answers("c", [Answer("p", sha256("p"), "hello there")])
    (p,) = compare(ref, cand).prompts
    assert (p.unit, p.diverged_at, p.reference_token, p.candidate_token) == ("char", 6, "w", "t")
    assert p.max_abs_logprob_delta is None


def test_input_errors(tmp_path: Path) -> None:
    assert parse_endpoint("a=http://127.0.0.1:8000/", "openai").url == "http://127.0.0.1:8000"
    assert parse_endpoint("http://127.0.0.1:8000", "anthropic").name == "127.0.0.1:8000"
    for bad in ("a=ftp://x", "a b=http://x", "nourl"):
        with pytest.raises(ConfigError):
            parse_endpoint(bad, "openai")
    with pytest.raises(ConfigError, match="api must be one of"):
        parse_endpoint("a=http://x", "grpc")
    f = tmp_path / "p.yml"
    f.write_text("a: [1]\n")
    with pytest.raises(ConfigError, match="non-empty strings"):
        load_prompts(f)
    f.write_text("one: hello\n")
    assert load_prompts(f) == {"one": "hello"}
    (tmp_path / "bad.json").write_text("{}")
    with pytest.raises(ConfigError, match="not answers stored"):
        load_answers(tmp_path / "bad.json")


def _drift(*args: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [PYTHON, "-m", "inferwatch.agent", "drift", *args],
        cwd=ROOT,
        capture_output=True,
        text=True,
        timeout=300,
        check=False,
    )


# --- llama.cpp: native vs AVX2-only ------------------------------------------------------------------------------


@pytest.fixture(scope="module")
def llama_pair(llama_bin: Path, tmp_path_factory: pytest.TempPathFactory) -> Iterator[dict[str, str]]:
    avx2 = find_avx2_binary()
    if avx2 is None:
        pytest.fail("AVX2-only llama-server not built: scripts/build-llama-server.sh --avx2-only", pytrace=False)
    tmp = tmp_path_factory.mktemp("drift-llama")
    model = cached(tmp, PRESETS["tiny"])
    other = cached(tmp, dataclasses.replace(PRESETS["tiny"], seed=7))  # other weights, same shape
    with contextlib.ExitStack() as stack:
        urls = {
            "native": stack.enter_context(llama_server(llama_bin, model, tmp / "n.log", parallel=1)).url,
            "native-again": stack.enter_context(llama_server(llama_bin, model, tmp / "n2.log", parallel=1)).url,
            "avx2": stack.enter_context(llama_server(avx2, model, tmp / "a.log", parallel=1)).url,
            "other-weights": stack.enter_context(llama_server(llama_bin, other, tmp / "o.log", parallel=1)).url,
        }
        yield urls


@pytest.mark.integration
@pytest.mark.skipif(not AVX512, reason="needs an AVX-512 x86 CPU (the native build is the AVX-512 one)")
def test_native_and_avx2_builds(llama_pair: dict[str, str], tmp_path: Path) -> None:
    """Measured (docs/matrix.md): the same build twice agrees bit for bit; the AVX2-only build gives the same
    tokens for the built-in prompts with log-probabilities that differ by less than 0.01 but not by zero."""
    eps = [f"--endpoint={n}={llama_pair[n]}" for n in ("native", "native-again", "avx2")]
    r = _drift(*eps, "--format", "json", "--max-tokens", "32", "--save", str(tmp_path))
    assert r.returncode == 0, r.stdout + r.stderr
    again, avx2 = json.loads(r.stdout)
    assert again["candidate"] == "native-again" and not again["flagged"]
    assert all(p["max_abs_logprob_delta"] == 0.0 and p["diverged_at"] is None for p in again["prompts"])
    assert avx2["diverged_prompts"] == 0 and not avx2["flagged"]
    deltas = [p["max_abs_logprob_delta"] for p in avx2["prompts"]]
    assert 0 < max(deltas) < 0.01, deltas
    stored = load_answers(tmp_path / "avx2.json")
    assert len(stored.answers) == 8 and all(len(a.tokens) == 32 and len(a.top[0]) == 5 for a in stored.answers)
    # A node compared with the stored reference: the native answers as the fleet's reference.
    r = _drift("--reference", str(tmp_path / "native.json"), f"--endpoint=avx2-node={llama_pair['avx2']}")
    assert r.returncode == 0 and "no drift: 0 of 8 prompts diverge" in r.stdout, r.stdout + r.stderr


@pytest.mark.integration
def test_different_weights_are_flagged(llama_pair: dict[str, str]) -> None:
    r = _drift(f"--endpoint=native={llama_pair['native']}", f"--endpoint=other={llama_pair['other-weights']}")
    assert r.returncode == 1, r.stdout + r.stderr
    assert "DRIFT: 8 of 8 prompts diverge" in r.stdout and "diverges at token " in r.stdout


# --- the simulator: deterministic ----------------------------------------------------------------------------


@pytest.fixture(scope="module")
def sims(tmp_path_factory: pytest.TempPathFactory) -> Iterator[list[str]]:
    tmp = tmp_path_factory.mktemp("drift-sim")
    with contextlib.ExitStack() as stack:
        urls = []
        for i, hw in enumerate(("h100", "a100")):
            port = free_port()
            cmd = [
                PYTHON,
                "-m",
                "inferwatch.agent",
                "simulate",
                "--host",
                "127.0.0.1",
                "--port",
                str(port),
                "--hardware",
                hw,
            ]
            proc = stack.enter_context(running([*cmd, "--model", "sim-model"], tmp / f"sim{i}.log", cwd=ROOT))
            urls.append(f"http://127.0.0.1:{port}")
            wait_http(f"{urls[-1]}/v1/models", proc=proc, timeout_s=90)
        yield urls


@pytest.mark.integration
@pytest.mark.parametrize("api", ["openai", "anthropic"])
def test_simulator_is_deterministic_and_prompts_stay_private(sims: list[str], tmp_path: Path, api: str) -> None:
    prompts = tmp_path / "prompts.yml"
    prompts.write_text(f"secret: {SECRET}\nplain: Say hello.\n")
    args = ["--api", api, "--model", "sim-model", "--prompts", str(prompts), "--max-tokens", "12"]
    r = _drift(f"--endpoint=h100={sims[0]}", f"--endpoint=a100={sims[1]}", *args, "--save", str(tmp_path / "s"))
    assert r.returncode == 0, r.stdout + r.stderr
    assert "no drift: 0 of 2 prompts diverge" in r.stdout
    assert "identical (" in r.stdout and "chars)" in r.stdout  # no log-probabilities: compared on text
    saved = (tmp_path / "s" / "h100.json").read_text()
    assert SECRET not in r.stdout + r.stderr + saved and sha256(SECRET) in saved
    assert load_answers(tmp_path / "s" / "h100.json").answers[0].text  # the answer is stored
    shown = _drift(f"--endpoint=h100={sims[0]}", f"--endpoint=a100={sims[1]}", *args, "--show-prompts")
    assert shown.returncode == 0 and SECRET in shown.stdout
    unreachable = _drift(f"--endpoint=a={sims[0]}", f"--endpoint=b=http://127.0.0.1:{free_port()}", *args)
    assert unreachable.returncode == 1 and "prompt secret" in unreachable.stderr
    assert SECRET not in unreachable.stderr
