"""Causes the tail explainer reads from their own phases (agent/node/analytics/tailcauses.py): a prefill stall, a
front-end delay and a long-prompt workload, named where a saturating cause's queue hides them in the TTFT's tail;
and prefill is not a second cause beside a slow rank by its share of the gap alone."""

from __future__ import annotations

import math
import random

from inferwatch.agent.common.samples import RequestTiming
from inferwatch.agent.node.analytics import explain as ex
from inferwatch.agent.node.analytics import tailcauses, tailrecords
from inferwatch.agent.node.analytics.tailcauses import EngineSignals
from tests.test_explain import explained, timing


def _saturated(rng: random.Random, n: int, prefill: float | None = None) -> list[RequestTiming]:
    """Requests that each waited 1-3 s in the queue (the median request waited: a saturated window)."""
    return [timing(rng, queue=rng.uniform(1.0, 3.0), prefill=prefill) for _ in range(n)]


def _with_signals(reqs: list[RequestTiming], signals: EngineSignals) -> dict:
    records = tailrecords.RequestRecords()
    records.add(reqs, 100.0)
    report = ex.explain(records, "m", 60.0, 100.0, top=0, signals=signals)
    assert report is not None
    return report["quantities"]["ttft"]


def test_a_prefill_stall_under_a_saturated_queue_is_named_not_the_queue() -> None:
    rng = random.Random(3)
    plain = _saturated(rng, 900)
    verdict = explained(plain)["quantities"]["ttft"]
    assert verdict["saturated"] is not None and verdict["driver"] == "queue", verdict["headline"]
    assert verdict["prefill_stall"] is None
    # 15 % of the requests stall 0.5 s before prefill (page cache): their prefill is ~17x what a 500-token prompt needs
    stalled = plain[:765] + _saturated(rng, 135, prefill=0.53)
    verdict = explained(stalled)["quantities"]["ttft"]
    assert verdict["driver"] == "prefill" and verdict["phase"] == "queue", verdict["headline"]
    assert "behind prefill stalls: 15% of requests waited a median 500 ms" in verdict["headline"]
    # prefill 3x slower on a third of the requests (a slow rank's pace) is no stall
    slower = plain[:600] + _saturated(rng, 300, prefill=0.09)
    assert explained(slower)["quantities"]["ttft"]["driver"] == "queue"


def test_a_front_end_delay_hidden_by_a_queue_of_seconds_is_listed() -> None:
    rng = random.Random(4)
    base = _saturated(rng, 900)
    assert "frontend" not in explained(base)["quantities"]["ttft"]["drivers"]
    late = base[:820] + [timing(rng, queue=rng.uniform(1.0, 3.0), frontend=0.4) for _ in range(80)]
    verdict = explained(late)["quantities"]["ttft"]
    assert verdict["drivers"][0] == "queue" and "frontend" in verdict["drivers"], verdict["headline"]
    assert "also front-end delays: 9% of requests waited a median 396 ms more in the front end" in verdict["headline"]
    # the front-end gap is the engine's TTFT less its queue and prefill: a saturated engine makes no such delay
    assert tailcauses.frontend_delay([3.0, 2.5] * 100, [2.996, 2.496] * 100, [0.0] * 200) is None


def test_long_prompts_are_a_workload_past_an_ordinary_mix() -> None:
    rng = random.Random(5)
    wide = [min(4096, round(rng.lognormvariate(math.log(500), 0.8))) for _ in range(4000)]
    assert tailcauses.long_prompt_share(wide) < tailcauses.LONG_PROMPT_WORKLOAD
    long = wide[:3880] + [rng.randint(8_000, 16_000) for _ in range(120)]
    assert tailcauses.long_prompt_share(long) >= tailcauses.LONG_PROMPT_WORKLOAD


