"""The tail explainer's records grow with the traffic, up to their bound, and read as a ring made at its bound would."""

from __future__ import annotations

import math
from array import array

from inferwatch.agent.common.samples import RequestTiming
from inferwatch.agent.node.analytics import tailrecords
from inferwatch.agent.node.analytics.tailrecords import HORIZON_S, INITIAL_SLOTS, RECORD_BYTES_MAX, RequestRecords


def _timing(n: int) -> RequestTiming:
    return RequestTiming(
        "m" if n % 3 else "other",
        {"ttft": n / 1000, "e2e": n / 100, "queue": n / 10_000},
        prompt_tokens=n % 20_000,
        completion_tokens=n % 7,
        request_id=f"req-{n}",
        trace_id=f"{n + 1:032x}",
        labels=(("tenant", f"t{n % 5}"),),
    )


def test_records_grow_with_the_traffic_and_keep_what_a_full_ring_keeps() -> None:
    capacity = 5 * INITIAL_SLOTS + 100  # not a power of two: the last growth stops at the bound
    records = RequestRecords(capacity=capacity, budget=10**9)  # no sampling: every request is kept
    made_at_start = records.memory_bytes()
    assert made_at_start <= INITIAL_SLOTS * RECORD_BYTES_MAX
    kept: list[tuple[float, int]] = []  # the reference: (stamp, request number), oldest first
    n = dropped = 0
    # (time, requests): fill part of the ring, let it expire, wrap the small ring, grow it while wrapped, pass the
    # bound (the oldest overwritten), then a quiet spell
    batches = [(0.0, 800), (HORIZON_S + 100, 600), (HORIZON_S + 101, 1000), (HORIZON_S + 150, 4000)]
    batches += [(HORIZON_S + 200, 3000), (2 * HORIZON_S + 190, 10)]
    for now, count in batches:
        batch = [_timing(n + j) for j in range(count)]
        records.add(batch, now)
        kept = [(t, k) for t, k in kept if t >= now - HORIZON_S] + [(now, n + j) for j in range(count)]
        dropped += max(0, len(kept) - capacity)
        kept = kept[-capacity:]
        n += count
        for models in (["m", "other"], ["m"]):
            win = records.window(models, HORIZON_S, now)
            want = [k for _, k in kept if ("m" if k % 3 else "other") in models]
            assert list(win.requests) == [f"req-{k}" for k in want]  # "req-9" .. "req-9999": the column widened
            assert [win.trace_id(j) for j in range(len(win))] == [f"{k + 1:032x}" for k in want]
            assert list(win.f["e2e"]) == list(array("f", [k / 100 for k in want]))  # 32-bit floats: 7 digits
            assert list(win.i["completion"]) == [k % 7 for k in want]
            assert [tailrecords.code_keys(c, win.label_sets)[-1] for c in win.codes] == [
                ("tenant", f"t{k % 5}") for k in want
            ]
    assert dropped > 0 and records.overwritten == dropped  # what the bound pushed out, the oldest first
    assert records._slots == capacity  # grew to the bound and stopped there
    assert made_at_start * 4 < records.memory_bytes() <= capacity * RECORD_BYTES_MAX


def test_a_quiet_agent_keeps_the_first_columns() -> None:
    records = RequestRecords()
    for step in range(3 * INITIAL_SLOTS):  # one request a second: never more than 301 records at once
        records.add([_timing(step)], float(step))
    assert records._slots == INITIAL_SLOTS
    win = records.window(["m", "other"], HORIZON_S, 3.0 * INITIAL_SLOTS - 1)
    assert len(win) == HORIZON_S + 1 and not math.isnan(win.f["ttft"][0])


def test_request_ids_are_one_column_as_wide_as_the_longest_and_read_back_as_put() -> None:
    ids = tailrecords.RequestIds(4)
    ids.put(0, "a")
    ids.put(1, None)
    ids.put(2, "chatcmpl-" + "f" * 32)  # widens the column with "a" in it
    ids.put(3, "é" * 40)  # 80 bytes of UTF-8: cut to 64, whole characters only
    assert ids.width == tailrecords.MAX_REQUEST_ID_BYTES
    assert list(ids) == ["a", None, "chatcmpl-" + "f" * 32, "é" * 32]
    assert list(ids.take([(2, 4), (0, 1)])) == ["chatcmpl-" + "f" * 32, "é" * 32, "a"]
    assert list(ids.pick([3, 1])) == ["é" * 32, None]
    assert list(ids.moved(2, 6)) == ["chatcmpl-" + "f" * 32, "é" * 32, "a", None, None, None]


def test_request_ids_cost_less_than_their_strings() -> None:
    """At 100 req/s the 5-minute window keeps ~30,000 ids: as strings ~3 MB (41 characters each)."""
    import sys

    n = 30_000
    ids = tailrecords.RequestIds(n)
    names = [f"chatcmpl-{k:032x}" for k in range(n)]
    for k, name in enumerate(names):
        ids.put(k, name)
    as_strings = sum(sys.getsizeof(x) for x in names) + 8 * n
    assert ids.memory_bytes() == 42 * n  # 41 bytes and a length each
    assert ids.memory_bytes() * 2 < as_strings, (ids.memory_bytes(), as_strings)


def test_durations_keep_a_microsecond_below_ten_seconds_and_the_stamp_its_double() -> None:
    records = RequestRecords()
    now = 1_796_000_000.123456  # a stamp of 2026: a 32-bit float would be off by minutes
    values = [1e-6 * k + 0.5 for k in range(0, 9_500_000, 250_001)]  # 0.5 s .. 10 s
    records.add([RequestTiming("m", {"ttft": v, "e2e": v}) for v in values], now)
    win = records.window(["m"], HORIZON_S, now)
    assert all(abs(a - v) < 1e-6 for a, v in zip(win.f["ttft"], values, strict=True))
    assert set(win.f["t"]) == {now}
