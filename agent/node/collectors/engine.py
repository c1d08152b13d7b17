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

**Progress passes.** Hang detection reads the engine every 2 s (its fast path, see the ENTRY below), the rest of the
collection needs a read once per collection interval (``full_every_s``: the agent's ``interval_s``). So a run is a
**full read** (the whole exposition parsed as it streams in, every quantity mapped, the latency windows moved, the
hang verdicts) when ``FULL_READ_DUE`` of that interval has passed since the last one, and otherwise a **progress
pass** (:mod:`inferwatch.agent.node.engine.progress`): the engine asked for those families alone (``name[]=``,
which prometheus_client's exposition app — vLLM's, SGLang's — answers with them only; ``engine.progress_filter``),
only the lines of the families hang detection reads taken out of the body as it arrives and read, the verdicts made
on them, and the collection returned is the last full read's series (the same objects, so the exposition reuses
their text) with the new verdicts, its details with the new ``hang`` and ``read``. A pass that cannot stand for a
full read (a line it keeps is bad, a rank quantity the last full read gave is missing from it) is a full read
instead (``fallback`` in ``details["read"]["runs"]``): of the same body where the engine sent all of it (the body
kept for that, compressed past 1 MiB), of the plain URL where the pass asked for its families alone — an answer
that misses one (prometheus_client before 0.25 answers with nothing from a multiprocess registry) is never taken
for the whole exposition, and the passes then read it whole for :data:`FILTER_RETRY_S` (``details["read"]
["filter"]``). A pass that asks for its families costs ~3 ms of CPU at 10 models x 2 ranks and ~25 ms at 200
(~7 and ~170 ms reading the whole body), a full read ~25 and ~620 ms (in process, 2026-12-07). Between
full reads the engine's own series in ``/metrics`` are up to one interval old, as a collector reading at the
interval would give them.

The histogram-derived stats are kept in the collector's own :class:`~inferwatch.agent.node.engine.board.LatencyBoard`
(``EngineCollector.board``, for inspection). The span analytics learn what they need from this
collector's collection in the state (``details["models"]`` and its ``frontend_gap`` series), and the tail
explainer each data-parallel rank's cumulative ITL sum and count (``details["rank_itl"]``, for a slow rank behind
stock vLLM spans), not from a shared object.
"""

from __future__ import annotations

import logging
import threading
import time
from collections.abc import Callable
from dataclasses import dataclass
from itertools import chain
from typing import TYPE_CHECKING, Any, ClassVar

from inferwatch.agent.common.samples import AnySample, Sample, attrs
from inferwatch.agent.config import DEFAULT_ENGINE_INTERVAL_S, EngineSettings
from inferwatch.agent.errors import NoDataError
from inferwatch.agent.node.collectors.base import BaseCollector, CollectContext, Collection
from inferwatch.agent.node.collectors.registry import MAX_TIMEOUT_S, TIMING_MARGIN_S, Entry
from inferwatch.agent.node.engine.adapters import DEFAULT_MODEL, QUANTITIES, EngineReading
from inferwatch.agent.node.engine.board import LatencyBoard
from inferwatch.agent.node.engine.derived import EngineTimeline
from inferwatch.agent.node.engine.emit import keep_sums, reading_samples
from inferwatch.agent.node.engine.fetch import REASONS, EngineScrapeError, fetch_into
from inferwatch.agent.node.engine.hang import HangDetector
from inferwatch.agent.node.engine.hangreport import hang_dict, hang_findings, hang_samples, health_url
from inferwatch.agent.node.engine.heap import release_freed_memory
from inferwatch.agent.node.engine.limits import LIMITS, EngineLimits
from inferwatch.agent.node.engine.modellen import (
    MODEL_LEN_MIN_GAP_S,
    MODEL_LEN_REASONS,
    MODEL_LEN_RETRY_S,
    MODEL_LEN_TIMEOUT_S,
    ModelLenAnswer,
    ask_model_len,
    model_len_url,
)
from inferwatch.agent.node.engine.progress import ProgressReader, ProgressScan, filtered_url
from inferwatch.agent.node.engine.rankitl import rank_itl
from inferwatch.agent.node.engine.scrape import EngineParser, ExpositionStream

if TYPE_CHECKING:  # httpx is imported with the client, on the first request: no engine URL, no httpx
    import httpx

log = logging.getLogger(__name__)

HEALTH_TIMEOUT_S = 1.0  # the /health probe runs only while a rank is stalled
# A collection that read a body larger than this hands the memory it freed back to the OS when it ends (512 KiB:
# ~5k series of vLLM; 20 models x 2 ranks expose 1.2 MB). Was 4 MiB: an agent at 50 models (3 MB) kept ~12 MB
# more (99.4 against 87.5 MB after 6 collections, docs/benchmarks.md "Engine scale"); malloc_trim costs 0.2-2 ms.
RELEASE_AFTER_BYTES = 512 << 10
# A reading asked for at a hang verdict's due time starts this much after it: its time (taken when the read ends) is
# then past the window however fast the read, and a few ms of timer slack cannot push the verdict a whole interval.
READ_AGAIN_MARGIN_S = 0.05
# The fetch deadline grows with the engine's exposition (fetch_timeout_s): this much per MB of its last body, up to
# this many times engine.timeout_s. At 200 models x 2 ranks of vLLM (12 MB) the engine took 0.2-1.1 s to send a body
# on the project's 2-core VM at load 4 (2026-12-07): the 7.5 s it gets is a margin of 7x and more.
TIMEOUT_S_PER_MB = 0.5
TIMEOUT_MAX_FACTOR = 8.0
TIMEOUT_SLOW_FACTOR = 2.0  # and at least twice what the engine took to send its last body
# A full read is made once this share of ``full_every_s`` has passed since the last one (on a 2 s cadence and a 5 s
# interval: every third run, 6 s apart); the runs between are progress passes.
FULL_READ_DUE = 0.9
EVENTS = ("finished", "preemptions")  # the request events hang detection counts per model
READS = ("full", "progress", "fallback")  # fallback: a progress pass that read its body in full
# After a progress pass asked for its families alone and could not stand for a full read, the passes read the whole
# exposition for this long before they ask again (an engine upgraded, restarted with another registry).
FILTER_RETRY_S = 600.0


@dataclass(eq=False)
class _FullRead:
    """What the last full read made (``at``: its time, seconds), for the progress passes after it: its series but
    the hang verdicts, its details, the models it kept and the ranks it judged, and the collection last returned."""

    at: float
    kind: str
    models: frozenset[str]
    judged: frozenset[tuple[str, str, str]]  # its _progress_shape
    dropped: int
    samples: list[AnySample]
    details: dict[str, Any]
    made: Collection


def fetch_timeout_s(base_s: float, last: tuple[int, float] | None, timed_out: bool = False) -> float:
    """The fetch deadline of a read (seconds), from ``engine.timeout_s`` (``base_s``) and the last read that succeeded
    (``last``: its body's bytes and the seconds the engine took to send it): ``base_s`` plus :data:`TIMEOUT_S_PER_MB`
    per MB of that body, at least :data:`TIMEOUT_SLOW_FACTOR` times those seconds, at most
    :data:`TIMEOUT_MAX_FACTOR` times ``base_s``; that most after a read that timed out (``timed_out``: a large engine,
    slow to render, is then read instead of cut again and again), ``base_s`` before any read. An engine renders and
    sends its exposition in a time that grows with its size: at 200 models x 2 ranks of vLLM (12 MB) the deadline is
    7.5 s by default, where 1.5 s cut every read (docs/benchmarks.md, "Cost at every size"); a small engine that
    stops answering is still cut at about the base deadline."""
    cap = min(base_s * TIMEOUT_MAX_FACTOR, MAX_TIMEOUT_S)
    if timed_out:
        return cap
    if last is None:
        return base_s
    size, took_s = last
    return min(cap, max(base_s + TIMEOUT_S_PER_MB * size / 1e6, TIMEOUT_SLOW_FACTOR * took_s))


class _Timed:
    """A fetch's sink that counts the seconds spent in it (the agent's parsing), so the engine's are the rest."""

    def __init__(self, sink: ExpositionStream) -> None:
        self.sink, self.spent_s = sink, 0.0

    def begin(self, content_type: str) -> None:
        self.sink.begin(content_type)

    def feed(self, chunk: bytes) -> None:
        t = time.perf_counter()
        try:
            self.sink.feed(chunk)
        finally:
            self.spent_s += time.perf_counter() - t


