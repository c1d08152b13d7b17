"""histogram_quantile's rules, reset-aware increases, and the sliding windows."""

from __future__ import annotations

import math

from hypothesis import given, settings
from hypothesis import strategies as st

from inferwatch.agent.node.engine.histogram import (
    Histogram,
    bucket_quantile,
    bucket_quantiles,
    histogram_increase,
    sum_histograms,
)
from inferwatch.agent.node.engine.windows import CounterWindow, HistogramWindow

INF = math.inf


def h(buckets: dict[float, float], total: float = 0.0) -> Histogram:
    items = tuple(sorted(buckets.items()))
    return Histogram(items, total, items[-1][1])


def test_linear_interpolation_and_lowest_bucket_from_zero() -> None:
    b = [(0.1, 10.0), (0.2, 30.0), (INF, 40.0)]
    assert bucket_quantile(0.5, b) == 0.1 + 0.1 * (20 - 10) / 20  # rank 20 inside (0.1, 0.2]
    assert bucket_quantile(0.125, b) == 0.1 * 5 / 10  # lowest bucket interpolates from 0
    assert bucket_quantile(0.0, b) == 0.0


def test_rank_in_inf_bucket_returns_highest_finite_bound() -> None:
    assert bucket_quantile(0.99, [(0.1, 10.0), (0.2, 30.0), (INF, 40.0)]) == 0.2


def test_lowest_bound_not_positive_is_returned_as_is() -> None:
    assert bucket_quantile(0.1, [(-1.0, 5.0), (0.0, 8.0), (INF, 10.0)]) == -1.0
    assert bucket_quantile(0.1, [(0.0, 5.0), (1.0, 10.0), (INF, 10.0)]) == 0.0


def test_nan_cases_and_out_of_range_q() -> None:
    assert math.isnan(bucket_quantile(0.5, [(0.1, 1.0), (0.2, 2.0)]))  # no +Inf bucket
    assert math.isnan(bucket_quantile(0.5, [(INF, 3.0)]))  # fewer than two buckets
    assert math.isnan(bucket_quantile(0.5, [(0.1, 0.0), (INF, 0.0)]))  # no observations
    assert math.isnan(bucket_quantile(math.nan, [(0.1, 1.0), (INF, 1.0)]))
    assert bucket_quantile(-0.1, [(0.1, 1.0), (INF, 1.0)]) == -INF
    assert bucket_quantile(1.1, [(0.1, 1.0), (INF, 1.0)]) == INF


def test_monotonicity_fix_and_unsorted_and_duplicate_bounds() -> None:
    # 0.2 has fewer than 0.1 (scraped mid-update): it takes 0.1's count, as Prometheus does.
    broken = [(0.3, 40.0), (0.1, 20.0), (INF, 40.0), (0.2, 15.0)]
    fixed = [(0.1, 20.0), (0.2, 20.0), (0.3, 40.0), (INF, 40.0)]
    for q in (0.25, 0.5, 0.75, 0.9):
        assert bucket_quantile(q, broken) == bucket_quantile(q, fixed)
    # equal bounds from two series coalesce (sum by le)
    twice = [(0.1, 5.0), (0.1, 5.0), (INF, 20.0)]
    assert bucket_quantile(0.5, twice) == bucket_quantile(0.5, [(0.1, 10.0), (INF, 20.0)])
    # float noise below 1e-12 relative is ignored
    noisy = [(0.1, 10.0), (0.2, 10.0 * (1 + 1e-14)), (INF, 20.0)]
    assert bucket_quantile(0.5, noisy) == 0.1


def test_increase_treats_a_decrease_as_reset_per_bucket() -> None:
    before = h({0.1: 50, 0.5: 80, INF: 100}, 30.0)
    after = h({0.1: 3, 0.5: 4, INF: 5}, 1.0)  # engine restarted
    inc = histogram_increase(before, after)
    assert inc.buckets == ((0.1, 3.0), (0.5, 4.0), (INF, 5.0)) and inc.count == 5 and inc.sum == 1.0
    grown = histogram_increase(before, h({0.1: 60, 0.5: 95, INF: 120}, 40.0))
    assert grown.buckets == ((0.1, 10.0), (0.5, 15.0), (INF, 20.0)) and grown.sum == 10.0


