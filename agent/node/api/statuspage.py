"""The node status page's overview (a sink): everything the page at ``/`` shows, as plain JSON-able values
(:func:`build_overview`, also served as ``/api/v1/overview``), built when requested.

What it reads: the state's latest collections (engine timing, span analytics, CPU features, page cache, GPUs,
findings) and the runner's health record; the page history's lines and TTFT baselines
(:class:`~inferwatch.agent.node.api.pagehistory.PageHistory`) and each collection's index (:class:`PageIndex`: made
once per collection, ahead of the request while the page is watched), the parts kept between requests; the agent's own
CPU time and peak RSS from ``getrusage`` (no /proc). What it derives: each model's latency and signals (mirroring two
alert rules without their ``for:``), the TTFT histogram's window and modes, goodput, and the findings in order. The
HTML is :mod:`inferwatch.agent.node.api.statushtml`; cost: benchmarks/status_page.py. Behind the API's token rules
(scope ``read``).
"""

from __future__ import annotations

import bisect
import math
import resource
import threading
import time
from collections.abc import Callable, Iterable, Mapping, Sequence
from typing import Any

from inferwatch.agent import __version__
from inferwatch.agent.catalog.engine import GOODPUT_TTFT_TARGET_S
from inferwatch.agent.common.samples import AnySample, Collection, Finding, HistogramSample, Sample
from inferwatch.agent.node.api.display import fmt_seconds
from inferwatch.agent.node.api.pagehistory import CHART_QUANTILES, MODEL, TTFT_HISTOGRAM, PageHistory
from inferwatch.agent.node.api.pagehistory import attribute as _attr
from inferwatch.agent.node.state import AgentState, CollectorHealth

MAX_CHART_POINTS = 120  # drawn (and in /api/v1/overview) per line: 30 s apart over the hour
QUANTILE_KEYS = {"0.5": "p50", "0.95": "p95", "0.99": "p99"}
# Goodput from the histogram: the share of the window's requests whose first token came within the catalog's
# goodput TTFT target (the ttft-500ms SLO of alerts/slo.yml; a bucket edge of the engine's histogram). Where spans
# arrive, the exact figure (TTFT and time per output token both within target) is shown beside it.
GOODPUT_TTFT_S = GOODPUT_TTFT_TARGET_S
# The signals below mirror two alert rules (alerts/inferwatch.rules.yml) without their for:, so the page says
# what the agent sees now: LatencyBimodal (5m and 1m TTFT verdicts, >= 50 requests in 5m) and TailLatencyRatioHigh
# (histogram prefill P99/P50 over 5m above 3, >= 50 requests).
MIN_WINDOW_REQUESTS = 50
TAIL_RATIO_MAX = 3.0
# Modes of the drawn histogram (density per log-second): a bucket is a peak when it holds >= MODE_MIN_SHARE of
# the window's requests and is a local maximum; two peaks are two modes when the density between them falls to
# <= VALLEY_RATIO of the smaller (a page-cache stall leaves ~0 there; queueing on a busy host makes shallow dips of
# 0.3-0.5 next to the fast mode). The text next to the chart names them, for readers who cannot see the bars.
MODE_MIN_SHARE = 0.05
VALLEY_RATIO = 0.25
STATUS_ORDER = {"fail": 0, "warn": 1, "ok": 2, "skip": 3}
MAX_EVIDENCE_CHARS = 160


def _num(v: float | None) -> float | None:
    return None if v is None or not math.isfinite(v) else float(v)


_KEYED = ("quantity", "window", "source", "quantile")
Values = dict[str, dict[tuple[str, ...], float]]  # a family's values: model → (quantity, window, source, quantile)
PAGE_PART = "statuspage"  # the page's index of a collection, in its ``rendered`` (what a sink made of it)