def test_prefill_beside_a_slow_rank_needs_its_own_evidence() -> None:
    """A rank 3x slower per token (stock spans: its rank from the engine's series) slows its prefills too; they hold
    a share of the gap, but that share is the rank's, not a second cause."""
    rng = random.Random(6)
    reqs = [timing(rng) for _ in range(600)]
    reqs += [timing(rng, queue=0.2, prefill=0.09, decode_per_token=0.03) for _ in range(300)]
    signals = EngineSignals(rank_itl_s={"0": 0.01, "1": 0.03})
    verdict = _with_signals(reqs, signals)
    assert verdict["driver"] == "dp_rank" and verdict["shares"]["prefill"] >= 0.2, verdict
    assert "prefill" not in verdict["drivers"], verdict["headline"]
    # with stalls of 0.25 s on 10 % of the requests, prefill is named beside the rank, whose requests hold the tail
    # (0.29 s: queue 0.2 s and a 3x slower prefill)
    stalled = reqs[:810] + [timing(rng, prefill=0.25) for _ in range(90)]
    verdict = _with_signals(stalled, signals)
    assert verdict["drivers"] == ["dp_rank", "prefill"], verdict["headline"]
    assert verdict["tail_parts"]["dp_rank"] > verdict["tail_parts"].get("prefill", 0.0), verdict["tail_parts"]
    # stalls of 0.6 s hold the tail: the stall is named first, the rank beside it
    stalled = reqs[:810] + [timing(rng, prefill=0.6) for _ in range(90)]
    verdict = _with_signals(stalled, signals)
    assert verdict["drivers"] == ["prefill", "dp_rank"], verdict["headline"]
    assert verdict["tail_parts"]["prefill"] >= 0.9, verdict["tail_parts"]
    assert "100% of the gap is prefill; prefill stalls: 10% of requests waited" in verdict["headline"], verdict[
        "headline"
    ]
    assert "also dp_rank=1 3.0x slower per output token" in verdict["headline"], verdict["headline"]


def test_tail_parts_split_each_tail_request_between_its_causes() -> None:
    """tailcauses.tail_parts: a front-end delay, a stall and a slow rank's stretch, each request's excess split."""
    f = {
        # 100 plain requests (TTFT 0.1), then three tail requests: one delayed 0.5 s in the front end, one stalled
        # 0.5 s before prefill, one on a 3x slower rank (queue 0.3 s, prefill 3x) with ITL 30 ms against 10 ms
        "ttft": [0.1] * 100 + [0.6, 0.6, 0.4],
        "queue": [0.05] * 100 + [0.05, 0.05, 0.3],
        "prefill": [0.03] * 100 + [0.03, 0.53, 0.09],
        "decode": [1.0] * 100 + [1.0, 1.0, 3.0],
    }
    prompts = [500] * 103
    comp = [101] * 103
    slow = {"attribute": "dp_rank", "value": "1", "itl_ratio": 3.0, "median_itl_s": 0.03, "others_median_itl_s": 0.01}
    parts = tailcauses.tail_parts(f, prompts, comp, [100, 101, 102], 0.1, slow)
    # excess 0.5 + 0.5 + 0.3 = 1.3 s: the front end's 0.5, the stall's 0.5, the rank's (0.3 + 0.09) x 2/3 = 0.26
    assert parts == {"frontend": round(0.5 / 1.3, 4), "prefill": round(0.5 / 1.3, 4), "dp_rank": round(0.26 / 1.3, 4)}
    assert tailcauses.tail_parts(f, prompts, comp, [100, 101, 102], 0.1, None) == {
        "frontend": round(0.5 / 1.3, 4),
        "prefill": round(0.5 / 1.3, 4),
    }


def test_a_saturated_window_with_a_long_prompt_workload_is_the_long_prompts() -> None:
    rng = random.Random(7)
    plain = _saturated(rng, 900)
    assert explained(plain)["quantities"]["ttft"]["driver"] == "queue"
    # 5 % of the prompts are 20x the median: they took the step budget while the queue built up
    long = plain[:855] + [timing(rng, queue=rng.uniform(1.0, 3.0), prompt=10_000, prefill=0.6) for _ in range(45)]
    verdict = explained(long)["quantities"]["ttft"]
    assert verdict["driver"] == "prefill" and verdict["phase"] == "queue", verdict["headline"]
    assert "behind long prompts (5.0% of requests at 8x the median prompt)" in verdict["headline"]
