"""The simulator over real HTTP: official openai/anthropic clients, vLLM /metrics contract, scenarios."""

from __future__ import annotations

import json
import time
from collections.abc import Iterator
from pathlib import Path

import anthropic
import httpx
import openai
import pytest
from prometheus_client.parser import text_string_to_metric_families

from inferwatch.simulator.metrics import build_1_2_5_buckets
from tests.conftest import FIXTURES, PYTHON, ROOT, free_port
from tests.procs import running, wait_http

pytestmark = pytest.mark.integration
MODEL = "meta-llama/Llama-3.1-8B-Instruct"
TOKEN = "test-token-123"
CONTRACT = json.loads((FIXTURES / "vllm" / "v1_contract.json").read_text())


@pytest.fixture(scope="module")
def sim(tmp_path_factory: pytest.TempPathFactory) -> Iterator[str]:
    port = free_port()
    log = tmp_path_factory.mktemp("sim") / "sim.log"
    cmd = [PYTHON, "-m", "inferwatch.agent", "simulate", "--port", str(port), "--model", MODEL, "--engines", "2",
           "--control-token", TOKEN, "--debug-profile", "--seed", "7"]  # fmt: skip
    with running(cmd, log, cwd=ROOT) as proc:
        url = f"http://127.0.0.1:{port}"
        wait_http(url + "/health", proc=proc)
        yield url


def control(url: str, body: dict, token: str | None = TOKEN) -> httpx.Response:
    headers = {"Authorization": f"Bearer {token}"} if token else {}
    return httpx.post(url + "/control/scenario", json=body, headers=headers, timeout=5)


@pytest.fixture
def scenarios(sim: str) -> Iterator[str]:
    yield sim
    assert control(sim, {"scenarios": []}).status_code == 200


def oai(url: str) -> openai.OpenAI:
    return openai.OpenAI(base_url=url + "/v1", api_key="x", max_retries=0, timeout=20)


def test_openai_client_chat_non_stream_and_stream(sim: str):
    client = oai(sim)
    r = client.chat.completions.create(model=MODEL, messages=[{"role": "user", "content": "Hi there"}], max_tokens=7)
    assert r.choices[0].message.role == "assistant"
    assert r.choices[0].finish_reason in ("stop", "length")
    assert r.usage is not None and r.usage.completion_tokens == len(r.choices[0].message.content.split()) <= 7
    assert r.usage.prompt_tokens == 2 + 4  # two words + chat template tokens
    chunks = list(
        client.chat.completions.create(
            model=MODEL, messages=[{"role": "user", "content": "Hi"}], max_tokens=12, stream=True,
            stream_options={"include_usage": True}, extra_body={"ignore_eos": True},
        )
    )  # fmt: skip
    text = "".join(c.choices[0].delta.content or "" for c in chunks if c.choices)
    assert len(text.split()) == 12
    assert chunks[-1].choices == [] and chunks[-1].usage.completion_tokens == 12
    assert [c.choices[0].finish_reason for c in chunks if c.choices][-1] == "length"


def test_openai_client_completions_both_ways(sim: str):
    client = oai(sim)
    r = client.completions.create(model=MODEL, prompt="Once upon a time", max_tokens=5, extra_body={"ignore_eos": True})
    assert r.usage.completion_tokens == 5 and r.choices[0].finish_reason == "length"
    parts = list(client.completions.create(model=MODEL, prompt="x", max_tokens=4, stream=True))
    assert "".join(p.choices[0].text for p in parts).strip()


def test_raw_sse_framing_ends_with_done(sim: str):
    body = {"model": MODEL, "messages": [{"role": "user", "content": "a"}], "max_tokens": 3, "stream": True,
            "ignore_eos": True}  # fmt: skip
    raw = httpx.post(sim + "/v1/chat/completions", json=body, timeout=10)
    assert raw.headers["content-type"].startswith("text/event-stream")
    events = raw.text.split("\n\n")
    assert events[-2] == "data: [DONE]" and events[-1] == ""
    for ev in events[:-2]:
        json.loads(ev.removeprefix("data: "))


