"""Open-loop load generator: Poisson arrivals, length distributions, streaming client-side timing.

Requests are launched at exponential inter-arrival times (a Poisson process at ``rate`` per second)
whether or not earlier ones finished — an open loop, so a slow server shows up as growing latency
instead of a politely lower request rate. Each request streams and the client measures time to the
first non-empty token (TTFT), the gaps between tokens (ITL) and the total time (e2e). Always bounded:
by ``count`` requests or ``duration_s`` seconds, whichever comes first, and by ``max_in_flight``
(arrivals beyond it are counted as ``dropped``, never queued).

With ``otlp_traces_endpoint`` each request is also reported as an OTLP client span with the TTFT measured here
(``gen_ai.response.time_to_first_chunk``) and its context sent as ``traceparent``, so the engine's span is its
child (:mod:`inferwatch.agent.clienttrace`): the agent's explainer sets the client's TTFT beside the engine's.
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import math
import random
import time
from collections import Counter
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

import httpx

from inferwatch.simulator.text import VOCABULARY

PROTOCOLS = ("chat", "completions", "messages")
PATHS = {"chat": "/v1/chat/completions", "completions": "/v1/completions", "messages": "/v1/messages"}
DEFAULT_TIMEOUT_S = 60.0
DEFAULT_MAX_IN_FLIGHT = 2000
LOOP_LAG_TICK_S = 0.02  # the client loop-lag sampler's sleep
MAX_LOOP_LAG_SAMPLES = 100_000  # ~33 min of samples; memory stays bounded on a long run


@dataclass(frozen=True, slots=True)
class Dist:
    """A token-count distribution: ``N`` / ``const:N``, ``uniform:LO:HI``, ``normal:MEAN:SD``,
    ``lognormal:MEDIAN:SIGMA``; samples are clamped to [1, 1_000_000]."""

    kind: str
    a: float
    b: float = 0.0

    @classmethod
    def parse(cls, spec: str) -> Dist:
        parts = spec.strip().split(":")
        try:
            if len(parts) == 1:
                return cls("const", float(parts[0]))
            kind, nums = parts[0], [float(p) for p in parts[1:]]
        except ValueError:
            raise ValueError(f"bad distribution {spec!r}: numbers expected") from None
        arity = {"const": 1, "uniform": 2, "normal": 2, "lognormal": 2}
        if kind not in arity or len(nums) != arity[kind]:
            raise ValueError(
                f"bad distribution {spec!r}: use N, const:N, uniform:LO:HI, normal:MEAN:SD, lognormal:MEDIAN:SIGMA"
            )
        if any(n < 0 for n in nums) or (kind == "uniform" and nums[0] > nums[1]):
            raise ValueError(f"bad distribution {spec!r}: parameters must be >= 0 (and LO <= HI)")
        return cls(kind, nums[0], nums[1] if len(nums) > 1 else 0.0)

    def sample(self, rng: random.Random) -> int:
        if self.kind == "const":
            v = self.a
        elif self.kind == "uniform":
            v = rng.uniform(self.a, self.b)
        elif self.kind == "normal":
            v = rng.gauss(self.a, self.b)
        else:
            v = rng.lognormvariate(math.log(max(self.a, 1e-9)), self.b)
        return int(min(max(round(v), 1), 1_000_000))


@dataclass(frozen=True, slots=True)
class LoadSpec:
    url: str
    model: str | None = None
    protocol: str = "chat"
    rate: float = 10.0
    count: int | None = 100
    duration_s: float | None = None
    prompt_tokens: Dist = Dist("const", 128)
    output_tokens: Dist = Dist("const", 32)
    shared_prefix_tokens: int = 0
    seed: int = 0
    timeout_s: float = DEFAULT_TIMEOUT_S
    max_in_flight: int = DEFAULT_MAX_IN_FLIGHT
    ignore_eos: bool = True
    api_key: str = "inferwatch"
    otlp_traces_endpoint: str | None = None

    def __post_init__(self) -> None:
        if self.protocol not in PROTOCOLS:
            raise ValueError(f"protocol must be one of {', '.join(PROTOCOLS)}")
        if self.rate <= 0:
            raise ValueError("rate must be > 0 requests/s")
        if self.count is None and self.duration_s is None:
            raise ValueError("bound the run with a request count or a duration")
        if self.count is not None and self.count < 1:
            raise ValueError("count must be >= 1")
        if self.duration_s is not None and self.duration_s <= 0:
            raise ValueError("duration must be > 0")


@dataclass(slots=True)
class Result:
    ok: bool
    error: str | None = None
    ttft_s: float | None = None
    e2e_s: float = 0.0
    output_tokens: int = 0
    itls: list[float] = field(default_factory=list)


def _words(rng: random.Random, n: int) -> str:
    return " ".join(rng.choice(VOCABULARY) for _ in range(n))


def build_body(spec: LoadSpec, rng: random.Random, prefix: str) -> dict[str, Any]:
    n_prompt = spec.prompt_tokens.sample(rng)
    n_out = spec.output_tokens.sample(rng)
    user = _words(rng, n_prompt)
    body: dict[str, Any] = {"max_tokens": n_out, "stream": True}
    if spec.model:
        body["model"] = spec.model
    if spec.protocol == "completions":
        body["prompt"] = f"{prefix} {user}" if prefix else user
    elif spec.protocol == "chat":
        body["messages"] = ([{"role": "system", "content": prefix}] if prefix else []) + [
            {"role": "user", "content": user}
        ]
        body["stream_options"] = {"include_usage": True}
    else:
        body["messages"] = [{"role": "user", "content": user}]
        if prefix:
            body["system"] = prefix
    if spec.ignore_eos and spec.protocol != "messages":
        body["ignore_eos"] = True
    return body


def _token_text(protocol: str, data: dict[str, Any]) -> str:
    if protocol == "messages":
        if data.get("type") == "content_block_delta":
            return str(data.get("delta", {}).get("text") or "")
        return ""
    choices = data.get("choices") or []
    if not choices:
        return ""
    c = choices[0]
    return str((c.get("delta") or {}).get("content") or "") if protocol == "chat" else str(c.get("text") or "")


def _error_type(resp: httpx.Response, body: bytes) -> str:
    kind = ""
    try:
        data = json.loads(body)
        err = data.get("error") if isinstance(data, dict) else None
        if isinstance(err, dict):
            kind = str(err.get("type") or "")
    except ValueError:
        pass
    return f"http_{resp.status_code}" + (f":{kind}" if kind else "")


async def one_request(client: httpx.AsyncClient, spec: LoadSpec, body: dict[str, Any], spans: Any = None) -> Result:
    """One streamed request; with ``spans`` (an :class:`~inferwatch.agent.clienttrace.ClientSpans`) also its client
    span."""
    span = None
    if spans is not None:
        operation = "text_completion" if spec.protocol == "completions" else "chat"
        span = spans.start(operation, body.get("model"), f"{spec.url}{PATHS[spec.protocol]}")
    start = time.perf_counter()
    result = Result(ok=False)
    last: float | None = None
    try:
        async with client.stream("POST", PATHS[spec.protocol], json=body, headers=span and span.headers) as resp:
            if resp.status_code != 200:
                result.error = _error_type(resp, await resp.aread())
                return result
            async for line in resp.aiter_lines():
                if not line.startswith("data:"):
                    continue
                payload = line[5:].strip()
                if payload == "[DONE]":
                    break
                text = _token_text(spec.protocol, json.loads(payload))
                if not text:
                    continue
                now = time.perf_counter()
                if last is None:
                    result.ttft_s = now - start
                else:
                    result.itls.append(now - last)
                last = now
                result.output_tokens += 1
        result.ok = result.output_tokens > 0
        if not result.ok:
            result.error = "empty_stream"
    except httpx.TimeoutException:
        result.error = "timeout"
    except httpx.TransportError as exc:
        result.error = f"transport:{type(exc).__name__}"
    except ValueError:
        result.error = "malformed_chunk"
    finally:
        result.e2e_s = time.perf_counter() - start
        if span is not None:
            if result.ttft_s is not None:
                span.first_token(result.ttft_s)
            span.end(result.error)
    return result


def percentile(sorted_values: list[float], q: float) -> float | None:
    """Nearest-rank percentile of an ascending list (None when empty)."""
    if not sorted_values:
        return None
    k = max(0, min(len(sorted_values) - 1, math.ceil(q / 100 * len(sorted_values)) - 1))
    return sorted_values[k]


@dataclass
class Progress:
    started: int = 0
    finished: int = 0
    errors: int = 0
    dropped: int = 0
    in_flight: int = 0
    elapsed_s: float = 0.0
    # how late the client's own event loop woke (a 20 ms sleep's overshoot), sampled through the run: a client
    # short of CPU adds this to every TTFT it measures, which the engine's own TTFT does not see
    loop_lag_s: list[float] = field(default_factory=list)


def summarize(spec: LoadSpec, results: list[Result], progress: Progress) -> dict[str, Any]:
    ok = [r for r in results if r.ok]
    errors = Counter(r.error or "unknown" for r in results if not r.ok)
    if progress.dropped:
        errors["dropped_max_in_flight"] = progress.dropped

    def stats(values: list[float]) -> dict[str, float | None]:
        v = sorted(values)
        mean = sum(v) / len(v) if v else None
        return {"mean": mean, "p50": percentile(v, 50), "p95": percentile(v, 95), "p99": percentile(v, 99)}

    elapsed = progress.elapsed_s or 1e-9
    return {
        "url": spec.url,
        "protocol": spec.protocol,
        "target_rate_per_s": spec.rate,
        "requests": len(results) + progress.dropped,
        "ok": len(ok),
        "errors": sum(errors.values()),
        "error_types": dict(errors),
        "duration_s": elapsed,
        "achieved_rate_per_s": len(results) / elapsed,
        "output_tokens_per_s": sum(r.output_tokens for r in ok) / elapsed,
        "ttft_s": stats([r.ttft_s for r in ok if r.ttft_s is not None]),
        "itl_s": stats([x for r in ok for x in r.itls]),
        "e2e_s": stats([r.e2e_s for r in ok]),
        "client_loop_lag_s": stats(progress.loop_lag_s),
    }


async def run_load(
    spec: LoadSpec, on_progress: Callable[[Progress], None] | None = None, stop: asyncio.Event | None = None
) -> dict[str, Any]:
    """:func:`_run_load`, with the client spans' exporter around it when ``spec.otlp_traces_endpoint`` is set."""
    spans = None
    if spec.otlp_traces_endpoint:
        from inferwatch.agent.clienttrace import ClientSpans

        spans = ClientSpans(spec.otlp_traces_endpoint, service_name="inferwatch-loadgen", provider_name="vllm")
    try:
        return await _run_load(spec, on_progress, stop, spans)
    finally:
        if spans is not None:
            await asyncio.to_thread(spans.shutdown)