class _Part:
    """One collection's samples indexed for the page, made once per collection and kept in its ``rendered`` (under
    :data:`PAGE_PART`) until the next one replaces it: the samples by name, and for each engine family the page asks
    for, when it first asks, its values by model and (quantity, window, source, quantile), its local-cache values by
    model and its attribute values. Requests while the state is unchanged index nothing again; a new collection (an
    engine read every few seconds) is indexed by the first request that sees it, or ahead by
    :meth:`PageIndex.on_collection`.

    ``samples``: the sequence indexed, checked by identity on use (a collection made from another keeps its
    ``rendered``, as the engine collector's progress passes do: their samples are another sequence, so they are
    indexed anew). Each family is indexed once: a second asker (a request, the listener) waits for the first."""

    __slots__ = ("_attr_values", "_by_model", "_lock", "_values", "by_name", "samples")

    def __init__(self, samples: Sequence[AnySample]) -> None:
        self.samples = samples
        self._lock = threading.Lock()  # a family is indexed once: a second asker waits for the first
        self.by_name: dict[str, list[AnySample]] = {}
        for s in samples:
            self.by_name.setdefault(s.name, []).append(s)
        self._values: dict[str, Values] = {}
        self._by_model: dict[str, dict[str, list[float]]] = {}
        self._attr_values: dict[tuple[str, str], frozenset[str]] = {}

    def values(self, name: str) -> Values:
        """model → (quantity, window, source, quantile) → value of the family's plain samples with a model (the last
        one where two have the same key); only engine families are indexed. The inner keys are shared by all models
        (a few dozen distinct), so the index kept for a 200-model engine is 1.35 MB, not 2.63 (tracemalloc)."""
        values = self._values.get(name)
        if values is None:
            with self._lock:
                values = self._values.get(name)
                if values is None:
                    values = self._values[name] = self._index(name)
        return values

    def _index(self, name: str) -> Values:
        values: Values = {}
        if not name.startswith("inferwatch.engine."):
            return values
        blanks = ("",) * len(_KEYED)
        keys: dict[tuple[str, ...], tuple[str, ...]] = {}
        for s in self.by_name.get(name, ()):
            if isinstance(s, Sample):
                a = dict(s.attributes)
                model = a.get(MODEL)
                if model is not None:
                    key = tuple(map(a.get, _KEYED, blanks))
                    per = values.get(model)
                    if per is None:
                        per = values[model] = {}
                    per[keys.setdefault(key, key)] = s.value
        return values

    def per_model(self, name: str) -> dict[str, list[float]]:
        """The values of the local-cache series of ``name`` (``cache`` "" or "local") by model, in sample order."""
        got = self._by_model.get(name)
        if got is None:
            with self._lock:
                got = self._by_model.get(name)
                if got is None:
                    got = {}
                    for s in self.by_name.get(name, ()):
                        if isinstance(s, Sample) and _attr(s, "cache") in ("", "local"):
                            got.setdefault(_attr(s, MODEL), []).append(s.value)
                    self._by_model[name] = got
        return got

    def attr_values(self, name: str, key: str) -> frozenset[str]:
        """The values of attribute ``key`` ("" where a sample has none) over the family ``name``."""
        got = self._attr_values.get((name, key))
        if got is None:
            with self._lock:
                got = self._attr_values.get((name, key))
                if got is None:
                    got = frozenset(_attr(s, key) for s in self.by_name.get(name, ()))
                    self._attr_values[(name, key)] = got
        return got


_PARTS_LOCK = threading.Lock()  # one part per collection: a request and the warming listener never both make it


def _part(collection: Collection) -> _Part:
    part = collection.rendered.get(PAGE_PART)
    if isinstance(part, _Part) and part.samples is collection.samples:
        return part
    with _PARTS_LOCK:
        part = collection.rendered.get(PAGE_PART)
        if not isinstance(part, _Part) or part.samples is not collection.samples:
            part = collection.rendered[PAGE_PART] = _Part(collection.samples)
    return part