def test_anthropic_client_streams_messages_in_the_exact_event_order(sim: str):
    client = anthropic.Anthropic(base_url=sim, api_key="x", max_retries=0, timeout=20)
    with client.messages.stream(model=MODEL, max_tokens=6, messages=[{"role": "user", "content": "Hello"}]) as s:
        types = [e.type for e in s]
        final = s.get_final_message()
    assert final.usage.output_tokens == len(final.content[0].text.split()) <= 6
    raw = httpx.post(
        sim + "/v1/messages",
        json={"model": MODEL, "max_tokens": 4, "stream": True, "messages": [{"role": "user", "content": "Hi"}]},
        timeout=10,
    )
    names = [line[len("event: ") :] for line in raw.text.splitlines() if line.startswith("event: ")]
    n = names.count("content_block_delta")
    assert n >= 1
    assert names == ["message_start", "content_block_start"] + ["content_block_delta"] * n + [
        "content_block_stop", "message_delta", "message_stop"
    ]  # fmt: skip
    assert "message_start" in types and "content_block_delta" in types
    nonstream = client.messages.create(model=MODEL, max_tokens=3, messages=[{"role": "user", "content": "Hi"}])
    assert nonstream.stop_reason in ("end_turn", "max_tokens")


def test_models_health_and_bad_input(sim: str):
    assert [m.id for m in oai(sim).models.list()] == [MODEL]
    assert httpx.get(sim + "/health").status_code == 200
    r = httpx.post(sim + "/v1/chat/completions", content=b"\xff\xfe not json", timeout=5)
    assert r.status_code == 400 and r.json()["error"]["type"] == "BadRequestError"
    r = httpx.post(sim + "/v1/chat/completions", json={"model": "nope", "messages": [{"role": "user", "content": "a"}]})
    assert r.status_code == 404 and r.json()["error"]["param"] == "model"
    r = httpx.post(sim + "/v1/chat/completions", json={"messages": [], "max_tokens": 1})
    assert r.status_code == 400
    r = httpx.post(sim + "/v1/messages", json={"messages": [{"role": "user", "content": "a"}]})
    assert r.status_code == 400 and r.json()["error"]["type"] == "invalid_request_error"


def _families(text: str) -> dict:
    return {f.name: f for f in text_string_to_metric_families(text)}


def test_metrics_are_exactly_vllm_v1s_families_labels_and_buckets(sim: str):
    oai(sim).chat.completions.create(model=MODEL, messages=[{"role": "user", "content": "x"}], max_tokens=3)
    text = httpx.get(sim + "/metrics").text
    fams = _families(text)
    # the text parser reports each *_created series as a family of its own
    got = {n for n in fams if n.startswith("vllm:") and not n.endswith("_created")}
    want = {f["name"] for f in CONTRACT["families"]}
    assert got == want, (got - want, want - got)
    max_len_buckets = [float(b) for b in build_1_2_5_buckets(8192)]
    for spec in CONTRACT["families"] + CONTRACT["http_families"]:
        fam = fams[spec["name"].removesuffix("_total") if spec["type"] == "counter" else spec["name"]]
        assert fam.type == spec["type"], spec["name"]
        assert fam.documentation == spec["help"].rstrip(), spec["name"]  # the parser drops trailing spaces
        if spec["name"] == "vllm:cache_config_info":
            for s in fam.samples:
                assert {"engine", "block_size", "num_gpu_blocks"} <= set(s.labels)
            continue
        for s in fam.samples:
            assert sorted(k for k in s.labels if k != "le") == spec["labels"], (spec["name"], s.labels)
        if spec["type"] == "histogram":
            want_b = max_len_buckets if isinstance(spec["buckets"], str) else [float(b) for b in spec["buckets"]]
            les = [float(s.labels["le"]) for s in fam.samples if s.name.endswith("_bucket")]
            per_series = les[: les.index(float("inf")) + 1]
            assert per_series == [*want_b, float("inf")], spec["name"]
    # two data-parallel engines, counters with _total and _created, deprecated names hidden
    assert {s.labels["engine"] for s in fams["vllm:num_requests_running"].samples} == {"0", "1"}
    assert "vllm:prompt_tokens_total{" in text and "vllm:prompt_tokens_created{" in text
    assert "vllm:gpu_cache_usage_perc" not in text and "vllm:time_per_output_token_seconds" not in text
    for series in CONTRACT["expected_series_after_one_request"]:
        assert f"\n{series}{{" in text or f"\n{series} " in text, series
    reasons = {s.labels["finished_reason"] for s in fams["vllm:request_success"].samples}
    assert reasons == set(CONTRACT["finished_reasons"])


