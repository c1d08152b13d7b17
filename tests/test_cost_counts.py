"""The agent's cost per engine series, counted rather than timed (issue 38: a regression check on the cheap axes).

Wall time on a shared 2-core machine moves by several times; the number of Python function calls (Python and C,
counted with ``sys.setprofile``) that one piece of work makes does not. Two pieces, each at 4, 8 and 16 vLLM models
× 2 data-parallel ranks read by the real engine collector from a real HTTP server on 127.0.0.1:

- recording that collection in the agent's state and one render of its ``/metrics``
  (``inferwatch.exporters.prometheus.render``): all the work a collection costs the exposition, wherever it is done;
- one ingest of the engine's exposition (the reader + the vLLM adapter, cold: a new reader each time);
- one progress pass over the same exposition (agent/node/engine/progress.py, warm, as the engine collector makes it
  between full reads): only the lines of hang detection's families are read, so it must cost a small fraction of an
  ingest per exposition line (``PROGRESS_CALLS_PER_SAMPLE``).

Each must grow at most linearly (the calls added from 8 to 16 models per added series no more than 1.25× those
added from 4 to 8), and stay under a stated number of calls per series (``RENDER_CALLS_PER_SERIES``,
``INGEST_CALLS_PER_SAMPLE``: about 1.5× what this build makes, so a change that makes each series cost half as
much again fails). benchmarks/cost_profile.py measures the same axes as CPU and RSS in a live agent.
"""

from __future__ import annotations

import gc
from collections.abc import Callable
from typing import Any

from inferwatch.agent.config import Settings
from inferwatch.agent.node.collectors.base import Collection
from inferwatch.agent.node.collectors.engine import EngineCollector
from inferwatch.agent.node.engine.adapters import VLLM, read
from inferwatch.agent.node.engine.limits import EngineLimits
from inferwatch.agent.node.engine.progress import ProgressReader
from inferwatch.agent.node.state import AgentState, CollectorHealth
from inferwatch.agent.node.wiring import collect_context
from inferwatch.exporters.prometheus import render
from tests import engine_server as es
from tests.engine_expo import VllmLike
from tests.test_exposition_whole import python_calls

SIZES = (4, 8, 16)  # models, each × 2 ranks
RENDER_CALLS_PER_SERIES = 10.0  # 6.8 calls per added /metrics series with the line templates (16.9-19.2 before)
INGEST_CALLS_PER_SAMPLE = 11.0  # this build: 7.1 calls per added exposition sample line, cold
PROGRESS_CALLS_PER_SAMPLE = 1.0  # 0.61 calls per added exposition sample line on 2026-12-07 (16 per line it reads)
SUPERLINEAR = 1.25  # the second step's calls per added series over the first step's


def calls(fn: Callable[[], Any]) -> int:
    """Python and C function calls made by ``fn()``, the garbage collector held off (its finalizers would vary)."""
    gc.collect()
    gc.disable()
    try:
        return python_calls(fn)
    finally:
        gc.enable()


def engine(models: int) -> VllmLike:
    gen = VllmLike([f"org/model-{i:03d}" for i in range(models)], engines=2, seed=7)
    gen.observe(5)
    return gen


def collected(gen: VllmLike) -> Collection:
    """Two collections by the real engine collector (the second one has windows to report), the second returned."""
    with es.EngineServer() as srv:
        srv.routes["/metrics"] = es.body(gen.text())
        settings = Settings.from_values(dict(engine={"metrics_url": srv.url("/metrics"), "kind": "vllm"}))
        collector = EngineCollector(collect_context(settings), settings.engine)
        try:
            collector.collect()
            gen.observe(5)
            srv.routes["/metrics"] = es.body(gen.text())
            return collector.collect()
        finally:
            collector.close()


def series(body: bytes) -> int:
    return sum(1 for ln in body.splitlines() if ln and not ln.startswith(b"#"))


def growth(points: list[tuple[int, int]]) -> tuple[float, float]:
    """Calls per added unit for the two steps between three (units, calls) points."""
    (u0, c0), (u1, c1), (u2, c2) = points
    return (c1 - c0) / (u1 - u0), (c2 - c1) / (u2 - u1)


def test_metrics_render_calls_grow_linearly_with_engine_series() -> None:
    # One render first, so that what the exporter makes once per metric for the process (each family's line
    # templates) is not counted in the smallest size alone, which would make its first step look cheaper.
    warm = AgentState(environment="test")
    warm.record("engine", CollectorHealth("engine", 5.0, 5.0, runs=1, state="ok"), collected(engine(SIZES[0])))
    render(warm)
    points = []
    for models in SIZES:
        state = AgentState(environment="test")
        state.register(CollectorHealth("engine", 5.0, 5.0))
        collection = collected(engine(models))

        def record_and_render(state: AgentState = state, collection: Collection = collection) -> None:
            # the collection's whole /metrics cost, wherever it is paid: on record (text rendered once per
            # collection) or on the first scrape after it
            state.record("engine", CollectorHealth("engine", 5.0, 5.0, runs=2, state="ok"), collection)
            render(state)

        count = calls(record_and_render)
        points.append((series(render(state)), count))
    assert points[2][0] > 3 * points[0][0] > 0, points  # the engine series dominate and grow with the models
    first, second = growth(points)
    print(f"render: (series, calls) {points}; calls per added series {first:.1f}, {second:.1f}")
    assert second <= SUPERLINEAR * first, points
    assert second <= RENDER_CALLS_PER_SERIES, f"{second:.1f} calls per series, bound {RENDER_CALLS_PER_SERIES}"


def test_engine_ingest_calls_grow_linearly_with_samples() -> None:
    points = []
    for models in SIZES:
        text = engine(models).text()
        samples = sum(1 for ln in text.splitlines() if ln and not ln.startswith("#"))
        limits = EngineLimits(max_series=samples * 2, max_models=models * 4)
        points.append((samples, calls(lambda text=text, limits=limits: read(VLLM, VLLM.reader(limits).read(text)))))
    first, second = growth(points)
    print(f"ingest: (samples, calls) {points}; calls per added sample {first:.1f}, {second:.1f}")
    assert second <= SUPERLINEAR * first, points
    assert second <= INGEST_CALLS_PER_SAMPLE, f"{second:.1f} calls per sample, bound {INGEST_CALLS_PER_SAMPLE}"


def test_a_progress_pass_costs_a_fraction_of_an_ingest_per_exposition_line() -> None:
    points = []
    for models in SIZES:
        body = engine(models).text().encode()
        samples = sum(1 for ln in body.splitlines() if ln and not ln.startswith(b"#"))
        reader = ProgressReader("vllm")
        assert reader.read(body) is not None  # warm: its caches hold the series, as between the collector's reads
        points.append((samples, calls(lambda body=body, reader=reader: reader.read(body))))
    first, second = growth(points)
    print(f"progress pass: (samples, calls) {points}; calls per added sample {first:.2f}, {second:.2f}")
    assert second <= SUPERLINEAR * first, points
    assert second <= PROGRESS_CALLS_PER_SAMPLE, f"{second:.2f} calls per sample, bound {PROGRESS_CALLS_PER_SAMPLE}"
