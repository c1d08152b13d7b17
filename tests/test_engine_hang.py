"""The hang detector on the simulator's scheduler and vLLM exposition in virtual time (tests/hang_sim.py).

A hang of one data-parallel rank is found within the allowance plus one scrape; the look-alikes that are not
hangs never are: an idle engine, one prefill of the maximum model length on a slow CPU profile (longer than
the minimum window, with no token), a burst queued behind a full KV cache, an engine restart. Each look-alike
also checks that it really looks like a hang to a naive rule (the test could fail). The maximum model length is
configured, or learnt by the engine collector from the engine (vLLM ``GET /v1/models``, llama.cpp ``GET /props``):
those tests scrape the virtual engine through the real collector over an ``httpx.MockTransport``.
"""

from __future__ import annotations

import contextlib
import json
import time
from collections.abc import Callable
from typing import Any

import httpx
import pytest

from inferwatch.agent.config import Settings
from inferwatch.agent.node.collectors.engine import EngineCollector
from inferwatch.agent.node.engine.adapters import RANK_LABELS
from inferwatch.agent.node.engine.fetch import EngineScrapeError
from inferwatch.agent.node.engine.hang import HangDetector, RankVerdict
from inferwatch.agent.node.engine.hangreport import hang_findings, hang_samples, health_url
from inferwatch.agent.node.engine.modellen import (
    MODEL_LEN_MIN_GAP_S,
    MODEL_LEN_RETRY_S,
    ask_model_len,
    model_len_url,
    model_lens,
)
from inferwatch.agent.node.engine.scrape import EngineParser
from inferwatch.agent.node.wiring import collect_context
from tests.conftest import FIXTURES
from tests.hang_sim import SCRAPE_S, Scraper, VirtualEngine

Handler = Callable[[httpx.Request], httpx.Response]


def vllm_models(e: VirtualEngine) -> Handler:
    """vLLM's ``GET /v1/models`` (``ModelCard`` of vllm/entrypoints/openai/protocol.py): ``max_model_len`` per card."""

    def answer(_req: httpx.Request) -> httpx.Response:
        permission = [{"id": "modelperm-0", "object": "model_permission", "allow_sampling": True}]
        card = {"id": "m", "object": "model", "created": 0, "owned_by": "vllm", "root": "/models/m", "parent": None,
                "max_model_len": e.dep.size.max_model_len, "permission": permission}  # fmt: skip
        lora = {"id": "m-lora", "object": "model", "created": 0, "owned_by": "vllm", "root": "/lora", "parent": "m",
                "max_model_len": None, "permission": []}  # fmt: skip
        return httpx.Response(200, json={"object": "list", "data": [card, lora]})

    return answer


class Engine:
    """The virtual engine behind a MockTransport: ``/metrics`` from its exposition (503 while ``down``), every other
    path from ``routes`` (404 if absent), each recorded in ``asked``; scraped by the real collector at virtual time."""

    def __init__(self, e: VirtualEngine, routes: dict[str, Handler] | None = None, **engine: Any) -> None:
        self.e, self.routes, self.asked, self.down = e, dict(routes or {}), list[str](), False
        self.history: list[dict[str, Any]] = []
        settings = Settings.from_values(
            dict(engine={"metrics_url": "http://engine:8000/metrics", "health_url": "", **engine})
        )
        client = httpx.Client(transport=httpx.MockTransport(self._handle))
        self.collector = EngineCollector(
            collect_context(settings, engine_http=client), settings.engine, clock=lambda: e.now
        )

    def _handle(self, req: httpx.Request) -> httpx.Response:
        if req.url.path == "/metrics":
            if self.down:
                return httpx.Response(503)
            return httpx.Response(200, content=self.e.exposition(), headers={"content-type": "text/plain"})
        self.asked.append(req.url.path)
        route = self.routes.get(req.url.path)
        return route(req) if route else httpx.Response(404)

    def run(self, seconds: float) -> None:
        end = self.e.now + seconds
        while self.e.now + SCRAPE_S <= end + 1e-9:
            self.e.advance(self.e.now + SCRAPE_S)
            with contextlib.suppress(EngineScrapeError):  # the engine is down: the scrape fails, as live
                self.history.append({**self.collector.collect().details, "t": self.e.now})
            self.collector.join_model_len()  # the answer is taken by the next scrape

    def first_stalled(self) -> float | None:
        return next((d["t"] for d in self.history if any(v["stalled"] for v in d["hang"])), None)

    def max_stall(self) -> float:
        return max((v["stall_s"] for d in self.history for v in d["hang"]), default=0.0)


