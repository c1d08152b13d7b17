"""Accuracy and cost of the tail explainer (agent/node/analytics/explain.py) on simulated faults whose cause is known.

Accuracy. The simulator's scheduler and timing model (simulator/engine.py, driven offline in virtual time, two
data-parallel engines of an 8B model on H100 with max_num_seqs 32) serve Poisson traffic under one scenario each:

=============  ====================================================================  ==========  ============
scenario       what is wrong                                                         quantity    true driver
=============  ====================================================================  ==========  ============
healthy        nothing (12 req/s, prompts lognormal median 512, natural outputs)    ttft, e2e   none
queue          arrival bursts above capacity (3 s at 50 req/s every 30 s)            ttft        queue
prefill        a long-prompt mix (3 % of prompts 8k-16k tokens)                      ttft        prefill
decode         KV cache saturated (gpu_memory_utilization 0.22): preemptions         e2e, ttft   preemption
slow_rank      data-parallel engine 1 steps 3x slower (scenario slow_rank)           ttft        dp_rank
frontend       10 % of requests wait 0.4 s in the frontend (scenario frontend_delay) ttft        frontend
page_cache     20 % of requests stall 0.55 s before prefill (page_cache_pressure)    ttft        prefill
=============  ====================================================================  ==========  ============

Each finished request becomes an ``llm_request`` span with vLLM's attributes (plus ``vllm.dp_rank`` and
``vllm.num_preemptions``, as simulator/tracing.py sets them), serialized as an OTLP ExportTraceServiceRequest and
handed to the agent's real intake (SpanIntake → LatencyAnalytics + TailExplainer), one export per virtual second.
At the end of every minute after a warm-up minute the explainer explains the last 60 s; the verdict for the
scenario's quantity is counted. Output: the confusion table (rows: scenario, columns: the driver named).

Cost. 5 minutes of 100 req/s (30 000 requests, healthy mix) recorded, then ``explain`` over the 5m window timed in
CPU seconds (time.process_time, median of repeats) side by side with a baseline from the same run: the span
analytics' own per-cycle ``LatencyAnalytics.compute()`` over the same requests. Also the bytes the records hold.

Out of sample (``--episodes N``). The rules above were tuned on those scenarios at seed 1; here every episode is
drawn at random from a seed never used in development (``--seed-base``, else drawn fresh and printed): the cause
(one of queue, prefill, preemption, dp_rank, frontend, page_cache, or none) at an intensity drawn uniformly over a
range wider than the tuned value on both sides (``draw_episode``), the load (0.3-0.75 of the deployment's measured
capacity), the prompt mix (lognormal median 256-1024 tokens, sigma 0.3-0.8), the output cap (256/512/1024 tokens),
the hardware (H100, A100, L40S), the model (Llama 3.1 8B, Qwen2.5 7B), 2 or 3 engines and max_num_seqs 16/32/64;
``--two-cause-share`` of the episodes carry two causes at once. Spans are stock vLLM's (no ``vllm.dp_rank``, no
``vllm.num_preemptions``; ``--enriched-spans`` adds them), and the explainer gets the engine's own series over the
same window beside them (:class:`EngineSeriesRecorder`: per-rank mean ITL, preemptions). Each runs a warm-up minute
and two windows; the TTFT verdict over the last window counts, scored twice. Against the configured causes: healthy,
right when no driver is named; one cause, when its driver is named first; two causes, when both are in the verdict's
``drivers``. Against the ground truth (:func:`ground_truth`: what the simulator did to the window's tail, recorded per
request in ``SimRequest.causes`` and decided before and apart from the verdict): the injected causes with at least
20 % of the tail's excess are effective; one, right when its driver is named first; two, when both are in
``drivers``; none (injected but not acting on the tail, or healthy), right when no driver is named. Output: accuracy
with Wilson 95 % intervals (overall, single-cause, two-cause, per cause, weak intensities apart), the confusion tables,
the healthy false-positive rate, the share of verdicts listing a driver no active cause has, the episodes missed
with the explainer's reason, and the episodes where the fault overloaded the deployment (P50 TTFT over 1 s) apart;
then the ground-truth scoring (``groundtruth_scoring``: its confusion table, the injected causes found not effective
and what the explainer named on them) beside the configured one.
Nothing here feeds back into the rules: develop against a fixed ``--seed-base``, measure with fresh draws.

Run: ``.venv/bin/python benchmarks/tail_explain.py [--minutes 20] [--json out.json]`` (about a minute on one core);
out of sample: ``... --episodes 300 --json out.json`` (about 5 minutes on one core, 10 loaded); ``--previous FILE``
(another build's explain.py) scores that build on the same episodes beside this one.
"""

from __future__ import annotations

import argparse
import importlib.util
import json
import math
import os
import random
import statistics
import sys
import tempfile
import time
from collections import Counter
from collections.abc import Callable, Iterator
from dataclasses import dataclass, replace
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from opentelemetry.proto.collector.trace.v1.trace_service_pb2 import ExportTraceServiceRequest
from opentelemetry.proto.common.v1.common_pb2 import AnyValue

from inferwatch.agent.node.analytics.explain import PREEMPTION, RecordingSink, TailExplainer, explain
from inferwatch.agent.node.analytics.latency import LatencyAnalytics
from inferwatch.agent.node.analytics.tailcauses import EngineSignals
from inferwatch.agent.node.analytics.tailrecords import RequestRecords
from inferwatch.agent.node.receiver.intake import SpanIntake
from inferwatch.simulator.engine import EngineCore, Recorder, SimRequest
from inferwatch.simulator.profiles import Deployment, deploy
from inferwatch.simulator.scenarios import Scenario, ScenarioSet, make

MODEL = "meta-llama/Llama-3.1-8B-Instruct"
ENGINES = 2
MAX_NUM_SEQS = 32
BASE_RATE = 12.0
WARMUP_S = 60.0


@dataclass(frozen=True)
class Case:
    name: str
    quantity: str  # the quantity whose verdict is counted
    truth: str
    rate: Callable[[float], float]
    scenarios: tuple[Scenario, ...] = ()
    long_prompt_share: float = 0.0
    gpu_memory_utilization: float = 0.9
    fixed_output_tokens: int = 0  # 0: natural lengths (median 180, at most 512); else every request generates this many


def steady(rate: float) -> Callable[[float], float]:
    return lambda t: rate


def bursts(t: float) -> float:
    return 50.0 if t % 30.0 < 3.0 else BASE_RATE * 0.6


CASES = (
    Case("healthy", "ttft", "none", steady(BASE_RATE)),
    Case("healthy", "e2e", "none", steady(BASE_RATE)),
    Case("queue", "ttft", "queue", bursts),
    Case("prefill", "ttft", "prefill", steady(BASE_RATE), long_prompt_share=0.03),
    Case("decode", "e2e", PREEMPTION, steady(BASE_RATE), gpu_memory_utilization=0.22),
    Case("decode", "ttft", PREEMPTION, steady(BASE_RATE), gpu_memory_utilization=0.22),
    Case("slow_rank", "ttft", "dp_rank", steady(BASE_RATE), (make("slow_rank", {"engine": 1, "factor": 3.0}),)),
    Case("frontend", "ttft", "frontend", steady(BASE_RATE), (make("frontend_delay", {"fraction": 0.1}),)),
    Case("page_cache", "ttft", "prefill", steady(BASE_RATE), (make("page_cache_pressure"),)),
)


def arrivals(case: Case, seconds: float, seed: int) -> list[SimRequest]:
    """Poisson arrivals at ``case.rate(t)`` (thinning), prompts lognormal median 512, natural output lengths."""
    rng = random.Random(seed)
    peak = max(case.rate(t / 10) for t in range(int(seconds * 10)))
    out: list[SimRequest] = []
    for k, t in enumerate(poisson(case.rate, peak, seconds, rng)):
        if rng.random() < case.long_prompt_share:
            prompt = rng.randint(8_192, 16_384)
        else:
            prompt = min(4096, max(16, round(rng.lognormvariate(6.24, 0.5))))
        fixed = case.fixed_output_tokens
        out.append(SimRequest(f"cmpl-{seed}-{k}", prompt, fixed or 512, t, ignore_eos=bool(fixed)))
    return out


