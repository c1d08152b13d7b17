"""Engine collector: the inference engine's own Prometheus ``/metrics`` (``engine.metrics_url``).

Reads vLLM v1, SGLang, TGI, llama.cpp server or TensorRT-LLM (detected from the exposition, or
``engine.kind``), maps their families to canonical per-model quantities (see docs/engine.md) and
emits, per model (``gen_ai.request.model``):

- ``inferwatch.engine.latency{quantity,window,source="histogram",quantile}`` (seconds), ``.samples``,
  ``.tail_ratio`` over 1 m and 5 m windows from bucket increments (reset-aware, summed over ranks);
- ``inferwatch.engine.frontend_gap`` = mean TTFT − (mean queue + mean prefill) over each window;
- ``inferwatch.engine.token_time{phase}`` for llama.cpp (seconds per token from its counters);
- requests running / waiting, KV-cache usage (0..1), tokens, preemptions, finished requests by reason;
- the engine's TTFT / inter-token / end-to-end histograms re-exported as ``gen_ai.server.*``
  (cumulative, summed over data-parallel ranks, with the engine's own bucket edges).

``inferwatch.engine.up`` and ``inferwatch.engine.scrape.errors{reason}`` come from
:meth:`EngineCollector.status_samples` (attached to the agent state), so they are exported even
while the collector is failing. Every failure raises :class:`~agent.engine.fetch.EngineScrapeError`
with its reason; the runner counts it and the agent keeps serving. A run the runner gives up on (past
``collectors.engine.timeout_s``, e.g. a parse that slow: the fetch deadline ``engine.timeout_s`` counts the
server's time only) or finds still running is reported the same way (:meth:`EngineCollector.run_failed`).

The histogram-derived stats are kept in the collector's own :class:`~agent.engine.board.LatencyBoard`
(``EngineCollector.board``, for inspection). The span analytics learn what they need from this
collector's collection in the state (``details["models"]`` and its ``frontend_gap`` series), not
from a shared object.
"""

from __future__ import annotations

import logging
import threading
import time
from typing import ClassVar

import httpx

from agent.catalog.engine import MODEL
from agent.collectors.base import BaseCollector, CollectContext, Collection
from agent.engine.adapters import DEFAULT_MODEL, QUANTITIES, EngineReading, ModelReading
from agent.engine.board import Key, LatencyBoard, LatencyStats, latency_samples
from agent.engine.fetch import REASONS, EngineScrapeError, fetch_into
from agent.engine.hang import HangDetector, RankVerdict
from agent.engine.histogram import sum_histograms
from agent.engine.limits import LIMITS, EngineLimits
from agent.engine.scrape import EngineParser, stats_from_histogram
from agent.engine.windows import WINDOWS_S, CounterWindow, HistogramWindow
from agent.errors import NoDataError
from agent.samples import AnySample, Finding, HistogramSample, Sample, attrs

log = logging.getLogger(__name__)

REEXPORTED = {
    "ttft": "gen_ai.server.time_to_first_token",
    "itl": "gen_ai.server.time_per_output_token",
    "e2e": "gen_ai.server.request.duration",
}
HANG_FINDING = "engine_hung"
HANG_RUNBOOK = "EngineHungButHealthy"
HEALTH_TIMEOUT_S = 1.0  # the /health probe runs only while a rank is stalled
TOKEN_TIME = {"prefill": ("prompt_seconds", "prompt_tokens"), "decode": ("generation_seconds", "generation_tokens")}