def test_a_hung_rank_is_found_within_the_minimum_window_and_the_other_rank_is_not():
    e = VirtualEngine("h100", 8.0, engines=2)
    s = Scraper(e, HangDetector())
    for _ in range(40):
        e.submit(512, 4000)
    s.run(60)
    assert s.first_stalled() is None
    for _ in range(20):
        e.submit(512, 4000)  # both ranks busy when rank 0 wedges
    e.hung.add(0)
    start = e.now
    s.run(120)
    found = s.first_stalled()
    assert found is not None and found - start <= 30.0 + SCRAPE_S
    ranks = {v.rank for _t, vs in s.history for v in vs if v.stalled}
    assert ranks == {"0"}  # rank 1 keeps producing tokens: a sum over ranks would have hidden the hang
    last = {v.rank: v for v in s.history[-1][1]}
    assert last["0"].running + last["0"].waiting > 0 and last["1"].stall_s == 0


def test_a_hang_that_begins_idle_is_found_from_the_requests_that_queue_behind_it():
    e = VirtualEngine("h100", 8.0)
    s = Scraper(e, HangDetector())
    s.run(30)
    e.hung.add(0)
    e.submit(128, 16)  # arrives after the hang began: waits forever
    start = e.now
    s.run(90)
    found = s.first_stalled()
    assert found is not None and found - start <= 30.0 + SCRAPE_S
    assert s.history[-1][1][0].waiting == 1 and s.history[-1][1][0].running == 0


def test_idle_engine_is_never_stalled():
    s = Scraper(VirtualEngine("h100", 8.0), HangDetector())
    s.run(600)
    assert s.max_stall() == 0 and s.first_stalled() is None
    assert all(v.running == 0 and v.waiting == 0 for _t, vs in s.history for v in vs)


def _long_prefill(e: VirtualEngine, s: Scraper | Engine) -> None:
    for _ in range(3):
        e.submit(256, 8)  # a little history: the engine's prefill seconds per token
    s.run(60)
    e.submit(e.dep.size.max_model_len - 1, 4)  # one prompt of the maximum model length
    s.run(240)


def test_one_long_prefill_on_a_slow_cpu_profile_is_not_a_hang_with_max_model_len_configured():
    e = VirtualEngine("graviton3-cpu", 8.0)
    s = Scraper(e, HangDetector(max_model_len=8192))
    _long_prefill(e, s)
    assert s.max_stall() >= 30.0  # no token for longer than the minimum window: the look-alike bites
    assert s.first_stalled() is None
    configured = Engine(VirtualEngine("graviton3-cpu", 8.0), {"/v1/models": vllm_models(e)}, max_model_len=8192)
    configured.run(60)
    assert configured.asked == [] and configured.history[-1]["max_model_len"]["last"] == "configured"


def test_one_long_prefill_is_not_a_hang_with_the_default_config_the_length_learnt_from_v1_models():
    e = VirtualEngine("graviton3-cpu", 8.0)
    s = Engine(e, {"/v1/models": vllm_models(e)})
    _long_prefill(e, s)
    assert s.max_stall() >= 30.0  # the look-alike bites
    assert s.first_stalled() is None
    assert s.asked == ["/v1/models"]  # once for this engine start, not on each of the 20 scrapes
    last = s.history[-1]
    assert last["max_model_len"] == {
        "configured": 0, "engine": {"m": 8192}, "url": "http://engine:8000/v1/models", "last": "ok", "errors": {},
    }  # fmt: skip
    assert last["hang"][0]["max_model_len"] == 8192 and last["hang"][0]["allowance_s"] > s.max_stall()


def test_without_a_length_endpoint_the_long_prefill_is_stalled_after_the_minimum_window():
    """The engine reports no length (404 here, as an engine without ``/v1/models``, or one whose cards lack
    ``max_model_len``): the agent cannot know a prefill may take this long, so the minimum window applies and
    this look-alike is flagged; docs/diagnostics.md says to set ``engine.max_model_len`` there."""
    e = VirtualEngine("graviton3-cpu", 8.0)
    s = Engine(e)
    _long_prefill(e, s)
    assert s.first_stalled() is not None
    assert s.asked == ["/v1/models"]  # asked again only after MODEL_LEN_RETRY_S (300 s): not within this run
    last = s.history[-1]
    assert last["max_model_len"]["engine"] == {} and last["max_model_len"]["errors"] == {"absent": 1}
    assert last["hang"][0]["max_model_len"] == 0 and last["hang"][0]["allowance_s"] == 30.0