class _Index:
    """The state's collections as the page reads them, for one request: each collection's :class:`_Part` (made once
    per collection) merged in the state's order, so each number on the page is one dict lookup and a request
    over an unchanged state indexes no sample. A family in one collection (every engine family of a node with one
    engine) is that collection's dicts, not a copy; the lists and dicts handed out are shared: read, never changed."""

    def __init__(self, collections: Mapping[str, Collection], asked: set[tuple[str, str, str]] | None = None) -> None:
        self._asked = set() if asked is None else asked  # what was asked: ("values" | "per_model" | "attr", name, key)
        self._parts = [_part(c) for c in collections.values()]
        self.by_name: dict[str, list[AnySample]] = {}
        for part in self._parts:
            for name, samples in part.by_name.items():
                had = self.by_name.get(name)
                self.by_name[name] = samples if had is None else [*had, *samples]
        self._values: dict[str, Values] = {}  # merged across parts, made on first use
        self._by_model: dict[str, dict[str, list[float]]] = {}

    def get(self, name: str) -> list[AnySample]:
        return self.by_name.get(name, [])

    def _holding(self, name: str) -> list[_Part]:
        return [p for p in self._parts if name in p.by_name]

    def value(
        self, name: str, model: str, quantity: str = "", window: str = "", source: str = "", quantile: str = ""
    ) -> float | None:
        values = self._values.get(name)
        if values is None:
            self._asked.add(("values", name, ""))
            parts = self._holding(name)
            if len(parts) == 1:
                values = parts[0].values(name)
            else:
                values = {}
                for p in parts:  # in the state's order: the last collection's value wins
                    for m, got in p.values(name).items():
                        had = values.get(m)
                        values[m] = got if had is None else {**had, **got}
            self._values[name] = values
        per = values.get(model)
        return None if per is None else _num(per.get((quantity, window, source, quantile)))

    def per_model(self, name: str) -> dict[str, list[float]]:
        """The values of the local-cache series of ``name`` (``cache`` "" or "local") by model, in sample order: one
        pass over the family (once per collection) for all the models of the page, not one per model."""
        got = self._by_model.get(name)
        if got is None:
            self._asked.add(("per_model", name, ""))
            parts = self._holding(name)
            if len(parts) == 1:
                got = parts[0].per_model(name)
            else:
                got = {}
                for p in parts:
                    for model, vals in p.per_model(name).items():
                        got.setdefault(model, []).extend(vals)
            self._by_model[name] = got
        return got

    def attr_values(self, name: str, key: str) -> set[str]:
        """The values of attribute ``key`` over the family ``name`` ("" where a sample has none)."""
        self._asked.add(("attr", name, key))
        out: set[str] = set()
        for p in self._holding(name):
            out |= p.attr_values(name, key)
        return out


WARM_S = 300.0  # after a page request, new collections are indexed ahead, in the collector's thread, this long


class PageIndex:
    """The page's reads of the state, between requests: each collection is indexed once (its :class:`_Part`, kept
    in the collection), and while the page is watched, ahead of the next request.

    :meth:`index` is a request's :class:`_Index`; it notes which families the page asked for.
    :meth:`on_collection`, a state listener, indexes those families of each new collection in the collector's
    thread when a page or overview was requested in the last ``warm_s`` (a 200-model engine read every few
    seconds and a page every few: otherwise nearly every request would index a new collection, ~20 ms of the
    interpreter on the serving path). Nobody watching, nothing is indexed ahead."""

    def __init__(self, warm_s: float = WARM_S, clock: Callable[[], float] = time.monotonic) -> None:
        self.warm_s = warm_s
        self._clock = clock
        self._asked: set[tuple[str, str, str]] = set()
        self._last_request = -math.inf

    def index(self, collections: Mapping[str, Collection]) -> _Index:
        self._last_request = self._clock()
        return _Index(collections, self._asked)

    def on_collection(self, name: str, collection: Collection) -> None:
        if self._clock() - self._last_request > self.warm_s:
            return
        part = _part(collection)
        for kind, family, key in list(self._asked):  # a copy: a request may add to it meanwhile
            if family not in part.by_name:
                continue
            if kind == "values":
                part.values(family)
            elif kind == "per_model":
                part.per_model(family)
            else:
                part.attr_values(family, key)