class EngineTimeline:
    """Per-model sliding windows over successive readings; turns them into samples and latency stats."""

    def __init__(self) -> None:
        self._hist: dict[tuple[str, str], HistogramWindow] = {}
        self._counters: dict[str, CounterWindow] = {}

    def update(self, t: float, reading: EngineReading) -> None:
        live: set[tuple[str, str]] = set()
        for model, m in reading.models.items():
            for quantity, series in m.histograms.items():
                key = (model, quantity)
                live.add(key)
                self._hist.setdefault(key, HistogramWindow()).update(t, series)
            flat = {name: sum(dims.values()) for name, dims in m.counters.items()}
            self._counters.setdefault(model, CounterWindow()).update(t, flat)
        for key in set(self._hist) - live:  # the model or family is gone (restart with other flags)
            del self._hist[key]
        for model in set(self._counters) - set(reading.models):
            del self._counters[model]

    def stats(self) -> dict[Key, LatencyStats]:
        out: dict[Key, LatencyStats] = {}
        for (model, quantity), window in self._hist.items():
            for wname, seconds in WINDOWS_S.items():
                stats = stats_from_histogram(window.window(seconds))
                if stats is not None:
                    out[(model, quantity, wname)] = stats
        return out

    def derived_samples(self, stats: dict[Key, LatencyStats]) -> list[Sample]:
        out: list[Sample] = []
        for (model, quantity, wname), s in sorted(stats.items()):
            out.extend(latency_samples(model, quantity, wname, s))
        models = {k[0] for k in self._hist} | set(self._counters)
        for model in sorted(models):
            for wname, seconds in WINDOWS_S.items():
                gap = frontend_gap(stats, model, wname)
                if gap is not None:
                    out.append(Sample("inferwatch.engine.frontend_gap", gap, attrs({MODEL: model}, window=wname)))
                counters = self._counters.get(model)
                if counters is None:
                    continue
                for phase, (secs, toks) in TOKEN_TIME.items():
                    d_secs = counters.increase(secs, seconds)
                    d_toks = counters.increase(toks, seconds)
                    if d_secs is not None and d_toks:
                        out.append(
                            Sample(
                                "inferwatch.engine.token_time",
                                d_secs / d_toks,
                                attrs({MODEL: model}, phase=phase, window=wname),
                            )
                        )
        return out


def frontend_gap(stats: dict[Key, LatencyStats], model: str, window: str) -> float | None:
    """Mean TTFT − (mean queue + mean prefill): API server, tokenisation, templating and IPC (seconds)."""
    parts = [stats.get((model, q, window)) for q in ("ttft", "queue", "prefill")]
    means = [p.mean_s if p is not None else None for p in parts]
    if any(m is None for m in means):
        return None
    ttft, queue, prefill = means
    assert ttft is not None and queue is not None and prefill is not None
    return ttft - (queue + prefill)


def reading_samples(reading: EngineReading) -> list[AnySample]:
    """Instant samples of one reading: info, gauges, counters and re-exported cumulative histograms."""
    out: list[AnySample] = []
    for model, m in sorted(reading.models.items()):
        out.extend(_model_samples(reading.kind, model, m))
    return out


def _model_samples(kind: str, model: str, m: ModelReading) -> list[AnySample]:
    a = attrs({MODEL: model})
    out: list[AnySample] = [Sample("inferwatch.engine.info", 1, attrs({MODEL: model}, engine=kind))]
    for gauge, name in (
        ("running", "inferwatch.engine.requests.running"),
        ("waiting", "inferwatch.engine.requests.waiting"),
        ("kv_usage", "inferwatch.engine.kv_cache.usage"),
    ):
        if gauge in m.gauges:
            out.append(Sample(name, m.gauges[gauge], a))
    for counter, typ in (("prompt_tokens", "prompt"), ("generation_tokens", "generation")):
        if counter in m.counters:
            total = sum(m.counters[counter].values())
            out.append(Sample("inferwatch.engine.tokens", total, attrs({MODEL: model}, type=typ)))
    if "preemptions" in m.counters:
        out.append(Sample("inferwatch.engine.preemptions", sum(m.counters["preemptions"].values()), a))
    for reason, v in sorted(m.counters.get("finished", {}).items()):
        out.append(Sample("inferwatch.engine.requests.finished", v, attrs({MODEL: model}, reason=reason or "unknown")))
    for quantity, name in REEXPORTED.items():
        series = m.histograms.get(quantity)
        h = sum_histograms(series.values()) if series else None
        if h is not None and h.sum == h.sum:  # skip when the engine gave no _sum (NaN)
            out.append(HistogramSample(name, h.buckets, h.sum, h.count, a))
    return out