def test_a_hang_is_found_as_fast_with_the_learnt_length():
    e = VirtualEngine("h100", 8.0, engines=2)
    s = Engine(e, {"/v1/models": vllm_models(e)})
    for _ in range(40):
        e.submit(512, 4000)
    s.run(60)
    for _ in range(20):
        e.submit(512, 4000)
    e.hung.add(0)
    start = e.now
    s.run(120)
    found = s.first_stalled()
    assert found is not None and found - start <= 30.0 + SCRAPE_S  # 2 × 8192 × ~0.5 ms per token < 30 s on H100
    assert {v["max_model_len"] for v in s.history[-1]["hang"]} == {8192}
    assert {v["rank"] for d in s.history for v in d["hang"] if v["stalled"]} == {"0"}


def test_the_length_is_asked_again_per_engine_start_and_after_a_failure_never_per_scrape():
    e = VirtualEngine("h100", 8.0)
    state = {"status": 503}

    def flaky(req: httpx.Request) -> httpx.Response:
        return vllm_models(e)(req) if state["status"] == 200 else httpx.Response(state["status"])

    s = Engine(e, {"/v1/models": flaky})
    e.submit(64, 100000)
    s.run(120)
    assert s.asked == ["/v1/models"] and s.history[-1]["max_model_len"]["errors"] == {"http_status": 1}
    state["status"] = 200
    s.run(MODEL_LEN_RETRY_S)  # the retry comes once its time has
    assert s.asked == ["/v1/models"] * 2 and s.history[-1]["max_model_len"]["engine"] == {"m": 8192}
    s.run(600)
    assert len(s.asked) == 2  # a steady engine is not asked again
    s.down = True  # the engine goes away for a minute and comes back (a scrape failed: maybe a new process)
    s.run(60)
    s.down = False
    e.restart()
    e.submit(64, 100000)
    s.run(30)
    assert len(s.asked) == 3
    e.advance(e.now + MODEL_LEN_MIN_GAP_S)
    e.restart()  # a restart between two scrapes: the counters went down
    e.submit(64, 100000)
    s.run(30)
    assert len(s.asked) == 4
    e.restart()  # again at once: within MODEL_LEN_MIN_GAP_S of the last request, it waits for the gap
    e.submit(64, 100000)
    s.run(30)
    assert len(s.asked) == 4
    s.run(60)
    assert len(s.asked) == 5
    state["status"] = 404  # a failure after a restart keeps the last answer
    e.advance(e.now + MODEL_LEN_MIN_GAP_S)
    e.restart()
    s.run(30)
    assert len(s.asked) == 6 and s.history[-1]["max_model_len"]["engine"] == {"m": 8192}
    assert s.history[-1]["max_model_len"]["errors"] == {"http_status": 1, "absent": 1}


def test_llamacpp_reports_its_per_slot_context_in_props() -> None:
    """llama-server ``GET /props``: ``default_generation_settings.n_ctx`` is the per-slot context (``-c 512 -np 4``
    → 256 per slot, ../shared/reference/llamacpp.md): the longest prompt one request can have."""
    props = {"default_generation_settings": {"id": 0, "n_ctx": 256, "params": {"n_predict": -1}}, "total_slots": 4}
    assert model_lens("llamacpp", props) == {"": 256}
    assert model_len_url("http://127.0.0.1:8080/metrics", "llamacpp") == "http://127.0.0.1:8080/props"
    client = httpx.Client(transport=httpx.MockTransport(lambda r: httpx.Response(200, json=props)))
    answer = ask_model_len(client, "http://127.0.0.1:8080/props", "llamacpp")
    assert answer.reason == "ok" and answer.lens == {"": 256}
    d = HangDetector()
    d.learn(answer.lens)
    assert d.model_len("default") == 256  # the reading's model name (llama.cpp has no label) gets the engine's


