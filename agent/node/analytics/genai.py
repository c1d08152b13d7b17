"""The GenAI semantic-convention server histograms from per-request timings (agent/catalog/genai.py).

One finished request (a :class:`RequestTiming` from a span) gives at most three measurements, in seconds:

- ``gen_ai.server.request.duration``: its ``e2e``, with ``error.type`` when it failed;
- ``gen_ai.server.time_to_first_token``: its ``ttft``, successful requests only;
- ``gen_ai.server.time_per_output_token``: (e2e − ttft) / (output tokens − 1), the conventions' definition,
  else decode / (output tokens − 1) (the span's ``itl``); successful requests with two or more output tokens only.

``gen_ai.operation.name`` and ``gen_ai.provider.name`` are the span's own when it has them, else the configured
defaults (vLLM's ``llm_request`` span has neither). Cumulative bucket counts per (model, operation, provider,
error type) are kept on the conventions' bucket edges; at most :data:`MAX_SERIES_PER_MODEL` attribute sets per
model, later ones are counted and dropped (span attributes are untrusted input).
"""

from __future__ import annotations

import bisect
import math
import time
from collections.abc import Iterator
from dataclasses import dataclass

from inferwatch.agent.catalog import genai
from inferwatch.agent.common.samples import Exemplar, HistogramSample, RequestTiming, attrs

DEFAULT_OPERATION = "chat"  # what an OpenAI-compatible server mostly serves; a span's gen_ai.operation.name wins
DEFAULT_PROVIDER = "vllm"  # the engine that sends gen_ai.latency.* spans; a span's gen_ai.provider.name wins
MAX_SERIES_PER_MODEL = 32

Measurement = tuple[str, float, tuple[tuple[str, str], ...]]  # (metric, seconds, attributes without the model)


@dataclass(frozen=True, slots=True)
class GenAIOptions:
    """Defaults for attributes a span lacks, and the TTFT edges past 10 s (``receiver.ttft_extra_buckets_s``)."""

    operation: str = DEFAULT_OPERATION
    provider: str = DEFAULT_PROVIDER
    ttft_extra_buckets_s: tuple[float, ...] = ()


def per_output_token(t: RequestTiming) -> float | None:
    """Seconds per output token after the first, or None when the request has fewer than two output tokens."""
    n, s = t.completion_tokens, t.seconds
    if n is None or n < 2:
        return s.get("itl")
    e2e, ttft = s.get("e2e"), s.get("ttft")
    if e2e is not None and ttft is not None and e2e >= ttft:
        return (e2e - ttft) / (n - 1)
    return s.get("itl")


def measurements(t: RequestTiming, options: GenAIOptions) -> list[Measurement]:
    """The semantic-convention measurements of one request (attributes sorted, the model left out)."""
    base = {genai.OPERATION: t.operation or options.operation, genai.PROVIDER: t.provider or options.provider}
    out: list[Measurement] = []
    s = t.seconds
    if "e2e" in s:
        out.append((genai.DURATION, s["e2e"], attrs(base, **{genai.ERROR_TYPE: t.error_type or ""})))
    if t.error_type is None:
        if "ttft" in s:
            out.append((genai.TTFT, s["ttft"], attrs(base)))
        tpot = per_output_token(t)
        if tpot is not None:
            out.append((genai.TPOT, tpot, attrs(base)))
    return out


class Histogram:
    """Cumulative explicit-bucket histogram (``le`` semantics: a value equal to an edge is in that bucket).

    Each bucket also keeps the last request observed in it that had a trace id (its exemplar: trace id, value,
    Unix time), so a latency panel can link a bucket to a trace.
    """

    __slots__ = ("bounds", "count", "counts", "exemplars", "total")

    def __init__(self, bounds: tuple[float, ...]) -> None:
        self.bounds = bounds
        self.counts = [0] * (len(bounds) + 1)
        self.exemplars: list[Exemplar | None] = [None] * (len(bounds) + 1)
        self.total = 0.0
        self.count = 0

    def observe(self, v: float, trace_id: str | None = None, at: float = 0.0) -> None:
        i = bisect.bisect_left(self.bounds, v)
        self.counts[i] += 1
        self.total += v
        self.count += 1
        if trace_id:
            self.exemplars[i] = (trace_id, v, at)

    def sample(self, name: str, attributes: tuple[tuple[str, str], ...]) -> HistogramSample:
        cum, buckets = 0, []
        for bound, c in zip((*self.bounds, math.inf), self.counts, strict=True):
            cum += c
            buckets.append((bound, float(cum)))
        exemplars = tuple(self.exemplars) if any(self.exemplars) else ()
        return HistogramSample(name, tuple(buckets), self.total, float(self.count), attributes, exemplars)


class ModelHistograms:
    """One model's semantic-convention histograms, by (metric, attributes); not thread-safe (the caller locks)."""

    __slots__ = ("dropped", "options", "series")

    def __init__(self, options: GenAIOptions) -> None:
        self.options = options
        self.series: dict[Measurement, Histogram] = {}  # key: (metric, 0.0, attributes)
        self.dropped = 0

    def observe(self, t: RequestTiming) -> list[Measurement]:
        """Add one request; return its measurements (for a synchronous OTLP instrument)."""
        got = measurements(t, self.options)
        now = time.time() if t.trace_id else 0.0
        for name, value, a in got:
            key = (name, 0.0, a)
            h = self.series.get(key)
            if h is None:
                if len(self.series) >= MAX_SERIES_PER_MODEL:
                    self.dropped += 1
                    continue
                h = self.series[key] = Histogram(genai.buckets(name, self.options.ttft_extra_buckets_s))
            h.observe(value, t.trace_id, now)
        return got

    def samples(self, model: str) -> Iterator[HistogramSample]:
        for (name, _, a), h in sorted(self.series.items()):
            yield h.sample(name, attrs(dict(a), **{genai.MODEL: model}))
