"""The tail explainer's records grow with the traffic, up to their bound, and read as a ring made at its bound would."""

from __future__ import annotations

import math

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
            assert win.requests == [f"req-{k}" for k in want]
            assert [win.trace_id(j) for j in range(len(win))] == [f"{k + 1:032x}" for k in want]
            assert list(win.f["e2e"]) == [k / 100 for k in want]
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