def poisson(rate: Callable[[float], float], peak: float, seconds: float, rng: random.Random) -> Iterator[float]:
    """Arrival times of a Poisson process at ``rate(t)`` <= ``peak`` over [0, seconds), by thinning."""
    t = 0.0
    while True:
        t += rng.expovariate(peak)
        if t >= seconds:
            return
        if rng.random() * peak <= rate(t):
            yield t


def deployment(case: Case) -> Deployment:
    dep = deploy(MODEL, "h100", max_num_seqs=MAX_NUM_SEQS, max_model_len=32_768)
    return replace(dep, gpu_memory_utilization=case.gpu_memory_utilization)


def run_dp(
    cores: list[EngineCore], requests: list[SimRequest], max_steps: int = 20_000_000, peak: list[int] | None = None
) -> None:
    """Drive data-parallel ``cores`` in virtual time; each arrival goes to the least loaded (vLLM's DP balancing).

    ``peak``: when given, each core's most KV-cache blocks in use at once is kept there.
    """
    inf = float("inf")
    due = [inf] * len(cores)
    steps: list[Any] = [None] * len(cores)
    i, n = 0, len(requests)
    for _ in range(max_steps):
        t_arr = requests[i].arrival if i < n else inf
        c = min(range(len(cores)), key=due.__getitem__)
        if t_arr <= due[c]:
            if t_arr == inf:
                return
            k = min(range(len(cores)), key=lambda j: cores[j].load)
            cores[k].add(requests[i])
            i += 1
            if steps[k] is None:
                due[k] = min(due[k], cores[k].pending[0][0] if cores[k].pending else t_arr)
            continue
        now = due[c]
        core = cores[c]
        if steps[c] is not None:
            core.complete(steps[c], now)
            steps[c] = None
        step = core.plan(now)
        if peak is not None:
            peak[c] = max(peak[c], core.total_blocks - core.free_blocks)
        if step is not None:
            steps[c] = step
            due[c] = step.start + step.duration
        else:
            wake = core.next_wakeup()
            due[c] = max(wake, now + 1e-6) if wake is not None else inf
    raise RuntimeError("simulation did not finish")


def export(reqs: list[SimRequest], rng: random.Random, model: str = MODEL, stock: bool = False) -> bytes:
    """The finished requests as one OTLP export of vLLM-style ``llm_request`` spans (simulator/tracing.py's keys).

    ``stock``: as stock vLLM sends them, without ``vllm.dp_rank`` and ``vllm.num_preemptions``."""
    out = ExportTraceServiceRequest()
    rs = out.resource_spans.add()
    rs.resource.attributes.add(key="service.name", value=AnyValue(string_value="vllm"))
    rs.resource.attributes.add(key="gen_ai.request.model", value=AnyValue(string_value=model))
    ss = rs.scope_spans.add()
    for r in reqs:
        sp = ss.spans.add()
        sp.trace_id = rng.randbytes(16)
        sp.span_id = rng.randbytes(8)
        sp.name = "llm_request"
        sp.kind = 2
        end = r.finished_at if r.finished_at is not None else r.arrival
        sp.start_time_unix_nano = int((1.7e9 + r.arrival) * 1e9)
        sp.end_time_unix_nano = int((1.7e9 + end) * 1e9)
        a = sp.attributes
        a.add(key="gen_ai.request.id", value=AnyValue(string_value=r.request_id))
        a.add(key="gen_ai.usage.prompt_tokens", value=AnyValue(int_value=r.prompt_tokens))
        a.add(key="gen_ai.usage.completion_tokens", value=AnyValue(int_value=r.generated))
        if not stock:
            a.add(key="vllm.dp_rank", value=AnyValue(int_value=r.engine_index))
            a.add(key="vllm.num_preemptions", value=AnyValue(int_value=r.preemptions))
        a.add(key="gen_ai.latency.e2e", value=AnyValue(double_value=end - r.arrival))
        if r.first_scheduled is not None and r.first_token is not None and r.last_token is not None:
            a.add(key="gen_ai.latency.time_in_queue", value=AnyValue(double_value=r.first_scheduled - r.queued))
            a.add(key="gen_ai.latency.time_to_first_token", value=AnyValue(double_value=r.first_token - r.arrival))
            a.add(
                key="gen_ai.latency.time_in_model_prefill",
                value=AnyValue(double_value=r.first_token - r.first_scheduled),
            )
            a.add(key="gen_ai.latency.time_in_model_decode", value=AnyValue(double_value=r.last_token - r.first_token))
    return out.SerializeToString()


class VirtualClock:
    def __init__(self) -> None:
        self.now = 0.0

    def __call__(self) -> float:
        return self.now


def simulate(case: Case, seconds: float, seed: int) -> list[SimRequest]:
    dep = deployment(case)
    scenarios = ScenarioSet(case.scenarios)
    recorder = Recorder()
    cores = [EngineCore(i, dep, scenarios, recorder, seed=seed) for i in range(ENGINES)]
    run_dp(cores, arrivals(case, seconds, seed))
    return sorted(recorder.finished, key=lambda r: r.finished_at or 0.0)


def feed(
    reqs: list[SimRequest],
    seed: int,
    end_s: float,
    on_minute: Callable[[TailExplainer, float], None] | None = None,
    model: str = MODEL,
    stock: bool = False,
) -> tuple[LatencyAnalytics, TailExplainer]:
    """Hand the requests to the agent's intake, one export per virtual second; call ``on_minute`` at each minute."""
    clock = VirtualClock()
    analytics = LatencyAnalytics(clock=clock)
    explainer = TailExplainer(clock=clock)
    intake = SpanIntake(RecordingSink(analytics, explainer))
    rng = random.Random(seed)
    by_second: dict[int, list[SimRequest]] = {}
    for r in reqs:
        by_second.setdefault(math.ceil(r.finished_at or 0.0), []).append(r)
    for second in range(1, int(end_s) + 1):
        clock.now = float(second)
        batch = by_second.get(second)
        if batch:
            intake.handle(export(batch, rng, model, stock), "grpc")
        if on_minute is not None and second % 60 == 0 and second > WARMUP_S:
            on_minute(explainer, float(second))
    return analytics, explainer


def accuracy(minutes: int, seed: int, names: set[str] | None = None) -> dict[str, Any]:
    rows: dict[str, Counter[str]] = {}
    examples: dict[str, str] = {}
    truths: dict[str, str] = {}
    for case in CASES:
        if names and case.name not in names:
            continue
        key = f"{case.name} ({case.quantity})"
        verdicts: Counter[str] = Counter()
        reqs = simulate(case, WARMUP_S + 60.0 * minutes, seed)
        end_s = WARMUP_S + 60.0 * minutes

        def on_minute(
            ex: TailExplainer, now: float, case: Case = case, verdicts: Counter[str] = verdicts, key: str = key
        ) -> None:
            report = ex.explain(MODEL, 60.0, top=0)
            d = report["quantities"][case.quantity] if report else None
            verdicts[d["driver"] if d else "no data"] += 1
            if d and key not in examples and d["driver"] == case.truth:
                examples[key] = d["headline"]
            if d and d["driver"] != case.truth:
                examples.setdefault(key + " miss", d["headline"])

        feed(reqs, seed, end_s, on_minute)
        rows[key] = verdicts
        truths[key] = case.truth
        total = sum(verdicts.values())
        right = verdicts[case.truth]
        print(f"{key:22} truth {case.truth:9} right {right}/{total}  {dict(verdicts)}", flush=True)
    return {"rows": {k: dict(v) for k, v in rows.items()}, "truths": truths, "examples": examples}