def log_widths(bounds: list[float]) -> list[float]:
    """ln(upper / lower) of each bucket (its width on a log axis); the first bucket (from 0) and ``+Inf`` take
    their neighbour's width."""
    w: list[float | None] = [
        math.log(bounds[i] / bounds[i - 1]) if i and bounds[i - 1] > 0 and math.isfinite(bounds[i]) else None
        for i in range(len(bounds))
    ]
    known = [x for x in w if x]
    fallback = known[0] if known else 1.0
    out: list[float] = []
    for i, x in enumerate(w):
        if x:
            out.append(x)
        else:
            near = [w[j] for j in (i + 1, i - 1) if 0 <= j < len(w) and w[j]]
            out.append(near[0] if near else fallback)  # type: ignore[arg-type]
    return out


def histogram_modes(bounds: list[float], counts: list[float]) -> list[int]:
    """Indexes of the buckets that are modes of the density on a log axis (count / log width: the engines'
    buckets are unequal, 20 ms next to 150 ms wide, so raw counts show dips that are not there); a mode holds
    >= :data:`MODE_MIN_SHARE` of the requests, and two are separate when the density between them falls to
    <= :data:`VALLEY_RATIO` of the smaller."""
    total = sum(counts)
    if total <= 0:
        return []
    d = [c / w for c, w in zip(counts, log_widths(bounds), strict=True)]
    floor = max(MODE_MIN_SHARE * total, 1.0)
    peaks = [
        i
        for i, c in enumerate(counts)
        if c >= floor and (i == 0 or d[i] > d[i - 1]) and (i == len(d) - 1 or d[i] >= d[i + 1])
    ]
    modes: list[int] = []
    for p in peaks:
        if modes:
            q = modes[-1]
            if min(d[q : p + 1]) > VALLEY_RATIO * min(d[q], d[p]):
                if d[p] > d[q]:
                    modes[-1] = p
                continue
        modes.append(p)
    return modes


def _bucket_label(bounds: list[float], i: int) -> str:
    lo = 0.0 if i == 0 else bounds[i - 1]
    hi = bounds[i]
    return f"{fmt_seconds(lo)}–{fmt_seconds(hi)}" if math.isfinite(hi) else f"> {fmt_seconds(lo)}"


def downsample(points: list[tuple[float, float | None, float | None, float | None]]) -> list[list[float | None]]:
    """At most :data:`MAX_CHART_POINTS`: consecutive points merged, each quantile the group's maximum (a P99
    spike stays visible), the time the group's last."""
    size = max(1, math.ceil(len(points) / MAX_CHART_POINTS))
    if size == 1:  # each group one point: the point itself
        return [list(p) for p in points]
    out: list[list[float | None]] = []
    for i in range(0, len(points), size):
        group = points[i : i + size]
        row: list[float | None] = [group[-1][0]]
        for k in (1, 2, 3):
            vals = [p[k] for p in group if p[k] is not None]
            row.append(max(vals) if vals else None)  # type: ignore[type-var]
        out.append(row)
    return out


def _ttft_histogram(
    model: str, current: HistogramSample | None, history: PageHistory, now: float
) -> dict[str, Any] | None:
    if current is None:
        return None
    cum = [c for _, c in current.buckets]
    bounds = [b for b, _ in current.buckets]
    base = history.baseline(model, now)
    window_s: float | None = None
    if base is not None and len(base[1]) == len(cum) and all(b <= c for (_, b), c in zip(base[1], cum, strict=True)):
        delta = [c - b for (_, b), c in zip(base[1], cum, strict=True)]
        if delta[-1] > 0:
            cum, window_s = delta, now - base[0]
    counts = [cum[0]] + [max(cum[i] - cum[i - 1], 0.0) for i in range(1, len(cum))]
    modes = histogram_modes(bounds, counts)
    good_i = bisect.bisect_left(bounds, GOODPUT_TTFT_S)
    total = cum[-1]
    within = cum[good_i] if good_i < len(cum) and bounds[good_i] == GOODPUT_TTFT_S else None
    return {
        "bounds": [b if math.isfinite(b) else None for b in bounds],
        "counts": counts,
        "total": total,
        "window_s": window_s,
        "modes": [{"index": i, "range": _bucket_label(bounds, i), "count": counts[i]} for i in modes],
        "goodput": {
            "threshold_s": GOODPUT_TTFT_S,
            "ratio": (within / total) if within is not None and total > 0 else None,
            "per_s": (within / window_s) if within is not None and window_s else None,
        },
    }