def test_metrics_answer_a_name_query_with_those_samples_alone_as_vllms_prometheus_client_app_does(sim: str):
    """vLLM's /metrics is prometheus_client's make_asgi_app: ``name[]=`` restricts the answer to those samples (the
    agent's progress passes ask so, agent/node/engine/progress.py)."""
    oai(sim).chat.completions.create(model=MODEL, messages=[{"role": "user", "content": "x"}], max_tokens=3)
    names = ["vllm:num_requests_running", "vllm:generation_tokens_total"]
    text = httpx.get(sim + "/metrics", params=[("name[]", n) for n in names]).text
    got = {s.name for fam in text_string_to_metric_families(text) for s in fam.samples}
    assert got == set(names), got
    assert len(text) * 10 < len(httpx.get(sim + "/metrics").text)


def test_hidden_metrics_only_behind_the_flag(tmp_path: Path):
    port = free_port()
    cmd = [
        PYTHON,
        "-m",
        "inferwatch.agent",
        "simulate",
        "--port",
        str(port),
        "--show-hidden-metrics-for-version",
        "0.11",
    ]
    with running(cmd, tmp_path / "log", cwd=ROOT) as proc:
        wait_http(f"http://127.0.0.1:{port}/health", proc=proc)
        fams = _families(httpx.get(f"http://127.0.0.1:{port}/metrics").text)
    for spec in CONTRACT["hidden_families"]:
        assert fams[spec["name"]].documentation == spec["help"]


def test_debug_profile_needs_the_header_and_the_start_flag(sim: str, scenarios: str, tmp_path: Path):
    hdr = {"X-Runtime-Debug": "runtime_profile=1"}
    assert httpx.get(sim + "/debug/runtime_profile").json() == {}
    assert httpx.get(sim + "/debug/runtime_profile", headers={"X-Runtime-Debug": "other"}).json() == {}
    prof = httpx.get(sim + "/debug/runtime_profile", headers=hdr).json()
    for key in ("quantization_scheme", "attention_kernel", "gpu_memory_used_bytes", "cpu_affinity_mask"):
        assert key in prof
    assert prof["quantization_scheme"] == "bf16" and int(prof["cpu_affinity_mask"], 16) > 0
    assert control(sim, {"enable": "debug_disabled"}).status_code == 200
    assert httpx.get(sim + "/debug/runtime_profile", headers=hdr).json() == {}
    assert control(sim, {"scenarios": ["simd_fallback"]}).status_code == 200
    prof = httpx.get(sim + "/debug/runtime_profile", headers=hdr).json()
    assert prof["simd_fallback"] is True
    port = free_port()  # debug mode not enabled at start: {} even with the header
    with running(
        [PYTHON, "-m", "inferwatch.agent", "simulate", "--port", str(port)], tmp_path / "log", cwd=ROOT
    ) as proc:
        wait_http(f"http://127.0.0.1:{port}/health", proc=proc)
        assert httpx.get(f"http://127.0.0.1:{port}/debug/runtime_profile", headers=hdr).json() == {}
        assert control(f"http://127.0.0.1:{port}", {"enable": "hang"}).status_code == 403


def test_control_endpoint_requires_the_bearer_token(sim: str, scenarios: str):
    assert control(sim, {"enable": "hang"}, token=None).status_code == 401
    assert control(sim, {"enable": "hang"}, token="wrong").status_code == 401
    assert control(sim, {"enable": "nope"}).status_code == 400
    assert control(sim, {"enable": {"name": "error_burst", "params": {"rate": 7}}}).status_code == 400
    r = control(sim, {"enable": "page_cache_pressure:fraction=0.3"})
    assert r.json()["scenarios"] == [{"name": "page_cache_pressure", "params": {"fraction": 0.3, "extra_s": 0.55}}]
    assert httpx.get(sim + "/control/scenario", headers={"Authorization": f"Bearer {TOKEN}"}).json() == r.json()


