"""The engine collector's adaptive cadence: every 2 s while a read is cheap, toward the agent's interval when not.

Real parts: the runner's threads, the engine collector, and an HTTP server on 127.0.0.1 serving a vLLM-style
exposition of 1 model (a read of a few milliseconds) and of 200 models (~4.6 MB: about a second a read). Counts of
reads over a bounded time, with margins wide enough for a loaded machine.
"""

from __future__ import annotations

import dataclasses
import time

from inferwatch.agent.config import DEFAULT_ENGINE_INTERVAL_S, Settings
from inferwatch.agent.node.collectors import schedule
from inferwatch.agent.node.collectors.engine import EngineCollector
from inferwatch.agent.node.runner import Runner
from inferwatch.agent.node.schedule import READ_BUDGET, adaptive_interval
from inferwatch.agent.node.state import AgentState
from inferwatch.agent.node.wiring import collect_context
from tests import engine_server as es
from tests.engine_expo import VllmLike

URL = "http://e:8000/metrics"


def test_a_cheap_read_keeps_the_fast_interval_and_a_costly_one_stretches_it_up_to_the_slow_one() -> None:
    fast, slow = DEFAULT_ENGINE_INTERVAL_S, 5.0
    assert adaptive_interval(fast, slow, 0.005) == fast
    assert adaptive_interval(fast, slow, READ_BUDGET * fast) == fast
    assert fast < adaptive_interval(fast, slow, 0.3) < slow  # in proportion: the reads keep to the budget
    assert adaptive_interval(fast, slow, 1.1) == slow  # 200 models: about a second a read


def test_the_engine_adapts_between_2_s_and_the_agent_interval_unless_an_interval_is_configured() -> None:
    plan = schedule("engine", Settings.from_values({"engine": {"metrics_url": URL}}))
    assert (plan.interval_s, plan.slow_interval_s) == (DEFAULT_ENGINE_INTERVAL_S, 5.0)
    slower = Settings.from_values({"engine": {"metrics_url": URL}, "interval_s": 15})
    assert schedule("engine", slower).slow_interval_s == 15.0
    fixed = Settings.from_values({"engine": {"metrics_url": URL}, "collectors": {"engine": {"interval_s": 2}}})
    assert (schedule("engine", fixed).interval_s, schedule("engine", fixed).slow_interval_s) == (2.0, None)
    quick = Settings.from_values({"engine": {"metrics_url": URL}, "interval_s": 1})
    assert (schedule("engine", quick).interval_s, schedule("engine", quick).slow_interval_s) == (1.0, None)
    assert schedule("cpu", slower).slow_interval_s is None  # only the engine adapts


def test_the_engine_run_may_take_its_fetch_deadline_whatever_the_interval() -> None:
    """A large exposition's read of several seconds is finished, not cut at the 2 s interval."""
    plan = schedule("engine", Settings.from_values({"engine": {"metrics_url": URL, "timeout_s": 5}}))
    assert plan.interval_s == DEFAULT_ENGINE_INTERVAL_S
    assert plan.timeout_s > 5 > plan.interval_s


def _exposition(models: int) -> str:
    gen = VllmLike([f"org/model-{i:03d}" for i in range(models)], engines=1, seed=3)
    gen.observe(3)
    return gen.text()


def test_a_large_exposition_is_read_less_often_and_a_small_one_every_2_s() -> None:
    small, large = _exposition(1), _exposition(200)
    assert len(large) > 100 * len(small)
    run_s = 13.0
    with es.EngineServer() as cheap_srv, es.EngineServer() as costly_srv:
        # the large one also answers 1 s late: a read's cost is its wall time, whatever the parser's speed this year
        cheap_srv.routes["/metrics"], costly_srv.routes["/metrics"] = es.body(small), es.slow(1.0, es.body(large))
        runners = []
        for srv in (cheap_srv, costly_srv):
            settings = Settings.from_values({"engine": {"metrics_url": srv.url("/metrics")}})
            plan = schedule("engine", settings)
            if srv is costly_srv:  # served from this process (its GIL): seconds a read on a loaded machine
                plan = dataclasses.replace(plan, timeout_s=plan.slow_interval_s or plan.timeout_s)
            runners.append(
                Runner(AgentState(), [EngineCollector(collect_context(settings), settings.engine)], {"engine": plan})
            )
        for r in runners:
            r.start()
        try:
            time.sleep(run_s)  # the runners' own threads read on their schedule meanwhile
        finally:
            for r in runners:
                r.stop()
        cheap = sum(1 for _t, path in cheap_srv.requests if path.startswith("/metrics"))
        costly = sum(1 for _t, path in costly_srv.requests if path.startswith("/metrics"))
    # every 2 s: 7 reads in 13 s; backed off to 5 s: 3
    assert cheap >= 5, cheap
    assert 1 <= costly <= 4, costly
    assert costly < cheap
