"""The status page's index of the state: each collection is indexed once, not once per request, and ahead of the
next request while the page is watched (agent/node/api/statuspage.py, ``PageIndex``).

Builds are counted (the per-collection index and each family's index, wrapped), never timed. The values read
through the kept index are checked against a direct reading of the samples, including a collection made from
another that keeps its ``rendered`` (as the engine collector's progress passes do) and a family two collections
share (the last collection's value wins, as before).
"""

from __future__ import annotations

import random
from collections.abc import Iterator
from typing import Any

import pytest

from inferwatch.agent.common.samples import Collection, Sample, attrs
from inferwatch.agent.node.api import statuspage
from inferwatch.agent.node.api.pagehistory import PageHistory
from inferwatch.agent.node.api.statushtml import render_page
from inferwatch.agent.node.api.statuspage import PageIndex, build_overview
from inferwatch.agent.node.state import AgentState, CollectorHealth

OK = CollectorHealth("engine", 1.0, 1.0, runs=1, state="ok")
MODEL = "gen_ai.request.model"
NOW = 1_800_000_000.0


def _engine(models: int, running: float = 1.0) -> Collection:
    """An engine collection: info, TTFT/ITL quantiles, a tail ratio and requests running per model."""
    samples: list[Sample] = []
    for k in range(models):
        m = {MODEL: f"model-{k:03d}"}
        samples.append(Sample("inferwatch.engine.info", 1, attrs(m, engine="vllm")))
        samples.append(Sample("inferwatch.engine.requests.running", running + k, attrs(m)))
        for quantity in ("ttft", "itl"):
            for q, v in (("0.5", 0.05), ("0.95", 0.09), ("0.99", 0.1)):
                la = attrs(m, quantity=quantity, window="1m", source="histogram", quantile=q)
                samples.append(Sample("inferwatch.engine.latency", v * (k + 1), la))
        window = {"quantity": "prefill", "window": "5m", "source": "histogram"}
        samples.append(Sample("inferwatch.engine.latency.tail_ratio", 1.5, attrs(m, **window)))
        samples.append(Sample("inferwatch.engine.latency.samples", 500, attrs(m, **window)))
    return Collection(samples=samples, details={"models": [f"model-{k:03d}" for k in range(models)]})


class Builds:
    """Counts of the page's index builds: collections indexed (``parts``) and families indexed (``families``)."""

    def __init__(self) -> None:
        self.parts = 0
        self.families = 0


@pytest.fixture
def builds(monkeypatch: pytest.MonkeyPatch) -> Iterator[Builds]:
    counts = Builds()
    part_init = statuspage._Part.__init__
    family_index = statuspage._Part._index

    def counted_init(self: Any, samples: Any) -> None:
        counts.parts += 1
        part_init(self, samples)

    def counted_index(self: Any, name: str) -> Any:
        counts.families += 1
        return family_index(self, name)

    monkeypatch.setattr(statuspage._Part, "__init__", counted_init)
    monkeypatch.setattr(statuspage._Part, "_index", counted_index)
    yield counts


def _page(state: AgentState, history: PageHistory, pages: PageIndex | None = None) -> dict[str, Any]:
    """The page's overview, rendered (as a request does), without the agent's own CPU and RSS (they move)."""
    overview = build_overview(state, history, now=NOW, max_models=20, pages=pages)
    assert render_page(overview)
    overview.pop("agent")
    return overview


def test_unchanged_state_is_not_indexed_again(builds: Builds) -> None:
    """A second, third request over the same collections indexes no collection and no family; a new engine
    collection is indexed once, by the request that first sees it; the page is the same either way."""
    state, history = AgentState(), PageHistory()
    state.record("engine", OK, _engine(200))
    first = _page(state, history)
    assert builds.parts == 1 and builds.families > 0
    families = builds.families
    for _ in range(3):
        assert _page(state, history) == first
    assert (builds.parts, builds.families) == (1, families)
    state.record("engine", OK, _engine(200, running=7.0))
    again = _page(state, history)
    assert (builds.parts, builds.families) == (2, 2 * families)
    assert again != first and _page(state, history) == again
    assert (builds.parts, builds.families) == (2, 2 * families)