def _latency(ix: _Index, model: str, quantity: str, window: str) -> dict[str, Any] | None:
    """P50/P95/P99 of one quantity, from the engine's histogram when it has one, else from spans."""
    name = "inferwatch.engine.latency"
    for source in ("histogram", "spans"):
        qs = {QUANTILE_KEYS[q]: ix.value(name, model, quantity, window, source, q) for q in CHART_QUANTILES}
        if any(v is not None for v in qs.values()):
            return {"source": source, "window": window, **qs}
    return None


def _per_model_value(ix: _Index, name: str, model: str, **want: str) -> float | None:
    return ix.value(name, model, **want)


def _signals(model: str, ix: _Index, sources: Iterable[str]) -> list[dict[str, Any]]:
    out: list[dict[str, Any]] = []
    for source in sources:
        on5 = _per_model_value(
            ix, "inferwatch.engine.latency.bimodal", model, quantity="ttft", window="5m", source=source
        )
        on1 = _per_model_value(
            ix, "inferwatch.engine.latency.bimodal", model, quantity="ttft", window="1m", source=source
        )
        n5 = _per_model_value(
            ix, "inferwatch.engine.latency.samples", model, quantity="ttft", window="5m", source=source
        )
        if on5 == 1 and on1 == 1 and (n5 or 0) >= MIN_WINDOW_REQUESTS:
            d = _per_model_value(
                ix, "inferwatch.engine.latency.bimodality", model, quantity="ttft", window="5m", source=source
            )
            out.append(
                {
                    "id": f"latency.bimodal/{model}",
                    "status": "warn",
                    "summary": f"{model}: TTFT is bimodal (a slow path or a slow node serves part of the requests)",
                    "evidence": f"Ashman's D {d or 0:.2f} over 5m and the 1m window bimodal too, "
                    f"{n5:.0f} requests ({source})",
                    "runbook": "LatencyBimodal",
                    "origin": "signal",
                }
            )
            break
    ratio = _per_model_value(
        ix, "inferwatch.engine.latency.tail_ratio", model, quantity="prefill", window="5m", source="histogram"
    )
    n = _per_model_value(
        ix, "inferwatch.engine.latency.samples", model, quantity="prefill", window="5m", source="histogram"
    )
    if ratio is not None and ratio > TAIL_RATIO_MAX and (n or 0) >= MIN_WINDOW_REQUESTS:
        out.append(
            {
                "id": f"latency.tail_ratio/{model}",
                "status": "warn",
                "summary": f"{model}: prefill P99 is {ratio:.1f}x its P50 (jitter more resources will not fix)",
                "evidence": f"prefill P99/P50 {ratio:.2f} > {TAIL_RATIO_MAX:g} over 5m, {n:.0f} requests (histogram)",
                "runbook": "TailLatencyRatioHigh",
                "origin": "signal",
            }
        )
    return out


def _prefix_hit_ratio(ix: _Index, model: str) -> float | None:
    """Local prefix-cache hits / lookups since the engine started (the counters; rates are recording rules)."""
    sums = {}
    for name in ("inferwatch.engine.prefix_cache.hits", "inferwatch.engine.prefix_cache.queries"):
        vals = ix.per_model(name).get(model)
        sums[name] = sum(vals) if vals else None
    hits, queries = sums.values()
    return hits / queries if hits is not None and queries else None


def _tail_driver(ix: _Index, model: str) -> dict[str, Any] | None:
    """The tail explainer's TTFT verdict over 5m (docs/explain.md): the phase behind the slowest 2 %."""
    for s in ix.get("inferwatch.engine.tail.driver"):
        if (
            isinstance(s, Sample)
            and _attr(s, MODEL) == model
            and _attr(s, "quantity") == "ttft"
            and _attr(s, "window") == "5m"
        ):
            return {"phase": _attr(s, "phase"), "attribute": _attr(s, "attribute"), "share": _num(s.value)}
    return None


