"""The engine's maximum model length, asked of the engine itself (the hang detector's allowance needs it).

``GET /v1/models`` on the metrics URL's origin (vLLM, SGLang: ``max_model_len`` per model) or ``GET /props``
for llama.cpp (its per-slot ``n_ctx``), bounded in bytes and time; an answer is the lengths or the reason
there are none (:data:`MODEL_LEN_REASONS`). When to ask is the engine collector's business.
"""

from __future__ import annotations

import json
import time
from dataclasses import dataclass
from typing import TYPE_CHECKING, TypeGuard

if TYPE_CHECKING:  # imported where an engine URL is read: no engine URL, no httpx
    import httpx

MODEL_LEN_TIMEOUT_S = 2.0  # GET /v1/models or /props: a small JSON document, asked off the scrape
MODEL_LEN_MAX_BYTES = 1 << 20  # a model list with thousands of LoRA adapters still fits
MODEL_LEN_RETRY_S = 300.0  # after no answer (or none with a length), asked again at most this often
MODEL_LEN_MIN_GAP_S = 60.0  # an engine that flaps up and down is asked at most once a minute
MODEL_LEN_PATHS = {"llamacpp": "/props"}  # every other engine: the OpenAI-compatible /v1/models
MODEL_LEN_REASONS = ("connect", "timeout", "http_status", "too_large", "not_json", "absent")


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
    import httpx

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
    import httpx  # the client's own import: already loaded

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
