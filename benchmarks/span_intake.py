"""Span intake throughput: decode + per-request extraction + sketch insert, in-process and over both transports.

Payload: OTLP export requests of ``--batch`` vLLM-style ``llm_request`` spans (the attributes vLLM v1's
``do_tracing`` sets: 6 latencies, tokens, sampling parameters, ids), as the SDK's BatchSpanProcessor
sends them (default max batch 512).

Stages, each side by side with the previous one as its baseline, all in the same run:

1. ``decode``: ``ExportTraceServiceRequest.ParseFromString`` only (the protobuf floor);
2. ``decode+extract``: plus turning spans into per-request timings;
3. ``decode+extract+sketch``: plus the windowed DDSketch inserts (what the receiver does per request);
4. ``http`` and ``grpc``: end to end through the real receiver in a child process pinned to one CPU,
   the sender in this process. Reported as spans per wall second and spans per CPU second of the
   receiver process (the "one core" figure: the receiver's own cost, whatever the sender's).

Run: ``.venv/bin/python benchmarks/span_intake.py [--batch 512] [--seconds 5]``.
"""

from __future__ import annotations

import argparse
import json
import os
import socket
import subprocess
import sys
import threading
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

from opentelemetry.proto.collector.trace.v1.trace_service_pb2 import ExportTraceServiceRequest  # noqa: E402
from opentelemetry.proto.common.v1.common_pb2 import AnyValue, KeyValue  # noqa: E402
from opentelemetry.proto.resource.v1.resource_pb2 import Resource  # noqa: E402
from opentelemetry.proto.trace.v1.trace_pb2 import ResourceSpans, ScopeSpans, Span  # noqa: E402

from inferwatch.agent.node.analytics.latency import LatencyAnalytics  # noqa: E402
from inferwatch.agent.node.receiver.intake import SpanIntake  # noqa: E402
from inferwatch.agent.node.receiver.spans import decode, extract  # noqa: E402


def payload(batch: int, seed: int = 1) -> bytes:
    import random

    rng = random.Random(seed)
    spans = []
    for i in range(batch):
        ttft = rng.lognormvariate(-1.0, 0.3)
        queue, prefill, decode_s = ttft * 0.1, ttft * 0.7, rng.uniform(0.5, 5.0)

        def d(k: str, v: float) -> KeyValue:
            return KeyValue(key=k, value=AnyValue(double_value=v))

        def n(k: str, v: int) -> KeyValue:
            return KeyValue(key=k, value=AnyValue(int_value=v))

        attrs = [
            KeyValue(key="gen_ai.response.model", value=AnyValue(string_value="Qwen/Qwen3-8B")),
            KeyValue(key="gen_ai.request.id", value=AnyValue(string_value=f"cmpl-{seed}-{i:08x}")),
            d("gen_ai.request.temperature", 0.7),
            d("gen_ai.request.top_p", 0.95),
            n("gen_ai.request.max_tokens", 512),
            n("gen_ai.request.n", 1),
            n("gen_ai.usage.prompt_tokens", rng.randint(50, 4000)),
            n("gen_ai.usage.completion_tokens", rng.randint(10, 500)),
            d("gen_ai.latency.time_in_queue", queue),
            d("gen_ai.latency.time_to_first_token", ttft),
            d("gen_ai.latency.e2e", ttft + decode_s),
            d("gen_ai.latency.time_in_model_prefill", prefill),
            d("gen_ai.latency.time_in_model_decode", decode_s),
            d("gen_ai.latency.time_in_model_inference", prefill + decode_s),
        ]
        start = 1_700_000_000_000_000_000 + i * 1_000_000
        spans.append(
            Span(
                trace_id=rng.randbytes(16),
                span_id=rng.randbytes(8),
                name="llm_request",
                kind=Span.SPAN_KIND_SERVER,
                start_time_unix_nano=start,
                end_time_unix_nano=start + int((ttft + decode_s) * 1e9),
                attributes=attrs,
            )
        )
    resource = Resource(attributes=[KeyValue(key="service.name", value=AnyValue(string_value="vllm"))])
    req = ExportTraceServiceRequest(
        resource_spans=[ResourceSpans(resource=resource, scope_spans=[ScopeSpans(spans=spans)])]
    )
    return req.SerializeToString()


def timed(fn, seconds: float) -> tuple[int, float]:
    """Call ``fn`` repeatedly for about ``seconds``; return (calls, CPU seconds of this thread)."""
    calls = 0
    t0 = time.thread_time()
    end = time.monotonic() + seconds
    while time.monotonic() < end:
        fn()
        calls += 1
    return calls, time.thread_time() - t0


def in_process(body: bytes, batch: int, seconds: float) -> dict[str, float]:
    intake = SpanIntake(LatencyAnalytics())
    stages = {
        "decode": lambda: decode(body),
        "decode+extract": lambda: extract(decode(body)),
        "decode+extract+sketch": lambda: intake.handle(body, "http"),
    }
    out = {}
    for name, fn in stages.items():
        calls, cpu = timed(fn, seconds)
        out[name] = calls * batch / cpu
    return out


