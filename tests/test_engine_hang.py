"""The hang detector on the simulator's scheduler and vLLM exposition in virtual time (tests/hang_sim.py).

A hang of one data-parallel rank is found within the allowance plus one scrape; the look-alikes that are not
hangs never are: an idle engine, one prefill of the maximum model length on a slow CPU profile (longer than
the minimum window, with no token), a burst queued behind a full KV cache, an engine restart. Each look-alike
also checks that it really looks like a hang to a naive rule (the test could fail).
"""

from __future__ import annotations

import time

import httpx
import pytest

from agent.collectors.engine import hang_findings, hang_samples, health_url
from agent.engine.adapters import RANK_LABELS
from agent.engine.hang import HangDetector, RankVerdict
from tests.hang_sim import SCRAPE_S, Scraper, VirtualEngine


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


def _long_prefill(detector: HangDetector) -> Scraper:
    e = VirtualEngine("graviton3-cpu", 8.0)
    s = Scraper(e, detector)
    for _ in range(3):
        e.submit(256, 8)  # a little history: the engine's prefill seconds per token
    s.run(60)
    e.submit(e.dep.size.max_model_len - 1, 4)  # one prompt of the maximum model length
    s.run(240)
    return s


def test_one_long_prefill_on_a_slow_cpu_profile_is_not_a_hang():
    s = _long_prefill(HangDetector(max_model_len=8192))
    assert s.max_stall() >= 30.0  # no token for longer than the minimum window: the look-alike bites
    assert s.first_stalled() is None
    # without the model length the agent cannot know a prefill may take this long: the minimum window fires
    assert _long_prefill(HangDetector(max_model_len=0)).first_stalled() is not None


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
    from agent.collectors.engine import EngineCollector
    from agent.config import Settings
    from agent.wiring import collect_context
    from tests.conftest import PYTHON, ROOT, free_port
    from tests.procs import running, wait_http

    port, token = free_port(), "hang-control-token-0123"
    cmd = [PYTHON, "-m", "agent", "simulate", "--port", str(port), "--engines", "2", "--control-token", token]
    with running(cmd, tmp_path / "sim.log", cwd=ROOT) as proc:
        url = f"http://127.0.0.1:{port}"
        wait_http(url + "/health", proc=proc)
        load = [PYTHON, "-m", "agent", "loadgen", "--url", url, "--rate", "8", "--duration", "120", "--no-progress"]
        with running([*load, "--output-tokens", "64", "--timeout", "120"], tmp_path / "load.log", cwd=ROOT):
            settings = Settings(engine={"metrics_url": f"{url}/metrics", "hang_min_stall_s": 2.0})
            collector = EngineCollector(collect_context(settings))
            try:
                deadline = time.monotonic() + 60
                while not any(v["stall_s"] == 0 and v["running"] for v in collector.collect().details["hang"]):
                    assert time.monotonic() < deadline, "the simulator never served"
                    time.sleep(0.5)
                r = httpx.post(f"{url}/control/scenario", json={"enable": "hang:engine=1"},
                               headers={"Authorization": f"Bearer {token}"}, timeout=5)  # fmt: skip
                assert r.status_code == 200, r.text
                found = None
                deadline = time.monotonic() + 30
                while found is None:
                    assert time.monotonic() < deadline, "rank 1 never found hung"
                    time.sleep(0.5)
                    c = collector.collect()
                    found = next((f for f in c.findings if f.id == "engine_hung"), None)
                assert found.evidence["rank"] == "1" and found.evidence["health"] == "ok"
                assert [f.evidence["rank"] for f in c.findings] == ["1"]
                hung = {s.attributes: s.value for s in c.samples if s.name == "inferwatch.engine.hung"}
                assert sorted(hung.values()) == [0, 1]
            finally:
                collector.close()