def test_sum_over_ranks_by_le() -> None:
    total = sum_histograms([h({0.1: 1, INF: 2}, 1.0), h({0.1: 3, INF: 5}, 2.0)])
    assert total is not None and total.buckets == ((0.1, 4.0), (INF, 7.0)) and total.sum == 3.0


def test_window_counts_only_increases_inside_it() -> None:
    w = HistogramWindow(horizon_s=300)
    rank0 = (("engine", "0"),)
    for t, n in ((0, 100), (10, 110), (20, 130), (30, 160)):
        w.update(float(t), {rank0: h({0.1: n / 2, INF: n})})
    last = w.window(20.0)  # steps 10→20 and 20→30
    assert last is not None and last.count == 50 and last.buckets == ((0.1, 25.0), (INF, 50.0))
    whole = w.window(60.0)
    assert whole is not None and whole.count == 60
    assert w.window(5.0) == sum_histograms([])  # no step fits: nothing, not zero


def test_window_survives_restart_and_new_rank() -> None:
    w = HistogramWindow(horizon_s=300)
    r0, r1 = (("engine", "0"),), (("engine", "1"),)
    w.update(0.0, {r0: h({0.1: 100, INF: 200})})
    w.update(5.0, {r0: h({0.1: 110, INF: 220})})
    # rank 0 restarts (counts drop), rank 1 appears with a long history
    w.update(10.0, {r0: h({0.1: 4, INF: 6}), r1: h({0.1: 1000, INF: 5000})})
    w.update(15.0, {r0: h({0.1: 8, INF: 12}), r1: h({0.1: 1001, INF: 5002})})
    total = w.window(60.0)
    # 20 (rank 0 before) + 6 (rank 0 after restart) + 6 (rank 0) + 2 (rank 1, second sighting only)
    assert total is not None and total.count == 34
    assert dict(total.buckets) == {0.1: 10 + 4 + 4 + 1, INF: 34}


def test_window_expires_old_steps() -> None:
    w = HistogramWindow(horizon_s=60)
    for t in range(0, 200, 10):
        w.update(float(t), {(): h({0.1: t, INF: 2 * t})})
    assert w.window(300.0).count == 2 * 60  # only the last 60 s are kept


def test_counter_window_reset() -> None:
    c = CounterWindow()
    c.update(0.0, {"x": 100.0})
    c.update(5.0, {"x": 150.0})
    c.update(10.0, {"x": 20.0})  # reset
    assert c.increase("x", 60.0) == 70.0
    assert c.increase("missing", 60.0) is None


BOUNDS = st.sampled_from([0.0, -1.0, 0.1, 0.5, 1.0, 2.0, INF, -INF, math.nan])
COUNTS = st.one_of(st.sampled_from([0.0, 1.0, 1e-13, 1.0 + 1e-13, math.nan]), st.floats(0, 100))
QS = st.lists(st.sampled_from([0.0, 0.5, 0.9, 0.95, 0.99, 1.0, -0.5, 1.5, math.nan]), max_size=6)


@settings(max_examples=500, deadline=None)
@given(buckets=st.lists(st.tuples(BOUNDS, COUNTS), max_size=7), qs=QS)
def test_quantiles_of_one_histogram_are_each_quantile_alone(
    buckets: list[tuple[float, float]], qs: list[float]
) -> None:
    """bucket_quantiles (the buckets prepared once for several quantiles) gives each bucket_quantile's answer."""
    many = bucket_quantiles(qs, buckets)
    assert [repr(v) for v in many] == [repr(bucket_quantile(q, list(buckets))) for q in qs]
    assert [repr(v) for v in bucket_quantiles(qs, iter(buckets))] == [repr(v) for v in many]  # read once
