"""The tail explainer (agent/node/analytics/explain.py): verdicts on known tails, bounded records, the API, CLI and
metric.

Units feed :class:`RequestTiming` values with a virtual clock; the integration test sends OTLP/HTTP spans to a real
agent on 127.0.0.1 and reads ``/api/v1/explain``, ``inferwatch explain`` and ``/metrics``.
"""

from __future__ import annotations

import bisect
import json
import math
import os
import random
import subprocess
import sys
import time
from dataclasses import replace

import httpx
import pytest
from opentelemetry.proto.collector.trace.v1.trace_service_pb2 import ExportTraceServiceRequest
from opentelemetry.proto.common.v1.common_pb2 import AnyValue

from inferwatch.agent import catalog
from inferwatch.agent.common.samples import RequestTiming, Sample, attrs
from inferwatch.agent.node.analytics import explain as ex
from inferwatch.agent.node.analytics import tailrecords, tailstats
from inferwatch.agent.node.analytics.explaintext import render_html, render_text
from inferwatch.agent.node.receiver.spans import extract
from tests.conftest import PYTHON, ROOT, free_port
from tests.procs import running, wait_http

MODEL = "m"
TRACE_URL = "http://127.0.0.1:6006/redirects/traces/"


def timing(
    rng: random.Random,
    queue: float = 0.0,
    prefill: float | None = None,
    frontend: float = 0.004,
    rank: int = 0,
    prompt: int = 500,
    decode_per_token: float = 0.01,
    preemptions: int = 0,
) -> RequestTiming:
    q = queue + rng.uniform(0.0, 0.004)
    p = prefill if prefill is not None else 0.03 * rng.uniform(0.9, 1.1)
    n = rng.randint(150, 210)
    d = decode_per_token * (n - 1) * rng.uniform(0.95, 1.05)
    ttft = frontend + q + p
    return RequestTiming(
        MODEL,
        {"ttft": ttft, "queue": q, "prefill": p, "decode": d, "e2e": ttft + d},
        prompt,
        n,
        f"{rng.getrandbits(128):032x}",
        f"cmpl-{rng.getrandbits(32):08x}",
        preemptions,
        (("dp_rank", str(rank)),),
    )


def explained(timings: list[RequestTiming], window_s: float = 60.0) -> dict:
    records = tailrecords.RequestRecords()
    records.add(timings, 100.0)
    report = ex.explain(records, MODEL, window_s, 100.0, top=5)
    assert report is not None
    return report


def test_queue_tail_is_named_with_its_share_and_the_slowest_requests() -> None:
    rng = random.Random(1)
    reqs = [timing(rng) for _ in range(950)] + [timing(rng, queue=rng.uniform(1.0, 2.0)) for _ in range(50)]
    report = explained(reqs)
    t = report["quantities"]["ttft"]
    assert t["driver"] == "queue" and t["confident"] and t["shares"]["queue"] > 0.9
    assert abs(sum(t["shares"].values()) - 1.0) < 1e-6  # the phases add up to the gap
    assert t["headline"].startswith("P99 TTFT ") and "of the gap is queue" in t["headline"]
    rows = report["slowest"]
    assert len(rows) == 5 and rows[0]["ttft_s"] >= rows[-1]["ttft_s"] > 1.0
    slowest = max(reqs, key=lambda r: r.seconds["ttft"])
    assert rows[0]["trace_id"] == slowest.trace_id and rows[0]["request_id"] == slowest.request_id
    assert rows[0]["frontend_gap_s"] == pytest.approx(0.004, abs=1e-6)
    assert rows[0]["labels"] == {"dp_rank": "0"} and rows[0]["preemptions"] == 0


def test_frontend_prefill_and_a_slow_rank_are_told_apart() -> None:
    rng = random.Random(2)
    base = [timing(rng) for _ in range(900)]
    front = explained(base + [timing(rng, frontend=0.5) for _ in range(100)])["quantities"]["ttft"]
    assert front["driver"] == "frontend" and front["phase"] == "frontend"
    long = [timing(rng, prefill=0.8, prompt=12_000) for _ in range(30)]
    prefill = explained(base + long)["quantities"]["ttft"]
    assert prefill["driver"] == "prefill" and prefill["attribute"] == "prompt_tokens=4k-16k"
    rank = [timing(rng, rank=1, queue=0.15, prefill=0.2, decode_per_token=0.03) for _ in range(250)]
    slow = explained(base[:750] + rank)["quantities"]
    assert slow["ttft"]["driver"] == "dp_rank" and slow["ttft"]["attribute"] == "dp_rank=1"


