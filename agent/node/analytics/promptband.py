"""Span-derived TTFT and time per output token split by prompt-length band (``receiver.prompt_band_histograms``).

The conformance band (alerts/matrix.rules.yml, docs/matrix.md) compares a node with its same-type peers per
(hardware type, model, prompt band): without the split, a node fed longer prompts than its peers reads slower. The
engines' histograms are not split by prompt length; a span carries the request's prompt token count, so the agent
keeps its own cumulative histograms per (model, band):

- ``inferwatch.engine.time_to_first_token``: the span's ``ttft``;
- ``inferwatch.engine.time_per_output_token``: :func:`inferwatch.agent.node.analytics.genai.per_output_token`;

for successful requests with a prompt token count only, on the GenAI conventions' bucket edges (TTFT with
``receiver.ttft_extra_buckets_s``). The bands are the tail explainer's
(:data:`inferwatch.agent.node.analytics.tailrecords.PROMPT_BANDS`, one definition): at most four per model, so the
series are bounded by the model cap.
"""

from __future__ import annotations

from collections.abc import Iterator

from inferwatch.agent.catalog import genai as semconv
from inferwatch.agent.catalog.engine import MODEL, PROMPT_BAND
from inferwatch.agent.common.samples import HistogramSample, RequestTiming, attrs
from inferwatch.agent.node.analytics import genai
from inferwatch.agent.node.analytics.tailrecords import PROMPT_BANDS, prompt_band

TTFT = "inferwatch.engine.time_to_first_token"
TPOT = "inferwatch.engine.time_per_output_token"
BANDS = (*(prompt_band(edge) for edge in PROMPT_BANDS), prompt_band(PROMPT_BANDS[-1] + 1))


class PromptBandHistograms:
    """One model's TTFT and TPOT histograms per prompt band; not thread-safe (the caller locks)."""

    __slots__ = ("series", "ttft_extra_buckets_s")

    def __init__(self, ttft_extra_buckets_s: tuple[float, ...] = ()) -> None:
        self.ttft_extra_buckets_s = ttft_extra_buckets_s
        self.series: dict[tuple[str, str], genai.Histogram] = {}  # (metric, band)

    def observe(self, t: RequestTiming) -> None:
        if t.error_type is not None or t.prompt_tokens is None or t.prompt_tokens < 0:
            return
        band = prompt_band(t.prompt_tokens)
        ttft = t.seconds.get("ttft")
        if ttft is not None:
            self._histogram(TTFT, band).observe(ttft)
        tpot = genai.per_output_token(t)
        if tpot is not None:
            self._histogram(TPOT, band).observe(tpot)

    def _histogram(self, metric: str, band: str) -> genai.Histogram:
        h = self.series.get((metric, band))
        if h is None:  # at most 2 x len(BANDS): the band comes from a fixed list
            semconv_name = semconv.TTFT if metric == TTFT else semconv.TPOT
            h = self.series[(metric, band)] = genai.Histogram(semconv.buckets(semconv_name, self.ttft_extra_buckets_s))
        return h

    def samples(self, model: str) -> Iterator[HistogramSample]:
        for (metric, band), h in sorted(self.series.items()):
            yield h.sample(metric, attrs({MODEL: model, PROMPT_BAND: band}))
