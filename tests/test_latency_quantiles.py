"""LatencyAnalytics' quantiles (agent/node/analytics/latency.py ``quantiles``) are DDSketch's, value for value.

The one-pass reading must give exactly what ``get_quantile_value`` gives for every quantile the analytics publish
and any other: random latencies over six decades, zeros, a single value, values collapsed into the lowest bin by the
bin limit, merged windows, an empty sketch, and a sketch with negative values (left to DDSketch).
"""

from __future__ import annotations

import random
from typing import Any

import pytest

from inferwatch.agent.node.analytics.latency import QUANTILES, quantiles
from inferwatch.agent.node.analytics.windows import new_sketch

ALL_QS = (*QUANTILES, 0.0, 0.001, 0.25, 0.5, 0.75, 0.999, 1.0, -0.1, 1.5)


def _ddsketch(sketch: Any, qs: tuple[float, ...] = ALL_QS) -> dict[float, float]:
    return {q: float(sketch.get_quantile_value(q) or 0.0) for q in qs}


@pytest.mark.parametrize("seed", range(8))
def test_quantiles_equal_ddsketchs(seed: int) -> None:
    rnd = random.Random(seed)
    sketch = new_sketch()
    n = rnd.choice((1, 2, 7, 100, 5_000))
    for _ in range(n):
        kind = rnd.random()
        if kind < 0.05:
            sketch.add(0.0)
        elif kind < 0.1:
            sketch.add(rnd.uniform(1e-9, 1e-7))  # far below the rest: collapsed into the lowest bin at the limit
        else:
            sketch.add(10 ** rnd.uniform(-4, 2))
    other = new_sketch()
    for _ in range(rnd.randrange(50)):
        other.add(10 ** rnd.uniform(-3, 1))
    for s in (sketch, other):
        assert quantiles(s, ALL_QS) == _ddsketch(s)
    sketch.merge(other)  # a window read merges sub-windows
    assert quantiles(sketch, ALL_QS) == _ddsketch(sketch)


def test_empty_zero_and_negative_sketches() -> None:
    empty = new_sketch()
    assert quantiles(empty, ALL_QS) == _ddsketch(empty) == dict.fromkeys(ALL_QS, 0.0)
    zeros = new_sketch()
    for _ in range(10):
        zeros.add(0.0)
    zeros.add(2.0)
    assert quantiles(zeros, ALL_QS) == _ddsketch(zeros)
    negative = new_sketch()
    for v in (-1.0, 0.5, 2.0, -0.25):
        negative.add(v)
    assert quantiles(negative, ALL_QS) == _ddsketch(negative)