def evidence_line(evidence: Mapping[str, object]) -> str:
    parts = []
    for k, v in evidence.items():
        if isinstance(v, (dict, list, tuple)):
            continue
        parts.append(f"{k}={v}")
    line = ", ".join(parts)
    return line if len(line) <= MAX_EVIDENCE_CHARS else line[: MAX_EVIDENCE_CHARS - 1] + "…"


def _finding(f: Finding) -> dict[str, Any]:
    return {
        "id": f.id,
        "status": f.status,
        "summary": f.summary,
        "evidence": evidence_line(f.evidence),
        "runbook": f.runbook,
        "origin": "agent",
    }


def _models(ix: _Index, collections: Mapping[str, Collection]) -> list[str]:
    engine = collections.get("engine")
    names = {str(m) for m in engine.details.get("models", ())} if engine is not None else set()
    names |= ix.attr_values("inferwatch.engine.info", MODEL)
    names |= ix.attr_values("inferwatch.engine.latency", MODEL)
    return sorted(n for n in names if n)


def _gpus(ix: _Index) -> list[dict[str, Any]]:
    gpus: dict[str, dict[str, Any]] = {}
    fields = {
        "hw.gpu.utilization": "utilization_ratio",
        "hw.gpu.memory.usage": "memory_used_bytes",
        "hw.gpu.memory.limit": "memory_limit_bytes",
        "inferwatch.gpu.temperature": "temperature_celsius",
        "inferwatch.gpu.power": "power_watts",
    }
    for name, key in fields.items():
        for s in ix.get(name):
            if isinstance(s, Sample) and not _attr(s, "hw.parent"):
                g = gpus.setdefault(_attr(s, "hw.id"), {"id": _attr(s, "hw.id"), "model": _attr(s, "hw.model")})
                g[key] = _num(s.value)
    for s in ix.get("inferwatch.gpu.throttle"):
        if isinstance(s, Sample) and s.value and _attr(s, "hw.id") in gpus:
            gpus[_attr(s, "hw.id")].setdefault("throttle", []).append(_attr(s, "reason") or "yes")
    return [gpus[k] for k in sorted(gpus)]


def _features(ix: _Index) -> list[dict[str, Any]]:
    """CPU features: expected for this CPU model, present on the node, and, where the runtime's profile says which
    it was compiled for, whether its kernels use them (``runtime``: active | inactive, the silent fallback)."""
    present = {_attr(s, "feature"): bool(s.value) for s in ix.get("inferwatch.cpu.feature.present")}  # type: ignore[union-attr]
    missing = {_attr(s, "feature"): s for s in ix.get("inferwatch.cpu.feature.missing")}
    inactive = {_attr(s, "feature"): bool(s.value) for s in ix.get("inferwatch.runtime.profile.simd_inactive")}  # type: ignore[union-attr]
    rows = []
    for feature in sorted(set(present) | set(missing) | set(inactive)):
        m = missing.get(feature)
        expected = m is not None
        is_missing = bool(m.value) if isinstance(m, Sample) else False
        rows.append(
            {
                "feature": feature,
                "expected": expected,
                "present": present.get(feature, not is_missing if expected else None),
                "missing": is_missing,
                "detected_by": _attr(m, "detected_by") if m is not None else "",
                "runtime": "" if feature not in inactive else "inactive" if inactive[feature] else "active",
            }
        )
    rows.sort(key=lambda r: (not r["missing"], r["runtime"] != "inactive", not r["expected"], r["feature"]))
    return rows


def _memory(ix: _Index, findings: list[Finding]) -> dict[str, Any]:
    out: dict[str, Any] = {}
    for f in findings:
        if f.id == "pagecache":
            out.update({"status": f.status, "summary": f.summary})
            for k in ("inactive_file_bytes", "threshold_bytes", "mem_available_bytes", "psi_memory_some_avg10_ratio"):
                if k in f.evidence:
                    out[k] = f.evidence[k]
    for s in ix.get("inferwatch.pressure.memory.avg"):
        if isinstance(s, Sample):
            out[f"psi_{_attr(s, 'kind') or 'some'}_{_attr(s, 'window') or ''}".rstrip("_")] = _num(s.value)
    return out