class EngineCollector(BaseCollector):
    name: ClassVar[str] = "engine"
    description: ClassVar[str] = "Inference engine /metrics (vLLM, SGLang, TGI, llama.cpp, TensorRT-LLM)"

    def __init__(self, ctx: CollectContext) -> None:
        super().__init__(ctx)
        cfg = ctx.settings.engine
        self.cfg = cfg
        self.limits = EngineLimits.of(cfg)
        self.parser = EngineParser(cfg.kind, cfg.model_name or DEFAULT_MODEL, self.limits)
        self.timeline = EngineTimeline()
        self.board = LatencyBoard()  # its own latest stats per (model, quantity, window); shared with no one
        self.hang = HangDetector(cfg.hang_min_stall_s, cfg.max_model_len, max_stall_s=cfg.hang_max_stall_s)
        self.health_url = health_url(cfg.metrics_url, cfg.health_url)
        injected = ctx.engine_http
        self._own_client = injected is None
        self._client: httpx.Client = injected or httpx.Client(follow_redirects=False, trust_env=False)
        self._lock = threading.Lock()
        self._up: float | None = None
        self._kind: str = cfg.kind if cfg.kind != "auto" else "unknown"
        self._errors = dict.fromkeys(REASONS, 0)
        self._limit_hits = dict.fromkeys(LIMITS, 0)
        self._models_dropped: int | None = None
        self._dropping = False
        self._given_up = 0  # runs the runner gave up on; a call that was one of them changes no status when it ends

    def collect(self) -> Collection:
        url = self.cfg.metrics_url
        if not url:
            raise NoDataError(
                "no engine /metrics URL configured",
                hint="set engine.metrics_url (INFERWATCH_ENGINE__METRICS_URL=http://127.0.0.1:8000/metrics)",
            )
        with self._lock:
            run = self._given_up
        try:  # parsed while it streams in: the body is never held (a limit stops the fetch at once)
            stream = self.parser.stream()
            size = fetch_into(self._client, url, self.cfg.timeout_s, self.cfg.max_bytes, stream, self.limits.max_series)
            reading = stream.finish()
        except EngineScrapeError as exc:
            with self._lock:
                if run != self._given_up:  # already counted as a timeout; the runner drops this run
                    raise
                self._up = 0
                self._errors[exc.reason] = self._errors.get(exc.reason, 0) + 1
                if exc.reason in self._limit_hits:
                    self._limit_hits[exc.reason] += 1
            raise  # the runner logs the failure once when it starts and once when it ends
        now = time.time()
        dropped = reading.models_dropped
        with self._lock:
            if run == self._given_up:  # else the runner gave up on this run (counted) and drops what it returns
                self._up = 1
                self._kind = reading.kind
                self._models_dropped = dropped
                if dropped:
                    self._limit_hits["max_models"] += 1
        if bool(dropped) != self._dropping:  # logged once when it starts, once when it ends
            self._dropping = bool(dropped)
            if dropped:
                log.warning(
                    "engine exposes more than engine.max_models=%d models: %d dropped", self.limits.max_models, dropped
                )
            else:
                log.info("engine models back within engine.max_models=%d", self.limits.max_models)
        self.timeline.update(now, reading)
        stats = self.timeline.stats()
        self.board.replace("histogram", stats)
        self.board.set_models("histogram", reading.models)
        samples: list[AnySample] = reading_samples(reading)
        samples.extend(self.timeline.derived_samples(stats))
        verdicts = self.hang.update(now, reading)
        health = self._health() if any(v.stalled for v in verdicts) else "not_probed"
        samples.extend(hang_samples(verdicts, health))
        findings = hang_findings(verdicts, health, self.health_url)
        details = {
            "engine": reading.kind,
            "models": sorted(reading.models),
            "series_read": reading.series,
            "bytes": size,
            "models_dropped": dropped,
            "quantities": {
                model: sorted(set(m.histograms) | set(m.gauges) | set(m.counters))
                for model, m in sorted(reading.models.items())
            },
            "absent": {
                model: [q for q in QUANTITIES if q not in m.histograms] for model, m in sorted(reading.models.items())
            },
        }
        details["hang"] = [hang_dict(v) for v in verdicts]
        return Collection(samples=samples, findings=findings, details=details)

    def _health(self) -> str:
        """The engine's /health while a rank is stalled: ok | failed | absent (404) | off (probe disabled)."""
        if not self.health_url:
            return "off"
        try:
            r = self._client.get(self.health_url, timeout=HEALTH_TIMEOUT_S)
        except httpx.HTTPError:
            return "failed"
        if r.status_code == 404:
            return "absent"
        return "ok" if r.status_code == 200 else "failed"

    def run_failed(self, reason: str) -> None:
        """The runner gave up on a run (``timeout``) or found it still running (``hung``): ``up`` 0 and one
        scrape error of reason ``timeout`` (as ``inferwatch.collector.errors`` counts a hung run), as for a fetch
        that timed out. The abandoned call, when it ends, changes no status."""
        with self._lock:
            self._up = 0
            self._errors["timeout"] += 1
            self._given_up += 1

    def status_samples(self) -> list[AnySample]:
        """``inferwatch.engine.up`` and scrape errors by reason; exported even while the collector fails."""
        with self._lock:
            out: list[AnySample] = []
            if self._up is not None:
                out.append(Sample("inferwatch.engine.up", self._up, attrs(engine=self._kind)))
            out.extend(
                Sample("inferwatch.engine.scrape.errors", n, attrs(reason=reason)) for reason, n in self._errors.items()
            )
            out.extend(Sample("inferwatch.engine.limit_hits", n, attrs(limit=k)) for k, n in self._limit_hits.items())
            if self._models_dropped is not None:
                out.append(Sample("inferwatch.engine.models.dropped", self._models_dropped, attrs()))
            return out

    def close(self) -> None:
        if self._own_client:
            self._client.close()