def test_healthy_windows_name_no_driver_and_say_why() -> None:
    rng = random.Random(3)
    report = explained([timing(rng) for _ in range(1000)])
    for q in ("ttft", "e2e"):
        d = report["quantities"][q]
        assert d["driver"] == "none" and not d["confident"] and d["why_not"]
        assert "no dominant driver" in d["headline"]
    few = explained([timing(rng, queue=rng.uniform(0, 3)) for _ in range(20)])["quantities"]["ttft"]
    assert few["driver"] == "none" and "20 requests < 50" in few["why_not"]


def test_preempted_decode_drives_e2e_beyond_output_length() -> None:
    rng = random.Random(4)
    base = [timing(rng) for _ in range(900)]
    slow = [timing(rng, decode_per_token=0.05, preemptions=2) for _ in range(60)]
    e2e = explained(base + slow)["quantities"]["e2e"]
    assert e2e["driver"] == "preemption" and e2e["phase"] == "decode" and e2e["attribute"] == "preempted=yes"
    assert "of the gap is decode under KV-cache preemptions: 6% of requests were preempted" in e2e["headline"]
    # the same slow tokens without preemptions: decode, and no preemption named
    plain = explained(base + [replace(t, preemptions=0) for t in slow])["quantities"]["e2e"]
    assert plain["driver"] == "decode" and plain["preemption"] is None


def test_queue_behind_preemptions_is_named_only_when_they_were_in_flight_together() -> None:
    """vLLM preempts only when no KV block is free; the queue tail is theirs when it waited beside them."""
    rng = random.Random(12)
    records = tailrecords.RequestRecords()
    records.add([timing(rng) for _ in range(500)], 50.0)
    records.add([timing(rng, preemptions=1) for _ in range(30)], 50.0)  # 5 % preempted, ending at 50 s
    records.add([timing(rng) for _ in range(450)], 99.0)
    records.add([timing(rng, queue=rng.uniform(1.0, 2.0)) for _ in range(30)], 51.0)  # queued while they ran
    report = ex.explain(records, MODEL, 60.0, 100.0)
    assert report is not None
    t = report["quantities"]["ttft"]
    assert t["driver"] == "preemption" and t["phase"] == "queue" and t["attribute"] == "preempted=yes"
    assert t["preemption"]["tail_in_flight_with_preempted"] == 1.0
    assert "of the gap is queue under KV-cache preemptions" in t["headline"]
    metric = {dict(x.attributes)["quantity"]: dict(x.attributes) for x in ex.driver_samples(report, MODEL, "5m")}
    assert metric["ttft"]["phase"] == "queue" and metric["ttft"]["attribute"] == "preempted=yes"  # the alert text
    # the same burst 40 s after the preemptions (they were over by then): an arrival burst, queue
    records = tailrecords.RequestRecords()
    records.add([timing(rng) for _ in range(500)], 50.0)
    records.add([timing(rng, preemptions=1) for _ in range(30)], 50.0)
    records.add([timing(rng) for _ in range(450)], 99.0)
    records.add([timing(rng, queue=rng.uniform(1.0, 2.0)) for _ in range(30)], 95.0)
    report = ex.explain(records, MODEL, 60.0, 100.0)
    assert report is not None
    t = report["quantities"]["ttft"]
    assert t["driver"] == "queue" and t["preemption"] is None
    # two preempted requests in a thousand are not a saturated cache
    few = [timing(rng) for _ in range(950)] + [timing(rng, preemptions=1) for _ in range(2)]
    t = explained(few + [timing(rng, queue=rng.uniform(1.0, 2.0)) for _ in range(30)])["quantities"]["ttft"]
    assert t["driver"] == "queue"