def _progress_shape(reading: EngineReading) -> frozenset[tuple[str, str, str]]:
    """What hang detection reads of ``reading``: (model, rank, quantity) of every rank quantity, (model, "",
    counter) of the request events; a progress pass must give all of the last full read's."""
    ranks = ((model, rank, q) for model, m in reading.models.items() for rank, qs in m.ranks.items() for q in qs)
    events = ((model, "", c) for model, m in reading.models.items() for c in EVENTS if c in m.counters)
    return frozenset(chain(ranks, events))


def _token_total(reading: EngineReading) -> float:
    """Prompt + generation tokens over every model: lower than the last scrape's after a restart."""
    counters = ("prompt_tokens", "generation_tokens")
    return sum(sum(m.counters.get(c, {}).values()) for m in reading.models.values() for c in counters)


class EngineCollector(BaseCollector):
    name: ClassVar[str] = "engine"
    description: ClassVar[str] = "Inference engine /metrics (vLLM, SGLang, TGI, llama.cpp, TensorRT-LLM)"
    reads: ClassVar[str] = "the engine's own `/metrics` over HTTP ([engine.md](engine.md))"

    def __init__(
        self,
        ctx: CollectContext,
        cfg: EngineSettings,
        full_every_s: float = 0.0,
        clock: Callable[[], float] = time.time,
    ) -> None:
        """``full_every_s``: seconds between full reads; a run sooner than that after the last one is a progress pass
        (the module's "Progress passes"); 0: every run reads in full. The registry passes the agent's interval."""
        super().__init__(ctx)
        self._clock = clock  # wall time of each scrape, seconds
        self.cfg = cfg
        self.full_every_s = full_every_s
        self._progress: ProgressReader | None = None  # made for the engine kind the last full read found
        # the metrics URL asking for the progress families alone (None until a reader is made): parsed once, as httpx
        # checks a URL string character by character on each request (~0.5 ms for this one's ~1 kB)
        self._filter_url: httpx.URL | None = None
        self._filter_off_until = float("-inf")  # a filtered answer could not stand for a full read: not until then
        self._filter_refused = 0  # such answers so far
        self._filter_state = "asked" if cfg.progress_filter else "off"  # as the last pass found it: or "paused"
        self._full: _FullRead | None = None  # what the last full read made, for the progress passes after it
        self.read_counts = dict.fromkeys(READS, 0)  # runs by the read they made
        self._last_read = ""  # the last run's: full (planned), progress, or fallback (a progress pass read in full)
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
        self._made_client: httpx.Client | None = injected  # made on first use: no engine URL, no client
        self._retries = ctx.http_retries
        if self._retries is not None and injected is None:
            self._retries.register("engine")  # its retries series exists from the start, as the client's would
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
        self._last_fetch: tuple[int, float] | None = None  # the last body read: bytes, seconds the engine took
        self._timed_out = False  # the last read timed out

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
        last = self._full
        full = self.full_every_s <= 0 or last is None or self._clock() - last.at >= FULL_READ_DUE * self.full_every_s
        progress: EngineReading | None = None
        deadline_s = self.fetch_timeout_s()
        try:
            whole = True
            if full:
                reading, size, sent_s = self._full_fetch(url, deadline_s)
            else:  # a progress pass: its lines taken as the body arrives; the engine read in full if they fail
                reading, progress, size, sent_s, whole = self._progress_fetch(url, deadline_s)
        except EngineScrapeError as exc:
            self._engine_mark = None  # the next scrape that succeeds may be of a restarted engine
            self._timed_out = exc.reason == "timeout"  # the next read may take the longest deadline (large, slow)
            with self._lock:
                if run != self._given_up:  # already counted as a timeout; the runner drops this run
                    raise
                self._up = 0
                self._errors[exc.reason] = self._errors.get(exc.reason, 0) + 1
                if exc.reason in self._limit_hits:
                    self._limit_hits[exc.reason] += 1
            raise  # the runner logs the failure once when it starts and once when it ends
        if whole:
            self._last_fetch = (size, sent_s)
        self._timed_out = False
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
        self._model_len_step(now, reading)
        if progress is not None:
            self.read_counts["progress"] += 1
            self._last_read = "progress"
            return self._progress_collection(now, progress)
        self._last_read = "full" if full else "fallback"
        self.read_counts[self._last_read] += 1
        self.timeline.update(now, reading)
        verdicts = self.hang.update(now, reading)
        ranks_itl = rank_itl(reading)  # per rank, before keep_sums sums the ranks (the tail explainer's)
        keep_sums(reading)  # the per-series histograms are read: what is left to do needs their sums only
        stats = self.timeline.stats()
        self.board.replace("histogram", stats)
        self.board.set_models("histogram", reading.models)
        samples: list[AnySample] = reading_samples(reading)
        samples.extend(self.timeline.derived_samples(stats))
        hang_from = len(samples)  # the hang verdicts last: a progress pass replaces them
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
        details["rank_itl"] = ranks_itl
        details["read"] = self._read_dict("full")
        out = Collection(samples=samples, findings=findings, details=details)
        judged = _progress_shape(reading)
        self._full = _FullRead(
            now, reading.kind, frozenset(reading.models), judged, dropped, samples[:hang_from], details, out
        )
        return out

    def _progress_fetch(
        self, url: str, deadline_s: float
    ) -> tuple[EngineReading, EngineReading | None, int, float, bool]:
        """A progress pass: the reading to use, the pass's own (None: it fell back to a full read), the body's bytes,
        the seconds the engine took to send it, and whether that body was the whole exposition (its size sets the
        next deadline)."""
        filtered = self._progress_url()
        started = time.perf_counter()
        scan = self._progress_scan(hold=filtered is None)
        try:
            size = fetch_into(
                self._client,
                url if filtered is None else filtered,
                deadline_s,
                self.cfg.max_bytes,
                scan,
                self.limits.max_series,
            )
        except EngineScrapeError as exc:
            if filtered is None or exc.reason not in ("http_status", "not_prometheus"):
                raise
            size = -1  # a server that refuses the query: read the plain URL in full, as below
        self._read_bytes = max(size, 0)
        progress = self._progress_reading(scan) if size >= 0 else None
        if progress is not None:
            return progress, progress, size, time.perf_counter() - started, filtered is None
        if filtered is None:
            return self.parser.parse(scan.body()), None, size, time.perf_counter() - started, True
        # the answer to the filtered query is never taken for the whole exposition: that is read from the plain URL
        self._filter_refused += 1
        self._filter_off_until = self._clock() + FILTER_RETRY_S
        self._filter_state = "paused"
        log.info(
            "engine progress pass: the answer to %s?name[]=... cannot stand for a full read; the passes read the "
            "whole exposition for %gs",
            url,
            FILTER_RETRY_S,
        )
        del scan
        reading, size, sent_s = self._full_fetch(url, deadline_s)
        return reading, None, size, sent_s, True

    def _full_fetch(self, url: str, deadline_s: float) -> tuple[EngineReading, int, float]:
        """A full read, parsed while it streams in (the body is never held; a limit stops the fetch at once): the
        reading, the body's bytes and the seconds the engine took to send it (the agent's parsing not counted)."""
        started = time.perf_counter()
        stream = self.parser.stream()
        timed = _Timed(stream)
        size = fetch_into(self._client, url, deadline_s, self.cfg.max_bytes, timed, self.limits.max_series)
        sent_s = time.perf_counter() - started - timed.spent_s
        self._read_bytes = size
        return stream.finish(), size, sent_s

    def _progress_scan(self, hold: bool = True) -> ProgressScan:
        """A progress pass over the body as it arrives (agent/node/engine/progress.py), for the engine kind of the
        last full read; ``hold``: keep the body for a full read of it."""
        return self._progress_reader().scan(hold)

    def _progress_reader(self) -> ProgressReader:
        last = self._full
        assert last is not None
        if self._progress is None or self._progress.kind != last.kind:
            self._progress = ProgressReader(last.kind, self.cfg.model_name or DEFAULT_MODEL, self.limits)
            import httpx  # the client's own import: already loaded by the full read before

            self._filter_url = httpx.URL(filtered_url(self.cfg.metrics_url or "", self._progress.names))
        return self._progress

    def _progress_url(self) -> httpx.URL | None:
        """The URL a progress pass asks for its families alone (None: the plain URL — the filter is off, or an answer
        to it could not stand for a full read less than :data:`FILTER_RETRY_S` ago)."""
        self._progress_reader()
        if not self.cfg.progress_filter:
            return None
        if self._filter_state == "paused":
            if self._clock() < self._filter_off_until:
                return None
            self._filter_state = "asked"
        return self._filter_url

    def _progress_reading(self, scan: ProgressScan) -> EngineReading | None:
        """The progress pass of ``scan``, limited to the models of the last full read; None when it cannot stand for
        a full read: its reader gave up, or a quantity the last full read gave hang detection (a rank's, or a
        model's request events) is missing from it (a series written in a form it does not take, such as a quoted
        name: the full read judges the body)."""
        last = self._full
        assert last is not None
        reading = scan.finish()
        if reading is None:
            return None
        reading.models = {name: m for name, m in reading.models.items() if name in last.models}
        reading.models_dropped = last.dropped  # the full read's count (it meets the models in its own order)
        return reading if last.judged <= _progress_shape(reading) else None

    def _progress_collection(self, now: float, reading: EngineReading) -> Collection:
        """The last full read's series with this pass's hang verdicts. It carries what the sinks made of the last
        collection (``rendered``): every series but the verdicts' are the same objects, which a sink reuses."""
        last = self._full
        assert last is not None
        verdicts = self.hang.update(now, reading, full=False)
        health = self._health() if any(v.stalled for v in verdicts) else "not_probed"
        samples = [*last.samples, *hang_samples(verdicts, health)]
        findings = hang_findings(verdicts, health, self.health_url)
        details = {
            **last.details,
            "hang": [hang_dict(v) for v in verdicts],
            "max_model_len": self._model_len_dict(),
            "read": self._read_dict("progress"),
        }
        out = Collection(samples=samples, findings=findings, details=details, rendered=dict(last.made.rendered))
        last.made = out
        return out

    def _read_dict(self, kind: str) -> dict[str, object]:
        last = self._full
        return {
            "kind": kind,  # full, or progress: the last full read's series, this pass's hang verdicts
            "full_at": last.at if last is not None and kind == "progress" else None,
            "progress_lines": self._progress.lines if self._progress is not None and kind == "progress" else None,
            "runs": dict(self.read_counts),
            "filter": self._filter_dict(),
        }

    def _filter_dict(self) -> dict[str, object]:
        """Whether the progress passes ask for their families alone (``asked``), read the whole exposition after an
        answer that could not stand for a full read (``paused``, ``until``: seconds), or never ask (``off``)."""
        paused = self._filter_state == "paused"
        return {
            "state": self._filter_state,
            "until": self._filter_off_until if paused else None,
            "refused": self._filter_refused,
        }

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
        import httpx  # a health URL is an engine URL's: the client's own import

        try:
            r = self._client.get(self.health_url, timeout=HEALTH_TIMEOUT_S)
        except httpx.HTTPError:
            return "failed"
        if r.status_code == 404:
            return "absent"
        return "ok" if r.status_code == 200 else "failed"

    def read_again_in(self) -> float | None:
        """Seconds until the hang detector's next verdict is due (a silent busy rank reaching its window), a little
        after, so the reading taken then is past it; None when no rank is waiting on one. The runner starts the next
        read by then if its cadence would come later (agent/node/engine/hang.py, "When to read next")."""
        at = self.hang.next_at
        return None if at is None else max(0.0, at - self._clock() + READ_AGAIN_MARGIN_S)

    def fetch_timeout_s(self) -> float:
        """The next read's fetch deadline, seconds (:func:`fetch_timeout_s`)."""
        return fetch_timeout_s(self.cfg.timeout_s, self._last_fetch, self._timed_out)

    def paces_cadence(self) -> bool:
        """Whether the last run's cost sets the next interval (the runner's adaptive cadence): not a full read made
        between progress passes, which comes once per ``full_every_s`` whatever the cadence; every run otherwise."""
        return self.full_every_s <= 0 or self._last_read != "full"

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

    @property
    def _client(self) -> httpx.Client:
        """The engine's HTTP client, made on the first request: an agent with no engine URL never imports httpx,
        httpcore or a TLS context (docs/benchmarks.md, "Where the megabytes go")."""
        with self._lock:
            if self._made_client is None:
                from inferwatch.agent.common.httpclient import http_client

                self._made_client = http_client("engine", self._retries)
            return self._made_client

    def close(self) -> None:
        self.join_model_len()  # bounded: the request's own timeout
        with self._lock:
            client, self._made_client = self._made_client, None
        if self._own_client and client is not None:
            client.close()


ENTRY = Entry(
    EngineCollector,
    order=50,
    sections=lambda s: (s.engine, s.interval_s),  # full reads at the agent's interval, progress passes between
    lane=None,
    configured=lambda s: bool(s.engine.metrics_url),
    needs="absent until `engine.metrics_url` or discovery is set",
    # hang detection's fast path needs two readings 6 s apart soon after the last token (agent/node/engine/hang.py);
    # a costly read (a large exposition: hundreds of models) backs off toward the agent's interval
    interval_s=lambda s: min(s.interval_s, DEFAULT_ENGINE_INTERVAL_S),
    slow_interval_s=lambda s: s.interval_s,
    # the fetch's own deadline plus the parse, not the 2 s interval: a large exposition's 2-5 s read is finished,
    # not cut (the runner starts the next run when a long one ends; the cadence then adapts)
    timeout_s=lambda s: min(s.engine.timeout_s * TIMEOUT_MAX_FACTOR, MAX_TIMEOUT_S) + TIMING_MARGIN_S,
)