def confusion_table(acc: dict[str, Any]) -> str:
    """The confusion table as Markdown: a row per scenario, a column per driver named, the true one in bold."""
    rows, truths = acc["rows"], acc["truths"]
    drivers = ["none", "queue", "prefill", "decode", "frontend", PREEMPTION, "dp_rank"]
    drivers += sorted({d for v in rows.values() for d in v} - set(drivers))
    lines = [
        "| scenario (quantity) | true driver | " + " | ".join(drivers) + " | right |",
        "|---|---|" + "---|" * len(drivers) + "---|",
    ]
    for key, verdicts in rows.items():
        truth = truths[key]
        cells = [(f"**{verdicts[d]}**" if d == truth else str(verdicts[d])) if verdicts.get(d) else "" for d in drivers]
        total = sum(verdicts.values())
        lines.append(f"| {key} | {truth} | " + " | ".join(cells) + f" | {verdicts.get(truth, 0)}/{total} |")
    return "\n".join(lines)


def load_previous(path: Path) -> Any:
    """Another build's explain.py as a module (``git show REV:agent/node/analytics/explain.py > FILE``); the modules
    it imports (tailcauses, tailrecords, tailstats) are this checkout's."""
    spec = importlib.util.spec_from_file_location("previous_explain", path)
    assert spec is not None and spec.loader is not None
    prev = sys.modules["previous_explain"] = importlib.util.module_from_spec(spec)  # dataclasses look it up
    spec.loader.exec_module(prev)
    return prev


def cost(seed: int, repeats: int = 15, previous: Path | None = None) -> dict[str, Any]:
    """5 minutes at 100 req/s recorded; explain(5m) CPU time against LatencyAnalytics.compute() on the same data.

    ``previous``: another build's explain.py (``git show REV:agent/node/analytics/explain.py > FILE``), fed the same
    requests and timed in the same rounds, with its verdicts and quantiles beside this build's. A build whose records
    and band statistics live beside it (tailrecords.py, tailstats.py) imports this checkout's: only its explain.py is
    the other build's.
    """
    rng = random.Random(seed)
    case = Case("cost", "ttft", "none", steady(100.0))
    base = arrivals(case, 300.0, seed)
    clock = VirtualClock()
    analytics = LatencyAnalytics(clock=clock)
    explainer = TailExplainer(RequestRecords(), clock=clock)
    sink: Any = RecordingSink(analytics, explainer)
    prev: Any = None
    if previous is not None:
        prev = load_previous(previous)
        prev_records = prev.RequestRecords()
        inner = sink

        class Tee:
            def record(self, timings: Any) -> int:
                batch = list(timings)
                prev_records.add(batch, clock.now)
                return int(inner.record(batch))

        sink = Tee()
    intake = SpanIntake(sink)
    # Synthetic phases (no simulation needed for cost): lognormal queue/prefill/decode per request.
    reqs = []
    for r in base:
        r.queued = r.arrival + 0.004
        r.first_scheduled = r.queued + rng.lognormvariate(-4, 1)
        r.first_token = r.first_scheduled + rng.lognormvariate(-3.5, 0.5)
        r.generated = max(1, round(rng.lognormvariate(5.2, 0.8)))
        r.last_token = r.first_token + 0.012 * r.generated
        r.finished_at = r.last_token
        r.engine_index = rng.randrange(2)
        reqs.append(r)
    by_second: dict[int, list[SimRequest]] = {}
    for r in reqs:
        by_second.setdefault(int(r.arrival), []).append(r)
    t_ingest = 0.0
    for s in range(300):
        clock.now = s + 1.0
        payload = export(by_second.get(s, []), rng)
        t0 = time.process_time()
        intake.handle(payload, "grpc")
        t_ingest += time.process_time() - t0
    explain_s, compute_s, prev_s = [], [], []
    prev_report = None
    for _ in range(repeats):
        t0 = time.process_time()
        report = explain(explainer.records, MODEL, 300.0, clock.now, top=10)
        explain_s.append(time.process_time() - t0)
        if prev is not None:
            t0 = time.process_time()
            prev_report = prev.explain(prev_records, MODEL, 300.0, clock.now, top=10)
            prev_s.append(time.process_time() - t0)
        analytics._bimodal_cache.clear()  # the baseline pays its bimodality fit as on a new sub-window
        t0 = time.process_time()
        analytics.compute()
        compute_s.append(time.process_time() - t0)
    assert report is not None
    out: dict[str, Any] = {}
    if prev_report is not None:
        out["previous_explain_cpu_ms_median"] = 1000 * statistics.median(prev_s)
        out["previous_agrees"] = {
            q: {
                k: (report["quantities"][q][k], prev_report["quantities"][q][k])
                for k in ("driver", "p50_s", "p99_s", "dominant_share")
            }
            for q in ("ttft", "e2e")
        }
    return out | {
        "load_average_1m": round(os.getloadavg()[0], 2),
        "requests": len(reqs),
        "records": report["requests"],
        "explain_cpu_ms_median": 1000 * statistics.median(explain_s),
        "explain_cpu_ms_max": 1000 * max(explain_s),
        "explain_cpu_ms_min": 1000 * min(explain_s),
        "baseline_compute_cpu_ms_median": 1000 * statistics.median(compute_s),
        "intake_cpu_us_per_request": 1e6 * t_ingest / len(reqs),
        "records_bytes": explainer.records.memory_bytes(),
        "records_capacity": explainer.records.capacity,
    }