def test_a_rank_slower_per_token_is_named_even_when_its_tail_shows_as_queue() -> None:
    rng = random.Random(13)
    fast = [timing(rng) for _ in range(740)]
    # rank 1 takes a quarter of the requests, decodes 3x slower and queues; its tail share is under 3x its share
    slow = [timing(rng, rank=1, decode_per_token=0.03) for _ in range(230)]
    slow += [timing(rng, rank=1, queue=rng.uniform(0.5, 1.0), decode_per_token=0.03) for _ in range(12)]
    fast += [timing(rng, queue=rng.uniform(0.5, 1.0)) for _ in range(8)]
    t = explained(fast + slow)["quantities"]["ttft"]
    assert t["shares"]["queue"] > 0.9 and t["separators"][0]["lift"] < ex.STRONG_LIFT
    assert t["driver"] == "dp_rank" and t["attribute"] == "dp_rank=1"
    assert t["slow_placement"]["itl_ratio"] == pytest.approx(3.0, rel=0.1)
    assert "3.0x slower per output token" in t["headline"]
    # a burst that one rank happened to take, its tokens at the others' pace: queue, the rank named beside it
    burst = [timing(rng, rank=1) for _ in range(480)]
    burst += [timing(rng, rank=1, queue=rng.uniform(0.5, 1.0)) for _ in range(20)]
    t = explained([timing(rng) for _ in range(500)] + burst)["quantities"]["ttft"]
    assert t["driver"] == "queue" and t["slow_placement"] is None and t["attribute"] == "dp_rank=1"
    # a slow rank does not take the blame for a front-end delay
    front = [timing(rng) for _ in range(660)] + [timing(rng, frontend=0.6) for _ in range(90)]
    t = explained(front + [timing(rng, rank=1, decode_per_token=0.03) for _ in range(250)])["quantities"]["ttft"]
    assert t["driver"] == "frontend"


def test_large_windows_keep_the_tail_band_and_p99_exact() -> None:
    """Above 8,192 records the middle of the ranking is sampled; the tail band and P99 stay exact."""
    rng = random.Random(14)
    values = [rng.lognormvariate(0.0, 1.0) for _ in range(20_000)]
    idx = list(range(len(values)))
    tail, mid, p50, p99 = tailstats.bands_by_value(idx, values)
    ranked = sorted(values)
    k = math.ceil(tailstats.TAIL_BAND * len(values))
    assert sorted(values[j] for j in tail) == ranked[-k:]
    assert p99 == ranked[math.ceil(0.99 * len(values)) - 1]
    assert abs(bisect.bisect_left(ranked, p50) / len(values) - 0.5) < 0.01  # P50 from the sample: rank within 1 %
    assert 0 < len(mid) <= 2 * tailstats.MEDIAN_BAND_SAMPLE
    assert all(ranked[int(0.38 * len(ranked))] <= values[j] <= ranked[int(0.62 * len(ranked))] for j in mid)


def test_records_are_bounded_and_sampled_above_the_budget_keeping_the_slow_ones() -> None:
    rng = random.Random(5)
    records = tailrecords.RequestRecords(capacity=500, budget=100)
    records.add([timing(rng) for _ in range(300)], 5.0)  # sub-window 0: 300 received, all kept
    records.slow[MODEL] = (0.5, 100.0)
    slow = [timing(rng, queue=1.0) for _ in range(10)]
    records.add([timing(rng) for _ in range(290)] + slow, 15.0)  # stride 3 now; the slow ones are kept whole
    assert records.stride() == 3 and records.sampled_out > 150
    win = records.window([MODEL], 60.0, 15.0)
    kept = {r for r in win.requests}
    assert all(s.request_id in kept for s in slow)
    weights = win.f["weight"]
    assert set(weights) == {1.0, 3.0}
    report = ex.explain(records, MODEL, 60.0, 15.0)
    assert report is not None and report["sampled"] and report["requests"] == len(win)
    records.add([timing(rng) for _ in range(600)], 25.0)  # over the capacity: the oldest go first
    assert records.overwritten > 0 and len(records.window([MODEL], 60.0, 25.0)) <= 500
    report = ex.explain(records, MODEL, 60.0, 25.0)
    assert report is not None and report["covered_s"] < 60.0
    assert records.memory_bytes() <= 500 * tailrecords.RECORD_BYTES_MAX


