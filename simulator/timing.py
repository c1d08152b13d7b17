"""The timing model: how long an engine step, the frontend and a slow path take.

Pure functions of the deployment, the active scenarios and a seeded ``random.Random``: the same
sequence of calls with the same seed gives the same durations (``--seed``).

* Engine step (one forward pass of the continuous batch, as vLLM's ``EngineCore.step``):
  ``overhead + max(compute, memory)`` where ``compute = 2·params·(prefill_tokens + decode_seqs) /
  (peak_flops·eff·tp)`` and ``memory = (weights/tp + kv_bytes_per_token·context_tokens/tp) /
  (bandwidth·eff)``. Prefill time therefore grows with prompt tokens, and inter-token latency grows
  with the running batch (more sequences, more KV bytes read per step). Multiplied by lognormal
  noise of mean 1 and by ``simd_fallback``'s factor.
* Frontend: API server + tokenisation before the engine queues the request (part of TTFT, not of
  the engine's queue/prefill phases, exactly as in vLLM).
* Output length: the request's ``max_tokens`` when ``ignore_eos``, else a lognormal "natural" length
  (median 180 tokens) capped by ``max_tokens`` — finish reason ``stop`` or ``length``.
"""

from __future__ import annotations

import math
import random

from inferwatch.simulator.profiles import Deployment
from inferwatch.simulator.scenarios import ScenarioSet

TP_EFFICIENCY = 0.85  # all-reduce cost per extra tensor-parallel rank
NATURAL_LENGTH_MEDIAN_TOKENS = 180.0
NATURAL_LENGTH_SIGMA = 0.8
FRONTEND_PER_PROMPT_TOKEN_S = 1e-6  # tokenisation
SLOW_PATH_SIGMA = 0.08


def _lognormal_mean_one(rng: random.Random, sigma: float) -> float:
    return rng.lognormvariate(-sigma * sigma / 2, sigma) if sigma > 0 else 1.0


class TimingModel:
    def __init__(
        self, deployment: Deployment, scenarios: ScenarioSet, rng: random.Random, engine_index: int = 0
    ) -> None:
        self.dep = deployment
        self.scenarios = scenarios
        self.rng = rng
        self.engine_index = engine_index
        hw = deployment.hardware
        tp = deployment.tensor_parallel_size
        tp_speedup = tp * (TP_EFFICIENCY ** (tp - 1))
        self._flops_per_token_s = 2 * deployment.size.params / (hw.peak_flops * hw.compute_efficiency * tp_speedup)
        bandwidth = hw.mem_bandwidth_bytes_s * hw.bandwidth_efficiency * tp_speedup
        self._weights_s = deployment.weight_bytes / bandwidth
        self._kv_s_per_token = deployment.size.kv_bytes_per_token() / bandwidth
        self.last_frontend_extra = 0.0  # frontend_delay's part of the last frontend_seconds() (ground truth only)

    def step_seconds(self, prefill_tokens: int, decode_seqs: int, context_tokens: int) -> float:
        """Duration of one engine step; deterministic given the RNG state."""
        hw = self.dep.hardware
        compute = self._flops_per_token_s * (prefill_tokens + decode_seqs)
        memory = self._weights_s + self._kv_s_per_token * context_tokens
        base = (hw.step_overhead_s + max(compute, memory)) * _lognormal_mean_one(self.rng, hw.noise_sigma)
        simd = self.scenarios.get("simd_fallback")
        if simd:
            base *= simd.get("factor")
        slow = self.scenarios.get("slow_rank")
        if slow and int(slow.get("engine")) == self.engine_index:
            base *= slow.get("factor")
        return base

    def frontend_seconds(self, prompt_tokens: int) -> float:
        hw = self.dep.hardware
        mean = hw.frontend_overhead_s + FRONTEND_PER_PROMPT_TOKEN_S * prompt_tokens
        seconds = mean * _lognormal_mean_one(self.rng, hw.noise_sigma)
        delay = self.scenarios.get("frontend_delay")
        self.last_frontend_extra = 0.0
        if delay is not None and self.rng.random() < delay.get("fraction"):
            self.last_frontend_extra = delay.get("extra_s") * _lognormal_mean_one(self.rng, SLOW_PATH_SIGMA)
            seconds += self.last_frontend_extra
        return seconds

    def slow_path_seconds(self) -> float:
        """Extra stall before prefill when ``page_cache_pressure`` picks this request, else 0."""
        sc = self.scenarios.get("page_cache_pressure")
        if sc is None or self.rng.random() >= sc.get("fraction"):
            return 0.0
        return sc.get("extra_s") * _lognormal_mean_one(self.rng, SLOW_PATH_SIGMA)

    def output_tokens(self, max_tokens: int, ignore_eos: bool) -> int:
        if ignore_eos:
            return max_tokens
        natural = self.rng.lognormvariate(math.log(NATURAL_LENGTH_MEDIAN_TOKENS), NATURAL_LENGTH_SIGMA)
        return max(1, min(max_tokens, round(natural)))
