"""The engine fetch deadline grows with the engine (issue 38): ``engine.timeout_s`` is a small engine's.

At 200 models x 2 ranks the default 1.5 s cut every read of a 12 MB exposition; the deadline now adds 0.5 s per MB of
the last body and at least twice what the engine took to send it, up to 8x ``engine.timeout_s``, and takes that most
after a read that timed out. A small engine that stops answering is still cut at about the base.
"""

from __future__ import annotations

import re
import time

import msgspec
import pytest

from inferwatch.agent.config import DEFAULT_ENGINE_TIMEOUT_S, Settings
from inferwatch.agent.node.collectors import schedule
from inferwatch.agent.node.collectors.engine import TIMEOUT_MAX_FACTOR, EngineCollector, fetch_timeout_s
from inferwatch.agent.node.engine.fetch import EngineScrapeError
from inferwatch.agent.node.wiring import collect_context
from tests import engine_server as es
from tests.conftest import FIXTURES

VLLM = (FIXTURES / "engines" / "vllm-v1-dp2-synthetic.prom").read_bytes()


def test_the_deadline_follows_the_last_body_and_how_long_it_took() -> None:
    base = DEFAULT_ENGINE_TIMEOUT_S
    assert fetch_timeout_s(base, None) == base  # the first read
    assert fetch_timeout_s(base, (60_000, 0.01), timed_out=True) == base * TIMEOUT_MAX_FACTOR == 12.0  # after a cut
    assert fetch_timeout_s(base, (60_000, 0.01)) == pytest.approx(base + 0.03)  # a small engine: ~the base
    assert fetch_timeout_s(base, (12_000_000, 0.8)) == pytest.approx(7.5)  # 200 models x 2 ranks of vLLM
    assert fetch_timeout_s(base, (60_000, 3.0)) == pytest.approx(6.0)  # small and slow: twice what it took
    assert fetch_timeout_s(base, (60_000_000, 9.0)) == 12.0  # never past 8x
    assert fetch_timeout_s(600.0, None, timed_out=True) == 600.0  # nor past the runner's longest timeout


def test_the_runner_gives_a_read_the_longest_deadline_and_its_margin() -> None:
    settings = Settings.from_values({"engine": {"metrics_url": "http://e:8000/metrics"}})
    assert schedule("engine", settings).timeout_s == DEFAULT_ENGINE_TIMEOUT_S * TIMEOUT_MAX_FACTOR + 5.0


def test_a_slow_engine_is_read_and_one_that_stops_answering_is_cut_near_its_own_pace() -> None:
    """Headers after 0.5 s at ``engine.timeout_s`` 0.2: the first read is cut at 0.2 s, the next (1.6 s) is read,
    and every one after (twice what it took); when it stops answering the read is cut at ~1 s (its pace), not at the
    base, and the next read gets the longest again."""
    settings = Settings.from_values(
        dict(engine={"metrics_url": "http://x/metrics", "kind": "vllm", "timeout_s": 0.2, "health_url": ""})
    )
    with es.EngineServer({"/metrics": es.slow(0.5, es.body(VLLM))}) as srv:
        cfg = msgspec.structs.replace(settings.engine, metrics_url=srv.url("/metrics"))
        c = EngineCollector(collect_context(settings), cfg)
        try:
            assert c.fetch_timeout_s() == 0.2
            with pytest.raises(EngineScrapeError) as first:
                c.collect()
            assert first.value.reason == "timeout" and c.fetch_timeout_s() == pytest.approx(1.6)
            for _ in range(3):
                started = time.monotonic()
                c.collect()
                took = time.monotonic() - started  # the engine's 0.5 s, the transfer and, at CI's load, the wait
                # twice what the engine took: ~1.0-1.1 s on an idle machine; bounded by the read's own wall time, not
                # by a fixed 1.6 s, since a machine at load 10-17 on 2 cores can add 0.3 s to a read
                assert 1.0 <= c.fetch_timeout_s() <= 2 * took, (c.fetch_timeout_s(), took)
            srv.routes["/metrics"] = es.slow(5.0, es.body(VLLM))
            with pytest.raises(EngineScrapeError) as cut:
                c.collect()
            said = re.search(r"(\d+(?:\.\d+)?)s\b", str(cut.value))  # the deadline the message names
            assert cut.value.reason == "timeout" and said is not None and 1.0 <= float(said.group(1)) <= 1.6, cut.value
            assert c.fetch_timeout_s() == pytest.approx(1.6)
        finally:
            c.close()