def _health(h: CollectorHealth, now: float) -> dict[str, Any]:
    return {
        "name": h.name,
        "state": h.state,
        "last_success_age_s": None if h.last_success_at is None else max(now - h.last_success_at, 0.0),
        "duration_s": h.duration_s,
        "runs": h.runs,
        "errors": h.errors,
        "last_error": h.last_error,
        "hint": h.hint,
    }


def agent_usage(started_at: float, now: float) -> dict[str, Any]:
    """The agent process's CPU seconds (user + system), its average share of a core, and its peak RSS."""
    ru = resource.getrusage(resource.RUSAGE_SELF)
    cpu = ru.ru_utime + ru.ru_stime
    uptime = max(now - started_at, 1e-9)
    return {
        "cpu_seconds": cpu,
        "cpu_core_share": cpu / uptime,
        "peak_rss_bytes": ru.ru_maxrss * 1024,  # Linux: KiB
        "uptime_s": uptime,
    }


PAGE_MODELS = 20  # model cards on the page by default: a node serving 200 models gets 20 cards and a link to all


def build_overview(
    state: AgentState,
    history: PageHistory,
    now: float | None = None,
    max_models: int | None = None,
    pages: PageIndex | None = None,
) -> dict[str, Any]:
    """Everything the page shows, as JSON-able values (also served as ``/api/v1/overview``).

    ``max_models``: at most that many model cards (``models``), those with a signal first, then by name; every
    model's signals are in ``findings`` whatever is left out, and ``models_total`` counts them all. A model's card is
    most of the page's cost (its latency, history lines and histogram): at 200 models the whole page took ~65 ms of
    CPU and 1 MB, which nobody reads on one screen. ``pages``: the route's :class:`PageIndex` (the index made
    ahead while the page is watched); without it a request still indexes each collection only once."""
    now = time.time() if now is None else now
    collections = state.collections()
    ix = _Index(collections) if pages is None else pages.index(collections)
    findings = [f for c in collections.values() for f in c.findings]
    ident = state.identity
    node_info = next(iter(ix.get("inferwatch.node.info")), None)
    node = {
        "host_name": ident.get("host.name", ""),
        "machine_type": ident.get("host.type") or (_attr(node_info, "machine_type") if node_info else ""),
        "cpu_model": ident.get("host.cpu.model.name") or (_attr(node_info, "cpu_model") if node_info else ""),
        "arch": ident.get("host.arch", ""),
        "kernel": ident.get("os.version") or (_attr(node_info, "kernel_release") if node_info else ""),
        "environment": state.environment,
    }
    engines = {_attr(s, MODEL): _attr(s, "engine") for s in ix.get("inferwatch.engine.info")}
    hists = {_attr(s, MODEL): s for s in ix.get(TTFT_HISTOGRAM) if isinstance(s, HistogramSample)}
    sources = sorted(ix.attr_values("inferwatch.engine.latency.bimodal", "source"))
    models = []
    names = _models(ix, collections)
    by_model = {model: _signals(model, ix, sources) for model in names}
    signals: list[dict[str, Any]] = [s for model in names for s in by_model[model]]
    shown = sorted(names, key=lambda m: (not by_model[m], m))[:max_models] if max_models is not None else names
    for model in sorted(shown):
        latency = {q: _latency(ix, model, q, "1m") for q in ("ttft", "itl")}
        lines = {}
        for q, cur in latency.items():
            src = cur["source"] if cur else "histogram"
            lines[q] = downsample(history.line(model, q, src))
        bimodal = {
            src: _per_model_value(
                ix, "inferwatch.engine.latency.bimodal", model, quantity="ttft", window="5m", source=src
            )
            for src in sources
        }
        models.append(
            {
                "model": model,
                "engine": engines.get(model, ""),
                "latency": latency,
                "history": lines,
                "tail_ratio": {
                    q: _per_model_value(
                        ix, "inferwatch.engine.latency.tail_ratio", model, quantity=q, window="5m", source="histogram"
                    )
                    for q in ("ttft", "prefill")
                },
                "bimodal_ttft_5m": {k: v for k, v in bimodal.items() if v is not None},
                "ttft_histogram": _ttft_histogram(model, hists.get(model), history, now),
                "kv_cache_usage_ratio": _per_model_value(ix, "inferwatch.engine.kv_cache.usage", model),
                "requests_running": _per_model_value(ix, "inferwatch.engine.requests.running", model),
                "requests_waiting": _per_model_value(ix, "inferwatch.engine.requests.waiting", model),
                "preemptions_total": _per_model_value(ix, "inferwatch.engine.preemptions", model),
                "prefix_cache_hit_ratio": _prefix_hit_ratio(ix, model),
                "goodput_exact_5m": ix.value("inferwatch.engine.goodput", model, window="5m", source="spans"),
                "tail_driver": _tail_driver(ix, model),
            }
        )
    all_findings = [*signals, *(_finding(f) for f in findings)]
    all_findings.sort(key=lambda f: (STATUS_ORDER.get(f["status"], 9), f["id"]))
    return {
        "version": __version__,
        "generated_at": now,
        "node": node,
        "gpus": _gpus(ix),
        "cpu_features": _features(ix),
        "memory": _memory(ix, findings),
        "engine_schema": _engine_schema(ix),
        "engines": _engines(state, collections, ix, now),
        "models": models,
        "models_total": len(names),
        "findings": all_findings,
        "collectors": [_health(h, now) for h in sorted(state.health().values(), key=lambda h: h.name)],
        "agent": agent_usage(state.started_at, now),
    }


