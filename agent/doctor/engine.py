"""Engine checks for ``inferwatch doctor --engine-url URL``, read from the ``engine`` collector's own run.

The doctor runs the registered ``engine`` collector once (``engine.metrics_url`` set from ``URL``) and
:func:`engine_findings` says what its result means for a gate: reachable, which engine, whether the
families its adapter maps (:data:`inferwatch.agent.node.engine.adapters.ADAPTERS`) are exposed, and which timing
quantities this engine cannot give. Nothing is fetched or parsed here: the collector's fetch, parser and
detection decide, as they do in the agent.

``URL`` is the engine's base URL (``http://127.0.0.1:8080``) or its metrics URL (``.../metrics``). The
SIMD verdict is the ``simd`` collector's, run twice :data:`SIMD_WINDOW_S` apart by the doctor while
:func:`load` sends a llama.cpp engine a few short completions.
"""

from __future__ import annotations

import contextlib
import threading
from collections.abc import Iterator, Mapping
from dataclasses import dataclass
from typing import Any

import httpx

from inferwatch.agent.common.httpclient import http_client
from inferwatch.agent.common.redact import redact_text, redact_url
from inferwatch.agent.common.samples import Collection, Finding
from inferwatch.agent.node.engine.adapters import ADAPTERS, FEATURE_QUANTITIES
from inferwatch.agent.node.engine.derived import TOKEN_TIME
from inferwatch.agent.node.engine.fetch import EngineScrapeError
from inferwatch.agent.node.engine.inspect import INSPECT_QUANTITIES

SIMD_WINDOW_S = 2.0
UNREACHABLE = ("connect", "timeout")  # the engine did not answer at all
NOT_AN_ENGINE = ("unknown_engine", "not_prometheus")  # it answered, but with no known engine's exposition
HTTP_STATUS_HINT = (
    "is the URL the engine's metrics endpoint? llama-server serves /metrics only when started with --metrics "
    "(HTTP 501 without it)"
)


@dataclass(frozen=True, slots=True)
class EngineRun:
    """One run of the ``engine`` collector: its collection, or the error it raised; wall seconds."""

    metrics_url: str
    elapsed_s: float
    collection: Collection | None
    error: Exception | None = None


def split_url(url: str) -> tuple[str, str]:
    """(base URL, metrics URL) from either form."""
    url = url.rstrip("/")
    if url.endswith("/metrics"):
        return url[: -len("/metrics")], url
    return url, url + "/metrics"


def engine_findings(run: EngineRun) -> list[Finding]:
    """reachable / kind / metrics / quantities findings from the engine collector's run, plus its own findings."""
    shown = redact_url(run.metrics_url)  # findings never carry credentials
    ev: dict[str, Any] = {"url": shown, "elapsed_ms": round(run.elapsed_s * 1e3, 1)}
    if run.collection is None:
        return _failed(run.error, shown, ev)
    details = run.collection.details
    kind = str(details.get("engine", ""))
    out = [
        Finding("engine.reachable", "ok", f"{shown} answered in {run.elapsed_s * 1e3:.0f} ms", {**ev, "status": 200}),
        Finding("engine.kind", "ok", f"engine: {kind} ({details.get('series_read', 0)} series read)", {"kind": kind}),
    ]
    read = _read_quantities(details)
    out.append(_metrics_finding(kind, read))
    out.append(_quantities_finding(kind, read))
    return out + list(run.collection.findings)


def _failed(error: Exception | None, shown: str, ev: dict[str, Any]) -> list[Finding]:
    message = redact_text(str(error))
    reason = error.reason if isinstance(error, EngineScrapeError) else "exception"
    if not isinstance(error, EngineScrapeError):
        message = redact_text(f"{type(error).__name__}: {error}")
    if reason in UNREACHABLE:
        return [Finding("engine.reachable", "fail", message, {**ev, "reason": reason})]
    out = [Finding("engine.reachable", "ok", f"{shown} answers", ev)]
    if reason in NOT_AN_ENGINE:
        return [*out, Finding("engine.kind", "warn", message, {**ev, "reason": reason})]
    hint = HTTP_STATUS_HINT if reason == "http_status" else ""
    return [*out, Finding("engine.metrics", "fail", message, {**ev, "reason": reason, "hint": hint})]


def _read_quantities(details: Mapping[str, Any]) -> set[str]:
    """Every adapter quantity (histogram, gauge or counter) the collector read, over all models."""
    per_model = details.get("quantities") or {}
    return {q for names in per_model.values() for q in names}


def _metrics_finding(kind: str, read: set[str]) -> Finding:
    """Are the families the engine's adapter maps exposed? None read: the agent gets nothing from this engine."""
    adapter = ADAPTERS[kind]
    mapped = {**adapter.histograms, **adapter.gauges, **adapter.counters}
    optional = {**FEATURE_QUANTITIES, **{q: f"{q} (some {kind} builds)" for q in adapter.build_dependent}}
    core = {q: cands for q, cands in mapped.items() if q not in optional}
    missing = {q: [src.name for src in cands] for q, cands in core.items() if q not in read}
    families = sorted({name for names in missing.values() for name in names})
    features_off = sorted({optional[q] for q in mapped if q in optional and q not in read})
    evidence = {"missing": families, "quantities_missing": sorted(missing), "features_not_exposed": features_off}
    if not read:
        return Finding("engine.metrics", "fail", f"no family the {kind} adapter maps has a sample", evidence)
    off = f"; not exposed (feature off or an older engine): {', '.join(features_off)}" if features_off else ""
    if not missing:
        return Finding(
            "engine.metrics", "ok", f"all {len(core)} core quantities the {kind} adapter maps read{off}", evidence
        )
    listed = "; ".join(f"{q} ({' | '.join(names)})" for q, names in sorted(missing.items()))
    return Finding("engine.metrics", "warn", f"not exposed by this {kind} engine: {listed}{off}", evidence)


def _quantities_finding(kind: str, read: set[str]) -> Finding:
    """Which timing quantities the agent gets from this engine: from histograms, or per token from counters."""
    histograms = [q for q in INSPECT_QUANTITIES if q in read and q in ADAPTERS[kind].histograms]
    counters = [q for q, names in TOKEN_TIME.items() if q not in histograms and set(names) <= read]
    absent = [q for q in INSPECT_QUANTITIES if q not in histograms and q not in counters]
    parts = [f"absent: {', '.join(absent) or 'none'}", f"from histograms: {', '.join(histograms) or 'none'}"]
    if counters:
        parts.append(f"time per token as window means of counters: {', '.join(counters)}")
    return Finding(
        "engine.quantities",
        "ok",
        "; ".join(parts),
        {"absent": absent, "present": histograms + counters, "from_counters": counters},
    )


def _load(base_url: str, stop: threading.Event) -> None:
    with http_client("doctor", trust_env=True) as c:
        while not stop.is_set():
            try:
                c.post(f"{base_url}/completion", json={"prompt": "doctor", "n_predict": 32}, timeout=10)
            except httpx.HTTPError:
                return


@contextlib.contextmanager
def load(url: str, kind: str | None) -> Iterator[None]:
    """Send the engine short completions while the block runs (``kind`` llama.cpp only: the one engine whose
    completion API needs no model name); any other engine is observed as it is."""
    base, _ = split_url(url)
    stop = threading.Event()
    loader = threading.Thread(target=_load, args=(base, stop), daemon=True) if kind == "llamacpp" else None
    if loader is not None:
        loader.start()
    try:
        yield
    finally:
        stop.set()
        if loader is not None:
            loader.join(15)