def test_window_parsing_and_the_histogram_fallback() -> None:
    assert ex.parse_window("5m") == 300.0 and ex.parse_window("30s") == 30.0
    for bad in ("", "10m", "5h", "-1m", "xs"):
        with pytest.raises(ValueError, match="window must be"):
            ex.parse_window(bad)
    quantiles = {
        ("ttft", 0.5): 0.1,
        ("ttft", 0.99): 2.0,
        ("queue", 0.5): 0.01,
        ("queue", 0.99): 1.8,
        ("prefill", 0.5): 0.05,
        ("prefill", 0.99): 0.1,
    }
    report = ex.explain_histograms(quantiles, MODEL, "5m", 500.0)
    t = report["quantities"]["ttft"]
    assert report["source"] == "histogram" and "quantiles do not add" in report["note"]
    assert t["driver"] == "queue" and t["headline"].endswith("(from histograms)")
    assert report["quantities"]["e2e"] is None and report["slowest"] == []


def test_spans_carry_trace_request_rank_and_preemptions_and_the_metric_is_in_the_catalog() -> None:
    req = _export([(0.01, 0.02, 1, 0)], random.Random(6))
    (t,) = extract(req).timings
    assert t.request_id == "cmpl-0" and t.preemptions == 0 and t.labels == (("dp_rank", "1"),)
    assert t.trace_id is not None and len(t.trace_id) == 32
    spec = catalog.get("inferwatch.engine.tail.driver")
    assert spec.prometheus == "inferwatch_engine_tail_driver_ratio"
    rng = random.Random(7)
    report = explained([timing(rng) for _ in range(950)] + [timing(rng, queue=1.5) for _ in range(50)])
    ttft, _ = ex.driver_samples(report, MODEL, "5m")
    assert dict(ttft.attributes)["phase"] == "queue" and ttft.value > 0.9
    assert set(dict(ttft.attributes)) == set(spec.attributes)


def _export(rows: list[tuple[float, float, int, int]], rng: random.Random) -> ExportTraceServiceRequest:
    """(queue, prefill, dp rank, preemptions) per request as vLLM-style llm_request spans."""
    out = ExportTraceServiceRequest()
    rs = out.resource_spans.add()
    rs.resource.attributes.add(key="gen_ai.request.model", value=AnyValue(string_value=MODEL))
    ss = rs.scope_spans.add()
    for k, (queue, prefill, rank, pre) in enumerate(rows):
        sp = ss.spans.add()
        sp.trace_id, sp.span_id, sp.name = rng.randbytes(16), rng.randbytes(8), "llm_request"
        ttft = 0.004 + queue + prefill
        a = sp.attributes
        a.add(key="gen_ai.request.id", value=AnyValue(string_value=f"cmpl-{k}"))
        a.add(key="gen_ai.usage.prompt_tokens", value=AnyValue(int_value=500))
        a.add(key="gen_ai.usage.completion_tokens", value=AnyValue(int_value=100))
        a.add(key="vllm.dp_rank", value=AnyValue(int_value=rank))
        a.add(key="vllm.num_preemptions", value=AnyValue(int_value=pre))
        a.add(key="gen_ai.latency.time_in_queue", value=AnyValue(double_value=queue))
        a.add(key="gen_ai.latency.time_in_model_prefill", value=AnyValue(double_value=prefill))
        a.add(key="gen_ai.latency.time_to_first_token", value=AnyValue(double_value=ttft))
        a.add(key="gen_ai.latency.time_in_model_decode", value=AnyValue(double_value=1.0))
        a.add(key="gen_ai.latency.e2e", value=AnyValue(double_value=ttft + 1.0))
    return out