def test_a_collection_that_keeps_its_predecessors_rendered_is_indexed_anew(builds: Builds) -> None:
    """The engine collector's progress passes make a collection with the last one's ``rendered``: its own samples
    are what the page shows, not the index kept for the last one's."""
    state, history = AgentState(), PageHistory()
    old = _engine(3, running=1.0)
    state.record("engine", OK, old)
    before = build_overview(state, history, now=NOW)
    assert [m["requests_running"] for m in before["models"]] == [1.0, 2.0, 3.0]
    progress = Collection(samples=_engine(3, running=10.0).samples, details=old.details, rendered=dict(old.rendered))
    state.record("engine", OK, progress)
    after = build_overview(state, history, now=NOW)
    assert [m["requests_running"] for m in after["models"]] == [10.0, 11.0, 12.0]
    assert builds.parts == 2


def test_the_index_is_made_ahead_while_the_page_is_watched(builds: Builds) -> None:
    """After a request, each new collection's families that the page reads are indexed by the state's listener (in
    the collector's thread), so the next request indexes nothing; ``warm_s`` after the last request, nothing is
    indexed ahead."""
    clock = [0.0]
    pages = PageIndex(warm_s=60.0, clock=lambda: clock[0])
    state, history = AgentState(), PageHistory()
    state.add_listener(pages.on_collection)
    state.record("engine", OK, _engine(50))
    assert builds.parts == 0  # nobody asked yet: nothing made ahead
    _page(state, history, pages)
    parts, families = builds.parts, builds.families
    assert (parts, families) != (0, 0)
    state.record("engine", OK, _engine(50, running=3.0))  # the listener indexes it
    assert (builds.parts, builds.families) == (parts + 1, 2 * families)
    _page(state, history, pages)
    assert (builds.parts, builds.families) == (parts + 1, 2 * families)  # the request: nothing left to index
    clock[0] = 61.0
    state.record("engine", OK, _engine(50, running=5.0))
    assert (builds.parts, builds.families) == (parts + 1, 2 * families)  # not watched: nothing ahead


def test_values_read_through_the_kept_index_are_the_samples(builds: Builds) -> None:
    """Random collections, a family spread over two of them with repeated keys: each value the index answers is the
    last sample of that key in the state's order (a direct reading of the samples), before and after a new one."""
    rng = random.Random(38)
    state = AgentState()
    names = ("inferwatch.engine.kv_cache.usage", "inferwatch.engine.requests.waiting")
    models = [f"m{k}" for k in range(8)]
    for step in range(4):
        for collector in ("engine", "engine:b"):
            samples = [
                Sample(rng.choice(names), rng.random(), attrs({MODEL: rng.choice(models)}))
                for _ in range(rng.randint(0, 30))
            ]
            state.record(collector, OK, Collection(samples=samples))
        expected: dict[tuple[str, str], float] = {}
        for c in state.collections().values():
            for s in c.samples:
                assert isinstance(s, Sample)
                expected[(s.name, dict(s.attributes)[MODEL])] = s.value
        for _ in range(2):  # the second request reads the kept index
            ix = statuspage._Index(state.collections())
            for name in names:
                for m in models:
                    assert ix.value(name, m) == expected.get((name, m)), (step, name, m)
        assert builds.parts == 2 * (step + 1)


def test_a_line_chart_is_drawn_again_only_when_its_points_change(monkeypatch: pytest.MonkeyPatch) -> None:
    """The page's line charts are kept drawn by model and quantity: the same points are not drawn again, other points
    (the next history step) are, and the kept SVG is the one drawn for those points."""
    from inferwatch.agent.node.api import statushtml

    drawn: list[tuple[str, str]] = []
    draw = statushtml._draw_line

    def counted(model: str, quantity: str, points: list[list[Any]]) -> str:
        drawn.append((model, quantity))
        return draw(model, quantity, points)

    monkeypatch.setattr(statushtml, "_draw_line", counted)
    monkeypatch.setattr(statushtml, "_drawn", {})
    points: list[list[Any]] = [[NOW + 30 * k, 0.1 * k, 0.2 * k, 0.3 * k] for k in range(1, 5)]
    first = statushtml._line_svg("m", "ttft", points)
    assert statushtml._line_svg("m", "ttft", [list(p) for p in points]) == first and len(drawn) == 1
    later = [*points, [NOW + 150, 0.5, None, 2.0]]
    assert statushtml._line_svg("m", "ttft", later) == draw("m", "ttft", later) != first
    assert statushtml._line_svg("m", "itl", points) == first.replace("TTFT", "ITL") and len(drawn) == 3