def health_url(metrics_url: str | None, configured: str | None) -> str:
    """``engine.health_url``, else the metrics URL's origin + ``/health`` ("" when there is neither)."""
    if configured is not None:
        return configured
    if not metrics_url:
        return ""
    u = httpx.URL(metrics_url)
    return str(u.copy_with(path="/health", query=None, fragment=None))


def hung(v: RankVerdict, health: str) -> bool:
    """Stalled past the allowance and the engine does not fail its health check (hung *but healthy*)."""
    return v.stalled and health != "failed"


def hang_samples(verdicts: list[RankVerdict], health: str) -> list[Sample]:
    out: list[Sample] = []
    for v in verdicts:
        a = attrs({MODEL: v.model}, rank=v.rank)
        out.append(Sample("inferwatch.engine.stall", v.stall_s, a))
        out.append(Sample("inferwatch.engine.stall.allowance", v.allowance_s, a))
        out.append(Sample("inferwatch.engine.hung", 1 if hung(v, health) else 0, a))
    return out


def hang_dict(v: RankVerdict) -> dict[str, object]:
    return {
        "model": v.model,
        "rank": v.rank,
        "running": v.running,
        "waiting": v.waiting,
        "stall_s": round(v.stall_s, 3),
        "allowance_s": round(v.allowance_s, 3),
        "stalled": v.stalled,
        "prefill_s_per_token": v.prefill_s_per_token,
    }


def hang_findings(verdicts: list[RankVerdict], health: str, url: str) -> list[Finding]:
    """One ``engine_hung`` finding per hung rank (status fail); none while every rank progresses."""
    out = []
    for v in verdicts:
        if not hung(v, health):
            continue
        out.append(
            Finding(
                HANG_FINDING,
                "fail",
                f"engine rank {v.rank} of {v.model}: {v.running:.0f} running, {v.waiting:.0f} waiting, no token for "
                f"{v.stall_s:.0f}s (allowance {v.allowance_s:.0f}s); /health {health}",
                {**hang_dict(v), "health": health, "health_url": url},
                HANG_RUNBOOK,
            )
        )
    return out
