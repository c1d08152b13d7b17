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
while the collector is failing. Every failure raises :class:`~inferwatch.agent.node.engine.fetch.EngineScrapeError`
with its reason; the runner counts it and the agent keeps serving. A run the runner gives up on (past
``collectors.engine.timeout_s``, e.g. a parse that slow: the fetch deadline ``engine.timeout_s`` counts the
server's time only) or finds still running is reported the same way (:meth:`EngineCollector.run_failed`).

Hang detection (:mod:`inferwatch.agent.node.engine.hang`) needs the engine's maximum model length. Unless
``engine.max_model_len`` is set, the collector asks the engine once per engine start (the first scrape, the first after
a failed one, a counter reset, another set of models), in a thread of its own so no scrape waits for it: ``GET
/v1/models`` on the metrics URL's origin (vLLM, SGLang: ``max_model_len`` per model) or ``GET /props`` for llama.cpp
(its per-slot ``n_ctx``), within :data:`MODEL_LEN_TIMEOUT_S`. No answer leaves what was known (nothing before the first
answer): counted by reason in ``details["max_model_len"]``, logged once when it starts and once when it ends,
asked again after :data:`MODEL_LEN_RETRY_S`.

The histogram-derived stats are kept in the collector's own :class:`~inferwatch.agent.node.engine.board.LatencyBoard`
(``EngineCollector.board``, for inspection). The span analytics learn what they need from this
collector's collection in the state (``details["models"]`` and its ``frontend_gap`` series), not
from a shared object.
"""

from __future__ import annotations

import json
import logging
import threading
import time
from collections.abc import Callable
from dataclasses import dataclass
from typing import ClassVar, TypeGuard

import httpx

from inferwatch.agent import catalog
from inferwatch.agent.catalog import genai
from inferwatch.agent.catalog.engine import MODEL
from inferwatch.agent.catalog.engine_schemas import DERIVED_MEANS
from inferwatch.agent.common.httpclient import http_client
from inferwatch.agent.common.samples import AnySample, Finding, HistogramSample, Sample, attrs
from inferwatch.agent.errors import NoDataError
from inferwatch.agent.node.collectors.base import BaseCollector, CollectContext, Collection
from inferwatch.agent.node.engine.adapters import DEFAULT_MODEL, QUANTITIES, EngineReading, ModelReading
from inferwatch.agent.node.engine.board import Key, LatencyBoard, LatencyStats, latency_samples
from inferwatch.agent.node.engine.fetch import REASONS, EngineScrapeError, fetch_into
from inferwatch.agent.node.engine.hang import HangDetector, RankVerdict
from inferwatch.agent.node.engine.heap import release_freed_memory
from inferwatch.agent.node.engine.histogram import sum_histograms
from inferwatch.agent.node.engine.limits import LIMITS, EngineLimits
from inferwatch.agent.node.engine.scrape import EngineParser, stats_from_histogram
from inferwatch.agent.node.engine.windows import WINDOWS_S, CounterWindow, HistogramWindow

log = logging.getLogger(__name__)

REEXPORTED = {
    "ttft": "gen_ai.server.time_to_first_token",
    "itl": "gen_ai.server.time_per_output_token",
    "e2e": "gen_ai.server.request.duration",
}
# Engine signals (issue 18): histograms re-exported as they are, counters and gauges by name. Quantities outside
# QUANTITIES (kv_transfer) are re-exported only, not windowed into latency quantiles.
SIGNAL_HISTOGRAMS = {"kv_transfer": "inferwatch.engine.kv_transfer.duration"}
SIGNAL_COUNTERS = {  # adapter counter → (metric, attribute kept from the counter's dimension or fixed value)
    "prefix_queries": ("inferwatch.engine.prefix_cache.queries", ("cache", "local")),
    "prefix_hits": ("inferwatch.engine.prefix_cache.hits", ("cache", "local")),
    "external_prefix_queries": ("inferwatch.engine.prefix_cache.queries", ("cache", "external")),
    "external_prefix_hits": ("inferwatch.engine.prefix_cache.hits", ("cache", "external")),
    "cached_tokens": ("inferwatch.engine.tokens", ("type", "cached")),
    "prompt_by_source": ("inferwatch.engine.prompt_tokens.by_source", ("source", None)),
    "spec_drafts": ("inferwatch.engine.spec_decode.drafts", None),
    "spec_draft_tokens": ("inferwatch.engine.spec_decode.draft_tokens", None),
    "spec_accepted": ("inferwatch.engine.spec_decode.accepted_tokens", None),
    "spec_accepted_by_position": ("inferwatch.engine.spec_decode.accepted_by_position", ("position", None)),
    "kv_transfer_bytes": ("inferwatch.engine.kv_transfer.bytes", None),
    "kv_transfer_failures": ("inferwatch.engine.kv_transfer.failures", None),
}
SIGNAL_GAUGES = {
    "spec_acceptance": "inferwatch.engine.spec_decode.acceptance",
    "spec_acceptance_length": "inferwatch.engine.spec_decode.acceptance_length",
    "kv_transfer_latency": "inferwatch.engine.kv_transfer.latency",
}
HANG_FINDING = "engine_hung"
HANG_RUNBOOK = "EngineHungButHealthy"
HEALTH_TIMEOUT_S = 1.0  # the /health probe runs only while a rank is stalled
MODEL_LEN_TIMEOUT_S = 2.0  # GET /v1/models or /props: a small JSON document, asked off the scrape
MODEL_LEN_MAX_BYTES = 1 << 20  # a model list with thousands of LoRA adapters still fits
MODEL_LEN_RETRY_S = 300.0  # after no answer (or none with a length), asked again at most this often
MODEL_LEN_MIN_GAP_S = 60.0  # an engine that flaps up and down is asked at most once a minute
MODEL_LEN_PATHS = {"llamacpp": "/props"}  # every other engine: the OpenAI-compatible /v1/models
MODEL_LEN_REASONS = ("connect", "timeout", "http_status", "too_large", "not_json", "absent")
# A collection that read a body larger than this hands the memory it freed back to the OS when it ends (512 KiB:
# ~5k series of vLLM; 20 models x 2 ranks expose 1.2 MB). Was 4 MiB: an agent at 50 models (3 MB) kept ~12 MB
# more (99.4 against 87.5 MB after 6 collections, docs/benchmarks.md "Engine scale"); malloc_trim costs 0.2-2 ms.
RELEASE_AFTER_BYTES = 512 << 10
TOKEN_TIME = {"prefill": ("prompt_seconds", "prompt_tokens"), "decode": ("generation_seconds", "generation_tokens")}
# the counters whose increases over a window are asked (token_time, and the means of quantities an engine exposes
# only as cumulative counters: DERIVED_MEANS): the only ones a CounterWindow keeps per scrape
WINDOWED_COUNTERS = frozenset(name for pair in (*TOKEN_TIME.values(), *DERIVED_MEANS.values()) for name in pair)


class EngineTimeline:
    """Per-model sliding windows over successive readings; turns them into samples and latency stats."""

    def __init__(self) -> None:
        self._hist: dict[tuple[str, str], HistogramWindow] = {}
        self._counters: dict[str, CounterWindow] = {}

    def update(self, t: float, reading: EngineReading) -> None:
        live: set[tuple[str, str]] = set()
        for model, m in reading.models.items():
            for quantity, series in m.histograms.items():
                if quantity not in QUANTITIES:  # re-exported only (SIGNAL_HISTOGRAMS)
                    continue
                key = (model, quantity)
                live.add(key)
                self._hist.setdefault(key, HistogramWindow()).update(t, series)
            flat = {name: sum(dims.values()) for name, dims in m.counters.items() if name in WINDOWED_COUNTERS}
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
                # a mean over the window from two cumulative counters: token time per phase, and the means an engine
                # exposes only as counters (Triton per request, llama.cpp per token)
                for name, key, table in (
                    ("inferwatch.engine.token_time", "phase", TOKEN_TIME),
                    ("inferwatch.engine.latency.mean", "quantity", DERIVED_MEANS),
                ):
                    for label, (secs, count) in table.items():
                        d_secs = counters.increase(secs, seconds)
                        d_count = counters.increase(count, seconds)
                        if d_secs is not None and d_count:
                            a = attrs({MODEL: model}, window=wname, **{key: label})
                            out.append(Sample(name, d_secs / d_count, a))
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


def keep_sums(reading: EngineReading) -> None:
    """Replace each histogram's series by their sum (under no labels), once the windows and the hang detector have
    read them: the samples made from a reading need the sums only. At 200 models x 2 ranks the series' buckets are
    ~6 MB of (bound, count) tuples; let go here, the collection's samples are made in their place instead of beside
    them."""
    for m in reading.models.values():
        for quantity, series in m.histograms.items():
            if len(series) > 1:
                total = sum_histograms(series.values())
                m.histograms[quantity] = {(): total} if total is not None else {}


def reading_samples(reading: EngineReading) -> list[AnySample]:
    """Instant samples of one reading: info, gauges, counters and re-exported cumulative histograms."""
    out: list[AnySample] = []
    for model, m in sorted(reading.models.items()):
        out.extend(_model_samples(reading.kind, model, m))
    out.extend(schema_samples(reading))
    return out


def schema_samples(reading: EngineReading) -> list[AnySample]:
    """What the agent recognised of the engine's schema: the release range and schema (an info gauge), how many
    claimed quantities it maps or derives, and how many of the engine's own families it does not read."""
    r = reading.recognition
    e = attrs(engine=reading.kind)
    return [
        Sample(
            "inferwatch.engine.schema.info",
            1,
            attrs(engine=reading.kind, release_range=r.release_range, schema=r.schema),
        ),
        Sample("inferwatch.engine.quantities.recognised", reading.recognised(), e),
        Sample("inferwatch.engine.unmapped_families", r.unmapped_families, e),
    ]


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
    for quantity, name in (*REEXPORTED.items(), *SIGNAL_HISTOGRAMS.items()):
        series = m.histograms.get(quantity)
        h = sum_histograms(series.values()) if series else None
        if h is not None and h.sum == h.sum:  # skip when the engine gave no _sum (NaN)
            out.append(HistogramSample(name, h.buckets, h.sum, h.count, _histogram_attrs(kind, model, name)))
    out.extend(signal_samples(model, m))
    return out


def _histogram_attrs(kind: str, model: str, name: str) -> tuple[tuple[str, str], ...]:
    """A re-exported histogram's attributes: the GenAI semconv ones (agent/catalog/genai.py) for gen_ai.server.*,
    with the engine kind as provider and no operation or error type (the engine's histograms mix them all)."""
    keys = catalog.get(name).attributes
    values = {MODEL: model, genai.PROVIDER: kind}
    return attrs({k: values.get(k, "") for k in keys})


def signal_samples(model: str, m: ModelReading) -> list[AnySample]:
    """The engine signals of one model (issue 18): counters, the engine's own gauges and the LoRA state."""
    out: list[AnySample] = []
    for counter, (name, attr) in SIGNAL_COUNTERS.items():
        dims = m.counters.get(counter)
        if not dims:
            continue
        if attr is None:
            out.append(Sample(name, sum(dims.values()), attrs({MODEL: model})))
        elif attr[1] is not None:
            out.append(Sample(name, sum(dims.values()), attrs({MODEL: model, attr[0]: attr[1]})))
        else:
            for dim, v in sorted(dims.items()):
                out.append(Sample(name, v, attrs({MODEL: model, attr[0]: dim or "unknown"})))
    for gauge, name in SIGNAL_GAUGES.items():
        if gauge in m.gauges:
            out.append(Sample(name, m.gauges[gauge], attrs({MODEL: model})))
    if m.lora is not None:
        lora = m.lora
        for state, names in (("running", lora.running), ("waiting", lora.waiting)):
            out.append(Sample("inferwatch.engine.lora.adapters", len(names), attrs({MODEL: model}, state=state)))
        out.append(Sample("inferwatch.engine.lora.max_adapters", lora.max_lora, attrs({MODEL: model})))
        out.append(Sample("inferwatch.engine.lora.blocked", lora.blocked, attrs({MODEL: model})))
    return out


@dataclass(frozen=True, slots=True)
class ModelLenAnswer:
    """One answer about the engine's maximum model length: tokens per model (``""``: every model), or why none.

    ``reason`` is ``ok`` or one of :data:`MODEL_LEN_REASONS` (``absent``: 404, or no length in the document).
    """

    lens: dict[str, int]
    reason: str
    message: str = ""


def model_len_url(metrics_url: str | None, kind: str) -> str:
    """Where ``kind``'s engine reports its maximum model length: the metrics URL's origin + the path ("" if none)."""
    if not metrics_url:
        return ""
    u = httpx.URL(metrics_url)
    if u.scheme not in ("http", "https"):
        return ""
    return str(u.copy_with(path=MODEL_LEN_PATHS.get(kind, "/v1/models"), query=None, fragment=None))


def _tokens(v: object) -> TypeGuard[int]:
    return isinstance(v, int) and not isinstance(v, bool) and v > 0


def model_lens(kind: str, doc: object) -> dict[str, int]:
    """Maximum model length in tokens per model from the engine's JSON document ({} when it has none).

    vLLM and SGLang ``GET /v1/models``: ``data[].max_model_len`` by ``data[].id`` (the served model name, the
    ``model_name`` label of their metrics; LoRA adapters carry none). llama.cpp ``GET /props``:
    ``default_generation_settings.n_ctx``, the per-slot context, the longest prompt one request can have (key "").
    """
    if not isinstance(doc, dict):
        return {}
    if kind == "llamacpp":
        settings = doc.get("default_generation_settings")
        n = settings.get("n_ctx") if isinstance(settings, dict) else None
        return {"": n} if _tokens(n) else {}
    data = doc.get("data")
    out: dict[str, int] = {}
    for card in data if isinstance(data, list) else []:
        if (
            isinstance(card, dict)
            and isinstance(model := card.get("id"), str)
            and _tokens(n := card.get("max_model_len"))
        ):
            out[model] = n
    return out


def ask_model_len(
    client: httpx.Client,
    url: str,
    kind: str,
    timeout_s: float = MODEL_LEN_TIMEOUT_S,
    max_bytes: int = MODEL_LEN_MAX_BYTES,
) -> ModelLenAnswer:
    """GET ``url`` (at most ``max_bytes``, ``timeout_s`` in total) and read the lengths with :func:`model_lens`."""
    deadline = time.monotonic() + timeout_s
    body = bytearray()
    try:
        with client.stream("GET", url, timeout=httpx.Timeout(timeout_s), headers={"Accept": "application/json"}) as r:
            if r.status_code != 200:
                reason = "absent" if r.status_code == 404 else "http_status"
                return ModelLenAnswer({}, reason, f"{url} answered HTTP {r.status_code}")
            for chunk in r.iter_bytes():
                body += chunk
                if len(body) > max_bytes:
                    return ModelLenAnswer({}, "too_large", f"{url} sent more than {max_bytes} bytes")
                if time.monotonic() > deadline:
                    return ModelLenAnswer({}, "timeout", f"{url} still sending after {timeout_s:g}s")
    except httpx.TimeoutException:
        return ModelLenAnswer({}, "timeout", f"{url}: no answer within {timeout_s:g}s")
    except httpx.HTTPError as exc:
        return ModelLenAnswer({}, "connect", f"{url}: {type(exc).__name__}: {exc}")
    try:
        doc = json.loads(body)
    except (ValueError, RecursionError):  # RecursionError: nested deeper than the parser's stack
        return ModelLenAnswer({}, "not_json", f"{url} did not answer JSON")
    lens = model_lens(kind, doc)
    if not lens:
        field = "default_generation_settings.n_ctx" if kind == "llamacpp" else "data[].max_model_len"
        return ModelLenAnswer({}, "absent", f"{url} has no {field}")
    return ModelLenAnswer(lens, "ok")


def _token_total(reading: EngineReading) -> float:
    """Prompt + generation tokens over every model: lower than the last scrape's after a restart."""
    counters = ("prompt_tokens", "generation_tokens")
    return sum(sum(m.counters.get(c, {}).values()) for m in reading.models.values() for c in counters)


class EngineCollector(BaseCollector):
    name: ClassVar[str] = "engine"
    description: ClassVar[str] = "Inference engine /metrics (vLLM, SGLang, TGI, llama.cpp, TensorRT-LLM)"

    def __init__(self, ctx: CollectContext, clock: Callable[[], float] = time.time) -> None:
        super().__init__(ctx)
        self._clock = clock  # wall time of each scrape, seconds
        cfg = ctx.settings.engine
        self.cfg = cfg
        self.limits = EngineLimits.of(cfg)
        self.parser = EngineParser(cfg.kind, cfg.model_name or DEFAULT_MODEL, self.limits)
        self.timeline = EngineTimeline()
        self.board = LatencyBoard()  # its own latest stats per (model, quantity, window); shared with no one
        self.hang = HangDetector(
            cfg.hang_min_stall_s,
            cfg.max_model_len,
            max_stall_s=cfg.hang_max_stall_s,
            fast_stall_s=cfg.hang_fast_stall_s,
        )
        self.health_url = health_url(cfg.metrics_url, cfg.health_url)
        injected = ctx.engine_http
        self._own_client = injected is None
        self._client: httpx.Client = injected or http_client("engine", ctx.http_retries)
        self._lock = threading.Lock()
        self._up: float | None = None
        self._kind: str = cfg.kind if cfg.kind != "auto" else "unknown"
        self._errors = dict.fromkeys(REASONS, 0)
        self._limit_hits = dict.fromkeys(LIMITS, 0)
        self._models_dropped: int | None = None
        self._dropping = False
        self._given_up = 0  # runs the runner gave up on; a call that was one of them changes no status when it ends
        # the engine's maximum model length (unless configured): asked per engine start, in a thread of its own
        self._len_url = ""
        self._len_thread: threading.Thread | None = None
        self._len_answer: ModelLenAnswer | None = None  # posted by the thread, taken by the next collect()
        self._len_due = cfg.max_model_len <= 0
        self._len_asked_at = float("-inf")
        self._len_retry_at: float | None = None
        self._len_last = "configured" if cfg.max_model_len > 0 else "not_asked"
        self._len_errors = dict.fromkeys(MODEL_LEN_REASONS, 0)
        self._len_failing = False
        self._engine_mark: tuple[frozenset[str], float] | None = None  # models and token total of the last scrape
        self._read_bytes = 0  # the size of the body the collection under way read

    def collect(self) -> Collection:
        """One scrape of the engine; after a body over :data:`RELEASE_AFTER_BYTES`, once everything the read held
        is let go (the body's pieces, the parsed samples, the reading), the memory it freed goes back to the OS
        (``malloc_trim``: 0.2-2 ms against the read's second or more): else glibc keeps it, and the
        agent's RSS stays near the read's peak (at 200 models x 2 ranks, 183 MB against 150 MB)."""
        self._read_bytes = 0
        try:
            return self._collect()
        finally:
            if self._read_bytes > RELEASE_AFTER_BYTES:
                release_freed_memory()

    def _collect(self) -> Collection:
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
            self._read_bytes = size
            reading = stream.finish()
        except EngineScrapeError as exc:
            self._engine_mark = None  # the next scrape that succeeds may be of a restarted engine
            with self._lock:
                if run != self._given_up:  # already counted as a timeout; the runner drops this run
                    raise
                self._up = 0
                self._errors[exc.reason] = self._errors.get(exc.reason, 0) + 1
                if exc.reason in self._limit_hits:
                    self._limit_hits[exc.reason] += 1
            raise  # the runner logs the failure once when it starts and once when it ends
        now = self._clock()
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
        self._model_len_step(now, reading)
        verdicts = self.hang.update(now, reading)
        keep_sums(reading)  # the per-series histograms are read: what is left to do needs their sums only
        stats = self.timeline.stats()
        self.board.replace("histogram", stats)
        self.board.set_models("histogram", reading.models)
        samples: list[AnySample] = reading_samples(reading)
        samples.extend(self.timeline.derived_samples(stats))
        health = self._health() if any(v.stalled for v in verdicts) else "not_probed"
        samples.extend(hang_samples(verdicts, health))
        findings = hang_findings(verdicts, health, self.health_url)
        details = {
            "engine": reading.kind,
            "models": sorted(reading.models),
            "series_read": reading.series,
            "bytes": size,
            "models_dropped": dropped,
            "schema": {
                "release_range": reading.recognition.release_range,
                "schema": reading.recognition.schema,
                "recognised": reading.recognised(),
                "unmapped_families": reading.recognition.unmapped_families,
            },
            "quantities": {
                model: sorted(set(m.histograms) | set(m.gauges) | set(m.counters))
                for model, m in sorted(reading.models.items())
            },
            "absent": {
                model: [q for q in QUANTITIES if q not in m.histograms] for model, m in sorted(reading.models.items())
            },
        }
        details["hang"] = [hang_dict(v) for v in verdicts]
        details["max_model_len"] = self._model_len_dict()
        return Collection(samples=samples, findings=findings, details=details)

    def _model_len_step(self, now: float, reading: EngineReading) -> None:
        """Hand a finished answer to the hang detector; ask (in a thread) when the engine (re)started or a failed
        answer's retry time has come, at most once per :data:`MODEL_LEN_MIN_GAP_S`. Nothing when configured."""
        if self.cfg.max_model_len > 0:
            return
        mark = (frozenset(reading.models), _token_total(reading))
        last, self._engine_mark = self._engine_mark, mark
        if last is None or last[0] != mark[0] or mark[1] < last[1]:
            self._len_due = True  # an engine start: the first scrape, the first after a failure, a restart
        self._take_model_len(now)
        retry = self._len_retry_at is not None and now >= self._len_retry_at
        if not (self._len_due or retry) or now - self._len_asked_at < MODEL_LEN_MIN_GAP_S:
            return
        if self._len_thread is not None and self._len_thread.is_alive():
            return
        url = model_len_url(self.cfg.metrics_url, reading.kind)
        if not url:
            return
        self._len_url, self._len_asked_at, self._len_due, self._len_retry_at = url, now, False, None
        timeout_s = min(self.cfg.timeout_s, MODEL_LEN_TIMEOUT_S)
        self._len_thread = threading.Thread(
            target=self._ask_model_len, args=(url, reading.kind, timeout_s), name="engine-model-len", daemon=True
        )
        self._len_thread.start()

    def _ask_model_len(self, url: str, kind: str, timeout_s: float) -> None:
        answer = ask_model_len(self._client, url, kind, timeout_s)
        with self._lock:
            self._len_answer = answer

    def _take_model_len(self, now: float) -> None:
        with self._lock:
            answer, self._len_answer = self._len_answer, None
        if answer is None:
            return
        self._len_last = answer.reason
        if answer.reason == "ok":
            self.hang.learn(answer.lens)
            log.info("engine maximum model length from %s: %s tokens", self._len_url, answer.lens)
            if self._len_failing:
                self._len_failing = False
                log.info("engine maximum model length answered again (%s)", self._len_url)
            return
        self._len_errors[answer.reason] += 1
        self._len_retry_at = now + MODEL_LEN_RETRY_S
        if not self._len_failing:  # logged once when it starts, once when it ends
            self._len_failing = True
            known = "the last answer" if self.hang.learnt else f"engine.hang_min_stall_s={self.hang.min_stall_s:g}s"
            log.warning(
                "engine maximum model length unknown: %s; the hang allowance uses %s (set engine.max_model_len)",
                answer.message,
                known,
            )

    def _model_len_dict(self) -> dict[str, object]:
        return {
            "configured": self.cfg.max_model_len,
            "engine": dict(sorted(self.hang.learnt.items())),
            "url": self._len_url,
            "last": self._len_last,
            "errors": {reason: n for reason, n in self._len_errors.items() if n},
        }

    def join_model_len(self, timeout_s: float = MODEL_LEN_TIMEOUT_S) -> None:
        """Wait (at most ``timeout_s``) for a model-length request in flight; its answer is taken by the next
        :meth:`collect`. For tests and :meth:`close`."""
        thread = self._len_thread
        if thread is not None:
            thread.join(timeout_s)

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
            dropped_lines = self.parser.dropped_lines()  # bad lines dropped, the rest of their scrape kept
            out.extend(Sample("inferwatch.engine.series.dropped", n, attrs(reason=k)) for k, n in dropped_lines.items())
            if self._models_dropped is not None:
                out.append(Sample("inferwatch.engine.models.dropped", self._models_dropped, attrs()))
            return out

    def close(self) -> None:
        self.join_model_len()  # bounded: the request's own timeout
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
        "max_model_len": v.max_model_len,
        "fast": v.fast,
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
                f"{v.stall_s:.0f}s ({'fast path' if v.fast else 'allowance'} {v.allowance_s:.0f}s); /health {health}",
                {**hang_dict(v), "health": health, "health_url": url},
                HANG_RUNBOOK,
            )
        )
    return out