@pytest.mark.parametrize(
    ("response", "reason"),
    [
        (httpx.Response(404), "absent"),
        (httpx.Response(401), "http_status"),
        (httpx.Response(200, content=b"<html>"), "not_json"),
        (httpx.Response(200, content=b"[" * 200_000), "not_json"),
        (httpx.Response(200, json={"object": "list", "data": [{"id": "m"}]}), "absent"),
        (httpx.Response(200, json={"data": [{"id": "m", "max_model_len": True}]}), "absent"),
        (httpx.Response(200, content=b"[" + b"1," * 600_000 + b"1]"), "too_large"),
    ],
)
def test_a_length_answer_that_cannot_be_used_says_why(response: httpx.Response, reason: str) -> None:
    client = httpx.Client(transport=httpx.MockTransport(lambda r: response))
    answer = ask_model_len(client, "http://e/v1/models", "vllm")
    assert (answer.reason, answer.lens) == (reason, {})


def test_a_length_request_that_cannot_connect_or_times_out_says_why() -> None:
    def refuse(req: httpx.Request) -> httpx.Response:
        raise httpx.ConnectError("refused", request=req)

    def slow(req: httpx.Request) -> httpx.Response:
        raise httpx.ReadTimeout("slow", request=req)

    for handler, reason in ((refuse, "connect"), (slow, "timeout")):
        answer = ask_model_len(httpx.Client(transport=httpx.MockTransport(handler)), "http://e/v1/models", "vllm")
        assert answer.reason == reason
    assert model_len_url("file:///tmp/metrics", "vllm") == "" and model_len_url(None, "vllm") == ""
    assert json.loads(json.dumps(model_lens("vllm", {"data": "x"}))) == {}