def test_hardware_mismatch_and_error_burst(sim: str, scenarios: str):
    control(sim, {"enable": "hardware_mismatch"})
    with pytest.raises(openai.BadRequestError) as exc:
        oai(sim).chat.completions.create(model=MODEL, messages=[{"role": "user", "content": "x"}], max_tokens=2)
    assert exc.value.status_code == 400 and exc.value.body["type"] == "hardware_mismatch"
    r = httpx.post(
        sim + "/v1/messages", json={"model": MODEL, "max_tokens": 2, "messages": [{"role": "user", "content": "x"}]}
    )
    assert r.status_code == 400 and r.json()["error"]["type"] == "hardware_mismatch"
    control(sim, {"scenarios": ["error_burst:rate=1,status=503"]})
    with pytest.raises(openai.InternalServerError) as exc5:
        oai(sim).chat.completions.create(model=MODEL, messages=[{"role": "user", "content": "x"}], max_tokens=2)
    assert exc5.value.status_code == 503
    control(sim, {"scenarios": ["error_burst:rate=0.5"]})
    codes = [
        httpx.post(sim + "/v1/completions", json={"prompt": "a", "max_tokens": 1}, timeout=10).status_code
        for _ in range(60)
    ]
    assert 10 < codes.count(500) < 50 and codes.count(200) == 60 - codes.count(500)
    text = httpx.get(sim + "/metrics").text
    assert 'http_requests_total{handler="/v1/completions",method="POST",status="5xx"}' in text


def test_stream_usage_only_sends_empty_deltas_with_usage(sim: str, scenarios: str):
    control(sim, {"enable": "stream_usage_only"})
    chunks = list(
        oai(sim).chat.completions.create(
            model=MODEL, messages=[{"role": "user", "content": "x"}], max_tokens=5, stream=True,
            extra_body={"ignore_eos": True},
        )
    )  # fmt: skip
    content = [c for c in chunks if c.choices and c.choices[0].finish_reason is None][1:]
    assert len(content) == 5
    assert all(c.choices[0].delta.content == "" and c.usage is not None for c in content)
    assert [c.usage.completion_tokens for c in content] == [1, 2, 3, 4, 5]


def test_hang_stops_tokens_while_health_stays_200(sim: str, scenarios: str):
    control(sim, {"enable": "hang"})
    body = {"model": MODEL, "messages": [{"role": "user", "content": "x"}], "max_tokens": 4, "stream": True}
    got = b""
    with httpx.stream("POST", sim + "/v1/chat/completions", json=body, timeout=httpx.Timeout(10, read=1.5)) as r:
        # The hang began with the engine idle; the request that arrived after it is visible as queued, as a
        # wedged vLLM shows it, so "requests in the engine, no tokens" holds (EngineHungButHealthy).
        queued = 0.0
        for _ in range(20):
            fams = _families(httpx.get(sim + "/metrics").text)
            queued = sum(
                s.value for f in ("vllm:num_requests_waiting", "vllm:num_requests_running") for s in fams[f].samples
            )
            if queued:
                break
            time.sleep(0.05)
        assert queued == 1
        with pytest.raises(httpx.ReadTimeout):
            for part in r.iter_bytes():
                got += part
        assert httpx.get(sim + "/health", timeout=5).status_code == 200
    assert b'"content":"' not in got.replace(b'"content":""', b"")
    control(sim, {"disable": "hang"})
    r = oai(sim).chat.completions.create(model=MODEL, messages=[{"role": "user", "content": "x"}], max_tokens=2)
    assert r.choices[0].message.content


def test_simd_fallback_live_slows_engine_phases(sim: str, scenarios: str):
    """Smaller live check (the n >= 500 statistics run in test_sim_model against the timing model)."""

    def decode_mean() -> tuple[float, float]:
        fams = _families(httpx.get(sim + "/metrics").text)
        samples = fams["vllm:request_decode_time_seconds"].samples  # summed over both engines
        total = sum(x.value for x in samples if x.name.endswith("_sum"))
        return total, sum(x.value for x in samples if x.name.endswith("_count"))

    def batch() -> float:
        s0, c0 = decode_mean()
        client = oai(sim)
        for _ in range(8):
            client.completions.create(model=MODEL, prompt="x", max_tokens=30, extra_body={"ignore_eos": True})
        s1, c1 = decode_mean()
        return (s1 - s0) / (c1 - c0)

    base = batch()
    control(sim, {"enable": "simd_fallback:factor=1.5"})
    slow = batch()
    assert 1.3 < slow / base < 1.7


