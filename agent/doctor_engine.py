"""Engine checks for ``inferwatch doctor --engine-url URL``: reachable, which engine, metrics present,
quantities absent, and the runtime's SIMD utilisation verdict.

``URL`` is the engine's base URL (``http://127.0.0.1:8080``) or its metrics URL (``.../metrics``). The
SIMD verdict is the ``simd`` collector's, run twice :data:`SIMD_WINDOW_S` apart by the doctor while
:func:`load` sends the engine a few short completions.
"""

from __future__ import annotations

import contextlib
import threading
import time
from collections.abc import Iterator
from dataclasses import dataclass
from typing import Any

import httpx

from agent.engine.adapters import detect
from agent.engine.fetch import EngineScrapeError
from agent.engine.scrape import EngineParser
from agent.redact import redact_text, redact_url
from agent.samples import Finding

SIMD_WINDOW_S = 2.0
FETCH_TIMEOUT_S = 5.0
MAX_METRICS_BYTES = 16 << 20

# Families the llama.cpp adapter reads; the server exposes them only with --metrics.
LLAMACPP_FAMILIES = (
    "llamacpp:prompt_tokens_total",
    "llamacpp:prompt_seconds_total",
    "llamacpp:tokens_predicted_total",
    "llamacpp:tokens_predicted_seconds_total",
    "llamacpp:requests_processing",
    "llamacpp:requests_deferred",
)
LLAMACPP_ABSENT = ("ttft", "itl", "e2e", "queue")  # no histograms: only means of prefill/decode from counters


@dataclass(frozen=True, slots=True)
class EngineProbe:
    base_url: str
    metrics_url: str
    status: int
    elapsed_s: float
    families: frozenset[str]
    kind: str | None
    unknown: EngineScrapeError | None = None  # no kind: why, as ``engine inspect`` says it (prefixes seen)


def split_url(url: str) -> tuple[str, str]:
    """(base URL, metrics URL) from either form."""
    url = url.rstrip("/")
    if url.endswith("/metrics"):
        return url[: -len("/metrics")], url
    return url, url + "/metrics"


def families(text: str) -> frozenset[str]:
    out = set()
    for line in text.splitlines():
        if line and not line.startswith("#"):
            name = line.split("{", 1)[0].split(" ", 1)[0]
            out.add(name)
    return frozenset(out)


def probe(url: str, client: httpx.Client | None = None) -> EngineProbe:
    base, metrics_url = split_url(url)
    own = client is None
    c = client or httpx.Client()
    try:
        start = time.perf_counter()
        r = c.get(metrics_url, timeout=FETCH_TIMEOUT_S)
        elapsed = time.perf_counter() - start
        text = r.content[:MAX_METRICS_BYTES].decode("utf-8", "replace") if r.status_code == 200 else ""
    finally:
        if own:
            c.close()
    names = families(text)
    kind = detect(text)
    return EngineProbe(base, metrics_url, r.status_code, elapsed, names, kind, None if kind else unknown(text))


def unknown(text: str) -> EngineScrapeError | None:
    """Why no engine is recognised in ``text``: the error ``engine inspect``'s parser raises on it."""
    try:
        EngineParser().parse(text.encode())
    except EngineScrapeError as exc:
        return exc
    return None


def engine_findings(url: str) -> list[Finding]:
    """reachable / kind / metrics / quantities findings for the engine at ``url``."""
    try:
        p = probe(url)
    except httpx.HTTPError as exc:
        shown = redact_url(split_url(url)[1])
        return [Finding("engine.reachable", "fail", redact_text(f"{shown}: {type(exc).__name__}: {exc}"))]
    shown, base = redact_url(p.metrics_url), redact_url(p.base_url)  # findings never carry credentials
    ev: dict[str, Any] = {"url": shown, "status": p.status, "elapsed_ms": round(p.elapsed_s * 1e3, 1)}
    if p.status != 200:
        hint = "llama-server exposes /metrics only when started with --metrics" if p.status == 501 else ""
        return [
            Finding("engine.reachable", "ok", f"{base} answers", ev),
            Finding("engine.metrics", "fail", f"{shown} answered HTTP {p.status}", {**ev, "hint": hint}),
        ]
    out = [Finding("engine.reachable", "ok", f"{shown} answered in {p.elapsed_s * 1e3:.0f} ms", ev)]
    if p.kind is None:
        why = p.unknown
        summary = redact_text(str(why)) if why else "no known engine families in the exposition"
        out.append(Finding("engine.kind", "warn", summary, {**ev, "reason": why.reason if why else "unknown_engine"}))
        return out
    out.append(Finding("engine.kind", "ok", f"engine: {p.kind} ({len(p.families)} series names)", {"kind": p.kind}))
    if p.kind == "llamacpp":
        missing = [f for f in LLAMACPP_FAMILIES if f not in p.families]
        status = "fail" if missing else "ok"
        summary = f"missing {', '.join(missing)}" if missing else f"all {len(LLAMACPP_FAMILIES)} families read"
        out.append(Finding("engine.metrics", status, summary, {"missing": missing}))
        out.append(
            Finding(
                "engine.quantities",
                "ok",
                f"absent (no histograms in llama.cpp): {', '.join(LLAMACPP_ABSENT)}; present: prefill and decode "
                "time per token as window means of the _seconds_total/_total counters",
                {"absent": list(LLAMACPP_ABSENT), "present": ["prefill", "decode"]},
            )
        )
    else:
        out.append(Finding("engine.metrics", "ok", f"{p.kind} families present", {"count": len(p.families)}))
    return out


def _load(base_url: str, stop: threading.Event) -> None:
    with httpx.Client() as c:
        while not stop.is_set():
            try:
                c.post(f"{base_url}/completion", json={"prompt": "doctor", "n_predict": 32}, timeout=10)
            except httpx.HTTPError:
                return


@contextlib.contextmanager
def load(url: str) -> Iterator[None]:
    """Send the engine short completions while the block runs (llama.cpp only: the one engine whose
    completion API needs no model name); any other engine is observed as it is."""
    base, _ = split_url(url)
    kind = None
    with contextlib.suppress(httpx.HTTPError):
        kind = probe(url).kind
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