@pytest.mark.integration
def test_agent_explains_spans_over_the_api_the_cli_and_metrics(tmp_path) -> None:
    rng = random.Random(8)
    rows = [(rng.uniform(0, 0.004), 0.03 * rng.uniform(0.9, 1.1), rng.randrange(2), 0) for _ in range(380)]
    rows += [(rng.uniform(1.0, 2.0), 0.03, rng.randrange(2), 0) for _ in range(20)]
    payload = _export(rows, rng).SerializeToString()
    port, spans_port = free_port(), free_port()
    env = {
        "INFERWATCH_RECEIVER__ENABLED": "true",
        "INFERWATCH_RECEIVER__GRPC_ENDPOINT": "",
        "INFERWATCH_RECEIVER__HTTP_ENDPOINT": f"127.0.0.1:{spans_port}",
        "INFERWATCH_RECEIVER__TRACE_URL": TRACE_URL,
        "INFERWATCH_SNAPSHOTS__DIR": str(tmp_path / "snap"),
        "INFERWATCH_EVIDENCE__DIR": str(tmp_path / "evidence"),
    }
    with running(
        [PYTHON, "-m", "inferwatch.agent", "run", "--port", str(port)], tmp_path / "agent.log", cwd=ROOT, env=env
    ) as a:
        base = f"http://127.0.0.1:{port}"
        wait_http(f"{base}/healthz", proc=a)
        wait_http(f"http://127.0.0.1:{spans_port}/v1/traces", proc=a, ok=lambda _r: True)
        r = httpx.post(
            f"http://127.0.0.1:{spans_port}/v1/traces",
            content=payload,
            headers={"Content-Type": "application/x-protobuf"},
        )
        assert r.status_code == 200
        report = httpx.get(f"{base}/api/v1/explain", params={"window": "1m", "top": 3}).json()
        assert report["model"] == MODEL and report["requests"] == 400
        assert report["quantities"]["ttft"]["driver"] == "queue"
        slowest_queue = max(q for q, _, _, _ in rows)
        assert report["slowest"][0]["queue_s"] == pytest.approx(slowest_queue, abs=1e-6)
        first = report["slowest"][0]
        assert first["trace_url"] == TRACE_URL + first["trace_id"]  # receiver.trace_url + the id, as dashboards link
        text = httpx.get(f"{base}/api/v1/explain", params={"model": MODEL, "format": "text"}).text
        assert "of the gap is queue" in text and "slowest 10 by ttft" in text
        assert TRACE_URL + first["trace_id"] in text
        page = httpx.get(f"{base}/api/v1/explain", params={"model": MODEL, "format": "html"})
        assert page.headers["content-type"].startswith("text/html")
        assert f'<a href="{TRACE_URL}{first["trace_id"]}"' in page.text  # the status page's model card links here
        bad = httpx.get(f"{base}/api/v1/explain", params={"window": "2h"})
        assert bad.status_code == 400 and "window must be" in bad.json()["message"]
        missing = httpx.get(f"{base}/api/v1/explain", params={"model": "nope"})
        assert missing.status_code == 404 and MODEL in missing.json()["message"]
        deadline = time.monotonic() + 120  # bounds a hang (CI's load 10-17 on 2 cores)
        while 'phase="queue"' not in (metrics := httpx.get(f"{base}/metrics").text):
            assert time.monotonic() < deadline, metrics[-2000:]
            time.sleep(0.3)
        name = "inferwatch_engine_tail_driver_ratio{"
        line = next(x for x in metrics.splitlines() if x.startswith(name) and 'quantity="ttft"' in x)
        assert 'attribute="none"' in line and 'window="5m"' in line and float(line.rsplit(" ", 1)[1]) > 0.9
        cli = [sys.executable, "-m", "inferwatch.agent", "explain", "--agent", base, "--window", "1m"]
        env_cli = {**os.environ}
        out = subprocess.run([*cli, "--json"], capture_output=True, text=True, cwd=ROOT, timeout=60, env=env_cli)
        assert out.returncode == 0, out.stderr
        assert json.loads(out.stdout)["quantities"]["ttft"]["phase"] == "queue"
        out = subprocess.run(cli, capture_output=True, text=True, cwd=ROOT, timeout=60, env=env_cli)
        assert out.returncode == 0 and "TTFT: P99 TTFT" in out.stdout and "request_id" in out.stdout
        assert TRACE_URL + first["trace_id"] in out.stdout  # the CLI prints the link, not a bare id
        out = subprocess.run([*cli[:-1], "10m"], capture_output=True, text=True, cwd=ROOT, timeout=60)
        assert out.returncode == 2 and "window must be" in out.stderr