async def _run_load(
    spec: LoadSpec,
    on_progress: Callable[[Progress], None] | None = None,
    stop: asyncio.Event | None = None,
    spans: Any = None,
) -> dict[str, Any]:
    """Run the load described by ``spec`` and return the summary (see :func:`summarize`).

    Setting ``stop`` (SIGINT/SIGTERM in the CLI) ends the run early: no new arrivals, in-flight
    requests are cancelled and counted as ``cancelled``, and the summary covers what was done.
    """
    stop = stop or asyncio.Event()
    rng = random.Random(spec.seed)
    prefix = _words(random.Random(spec.seed ^ 0xABC), spec.shared_prefix_tokens) if spec.shared_prefix_tokens else ""
    progress = Progress()
    results: list[Result] = []
    tasks: set[asyncio.Task[None]] = set()
    limits = httpx.Limits(max_connections=spec.max_in_flight, max_keepalive_connections=spec.max_in_flight)
    headers = {"Authorization": f"Bearer {spec.api_key}", "x-api-key": spec.api_key, "anthropic-version": "2023-06-01"}
    timeout = httpx.Timeout(spec.timeout_s, connect=min(10.0, spec.timeout_s))
    async with httpx.AsyncClient(base_url=spec.url, limits=limits, timeout=timeout, headers=headers) as client:

        async def launch(body: dict[str, Any]) -> None:
            progress.in_flight += 1
            try:
                res = await one_request(client, spec, body, spans)
            except asyncio.CancelledError:
                res = Result(ok=False, error="cancelled")
            finally:
                progress.in_flight -= 1
            results.append(res)
            progress.finished += 1
            progress.errors += not res.ok

        async def sample_loop_lag() -> None:
            while True:
                asked = time.perf_counter()
                await asyncio.sleep(LOOP_LAG_TICK_S)
                if len(progress.loop_lag_s) < MAX_LOOP_LAG_SAMPLES:
                    progress.loop_lag_s.append(max(0.0, time.perf_counter() - asked - LOOP_LAG_TICK_S))

        lag_sampler = asyncio.create_task(sample_loop_lag())
        start = time.perf_counter()
        next_at = start
        deadline = start + spec.duration_s if spec.duration_s else math.inf
        last_report = 0.0
        while spec.count is None or progress.started + progress.dropped < spec.count:
            next_at += rng.expovariate(spec.rate)
            if next_at >= deadline:
                break
            delay = next_at - time.perf_counter()
            if delay > 0:
                with contextlib.suppress(TimeoutError):
                    await asyncio.wait_for(stop.wait(), delay)
            if stop.is_set():
                break
            body = build_body(spec, rng, prefix)
            if progress.in_flight >= spec.max_in_flight:
                progress.dropped += 1
            else:
                progress.started += 1
                task = asyncio.create_task(launch(body))
                tasks.add(task)
                task.add_done_callback(tasks.discard)
            now = time.perf_counter()
            progress.elapsed_s = now - start
            if on_progress is not None and now - last_report > 0.25:
                last_report = now
                on_progress(progress)
        while tasks:
            if stop.is_set():
                for task in tasks:
                    task.cancel()
                await asyncio.gather(*tasks, return_exceptions=True)
                break
            await asyncio.wait(set(tasks), timeout=0.25)
            progress.elapsed_s = time.perf_counter() - start
            if on_progress is not None:
                on_progress(progress)
        progress.elapsed_s = time.perf_counter() - start
        lag_sampler.cancel()
        with contextlib.suppress(asyncio.CancelledError):
            await lag_sampler
    return summarize(spec, results, progress)