def test_burst_queued_behind_a_full_kv_cache_still_progresses():
    e = VirtualEngine("l40s", 8.0)
    s = Scraper(e, HangDetector())
    for _ in range(600):
        e.submit(4000, 1500)
    kv = []
    for _ in range(20):
        s.run(SCRAPE_S)
        kv.append(s.parser.parse(e.exposition()).models["m"].gauges["kv_usage"])
    waiting = [v.waiting for _t, vs in s.history for v in vs]
    assert sorted(kv)[len(kv) // 2] > 0.9 and min(waiting) > 100  # the cache full, the queue long the whole time
    assert s.first_stalled() is None and s.max_stall() == 0


def test_engine_restart_is_not_a_hang():
    e = VirtualEngine("h100", 8.0, engines=2)
    s = Scraper(e, HangDetector())
    for _ in range(60):
        e.submit(512, 2000)
    s.run(45)
    e.advance(e.now + 60)  # the engine is down for a minute: no scrape succeeds (the collector fails)
    e.restart()  # a new process: counters from zero, its requests lost
    for _ in range(60):
        e.submit(512, 2000)
    s.run(180)
    assert s.first_stalled() is None


def test_rank_labels_and_a_counter_reset_count_as_progress():
    assert RANK_LABELS == ("engine", "dp_rank")
    e = VirtualEngine("h100", 8.0)
    d = HangDetector(min_stall_s=30)
    s = Scraper(e, d)
    for _ in range(5):
        e.submit(256, 100000)
    s.run(30)
    e.hung.add(0)
    s.run(15)
    e.restart()  # the same rank comes back with lower counters while a request is in: progress, not a stall
    e.hung.clear()
    e.submit(256, 100000)
    s.run(15)
    assert s.history[-1][1][0].stall_s == 0


@pytest.mark.parametrize(
    ("metrics_url", "configured", "expected"),
    [
        ("http://127.0.0.1:8000/metrics", None, "http://127.0.0.1:8000/health"),
        ("https://e:9/x/metrics?a=1", None, "https://e:9/health"),
        ("http://127.0.0.1:8000/metrics", "", ""),
        ("http://127.0.0.1:8000/metrics", "http://127.0.0.1:8001/healthz", "http://127.0.0.1:8001/healthz"),
        (None, None, ""),
    ],
)
def test_health_url(metrics_url: str | None, configured: str | None, expected: str):
    assert health_url(metrics_url, configured) == expected


def test_a_failing_health_check_is_not_hung_but_healthy():
    v = RankVerdict("m", "0", 2, 3, 45.0, 30.0, True, None)
    assert [s.value for s in hang_samples([v], "ok") if s.name == "inferwatch.engine.hung"] == [1]
    assert [s.value for s in hang_samples([v], "failed") if s.name == "inferwatch.engine.hung"] == [0]
    (f,) = hang_findings([v], "absent", "http://x/health")
    assert f.runbook == "EngineHungButHealthy" and f.evidence["health"] == "absent"
    assert hang_findings([v], "failed", "http://x/health") == []
    assert httpx.URL(health_url("http://h:1/metrics", None)).path == "/health"


@pytest.mark.integration
def test_live_simulator_one_rank_hung_through_the_engine_collector(tmp_path) -> None:
    """The real simulator (2 data-parallel engines, under load), ``hang:engine=1``, the agent's engine collector."""
    from inferwatch.agent.config import Settings
    from inferwatch.agent.node.collectors.engine import EngineCollector
    from inferwatch.agent.node.wiring import collect_context
    from tests.conftest import PYTHON, ROOT, free_port
    from tests.procs import running, wait_http

    port, token = free_port(), "hang-control-token-0123"
    cmd = [
        PYTHON,
        "-m",
        "inferwatch.agent",
        "simulate",
        "--port",
        str(port),
        "--engines",
        "2",
        "--control-token",
        token,
    ]
    with running(cmd, tmp_path / "sim.log", cwd=ROOT) as proc:
        url = f"http://127.0.0.1:{port}"
        wait_http(url + "/health", proc=proc)
        load = [
            PYTHON,
            "-m",
            "inferwatch.agent",
            "loadgen",
            "--url",
            url,
            "--rate",
            "8",
            "--duration",
            "300",  # outlives the waits below (stopped on exit): a hang is seen only while requests run
            "--no-progress",
        ]
        with running([*load, "--output-tokens", "64", "--timeout", "120"], tmp_path / "load.log", cwd=ROOT):
            settings = Settings.from_values(dict(engine={"metrics_url": f"{url}/metrics", "hang_min_stall_s": 2.0}))
            collector = EngineCollector(collect_context(settings), settings.engine)
            try:
                deadline = time.monotonic() + 60
                while not any(v["stall_s"] == 0 and v["running"] for v in collector.collect().details["hang"]):
                    assert time.monotonic() < deadline, "the simulator never served"
                    time.sleep(0.5)
                r = httpx.post(f"{url}/control/scenario", json={"enable": "hang:engine=1"},
                               headers={"Authorization": f"Bearer {token}"}, timeout=5)  # fmt: skip
                assert r.status_code == 200, r.text
                found = None
                deadline = time.monotonic() + 120  # bounds a hang (CI's load 10-17 on 2 cores)
                while found is None:
                    assert time.monotonic() < deadline, "rank 1 never found hung"
                    time.sleep(0.5)
                    c = collector.collect()
                    found = next((f for f in c.findings if f.id == "engine_hung"), None)
                assert found.evidence["rank"] == "1" and found.evidence["health"] == "ok"
                assert found.evidence["max_model_len"] == 8192  # learnt from the simulator's GET /v1/models
                assert c.details["max_model_len"]["last"] == "ok"
                assert [f.evidence["rank"] for f in c.findings] == ["1"]
                hung = {s.attributes: s.value for s in c.samples if s.name == "inferwatch.engine.hung"}
                assert sorted(hung.values()) == [0, 1]
            finally:
                collector.close()


@pytest.mark.parametrize(
    ("capture", "has_step"),
    [
        ("vllm-v1-ngc-25.09-full.prom", True),  # V1: kv_cache_usage_perc (beside the deprecated name)
        ("vllm-v1-dp2-synthetic.prom", True),
        ("vllm-v1-signals-dp2.prom", True),
        ("vllm-v1-deprecated-names-synthetic.prom", False),  # gpu_cache_usage_perc only: not known to be per step
        ("vllm-0.4-ibm-tgis-pr18.prom", False),  # V0: a prompt's blocks allocated at admission
        ("sglang-0.5.10.post1.prom", False),  # SGLang publishes no per-step figure
        ("llamacpp-b5600-counters-pr13196.prom", False),
    ],
)
def test_the_step_signal_is_read_only_where_the_engine_moves_it_at_every_step(capture: str, has_step: bool) -> None:
    text = (FIXTURES / "engines" / capture).read_text()
    verdicts = HangDetector().update(0.0, EngineParser().parse((text if text.endswith("\n") else text + "\n").encode()))
    assert verdicts, "no rank judged"
    assert {v.step_stall_s is not None for v in verdicts} == {has_step}