@pytest.mark.integration
def test_prometheus_stores_the_agents_exemplars_with_the_spans_trace_ids(tmp_path) -> None:
    """Real Prometheus with exemplar storage scrapes the agent (OpenMetrics) and returns the spans' trace ids."""
    rng = random.Random(9)
    rows = [(rng.uniform(0, 0.05), rng.uniform(0.01, 0.5), 0, 0) for _ in range(60)]
    req = _export(rows, rng)
    sent = {span.trace_id.hex() for rs in req.resource_spans for ss in rs.scope_spans for span in ss.spans}
    port, spans_port, prom_port = free_port(), free_port(), free_port()
    env = {
        "INFERWATCH_RECEIVER__ENABLED": "true",
        "INFERWATCH_RECEIVER__EMIT_HISTOGRAMS": "true",
        "INFERWATCH_RECEIVER__GRPC_ENDPOINT": "",
        "INFERWATCH_RECEIVER__HTTP_ENDPOINT": f"127.0.0.1:{spans_port}",
        "INFERWATCH_SNAPSHOTS__DIR": str(tmp_path / "snap"),
        "INFERWATCH_EVIDENCE__DIR": str(tmp_path / "evidence"),
    }
    cfg = tmp_path / "prometheus.yml"
    cfg.write_text(
        "global: {scrape_interval: 1s}\n"
        "scrape_configs:\n"
        f"  - {{job_name: inferwatch-agent, static_configs: [{{targets: ['127.0.0.1:{port}']}}]}}\n"
    )
    prom = [
        "prometheus",
        f"--config.file={cfg}",
        f"--storage.tsdb.path={tmp_path / 'prom-data'}",
        f"--web.listen-address=127.0.0.1:{prom_port}",
        "--enable-feature=exemplar-storage",
    ]
    with running(
        [PYTHON, "-m", "inferwatch.agent", "run", "--port", str(port)], tmp_path / "agent.log", cwd=ROOT, env=env
    ) as a:
        base = f"http://127.0.0.1:{port}"
        wait_http(f"{base}/healthz", proc=a)
        r = httpx.post(
            f"http://127.0.0.1:{spans_port}/v1/traces",
            content=req.SerializeToString(),
            headers={"Content-Type": "application/x-protobuf"},
        )
        assert r.status_code == 200
        om = httpx.get(f"{base}/metrics", headers={"Accept": "application/openmetrics-text; version=1.0.0"})
        assert om.headers["content-type"].startswith("application/openmetrics-text") and om.text.endswith("# EOF\n")
        assert '# {trace_id="' in om.text
        plain = httpx.get(f"{base}/metrics")
        assert plain.headers["content-type"].startswith("text/plain") and "trace_id" not in plain.text
        prom_url = f"http://127.0.0.1:{prom_port}"
        with running(prom, tmp_path / "prometheus.log") as p:
            wait_http(f"{prom_url}/-/ready", timeout_s=60, proc=p, ok=lambda r: r.status_code == 200)
            deadline = time.monotonic() + 120  # bounds a hang (CI's load 10-17 on 2 cores)
            got: set[str] = set()
            while not got:
                assert time.monotonic() < deadline, (tmp_path / "prometheus.log").read_text()[-2000:]
                time.sleep(1.0)
                now = time.time()
                answer = httpx.get(
                    f"{prom_url}/api/v1/query_exemplars",
                    params={
                        "query": "gen_ai_server_time_to_first_token_seconds_bucket",
                        "start": now - 300,
                        "end": now + 60,
                    },
                ).json()
                assert answer["status"] == "success", answer
                got = {e["labels"]["trace_id"] for s in answer["data"] for e in s["exemplars"]}
            assert got <= sent  # every stored exemplar is a trace id the agent's spans really had
            buckets = {s["seriesLabels"]["le"] for s in answer["data"]}
            assert len(buckets) >= 2  # several buckets carry their own recent request