def serve() -> None:
    """Child: run the receiver on free ports, print them, serve until stdin closes."""
    from inferwatch.agent.config import ReceiverSettings
    from inferwatch.agent.node.receiver import Receiver

    r = Receiver(
        ReceiverSettings(
            enabled=True, grpc_endpoint="127.0.0.1:0", http_endpoint="127.0.0.1:0", max_message_bytes=64 << 20
        ),
        LatencyAnalytics(),
    )
    r.start()
    print(json.dumps({"grpc": r.grpc_port, "http": r.http_port}), flush=True)
    sys.stdin.read()
    r.stop()


def over_transport(body: bytes, batch: int, seconds: float, senders: int) -> dict[str, dict[str, float]]:
    import grpc
    import httpx
    import psutil

    from inferwatch.agent.node.receiver.forward import GRPC_METHOD

    child = subprocess.Popen(
        [sys.executable, __file__, "--serve"], stdin=subprocess.PIPE, stdout=subprocess.PIPE, cwd=ROOT
    )
    try:
        assert child.stdout is not None
        ports = json.loads(child.stdout.readline())
        proc = psutil.Process(child.pid)
        try:
            proc.cpu_affinity([0])  # the receiver gets one core; senders run on the others
            os.sched_setaffinity(0, set(range(1, os.cpu_count() or 2)) or {0})
        except (AttributeError, OSError, psutil.Error):
            pass
        results: dict[str, dict[str, float]] = {}

        def http_sender(stop: float, counts: list[int]) -> None:
            # TCP_NODELAY as the OTel SDK's requests-based exporter effectively gets from urllib3; without it
            # httpx's separate header and body writes meet delayed ACKs (~40 ms per request).
            nodelay = httpx.HTTPTransport(socket_options=[(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)])
            with httpx.Client(timeout=30, transport=nodelay) as client:
                while time.monotonic() < stop:
                    r = client.post(
                        f"http://127.0.0.1:{ports['http']}/v1/traces",
                        content=body,
                        headers={"Content-Type": "application/x-protobuf"},
                    )
                    assert r.status_code == 200, r.status_code
                    counts[0] += 1

        def grpc_sender(stop: float, counts: list[int]) -> None:
            with grpc.insecure_channel(
                f"127.0.0.1:{ports['grpc']}", options=[("grpc.max_send_message_length", 64 << 20)]
            ) as ch:
                call = ch.unary_unary(GRPC_METHOD)
                while time.monotonic() < stop:
                    call(body, timeout=30)
                    counts[0] += 1

        for name, sender in (("http", http_sender), ("grpc", grpc_sender)):
            counts = [[0] for _ in range(senders)]
            cpu0 = sum(proc.cpu_times()[:2])
            t0 = time.monotonic()
            stop = t0 + seconds
            threads = [threading.Thread(target=sender, args=(stop, c)) for c in counts]
            for t in threads:
                t.start()
            for t in threads:
                t.join()
            wall = time.monotonic() - t0
            cpu = sum(proc.cpu_times()[:2]) - cpu0
            spans = sum(c[0] for c in counts) * batch
            results[name] = {
                "spans_per_wall_s": spans / wall,
                "spans_per_cpu_s": spans / cpu,
                "receiver_cpu_share": cpu / wall,
            }
        return results
    finally:
        if child.stdin:
            child.stdin.close()
        child.wait(30)


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--batch", type=int, default=512)
    ap.add_argument("--seconds", type=float, default=5.0)
    ap.add_argument("--senders", type=int, default=2)
    ap.add_argument("--serve", action="store_true", help=argparse.SUPPRESS)
    args = ap.parse_args()
    if args.serve:
        serve()
        return
    body = payload(args.batch)
    print(f"payload: {args.batch} llm_request spans, {len(body)} bytes ({len(body) / args.batch:.0f} B/span)")
    stages = in_process(body, args.batch, args.seconds)
    base = stages["decode"]
    print(f"\n{'in-process stage (one thread)':34s} {'spans/CPU-s':>12s} {'vs decode':>10s}")
    for name, rate in stages.items():
        print(f"{name:34s} {rate:12,.0f} {rate / base:10.2f}")
    transports = over_transport(body, args.batch, args.seconds, args.senders)
    print(f"\n{'end to end (receiver on 1 CPU)':34s} {'spans/CPU-s':>12s} {'spans/wall-s':>12s} {'rcv CPU':>8s}")
    for name, r in transports.items():
        print(f"{name:34s} {r['spans_per_cpu_s']:12,.0f} {r['spans_per_wall_s']:12,.0f} {r['receiver_cpu_share']:8.2f}")


if __name__ == "__main__":
    main()
