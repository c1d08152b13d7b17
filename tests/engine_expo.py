"""A vLLM-v1-style exposition built with prometheus_client itself (as vLLM builds its own).

Same families, label names (``model_name``, ``engine``), bucket edges, ``_total``/``_created``
suffixes and formatting as vLLM's ``/metrics`` (vLLM's ``vllm/v1/metrics/loggers.py``). Used by
the engine tests, the real-Prometheus comparison and ``benchmarks/exposition_ingest.py``.
"""

from __future__ import annotations

import random

from prometheus_client import CollectorRegistry, Counter, Gauge, Histogram, generate_latest

from inferwatch.agent.catalog.engine import E2E_BUCKETS_S, ITL_BUCKETS_S, TTFT_BUCKETS_S

TOKENS_BUCKETS = (1, 2, 5, 10, 20, 50, 100, 200, 500, 1000, 2000)
ITERATION_BUCKETS = (1, 8, 16, 32, 64, 128, 256, 512, 1024, 2048, 4096, 8192, 16384)
PHASES = ("queue", "prefill", "decode", "inference")
REASONS = ("stop", "length", "abort", "error")


class VllmLike:
    """Engines × models of a vLLM v1 server; ``observe`` finishes requests, ``text`` renders /metrics."""

    def __init__(
        self,
        models: list[str],
        engines: int = 1,
        seed: int = 0,
        deprecated: bool = False,
        current: bool = True,
    ) -> None:
        self.models = models
        self.engines = [str(i) for i in range(engines)]
        self.rng = random.Random(seed)
        self.deprecated = deprecated
        self.current = current
        self.restart()

    def restart(self) -> None:
        """A new process: every counter starts again from zero."""
        r = self.registry = CollectorRegistry()
        ln = ["model_name", "engine"]
        self.running = Gauge("vllm:num_requests_running", "Running.", ln, registry=r)
        self.waiting = Gauge("vllm:num_requests_waiting", "Waiting.", ln, registry=r)
        if self.current:
            self.kv = Gauge("vllm:kv_cache_usage_perc", "KV-cache usage. 1 means 100 percent usage.", ln, registry=r)
        if self.deprecated:
            self.kv_old = Gauge("vllm:gpu_cache_usage_perc", "GPU KV-cache usage (deprecated).", ln, registry=r)
        self.preempt = Counter("vllm:num_preemptions", "Preemptions.", ln, registry=r)
        self.prompt = Counter("vllm:prompt_tokens", "Prefill tokens.", ln, registry=r)
        self.gen = Counter("vllm:generation_tokens", "Generation tokens.", ln, registry=r)
        self.success = Counter("vllm:request_success", "Finished.", [*ln, "finished_reason"], registry=r)
        self.ttft = Histogram("vllm:time_to_first_token_seconds", "TTFT.", ln, buckets=TTFT_BUCKETS_S, registry=r)
        if self.current:
            self.itl = Histogram("vllm:inter_token_latency_seconds", "ITL.", ln, buckets=ITL_BUCKETS_S, registry=r)
            self.tpot_req = Histogram(
                "vllm:request_time_per_output_token_seconds", "TPOT.", ln, buckets=ITL_BUCKETS_S, registry=r
            )
        if self.deprecated:
            self.itl_old = Histogram(
                "vllm:time_per_output_token_seconds", "TPOT (deprecated).", ln, buckets=ITL_BUCKETS_S, registry=r
            )
        self.e2e = Histogram("vllm:e2e_request_latency_seconds", "E2E.", ln, buckets=E2E_BUCKETS_S, registry=r)
        self.phase = {
            p: Histogram(f"vllm:request_{p}_time_seconds", f"{p}.", ln, buckets=E2E_BUCKETS_S, registry=r)
            for p in PHASES
        }
        self.req_prompt = Histogram("vllm:request_prompt_tokens", "Prompt.", ln, buckets=TOKENS_BUCKETS, registry=r)
        self.req_gen = Histogram("vllm:request_generation_tokens", "Gen.", ln, buckets=TOKENS_BUCKETS, registry=r)
        self.iteration = Histogram("vllm:iteration_tokens_total", "Iter.", ln, buckets=ITERATION_BUCKETS, registry=r)
        for m in self.models:
            for e in self.engines:
                self.running.labels(m, e).set(0)
                self.waiting.labels(m, e).set(0)
                for reason in REASONS:
                    self.success.labels(m, e, reason)
                for metric in (self.preempt, self.prompt, self.gen, self.ttft, self.e2e, self.req_prompt):
                    metric.labels(m, e)
                for metric in (self.req_gen, self.iteration, *self.phase.values()):
                    metric.labels(m, e)
                if self.current:
                    self.kv.labels(m, e).set(0)
                    self.itl.labels(m, e)
                    self.tpot_req.labels(m, e)
                if self.deprecated:
                    self.kv_old.labels(m, e).set(0)
                    self.itl_old.labels(m, e)

    def observe(self, requests: int, model: str | None = None, engine: str | None = None, slow: float = 1.0) -> None:
        """Finish ``requests`` requests on each (model, engine) selected (all by default)."""
        rng = self.rng
        for m in [model] if model else self.models:
            for e in [engine] if engine else self.engines:
                for _ in range(requests):
                    queue = rng.lognormvariate(-2.5, 1.0) * slow
                    prefill = rng.lognormvariate(-2.0, 0.6) * slow
                    itl = rng.lognormvariate(-3.9, 0.4) * slow
                    out_tokens = rng.randint(1, 400)
                    decode = itl * (out_tokens - 1)
                    ttft = queue + prefill + rng.uniform(0.001, 0.02)
                    self.ttft.labels(m, e).observe(ttft)
                    if self.current:
                        self.itl.labels(m, e).observe(itl)
                        self.tpot_req.labels(m, e).observe(itl)
                    if self.deprecated:
                        self.itl_old.labels(m, e).observe(itl)
                    self.e2e.labels(m, e).observe(ttft + decode)
                    for p, v in zip(PHASES, (queue, prefill, decode, prefill + decode), strict=True):
                        self.phase[p].labels(m, e).observe(v)
                    prompt = rng.randint(5, 2000)
                    self.prompt.labels(m, e).inc(prompt)
                    self.gen.labels(m, e).inc(out_tokens)
                    self.req_prompt.labels(m, e).observe(prompt)
                    self.req_gen.labels(m, e).observe(out_tokens)
                    self.iteration.labels(m, e).observe(rng.randint(1, 8192))
                    self.success.labels(m, e, rng.choice(REASONS[:2])).inc()
                self.running.labels(m, e).set(rng.randint(0, 16))
                self.waiting.labels(m, e).set(rng.randint(0, 4))
                usage = rng.random()
                if self.current:
                    self.kv.labels(m, e).set(usage)
                if self.deprecated:
                    self.kv_old.labels(m, e).set(usage)

    def text(self) -> str:
        return generate_latest(self.registry).decode()


def big_exposition(target_series: int = 20_000, seed: int = 1) -> tuple[str, VllmLike]:
    """A vLLM-style exposition with about ``target_series`` sample lines (2 engines per model)."""
    per_pair = len([ln for ln in VllmLike(["m"], 1).text().splitlines() if ln and not ln.startswith("#")])
    pairs = max(1, round(target_series / per_pair))
    models = [f"org/model-{i:03d}" for i in range((pairs + 1) // 2)]
    gen = VllmLike(models, engines=2, seed=seed)
    gen.observe(3)
    return gen.text(), gen