def test_unnamed_spans_are_the_engines_one_model_and_the_metric_is_cached_per_sub_window() -> None:
    """vLLM v1's spans name no model: the explainer reports them under the engine collector's one model."""
    rng = random.Random(10)
    clock = [100.0]
    explainer = ex.TailExplainer(clock=lambda: clock[0])
    reqs = [timing(rng) for _ in range(950)] + [timing(rng, queue=1.5) for _ in range(50)]
    explainer.record([replace(t, model="unknown") for t in reqs])
    report = explainer.explain("llama", 60.0, engine_models=["llama"])
    assert report is not None and report["quantities"]["ttft"]["driver"] == "queue"
    assert explainer.explain("llama", 60.0) is None  # without the engine's word the name is not guessed
    first = explainer.samples(["llama"], {})
    assert {dict(s.attributes)["gen_ai.request.model"] for s in first} == {"llama"}
    clock[0] = 105.0
    explainer.record([replace(timing(rng, frontend=2.0), model="unknown") for _ in range(100)])
    assert explainer.samples(["llama"], {}) == first  # same 10 s sub-window: not recomputed
    clock[0] = 110.0
    later = {dict(s.attributes)["quantity"]: dict(s.attributes)["phase"] for s in explainer.samples(["llama"], {})}
    assert later["ttft"] == "frontend"  # the next sub-window sees the front-end delay


def test_a_lora_adapter_or_a_tenant_that_holds_the_tail_is_named() -> None:
    rng = random.Random(11)
    base = [replace(timing(rng), labels=(("lora", "base"), ("tenant", "t1"))) for _ in range(800)]
    slow = [
        replace(timing(rng, queue=0.3, prefill=0.4), labels=(("lora", "sql-adapter"), ("tenant", "t1")))
        for _ in range(60)
    ]
    fast = [replace(timing(rng), labels=(("lora", "sql-adapter"), ("tenant", "t1"))) for _ in range(140)]
    t = explained(base + slow + fast)["quantities"]["ttft"]
    assert t["driver"] == "lora" and t["attribute"] == "lora=sql-adapter"
    assert "lora=sql-adapter is 20% of requests" in t["headline"]
    assert all(s["attribute"] != "tenant" for s in t["separators"])  # one value for every request: no contrast


def test_trace_url_must_be_a_url_and_unset_prints_bare_ids() -> None:
    from inferwatch.agent.config import ReceiverSettings
    from inferwatch.agent.config.convert import convert
    from inferwatch.agent.errors import ConfigError

    assert convert({"trace_url": TRACE_URL}, ReceiverSettings).trace_url == TRACE_URL
    with pytest.raises(ConfigError, match="trace_url: String should match pattern"):
        convert({"trace_url": "localhost:6006/traces/"}, ReceiverSettings)
    rng = random.Random(9)
    explainer = ex.TailExplainer(clock=lambda: 100.0)
    explainer.record([timing(rng) for _ in range(60)])
    report = explainer.explain(MODEL, 60.0, top=2)
    assert report is not None and report["slowest"][0]["trace_url"] is None
    assert report["slowest"][0]["trace_id"] in render_text(report) and "<a href" not in render_html(report)


def _stock(t: RequestTiming) -> RequestTiming:
    """As stock vLLM sends it: no rank, no preemption count."""
    return replace(t, preemptions=None, labels=())