def llamacpp(seed: int, requests: int = 80) -> dict[str, Any]:
    """The explainer on the real llama.cpp server's per-request timings (it emits no spans).

    llama-server's ``/completion`` answers with ``timings`` (prompt_n, prompt_ms, predicted_n, predicted_ms); the
    client measures e2e. So per request: prefill = prompt_ms, decode = predicted_ms, and queue = e2e − prefill −
    decode is everything before the prompt is evaluated (HTTP, waiting for a free slot): llama.cpp does not tell
    queue from front-end, so frontend is 0 by construction, and it has no data-parallel rank or preemption.
    Two phases on the ``small`` generated model (tests/llamacpp_model.py), 2 slots: one client with 10 % long
    prompts (prefill-driven), then 3 concurrent clients on short prompts (queue-driven: 2 slots, so one request in
    three waits for a slot).
    """
    import threading

    import httpx

    from inferwatch.agent.common.samples import RequestTiming
    from tests.llamacpp_model import PRESETS, cached
    from tests.llamacpp_server import find_binary, llama_server

    binary = find_binary()
    if binary is None:
        return {"error": "llama-server not built (scripts/build-llama-server.sh)"}
    tmp = Path(tempfile.mkdtemp(prefix="tail-explain-"))
    model = cached(tmp, PRESETS["small"])
    rng = random.Random(seed)
    out: dict[str, Any] = {}
    with llama_server(binary, model, tmp / "llama.log", parallel=2, ctx=8192) as server:

        def one(prompt_words: int, n_predict: int) -> RequestTiming:
            prompt = " ".join(rng.choice(("alpha", "beta", "gamma", "delta")) for _ in range(prompt_words))
            t0 = time.perf_counter()
            r = httpx.post(
                f"{server.url}/completion",
                json={"prompt": prompt, "n_predict": n_predict, "cache_prompt": False, "ignore_eos": True},
                timeout=120,
            )
            e2e = time.perf_counter() - t0
            r.raise_for_status()
            body = r.json()
            tm = body["timings"]
            prefill, decode = tm["prompt_ms"] / 1000, tm["predicted_ms"] / 1000
            queue = max(0.0, e2e - prefill - decode)
            return RequestTiming(
                "llama.cpp",
                {"queue": queue, "prefill": prefill, "ttft": queue + prefill, "decode": decode, "e2e": e2e},
                int(tm["prompt_n"]),
                int(tm["predicted_n"]),
                f"{rng.getrandbits(128):032x}",
                f"slot{body.get('id_slot', '?')}-{rng.getrandbits(32):08x}",
                None,
                (("slot", str(body.get("id_slot", "?"))),),
            )

        def phase(name: str, clients: int, make: Callable[[], tuple[int, int]]) -> None:
            timings: list[RequestTiming] = []
            lock = threading.Lock()

            def worker() -> None:
                for _ in range(requests // clients):
                    words, n = make()
                    t = one(words, n)
                    with lock:
                        timings.append(t)

            threads = [threading.Thread(target=worker) for _ in range(clients)]
            for t in threads:
                t.start()
            for t in threads:
                t.join(600)
            records = RequestRecords()
            records.add(timings, 100.0)
            report = explain(records, "llama.cpp", 60.0, 100.0, top=3)
            assert report is not None
            out[name] = {
                q: {k: d[k] for k in ("driver", "headline", "shares")} if d else None
                for q, d in report["quantities"].items()
            }
            print(f"llama.cpp {name}: {report['quantities']['ttft']['headline']}", flush=True)

        phase("long_prompts", 1, lambda: (250 if rng.random() < 0.1 else 5, 8))
        phase("queue", 3, lambda: (5, 48))
    return out


# ---------------------------------------------------------------------------------------------------------------
# Out of sample: episodes drawn at random over cause, intensity, load, mix and deployment (--episodes N).

CAUSES = ("queue", "prefill", PREEMPTION, "dp_rank", "frontend", "page_cache")
TRUTH = {c: c for c in CAUSES} | {"page_cache": "prefill"}  # the page-cache stall is before prefill, as in sample
HARDWARE = ("h100", "a100", "l40s")
MODELS = (MODEL, "Qwen/Qwen2.5-7B-Instruct")
# Completed req/s of two engines of the 8B model saturated with the default mix (measured with run_dp, 80 req/s
# offered, seconds 30-60), per hardware and max_num_seqs: the load is drawn as a share of this.
CAPACITY_2 = {
    ("h100", 16): 12.1,
    ("h100", 32): 22.0,
    ("h100", 64): 34.9,
    ("a100", 16): 7.7,
    ("a100", 32): 12.2,
    ("a100", 64): 17.4,
    ("l40s", 16): 6.8,
    ("l40s", 32): 10.6,
    ("l40s", 64): 14.8,
}
EPISODE_S = WARMUP_S + 120.0  # a warm-up minute, then two one-minute windows; the last one's verdict counts
OVERLOAD_P50_S = 1.0
WEAK = 1 / 3  # intensities below this are "weak" (the tuned ones sit at 0.3-0.55 of each range)


@dataclass(frozen=True)
class Episode:
    """One randomly drawn episode: what is wrong (0, 1 or 2 causes, each with an intensity in [0, 1]) and where."""

    seed: int
    causes: tuple[tuple[str, float], ...]  # (cause, intensity); () is healthy
    hardware: str
    model: str
    engines: int
    max_num_seqs: int
    rate: float  # steady arrivals, req/s (the base between bursts under ``queue``)
    load: float  # rate / nominal capacity
    prompt_median: float
    prompt_sigma: float
    max_tokens: int
    params: dict[str, Any]  # the parameters the intensities map to

    @property
    def truths(self) -> set[str]:
        return {TRUTH[c] for c, _ in self.causes} or {"none"}

    @property
    def label(self) -> str:
        return "+".join(c for c, _ in self.causes) or "healthy"


def draw_episode(seed: int, two_cause_share: float) -> Episode:
    """Draw an episode from ``seed``: intensity ranges wider than the tuned values on both sides (weak to strong).

    Intensity s in [0, 1] maps per cause (the in-sample value in brackets): queue, bursts of (1 + 2.5 s) x capacity
    for (1 + 4 s) seconds every 20-45 s (longer where the mean offered load would pass 0.85) [2.3x for 3 s every 30
    s, s ~ 0.5]; prefill, (0.5 + 5.5 s) % of prompts long [3 %, s ~ 0.45], long = L..2L tokens, L 6k-12k;
    preemption, the KV cache cut to (1 - 0.7 s) of the most blocks the same traffic holds without the cut (a first,
    uncut run of the episode measures it) [869 of 1,311-1,423 on seeds 1-3, s ~ 0.5]; dp_rank, one engine (1.2 + 3.6
    s) x slower [3x, s = 0.5]; frontend, (3 + 20 s) % of requests wait (0.1 + 0.7 s) s [10 % for 0.4 s, s ~
    0.35-0.43]; page_cache, (5 + 30 s) % of requests stall (0.15 + 0.8 s) s [20 % for 0.55 s, s = 0.5].
    """
    rng = random.Random(seed)
    roll = rng.random()
    if roll < two_cause_share:
        while True:
            pair = tuple(rng.sample(CAUSES, 2))
            if TRUTH[pair[0]] != TRUTH[pair[1]]:  # prefill + page_cache would both be "prefill": not two causes
                break
        causes = tuple((c, rng.random()) for c in pair)
    else:
        pick = rng.randrange(len(CAUSES) + 1)
        causes = () if pick == len(CAUSES) else ((CAUSES[pick], rng.random()),)
    hardware = rng.choice(HARDWARE)
    model = rng.choice(MODELS)
    engines = rng.choice((2, 2, 3))
    seqs = rng.choice((16, 32, 64))
    load = rng.uniform(0.3, 0.75)
    rate = load * CAPACITY_2[(hardware, seqs)] * engines / 2
    prompt_median = math.exp(rng.uniform(math.log(256), math.log(1024)))
    prompt_sigma = rng.uniform(0.3, 0.8)
    max_tokens = rng.choice((256, 512, 1024))
    params: dict[str, Any] = {}
    cap = CAPACITY_2[(hardware, seqs)] * engines / 2
    for cause, s in causes:
        if cause == "queue":
            mult, burst_s = 1.0 + 2.5 * s, 1.0 + 4.0 * s
            # Bursts, not a lasting overload: the period keeps the mean offered load at most 0.85 of capacity.
            floor = burst_s * (mult - 0.6 * load) / (0.85 - 0.6 * load)
            params["queue"] = {
                "burst_rate": cap * mult,
                "burst_s": burst_s,
                "period_s": max(rng.uniform(20, 45), floor),
            }
        elif cause == "prefill":
            lo = rng.randint(6_144, 12_288)
            params["prefill"] = {"share": 0.005 + 0.055 * s, "min_tokens": lo, "max_tokens": 2 * lo}
        elif cause == PREEMPTION:
            params[PREEMPTION] = {"kv_kept": 1.0 - 0.7 * s}
        elif cause == "dp_rank":
            params["dp_rank"] = {"engine": rng.randrange(engines), "factor": 1.2 + 3.6 * s}
        elif cause == "frontend":
            params["frontend"] = {"fraction": 0.03 + 0.2 * s, "extra_s": 0.1 + 0.7 * s}
        elif cause == "page_cache":
            params["page_cache"] = {"fraction": 0.05 + 0.3 * s, "extra_s": 0.15 + 0.8 * s}
    return Episode(
        seed, causes, hardware, model, engines, seqs, rate, load, prompt_median, prompt_sigma, max_tokens, params
    )


def episode_arrivals(ep: Episode, seconds: float) -> list[SimRequest]:
    """Poisson arrivals (bursts under ``queue``), prompts lognormal around the episode's median, natural outputs."""
    rng = random.Random(ep.seed * 7919 + 1)
    q = ep.params.get("queue")
    lp = ep.params.get("prefill")

    def rate(t: float) -> float:
        if q and t % q["period_s"] < q["burst_s"]:
            return float(q["burst_rate"])
        return ep.rate * (0.6 if q else 1.0)

    peak = max(ep.rate, q["burst_rate"] if q else 0.0)
    out: list[SimRequest] = []
    for k, t in enumerate(poisson(rate, peak, seconds, rng)):
        injected = "arrival_burst" if q and t % q["period_s"] < q["burst_s"] else ""
        if lp and rng.random() < lp["share"]:
            prompt = rng.randint(lp["min_tokens"], lp["max_tokens"])
            injected = "long_prompt"
        else:
            prompt = min(4096, max(16, round(rng.lognormvariate(math.log(ep.prompt_median), ep.prompt_sigma))))
        out.append(SimRequest(f"cmpl-{ep.seed}-{k}", prompt, ep.max_tokens, t, injected=injected))
    return out


KV_READ_S = 5.0  # the agent reads the engine's KV-cache usage once per collection interval (5 s by default)


class EngineSeriesRecorder(Recorder):
    """The engine's own series as vLLM exports them, per second of virtual time: per data-parallel rank its
    inter-token latency sum and count (``vllm:inter_token_latency_seconds{engine=N}``), and preemptions
    (``vllm:num_preemptions_total``); and its KV-cache usage (``vllm:kv_cache_usage_perc``) as the agent reads it,
    once per :data:`KV_READ_S`, the mean over the ranks (what the engine collector publishes per model). What the
    agent reads from /metrics; stock spans carry none of it."""

    def __init__(self) -> None:
        super().__init__()
        self.now = 0.0
        self.itl: dict[tuple[str, int], list[float]] = {}  # (rank, second) -> [sum, count]
        self.preempted: Counter[int] = Counter()  # second -> preemptions
        self.kv: dict[int, dict[int, float]] = {}  # reading -> rank -> its usage at its last step before the reading

    def on_token(self, req: SimRequest, now: float, itl: float | None) -> None:
        self.now = now
        if itl is not None:
            cell = self.itl.setdefault((str(req.engine_index), math.ceil(now)), [0.0, 0.0])
            cell[0] += itl
            cell[1] += 1

    def on_step(self, core: EngineCore, prompt_tokens: int, generation_tokens: int, preempted: int) -> None:
        super().on_step(core, prompt_tokens, generation_tokens, preempted)
        if preempted:
            self.preempted[math.ceil(self.now)] += preempted
        self.kv.setdefault(math.ceil(self.now / KV_READ_S), {})[core.index] = core.kv_usage

    def signals(self, now: float, window_s: float) -> EngineSignals:
        """The counters' increase over (now - window_s, now]: preemptions, and each rank's mean ITL."""
        lo = now - window_s
        sums: dict[str, list[float]] = {}
        for (rank, sec), (total, count) in self.itl.items():
            if lo < sec <= now:
                cell = sums.setdefault(rank, [0.0, 0.0])
                cell[0] += total
                cell[1] += count
        preempted = sum(n for sec, n in self.preempted.items() if lo < sec <= now)
        usage = [sum(v.values()) / len(v) for k, v in self.kv.items() if lo < k * KV_READ_S <= now and v]
        return EngineSignals(
            float(preempted), {r: t / c for r, (t, c) in sums.items() if c}, max(usage) if usage else None
        )


def simulate_episode(ep: Episode, seconds: float, recorder: Recorder | None = None) -> list[SimRequest]:
    dep = deploy(ep.model, ep.hardware, max_num_seqs=ep.max_num_seqs, max_model_len=32_768)
    if PREEMPTION in ep.params:  # the cache cut to a share of what this very traffic holds at its peak
        peak = [0] * ep.engines
        run_dp(_cores(ep, dep), episode_arrivals(ep, seconds), peak=peak)
        longest = max(r.prompt_tokens for r in episode_arrivals(ep, seconds)) + ep.max_tokens
        fits = math.ceil(longest / dep.block_size) + 1  # one request alone always fits, as vLLM sizes the cache
        blocks = max(fits, round(ep.params[PREEMPTION]["kv_kept"] * max(peak)))
        ep.params[PREEMPTION] |= {"peak_blocks_in_use": max(peak), "kv_blocks": blocks}
        per_block = dep.size.kv_bytes_per_token() * dep.block_size
        free = blocks * per_block / dep.tensor_parallel_size + dep.weight_bytes_per_device + 1024**3
        dep = replace(dep, gpu_memory_utilization=(free + per_block / 2) / dep.hardware.memory_bytes)
    recorder = recorder or Recorder()
    run_dp(_cores(ep, dep, recorder), episode_arrivals(ep, seconds))
    return sorted(recorder.finished, key=lambda r: r.finished_at or 0.0)


def _cores(ep: Episode, dep: Deployment, recorder: Recorder | None = None) -> list[EngineCore]:
    scenarios: list[Scenario] = []
    if "dp_rank" in ep.params:
        scenarios.append(make("slow_rank", ep.params["dp_rank"]))
    if "frontend" in ep.params:
        scenarios.append(make("frontend_delay", ep.params["frontend"]))
    if "page_cache" in ep.params:
        scenarios.append(make("page_cache_pressure", ep.params["page_cache"]))
    rec = recorder or Recorder()
    return [EngineCore(i, dep, ScenarioSet(scenarios), rec, seed=ep.seed) for i in range(ep.engines)]


def run_episode(ep: Episode, stock: bool = True, previous: Any = None) -> dict[str, Any]:
    """Simulate, feed the agent's intake, and keep the explainer's verdicts at the end of each window.

    ``stock``: spans as stock vLLM sends them (no rank, no preemption count), the engine's per-rank ITL and
    preemption counter over the same window handed to the explainer beside them. ``previous``: another build's
    explain module (:func:`load_previous`), whose TTFT verdict on the same records is kept beside (``previous``)."""
    series = EngineSeriesRecorder()
    reqs = simulate_episode(ep, EPISODE_S, series)
    windows: list[dict[str, Any]] = []

    def on_minute(ex: TailExplainer, now: float) -> None:
        signals = series.signals(now, 60.0) if stock else None
        report = explain(ex.records, ep.model, 60.0, now, top=0, signals=signals)
        w: dict[str, Any] = {"t": now}
        if previous is not None:
            old = previous.explain(ex.records, ep.model, 60.0, now, top=0, signals=signals)
            d = old["quantities"]["ttft"] if old else None
            w["previous"] = {"driver": d["driver"], "drivers": d["drivers"]} if d else {"driver": "no data"}
        for quantity in ("ttft", "e2e"):
            d = report["quantities"][quantity] if report else None
            w[quantity] = (
                {"driver": d["driver"], "drivers": d["drivers"], "dominant_phase": d["dominant_phase"]}
                | {"shares": d["shares"]}
                | {"why_not": d["why_not"], "headline": d["headline"]}
                if d
                else {"driver": "no data"}
            )
        windows.append(w)

    feed(reqs, ep.seed, EPISODE_S, on_minute, ep.model, stock)
    last = [r for r in reqs if (r.finished_at or 0.0) > EPISODE_S - 60.0]
    ttfts = sorted(r.first_token - r.arrival for r in last if r.first_token is not None)
    return {
        "groundtruth": ground_truth(last, tuple(c for c, _ in ep.causes)),
        "windows": windows,
        "requests_last_window": len(last),
        "preempted_share_last_window": round(sum(r.preemptions > 0 for r in last) / max(1, len(last)), 4),
        "ttft_p50_s": round(ttfts[len(ttfts) // 2], 4) if ttfts else None,
        "ttft_p99_s": round(ttfts[min(len(ttfts) - 1, int(0.99 * len(ttfts)))], 4) if ttfts else None,
    }


# Ground truth from what the simulator did (simulator/engine.py's ``SimRequest.causes``), by the cause it belongs to.
EFFECT_CAUSE = {
    "arrival_burst": "queue",
    "long_prompt": "prefill",
    "kv_blocks": PREEMPTION,
    "slow_rank": "dp_rank",
    "frontend_delay": "frontend",
    "page_cache_pressure": "page_cache",
}
EFFECTIVE_SHARE = 0.2  # fixed before any scored run: see ground_truth()


def ground_truth(reqs: list[SimRequest], injected: tuple[str, ...]) -> dict[str, Any]:
    """Which injected causes acted on the TTFT tail of ``reqs`` (the scored window), decided from the simulator alone.

    The quantity: the excess time over the window's median of the requests at or above its P99 (P50 and P99 as
    :func:`run_episode` takes them), not the P99 − P50 gap itself: the gap is one request's TTFT, so its attribution
    would rest on one draw of the noise, while the requests above P99 (6 to 40 here) are the tail the explainer is
    asked about. Each such request's excess is split between the seconds each injected effect added to it
    (``SimRequest.causes``, mapped to causes by :data:`EFFECT_CAUSE`); where those exceed the excess (the median
    request carries some of them too) they share the excess pro rata, so a cause accounts for at most the excess.
    A cause's share is its seconds over the tail's whole excess; what no injected effect claims is the traffic's own.

    A cause is *effective* when its share is at least :data:`EFFECTIVE_SHARE` (20 %). The threshold was fixed before
    any scored run, not fitted: a cause that accounts for less than a fifth of the tail's excess is not what an
    engineer would be sent to fix first, and with at most two causes beside the traffic's own queueing, 20 % leaves
    room for both of two causes to count (two causes at 40 % and 25 % are both effective). ``dominant`` is the
    effective cause with the largest share (None: no injected cause acted on the tail)."""
    causes = tuple(dict.fromkeys(injected))
    ttft = sorted((r.first_token - r.arrival, i) for i, r in enumerate(reqs) if r.first_token is not None)
    shares = dict.fromkeys(causes, 0.0)
    out: dict[str, Any] = {"threshold": EFFECTIVE_SHARE, "shares": shares, "effective": [], "dominant": None}
    if not ttft:
        return out
    p50 = ttft[len(ttft) // 2][0]
    p99 = ttft[min(len(ttft) - 1, int(0.99 * len(ttft)))][0]
    tail = [(v, i) for v, i in ttft if v >= p99]
    total = 0.0
    for v, i in tail:
        excess = max(0.0, v - p50)
        total += excess
        seconds = dict.fromkeys(causes, 0.0)
        for effect, s in reqs[i].causes.items():
            cause = EFFECT_CAUSE.get(effect)
            if cause in seconds:
                seconds[cause] += s
        claimed = sum(seconds.values())
        scale = min(1.0, excess / claimed) if claimed > 0 else 0.0
        for cause, s in seconds.items():
            shares[cause] += s * scale
    for cause in causes:
        shares[cause] = round(shares[cause] / total, 4) if total > 0 else 0.0
    effective = sorted((c for c in causes if shares[c] >= EFFECTIVE_SHARE), key=lambda c: -shares[c])
    return out | {
        "p50_s": round(p50, 4),
        "p99_s": round(p99, 4),
        "tail_requests": len(tail),
        "excess_s": round(total, 4),
        "effective": effective,
        "dominant": effective[0] if effective else None,
    }


def right_by_groundtruth(gt: dict[str, Any], named: str, drivers: list[str]) -> bool:
    """No effective cause: right when no driver is named (naming one is a false positive, as on a healthy episode);
    one: its driver named first; two: both drivers among the verdict's ``drivers``."""
    effective = gt["effective"]
    if not effective:
        return named == "none"
    if len(effective) == 1:
        return named == TRUTH[effective[0]]
    return {TRUTH[c] for c in effective} <= set(drivers)


def wilson(k: int, n: int, z: float = 1.96) -> tuple[float, float]:
    """Wilson score interval of a proportion k/n (95 % for z = 1.96)."""
    if n == 0:
        return (0.0, 1.0)
    p = k / n
    centre = (p + z * z / (2 * n)) / (1 + z * z / n)
    half = z * math.sqrt(p * (1 - p) / n + z * z / (4 * n * n)) / (1 + z * z / n)
    return (max(0.0, centre - half), min(1.0, centre + half))


def _rate(k: int, n: int) -> dict[str, Any]:
    lo, hi = wilson(k, n)
    return {"right": k, "episodes": n, "accuracy": round(k / n, 4) if n else None, "ci95": [round(lo, 4), round(hi, 4)]}


def out_of_sample(
    episodes: int, seed_base: int, two_cause_share: float, timeout_s: float, stock: bool = True, previous: Any = None
) -> dict[str, Any]:
    """Run ``episodes`` drawn episodes (seeds seed_base .. seed_base + episodes - 1); score the TTFT verdict.

    Right: healthy, no driver named; one cause, its driver named first; two causes, both drivers named (the verdict's
    ``drivers``). ``one_named`` keeps the looser score (the first driver named is one of the episode's). ``previous``:
    another build's explain module, scored the same way on the same records (``previous_rules``)."""
    rows: list[dict[str, Any]] = []
    started = time.monotonic()
    for i in range(episodes):
        if time.monotonic() - started > timeout_s:
            print(f"stopped after {i} episodes: --timeout {timeout_s:g} s reached", flush=True)
            break
        ep = draw_episode(seed_base + i, two_cause_share)
        t0 = time.process_time()
        try:
            res = run_episode(ep, stock, previous)
        except RuntimeError as exc:  # the scheduler did not finish: counted, never scored as right
            res = {"error": str(exc), "windows": [], "groundtruth": {"effective": ["error"], "dominant": "error"}}
        cpu = time.process_time() - t0
        last = res["windows"][-1] if res["windows"] else {"ttft": {"driver": "error"}, "e2e": {"driver": "error"}}
        named = last["ttft"]["driver"]
        drivers = last["ttft"].get("drivers", [])
        right = _right(ep, named, drivers)
        gt = res["groundtruth"]
        right_gt = bool(res["windows"]) and right_by_groundtruth(gt, named, drivers)
        row = {
            "seed": ep.seed,
            "label": ep.label,
            "causes": [{"cause": c, "intensity": round(s, 3), "weak": s < WEAK} for c, s in ep.causes],
            "truths": sorted(ep.truths),
            "named_ttft": named,
            "named_e2e": last["e2e"]["driver"],
            "named_ttft_first_window": res["windows"][0]["ttft"]["driver"] if res["windows"] else "error",
            "drivers_ttft": drivers,
            "right": right,
            "right_gt": right_gt,
            "one_named": named in ep.truths,
            "deployment": {
                "hardware": ep.hardware,
                "model": ep.model,
                "engines": ep.engines,
                "max_num_seqs": ep.max_num_seqs,
            },
            "rate": round(ep.rate, 2),
            "load": round(ep.load, 3),
            "mix": {"prompt_median": round(ep.prompt_median), "prompt_sigma": round(ep.prompt_sigma, 2)}
            | {"max_tokens": ep.max_tokens},
            "params": ep.params,
            "why_not": last["ttft"].get("why_not"),
            "headline": last["ttft"].get("headline"),
            "shares": last["ttft"].get("shares"),
            "cpu_s": round(cpu, 2),
        } | {k: v for k, v in res.items() if k != "windows"}
        if previous is not None and res["windows"]:
            old = res["windows"][-1]["previous"]
            row["previous"] = {"named_ttft": old["driver"], "drivers_ttft": old.get("drivers", [])}
            row["previous"]["right"] = _right(ep, old["driver"], old.get("drivers", []))
            row["previous"]["right_gt"] = right_by_groundtruth(gt, old["driver"], old.get("drivers", []))
        rows.append(row)
        mark = ("ok " if row["right"] else "MISS") + "/" + ("ok " if right_gt else "MISS")
        print(
            f"{i:4d} seed {ep.seed} {mark} {ep.label:22} "
            + " ".join(f"{c}={s:.2f}" for c, s in ep.causes)
            + f"  named {'+'.join(drivers) or named:16} {ep.hardware}/{ep.max_num_seqs}x{ep.engines}"
            + f" load {ep.load:.2f}  effective {'+'.join(gt['effective']) or '-'}  {cpu:.1f}s",
            flush=True,
        )
    out = summarize(rows)
    out["groundtruth_scoring"] = summarize_groundtruth(rows)
    if previous is not None:
        scored = [
            r | r["previous"] | {"one_named": r["previous"]["named_ttft"] in r["truths"]}
            for r in rows
            if "previous" in r
        ]
        old = summarize(scored)
        keys = ("overall", "single_cause", "two_causes", "two_causes_one_named_first", "healthy_false_positive")
        out["previous_rules"] = {k: old[k] for k in (*keys, "extra_driver", "per_cause", "confusion_single")}
        out["previous_rules"]["groundtruth_scoring"] = summarize_groundtruth(
            [r | r["previous"] for r in rows if "previous" in r]
        )
    return out | {
        "episodes": rows,
        "seed_base": seed_base,
        "two_cause_share": two_cause_share,
        "spans": "stock (no rank, no preemption count; engine series beside)" if stock else "with rank and preemptions",
    }


def _pct(rate: dict[str, Any]) -> str:
    if not rate["episodes"]:
        return "0/0"
    lo, hi = rate["ci95"]
    return f"{rate['right']}/{rate['episodes']} = {100 * rate['accuracy']:.1f} % ({100 * lo:.1f}-{100 * hi:.1f})"


def _right(ep: Episode, named: str, drivers: list[str]) -> bool:
    """Healthy: nothing named; one cause: its driver named first; two causes: both among the verdict's drivers."""
    return ep.truths <= set(drivers) if len(ep.causes) == 2 else named in ep.truths


def summarize(rows: list[dict[str, Any]]) -> dict[str, Any]:
    single = [r for r in rows if len(r["causes"]) == 1]
    double = [r for r in rows if len(r["causes"]) == 2]
    healthy = [r for r in rows if not r["causes"]]
    out: dict[str, Any] = {
        "overall": _rate(sum(r["right"] for r in rows), len(rows)),
        "single_cause": _rate(sum(r["right"] for r in single), len(single)),
        "two_causes": _rate(sum(r["right"] for r in double), len(double)),
        "two_causes_one_named_first": _rate(sum(r["one_named"] for r in double), len(double)),
        "healthy": _rate(sum(r["right"] for r in healthy), len(healthy)),
    }
    fp_ttft = sum(r["named_ttft"] != "none" for r in healthy)
    fp_any = sum(r["named_ttft"] != "none" or r["named_e2e"] != "none" for r in healthy)
    out["healthy_false_positive"] = {"ttft": _rate(fp_ttft, len(healthy)), "ttft_or_e2e": _rate(fp_any, len(healthy))}
    per: dict[str, Any] = {}
    for cause in (*CAUSES, "healthy"):
        rs = [r for r in single if r["label"] == cause] if cause != "healthy" else healthy
        weak = [r for r in rs if r["causes"] and r["causes"][0]["weak"]]
        strong = [r for r in rs if r["causes"] and not r["causes"][0]["weak"]]
        per[cause] = _rate(sum(r["right"] for r in rs), len(rs)) | {
            "weak": _rate(sum(r["right"] for r in weak), len(weak)),
            "not_weak": _rate(sum(r["right"] for r in strong), len(strong)),
        }
    out["per_cause"] = per
    # A driver listed that no active cause has (the verdict's drivers beyond the first included): naming every
    # cause would make two-cause episodes right, so this is reported beside them.
    out["extra_driver"] = {
        k: _rate(sum(bool(set(r.get("drivers_ttft") or []) - set(r["truths"])) for r in rs), len(rs))
        for k, rs in (("single_cause", single), ("two_causes", double))
    }
    pre = [r for r in single if r["label"] == PREEMPTION]
    out["preemption_by_e2e"] = _rate(sum(r["named_e2e"] == PREEMPTION for r in pre), len(pre))
    confusion: dict[str, Counter[str]] = {}
    for r in single + healthy:
        confusion.setdefault(r["label"], Counter())[r["named_ttft"]] += 1
    out["confusion_single"] = {k: dict(v) for k, v in confusion.items()}
    pairs: dict[str, Counter[str]] = {}
    for r in double:
        both = "+".join(sorted(TRUTH[c["cause"]] for c in r["causes"]))
        pairs.setdefault(both, Counter())["+".join(sorted(r.get("drivers_ttft") or [])) or r["named_ttft"]] += 1
    out["confusion_two_causes"] = {k: dict(v) for k, v in sorted(pairs.items())}
    out["two_causes_both_weak"] = _rate(
        sum(r["right"] for r in double if all(c["weak"] for c in r["causes"])),
        sum(all(c["weak"] for c in r["causes"]) for r in double),
    )
    out["failures"] = [
        {k: r.get(k) for k in ("seed", "label", "causes", "named_ttft", "load", "deployment", "why_not", "headline")}
        | {k: r.get(k) for k in ("preempted_share_last_window", "ttft_p50_s", "ttft_p99_s")}
        for r in rows
        if not r["right"]
    ]
    # Overloaded: the median request itself waited (P50 TTFT over 1 s; healthy medians here are 20-200 ms), so
    # there is hardly a tail beside the median to explain. Shown apart; they stay in every figure above.
    calm = [r for r in rows if (r.get("ttft_p50_s") or 0.0) <= OVERLOAD_P50_S]
    out["not_overloaded"] = {
        "overall": _rate(sum(r["right"] for r in calm), len(calm)),
        "single_cause": _rate(
            sum(r["right"] for r in calm if len(r["causes"]) == 1), sum(len(r["causes"]) == 1 for r in calm)
        ),
        "two_causes": _rate(
            sum(r["right"] for r in calm if len(r["causes"]) == 2), sum(len(r["causes"]) == 2 for r in calm)
        ),
    }
    out["overloaded"] = Counter(r["label"] for r in rows if r not in calm)
    # Healthy episodes by the width of their prompt mix (the in-sample mix: lognormal sigma 0.5) and by load.
    out["healthy_false_positive_by"] = {
        "prompt_sigma<=0.5": _rate(
            sum(r["named_ttft"] != "none" for r in healthy if r["mix"]["prompt_sigma"] <= 0.5),
            sum(r["mix"]["prompt_sigma"] <= 0.5 for r in healthy),
        ),
        "prompt_sigma>0.5": _rate(
            sum(r["named_ttft"] != "none" for r in healthy if r["mix"]["prompt_sigma"] > 0.5),
            sum(r["mix"]["prompt_sigma"] > 0.5 for r in healthy),
        ),
        "load<=0.55": _rate(
            sum(r["named_ttft"] != "none" for r in healthy if r["load"] <= 0.55),
            sum(r["load"] <= 0.55 for r in healthy),
        ),
        "load>0.55": _rate(
            sum(r["named_ttft"] != "none" for r in healthy if r["load"] > 0.55), sum(r["load"] > 0.55 for r in healthy)
        ),
    }
    # Single-cause episodes by the same split: how much of the miss rate the mix explains.
    out["single_cause_by_prompt_sigma"] = {
        k: _rate(sum(r["right"] for r in single if test(r)), sum(test(r) for r in single))
        for k, test in (
            ("<=0.5", lambda r: r["mix"]["prompt_sigma"] <= 0.5),
            (">0.5", lambda r: r["mix"]["prompt_sigma"] > 0.5),
        )
    }
    pre_idle = [r for r in rows if any(c["cause"] == PREEMPTION for c in r["causes"])]
    out["preemption_no_request_preempted"] = sum(r.get("preempted_share_last_window") == 0 for r in pre_idle)
    out["cpu_s_total"] = round(sum(r["cpu_s"] for r in rows), 1)
    return out


def summarize_groundtruth(rows: list[dict[str, Any]]) -> dict[str, Any]:
    """The same episodes scored against the ground truth (:func:`ground_truth`, :func:`right_by_groundtruth`), by
    how many injected causes were effective in the scored window; episodes with a cause injected but none effective
    apart from healthy ones (nothing injected), with what the explainer named on them."""
    ok = [r for r in rows if r.get("groundtruth", {}).get("effective") != ["error"]]
    healthy = [r for r in ok if not r["causes"]]
    idle = [r for r in ok if r["causes"] and not r["groundtruth"]["effective"]]
    one = [r for r in ok if len(r["groundtruth"]["effective"]) == 1]
    two = [r for r in ok if len(r["groundtruth"]["effective"]) == 2]
    out: dict[str, Any] = {
        "threshold": EFFECTIVE_SHARE,
        "errors": len(rows) - len(ok),
        "one_effective_named_first": _rate(sum(r["right_gt"] for r in one), len(one)),
        "one_effective_of_two_injected": _rate(
            sum(r["right_gt"] for r in one if len(r["causes"]) == 2), sum(len(r["causes"]) == 2 for r in one)
        ),
        "two_effective_both_named": _rate(sum(r["right_gt"] for r in two), len(two)),
        "no_effective_cause_none_named": _rate(sum(r["right_gt"] for r in idle), len(idle)),
        "healthy_none_named": _rate(sum(r["right_gt"] for r in healthy), len(healthy)),
        "overall": _rate(sum(r["right_gt"] for r in rows), len(rows)),
    }
    moved: dict[str, Counter[str]] = {}
    for r in idle:
        moved.setdefault(r["label"], Counter())[r["named_ttft"]] += 1
    out["no_effective_cause_named"] = {k: dict(v) for k, v in sorted(moved.items())}
    conf: dict[str, Counter[str]] = {}
    for r in one:
        conf.setdefault(r["groundtruth"]["dominant"], Counter())[r["named_ttft"]] += 1
    out["confusion_one_effective"] = {k: dict(v) for k, v in sorted(conf.items())}
    out["per_dominant_cause"] = {
        c: _rate(sum(r["right_gt"] for r in one if r["groundtruth"]["dominant"] == c), sum(v.values()))
        for c, v in conf.items()
    }
    pairs: dict[str, Counter[str]] = {}
    for r in two:
        both = "+".join(sorted(TRUTH[c] for c in r["groundtruth"]["effective"]))
        pairs.setdefault(both, Counter())["+".join(sorted(r.get("drivers_ttft") or [])) or r["named_ttft"]] += 1
    out["confusion_two_effective"] = {k: dict(v) for k, v in sorted(pairs.items())}
    # How the configured causes map to the effective ones: one injected cause that is not effective, two injected of
    # which one is, ... (rows: causes injected, columns: causes effective).
    out["injected_vs_effective"] = dict(
        Counter(f"{len(r['causes'])} injected, {len(r['groundtruth']['effective'])} effective" for r in ok)
    )
    out["failures"] = [
        {k: r.get(k) for k in ("seed", "label", "named_ttft", "drivers_ttft", "load")}
        | {"effective": r["groundtruth"]["effective"], "shares": r["groundtruth"]["shares"]}
        for r in ok
        if not r["right_gt"]
    ]
    return out


def groundtruth_table(gt: dict[str, Any]) -> str:
    """The ground-truth scoring's confusion table as Markdown (rows: the one effective cause, or no effective cause
    by the cause injected; columns: driver named on TTFT)."""
    drivers = ["none", "queue", "prefill", "frontend", PREEMPTION, "dp_rank"]
    rows = [(c, TRUTH[c], v) for c, v in gt["confusion_one_effective"].items()]
    rows += [(f"{label} (not effective)", "none", v) for label, v in gt["no_effective_cause_named"].items()]
    drivers += sorted({d for _, _, v in rows for d in v} - set(drivers))
    lines = [
        "| effective cause | true driver | " + " | ".join(drivers) + " | right |",
        "|---|---|" + "---|" * len(drivers) + "---|",
    ]
    for name, truth, v in rows:
        cells = [(f"**{v[d]}**" if d == truth else str(v[d])) if v.get(d) else "" for d in drivers]
        lines.append(f"| {name} | {truth} | " + " | ".join(cells) + f" | {v.get(truth, 0)}/{sum(v.values())} |")
    return "\n".join(lines)


def oos_table(summary: dict[str, Any]) -> str:
    """The single-cause confusion table as Markdown (rows: cause injected, columns: driver named on TTFT)."""
    conf = summary["confusion_single"]
    drivers = ["none", "queue", "prefill", "frontend", PREEMPTION, "dp_rank"]
    drivers += sorted({d for v in conf.values() for d in v} - set(drivers))
    lines = [
        "| cause injected | true driver | " + " | ".join(drivers) + " | right (95 % CI) | weak right |",
        "|---|---|" + "---|" * len(drivers) + "---|---|",
    ]
    for cause in (*CAUSES, "healthy"):
        v = conf.get(cause, {})
        truth = TRUTH.get(cause, "none")
        cells = [(f"**{v[d]}**" if d == truth else str(v[d])) if v.get(d) else "" for d in drivers]
        p = summary["per_cause"][cause]
        ci = f"{100 * p['ci95'][0]:.0f}–{100 * p['ci95'][1]:.0f} %"
        weak = f"{p['weak']['right']}/{p['weak']['episodes']}" if cause != "healthy" else ""
        lines.append(
            f"| {cause} | {truth} | " + " | ".join(cells) + f" | {p['right']}/{p['episodes']} ({ci}) | {weak} |"
        )
    return "\n".join(lines)


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--minutes", type=int, default=20, help="1-minute windows per scenario")
    ap.add_argument("--seed", type=int, default=1)
    ap.add_argument("--json", type=Path, help="write the results here")
    ap.add_argument("--skip-accuracy", action="store_true")
    ap.add_argument(
        "--cases",
        help="comma-separated scenario names to run (default: all): " + ", ".join(sorted({c.name for c in CASES})),
    )
    ap.add_argument(
        "--previous",
        type=Path,
        help="another build's explain.py: timed beside this one (cost part), scored on the same episodes (--episodes)",
    )
    ap.add_argument("--cost-repeats", type=int, default=15, help="explain() calls timed in the cost part")
    ap.add_argument("--llamacpp", action="store_true", help="also run on the real llama.cpp server's timings")
    ap.add_argument("--episodes", type=int, help="out of sample: run this many randomly drawn episodes instead")
    ap.add_argument("--seed-base", type=int, help="first episode's seed (default: drawn fresh, printed)")
    ap.add_argument("--two-cause-share", type=float, default=0.3, help="share of episodes with two causes at once")
    ap.add_argument("--timeout", type=float, default=3600.0, help="stop drawing episodes after this many seconds")
    ap.add_argument(
        "--enriched-spans",
        action="store_true",
        help="out of sample: spans carry vllm.dp_rank and vllm.num_preemptions (default: stock vLLM spans, without)",
    )
    args = ap.parse_args()
    if args.episodes:
        seed_base = args.seed_base if args.seed_base is not None else 10_000 + random.SystemRandom().randrange(10**6)
        print(
            f"out of sample: {args.episodes} episodes, seeds {seed_base}..{seed_base + args.episodes - 1}", flush=True
        )
        t0 = time.monotonic()
        prev = load_previous(args.previous) if args.previous else None
        oos = out_of_sample(args.episodes, seed_base, args.two_cause_share, args.timeout, not args.enriched_spans, prev)
        oos["wall_s"] = round(time.monotonic() - t0, 1)
        print(oos_table(oos), flush=True)
        for key in ("overall", "single_cause", "two_causes", "two_causes_one_named_first", "healthy_false_positive"):
            print(f"{key}: {oos[key]}")
        for key in ("not_overloaded", "overloaded", "two_causes_both_weak", "healthy_false_positive_by"):
            print(f"{key}: {oos[key]}")
        for key in ("extra_driver", "preemption_no_request_preempted"):
            print(f"{key}: {oos[key]}")
        gts = oos["groundtruth_scoring"]
        print(groundtruth_table(gts), flush=True)
        print("scoring          configured causes            ground truth (effective causes)")
        print(f"one cause        {_pct(oos['single_cause']):28} {_pct(gts['one_effective_named_first'])}")
        print(f"two causes       {_pct(oos['two_causes']):28} {_pct(gts['two_effective_both_named'])}")
        print(f"healthy          {_pct(oos['healthy']):28} {_pct(gts['healthy_none_named'])}")
        print(f"no effective     {'':28} {_pct(gts['no_effective_cause_none_named'])}")
        print(f"overall          {_pct(oos['overall']):28} {_pct(gts['overall'])}")
        for key in ("injected_vs_effective", "no_effective_cause_named", "confusion_two_effective", "errors"):
            print(f"ground truth, {key}: {gts[key]}")
        for key, value in oos.get("previous_rules", {}).items():
            if key not in ("per_cause", "confusion_single"):
                print(f"previous rules, {key}: {value}")
        print(f"wall {oos['wall_s']} s, CPU {oos['cpu_s_total']} s")
        if args.json:
            args.json.write_text(json.dumps({"out_of_sample": oos}, indent=1) + "\n")
        return
    out: dict[str, Any] = {"minutes": args.minutes, "seed": args.seed}
    if not args.skip_accuracy:
        out["accuracy"] = accuracy(args.minutes, args.seed, set(args.cases.split(",")) if args.cases else None)
        print(confusion_table(out["accuracy"]), flush=True)
    out["cost"] = cost(args.seed, args.cost_repeats, args.previous)
    if args.llamacpp:
        out["llamacpp"] = llamacpp(args.seed)
    print(json.dumps(out["cost"], indent=2))
    if "accuracy" in out:
        for k, v in out["accuracy"]["examples"].items():
            print(f"  {k}: {v}")
    if args.json:
        args.json.write_text(json.dumps(out, indent=2) + "\n")


if __name__ == "__main__":
    main()
