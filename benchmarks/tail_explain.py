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

Run: ``.venv/bin/python benchmarks/tail_explain.py [--minutes 20] [--json out.json]`` (about a minute on one core).
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
from collections.abc import Callable
from dataclasses import dataclass, replace
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from opentelemetry.proto.collector.trace.v1.trace_service_pb2 import ExportTraceServiceRequest
from opentelemetry.proto.common.v1.common_pb2 import AnyValue

from inferwatch.agent.node.analytics.explain import PREEMPTION, RecordingSink, TailExplainer, explain
from inferwatch.agent.node.analytics.latency import LatencyAnalytics
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
    t, k = 0.0, 0
    while True:
        t += rng.expovariate(peak)
        if t >= seconds:
            return out
        if rng.random() * peak > case.rate(t):
            continue
        if rng.random() < case.long_prompt_share:
            prompt = rng.randint(8_192, 16_384)
        else:
            prompt = min(4096, max(16, round(rng.lognormvariate(6.24, 0.5))))
        fixed = case.fixed_output_tokens
        out.append(SimRequest(f"cmpl-{seed}-{k}", prompt, fixed or 512, t, ignore_eos=bool(fixed)))
        k += 1


def deployment(case: Case) -> Deployment:
    dep = deploy(MODEL, "h100", max_num_seqs=MAX_NUM_SEQS, max_model_len=32_768)
    return replace(dep, gpu_memory_utilization=case.gpu_memory_utilization)


def run_dp(cores: list[EngineCore], requests: list[SimRequest], max_steps: int = 20_000_000) -> None:
    """Drive data-parallel ``cores`` in virtual time; each arrival goes to the least loaded (vLLM's DP balancing)."""
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
        if step is not None:
            steps[c] = step
            due[c] = step.start + step.duration
        else:
            wake = core.next_wakeup()
            due[c] = max(wake, now + 1e-6) if wake is not None else inf
    raise RuntimeError("simulation did not finish")


def export(reqs: list[SimRequest], rng: random.Random) -> bytes:
    """The finished requests as one OTLP export of vLLM-style ``llm_request`` spans (simulator/tracing.py's keys)."""
    out = ExportTraceServiceRequest()
    rs = out.resource_spans.add()
    rs.resource.attributes.add(key="service.name", value=AnyValue(string_value="vllm"))
    rs.resource.attributes.add(key="gen_ai.request.model", value=AnyValue(string_value=MODEL))
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
    reqs: list[SimRequest], seed: int, end_s: float, on_minute: Callable[[TailExplainer, float], None] | None = None
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
            intake.handle(export(batch, rng), "grpc")
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
        spec = importlib.util.spec_from_file_location("previous_explain", previous)
        assert spec is not None and spec.loader is not None
        prev = sys.modules["previous_explain"] = importlib.util.module_from_spec(spec)  # dataclasses look it up
        spec.loader.exec_module(prev)
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
    ap.add_argument("--previous", type=Path, help="another build's explain.py, timed beside this one (cost part)")
    ap.add_argument("--cost-repeats", type=int, default=15, help="explain() calls timed in the cost part")
    ap.add_argument("--llamacpp", action="store_true", help="also run on the real llama.cpp server's timings")
    args = ap.parse_args()
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