def test_stock_spans_name_preemption_and_a_slow_rank_from_the_engines_own_series() -> None:
    rng = random.Random(11)
    reqs = [_stock(timing(rng)) for _ in range(950)] + [_stock(timing(rng, queue=rng.uniform(1, 2))) for _ in range(50)]
    records = tailrecords.RequestRecords()
    records.add(reqs, 100.0)
    plain = ex.explain(records, MODEL, 60.0, 100.0, top=0)
    assert plain is not None and plain["quantities"]["ttft"]["driver"] == "queue"  # spans alone cannot tell
    counted = ex.explain(records, MODEL, 60.0, 100.0, top=0, signals=ex.EngineSignals(preemptions=40))
    assert counted is not None
    t = counted["quantities"]["ttft"]
    assert t["driver"] == "preemption" and t["phase"] == "queue" and "engine preemption counter" in t["headline"]
    # fewer preemptions (2 of 1,000 requests) still say the cache ran out, and a queue tail that did not arrive in a
    # burst is then the cache's (nothing waiting is admitted while it is out); so does a usage reading of 90 % or more
    for signals in (ex.EngineSignals(preemptions=2), ex.EngineSignals(preemptions=0, kv_usage_max=0.95)):
        few = ex.explain(records, MODEL, 60.0, 100.0, top=0, signals=signals)
        assert few is not None
        f = few["quantities"]["ttft"]
        assert f["driver"] == "preemption" and f["phase"] == "queue", f["headline"]
        assert "of the gap is queue while the KV cache ran out" in f["headline"], f["headline"]
    # neither: the queue tail stays the queue's
    room = ex.explain(records, MODEL, 60.0, 100.0, top=0, signals=ex.EngineSignals(preemptions=0, kv_usage_max=0.6))
    assert room is not None and room["quantities"]["ttft"]["driver"] == "queue"
    ranks = ex.EngineSignals(rank_itl_s={"0": 0.010, "1": 0.031, "2": 0.011})
    slow = ex.explain(records, MODEL, 60.0, 100.0, top=0, signals=ranks)
    assert slow is not None
    s = slow["quantities"]["ttft"]
    assert s["driver"] == "dp_rank" and s["attribute"] == "dp_rank=1" and "engine per-rank series" in s["headline"]
    # the daemon's path: the engine collector's counter readings, kept by time, give the window's increase
    clock = [40.0]
    explainer = ex.TailExplainer(records, clock=lambda: clock[0])
    explainer.observe_engine([Sample("inferwatch.engine.preemptions", 100.0, attrs({"gen_ai.request.model": MODEL}))])
    clock[0] = 100.0
    explainer.observe_engine([Sample("inferwatch.engine.preemptions", 160.0, attrs({"gen_ai.request.model": MODEL}))])
    report = explainer.explain(MODEL, 60.0, top=0)
    assert report is not None and report["quantities"]["ttft"]["driver"] == "preemption"
    # ... and its KV-cache usage readings, the highest in the window
    explainer = ex.TailExplainer(records, clock=lambda: clock[0])
    for when, usage in ((30.0, 0.97), (70.0, 0.5), (100.0, 0.93)):
        clock[0] = when
        explainer.observe_engine(
            [Sample("inferwatch.engine.kv_cache.usage", usage, attrs({"gen_ai.request.model": MODEL}))]
        )
    got = explainer.engine.signals([MODEL], 60.0, 100.0)
    assert got is not None and got.kv_usage_max == 0.93 and got.preemptions is None  # 0.97 was before the window
    report = explainer.explain(MODEL, 60.0, top=0)
    assert report is not None and report["quantities"]["ttft"]["driver"] == "preemption"


def test_a_wide_prompt_mix_is_the_workload_and_two_causes_are_both_named() -> None:
    rng = random.Random(12)

    def mixed(frontend: float = 0.004, rank: int = 0, per_token: float = 0.01) -> RequestTiming:
        prompt = min(4096, round(rng.lognormvariate(math.log(500), 0.8)))
        return timing(rng, prefill=0.01 + 0.00005 * prompt, prompt=prompt, frontend=frontend, rank=rank,
                      decode_per_token=per_token)  # fmt: skip

    wide = explained([mixed() for _ in range(1000)])["quantities"]["ttft"]
    assert wide["dominant_phase"] == "prefill" and wide["driver"] == "none"
    assert "prefill that follows prompt length" in wide["why_not"] and wide["prompt_workload"]["factor"] < 8
    # a front-end delay on 10 % of requests and a rank 3x slower per token at once: both named
    reqs = [mixed(rank=rng.randrange(2)) for _ in range(700)]
    reqs += [mixed(frontend=0.6, rank=rng.randrange(2)) for _ in range(60)]
    reqs += [timing(rng, rank=2, queue=0.3, prefill=0.09, decode_per_token=0.03) for _ in range(240)]
    both = explained(reqs)["quantities"]["ttft"]
    assert set(both["drivers"]) >= {"dp_rank", "frontend"}, both["headline"]
    assert "also" in both["headline"]