def _engines(state: AgentState, collections: Mapping[str, Collection], ix: _Index, now: float) -> list[dict[str, Any]]:
    """Each engine the agent watches: the single configured one (collector ``engine``) and each discovered target
    (``engine:<name>``, agent/node/targets.py) with its identity, collector state, ``up`` and models. ``up`` is
    the last of the state's samples (its collections', then the attached sources', where the collectors put it)."""
    discovered = collections.get("discovery")
    targets = {f"engine:{t['name']}": t for t in (discovered.details.get("targets", ()) if discovered else ())}
    ups = {
        _attr(s, "inferwatch.engine.name"): s.value
        for s in (*ix.get("inferwatch.engine.up"), *state.loose_samples())
        if isinstance(s, Sample) and s.name == "inferwatch.engine.up"
    }
    out = []
    for h in sorted(state.health().values(), key=lambda h: h.name):
        if h.name != "engine" and not h.name.startswith("engine:"):
            continue
        t = targets.get(h.name, {})
        # a target's name is its collector's (engine:<name>), also before the discovery's collection is recorded
        name = "" if h.name == "engine" else t.get("name") or h.name.partition(":")[2]
        collection = collections.get(h.name)
        up = ups.get(name)
        out.append(
            {
                "name": name or "engine",
                "collector": h.name,
                "namespace": t.get("namespace", ""),
                "pod": t.get("pod", ""),
                "container": t.get("container", ""),
                "source": t.get("source", "settings"),
                "kind": str(collection.details.get("engine", "")) if collection else t.get("kind", ""),
                "state": h.state,
                "up": None if up is None else float(up),
                "models": [str(m) for m in collection.details.get("models", ())] if collection else [],
                "last_success_age_s": None if h.last_success_at is None else max(now - h.last_success_at, 0.0),
                "last_error": h.last_error if h.state == "failed" else None,
                "hint": h.hint,
            }
        )
    return out


def _engine_schema(ix: _Index) -> dict[str, Any] | None:
    """The release range and schema the engine collector recognised, with how many claimed quantities it maps or
    derives and how many of the engine's families it does not read (docs/engine.md); None before a good scrape."""
    info = next(iter(ix.get("inferwatch.engine.schema.info")), None)
    if info is None:
        return None
    recognised = next(iter(ix.get("inferwatch.engine.quantities.recognised")), None)
    unmapped = next(iter(ix.get("inferwatch.engine.unmapped_families")), None)
    return {
        "engine": _attr(info, "engine"),
        "release_range": _attr(info, "release_range"),
        "schema": _attr(info, "schema"),
        "quantities_recognised": recognised.value if isinstance(recognised, Sample) else None,
        "unmapped_families": unmapped.value if isinstance(unmapped, Sample) else None,
    }