def load_failed(summary: dict[str, Any], max_error_ratio: float | None = None) -> str:
    """Why a run counts as failed ("" when it does not): every request failed, so nothing was measured, or the
    share of failed requests (dropped ones included) is above ``max_error_ratio``. A run that sent nothing did not
    fail."""
    requests, errors = int(summary["requests"]), int(summary["errors"])
    if not requests:
        return ""
    kinds = ", ".join(f"{k} {v}" for k, v in sorted(summary["error_types"].items()))
    if summary["ok"] == 0:
        return f"every request failed ({requests}: {kinds})"
    if max_error_ratio is not None and errors / requests > max_error_ratio:
        return f"{errors} of {requests} requests failed, above --max-error-ratio {max_error_ratio:g} ({kinds})"
    return ""


def summary_table(summary: dict[str, Any]) -> Any:
    """A rich Table of the summary (count, errors, P50/P95/P99 of TTFT, ITL, e2e)."""
    from rich.table import Table

    table = Table(title=f"inferwatch loadgen — {summary['protocol']} at {summary['target_rate_per_s']:g} req/s")
    table.add_column("metric")
    for col in ("mean", "p50", "p95", "p99"):
        table.add_column(col, justify="right")
    for key, label in (("ttft_s", "TTFT"), ("itl_s", "ITL"), ("e2e_s", "e2e")):
        s = summary[key]
        table.add_row(
            label + " (ms)", *("-" if s[c] is None else f"{s[c] * 1000:.1f}" for c in ("mean", "p50", "p95", "p99"))
        )
    return table


def summary_line(summary: dict[str, Any]) -> str:
    errors = f" {summary['error_types']}" if summary["error_types"] else ""
    return (
        f"requests {summary['requests']}  ok {summary['ok']}  errors {summary['errors']}{errors}  "
        f"achieved {summary['achieved_rate_per_s']:.1f} req/s  {summary['output_tokens_per_s']:.0f} tok/s  "
        f"in {summary['duration_s']:.1f} s"
    )