def _aborted(url: str) -> float:
    fams = _families(httpx.get(url + "/metrics").text)
    return sum(s.value for s in fams["vllm:request_success"].samples if s.labels.get("finished_reason") == "abort")


def test_client_disconnect_aborts_the_request(sim: str):
    before = _aborted(sim)
    body = {"model": MODEL, "messages": [{"role": "user", "content": "x"}], "max_tokens": 2000, "stream": True,
            "ignore_eos": True}  # fmt: skip
    with httpx.stream("POST", sim + "/v1/chat/completions", json=body, timeout=10) as r:
        for line in r.iter_lines():
            if '"content":"' in line and '"content":""' not in line:
                break  # leave after the first token
    deadline = time.monotonic() + 60  # bounds a hang: the server notices the disconnect when the load lets it
    while _aborted(sim) < before + 1 and time.monotonic() < deadline:
        time.sleep(0.1)
    assert _aborted(sim) == before + 1
    running = _families(httpx.get(sim + "/metrics").text)["vllm:num_requests_running"].samples
    assert sum(s.value for s in running) == 0


def test_oversized_body_is_refused(sim: str):
    r = httpx.post(sim + "/v1/completions", content=b"x" * (9 << 20), headers={"content-type": "application/json"})
    assert r.status_code == 413 and "exceeds" in r.json()["error"]["message"]


def test_several_models_each_with_their_own_engines():
    from starlette.testclient import TestClient

    from inferwatch.simulator.config import SimConfig
    from inferwatch.simulator.server import create_app

    app, _ = create_app(SimConfig(models=("org/a-1B", "org/b-3B"), engines=2))
    with TestClient(app) as client:
        assert [m["id"] for m in client.get("/v1/models").json()["data"]] == ["org/a-1B", "org/b-3B"]
        for model in ("org/a-1B", "org/b-3B"):
            r = client.post("/v1/completions", json={"model": model, "prompt": "hi", "max_tokens": 3})
            assert r.status_code == 200 and r.json()["model"] == model
        fams = _families(client.get("/metrics").text)
    pairs = {(s.labels["model_name"], s.labels["engine"]) for s in fams["vllm:num_requests_running"].samples}
    assert pairs == {(m, e) for m in ("org/a-1B", "org/b-3B") for e in ("0", "1")}
    done = {s.labels["model_name"] for s in fams["vllm:request_success"].samples if s.value > 0}
    assert done == {"org/a-1B", "org/b-3B"}


def test_page_cache_pressure_live_splits_prefill_into_two_buckets(sim: str, scenarios: str):
    """Smaller live check: half the requests take the 0.4 s slow path, the rest stay in the first bucket."""
    import asyncio

    def counts() -> tuple[float, float, float]:
        samples = _families(httpx.get(sim + "/metrics").text)["vllm:request_prefill_time_seconds"].samples
        le = lambda b: sum(s.value for s in samples if s.name.endswith("_bucket") and s.labels["le"] == b)  # noqa: E731
        return le("0.3"), le("0.8"), le("+Inf")

    async def burst(n: int) -> None:
        async with httpx.AsyncClient(timeout=30) as c:
            rs = await asyncio.gather(
                *(c.post(sim + "/v1/completions", json={"prompt": "x", "max_tokens": 2}) for _ in range(n))
            )
        assert all(r.status_code == 200 for r in rs)

    control(sim, {"enable": "page_cache_pressure:fraction=0.5,extra_s=0.4"})
    fast0, below0, all0 = counts()
    asyncio.run(burst(24))
    fast1, below1, all1 = counts()
    fast = fast1 - fast0
    assert all1 - all0 == 24 and below1 - below0 == 24  # ~15 ms or ~0.4 s, nothing slower
    assert 4 <= 24 - fast <= 20, fast
