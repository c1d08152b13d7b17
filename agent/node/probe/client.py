"""One synthetic streamed request: send, read the SSE stream, time it, validate every event.

Client-side timings (monotonic): ``ttft_s`` from sending the request to the first event carrying
generated text, ``itl_s`` the mean gap between consecutive text-bearing events, ``duration_s`` until the
stream ended. HTTP errors are classified by the error type in the body (OpenAI ``{"error": {"type"}}``,
Anthropic ``{"type": "error", "error": {"type"}}``); ``hardware_mismatch`` keeps its own type.
"""

from __future__ import annotations

import json
import re
import time
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any

from inferwatch.agent.common.redact import redact_text, redact_url
from inferwatch.agent.node.probe.schema import OrderChecker, Violation, validate_payload
from inferwatch.agent.node.probe.sse import SSEParser

if TYPE_CHECKING:  # httpx is imported by the first probe: no probe URL, no httpx
    import httpx

PROTOCOLS = ("openai", "anthropic")
PATHS = {"openai": "/v1/chat/completions", "anthropic": "/v1/messages"}
ANTHROPIC_VERSION = "2023-06-01"
MAX_VIOLATIONS = 100
MAX_ERROR_BODY_BYTES = 64 * 1024
DISCOVERY_TIMEOUT_S = 2.0
FALLBACK_MODEL = "default"
_ERROR_TYPE = re.compile(r"^[A-Za-z][A-Za-z0-9_]{0,47}$")


@dataclass
class ProbeResult:
    protocol: str
    url: str
    ok: bool = False
    status_code: int | None = None
    ttft_s: float | None = None
    itl_s: float | None = None
    duration_s: float | None = None
    events: int = 0
    text_events: int = 0
    text: str = ""
    error_type: str | None = None  # set when the request failed (HTTP error, connect, timeout, stream error)
    error_message: str | None = None
    violations: list[Violation] = field(default_factory=list)

    def violation_counts(self) -> dict[str, int]:
        out: dict[str, int] = {}
        for v in self.violations:
            out[v.kind] = out.get(v.kind, 0) + 1
        return out

    def as_dict(self) -> dict[str, Any]:
        return {
            "protocol": self.protocol,
            "url": self.url,
            "ok": self.ok,
            "status_code": self.status_code,
            "ttft_s": self.ttft_s,
            "itl_s": self.itl_s,
            "duration_s": self.duration_s,
            "events": self.events,
            "text_events": self.text_events,
            "error_type": self.error_type,
            "error_message": self.error_message,
            "violations": [
                {
                    "kind": v.kind,
                    "message": v.message,
                    "event": v.event_index,
                    "schema_path": v.schema_path,
                    "instance_path": v.instance_path,
                }
                for v in self.violations
            ],
        }


def endpoint(url: str, protocol: str) -> str:
    """The request URL: ``url`` as given when it already names the API path, else base + path."""
    if url.rstrip("/").endswith(PATHS[protocol]):
        return url.rstrip("/")
    base = url.rstrip("/")
    for suffix in ("/v1/chat/completions", "/v1/messages", "/v1"):
        if base.endswith(suffix):
            base = base[: -len(suffix)]
            break
    return base + PATHS[protocol]


def discover_model(http: httpx.Client, url: str, timeout_s: float) -> str | None:
    """The first model id of ``GET /v1/models`` (OpenAI list shape), or None."""
    import httpx  # the client's own import: already loaded

    base = endpoint(url, "openai").removesuffix(PATHS["openai"])
    try:
        r = http.get(base + "/v1/models", timeout=min(timeout_s, DISCOVERY_TIMEOUT_S))
        data = r.json().get("data") if r.status_code == 200 and len(r.content) <= MAX_ERROR_BODY_BYTES else None
    except (httpx.HTTPError, ValueError, AttributeError):
        return None
    if isinstance(data, list) and data and isinstance(data[0], dict) and isinstance(data[0].get("id"), str):
        return str(data[0]["id"])
    return None


def request_body(protocol: str, model: str, prompt: str, max_tokens: int) -> dict[str, Any]:
    body: dict[str, Any] = {
        "model": model,
        "messages": [{"role": "user", "content": prompt}],
        "max_tokens": max_tokens,
        "stream": True,
    }
    if protocol == "openai":
        body["stream_options"] = {"include_usage": True}
    return body


def error_type_of(status: int, body: bytes) -> tuple[str, str]:
    """(error_type, message) from an error body; ``http_<status>`` when the body names no type."""
    try:
        data = json.loads(body.decode("utf-8"))
    except (UnicodeDecodeError, ValueError):
        return f"http_{status}", body[:200].decode("utf-8", "replace")
    err = data.get("error") if isinstance(data, dict) else None
    if isinstance(err, dict):
        etype, msg = err.get("type"), err.get("message", "")
        if isinstance(etype, str) and _ERROR_TYPE.match(etype):
            return etype.lower(), str(msg)[:300]
        return f"http_{status}", str(msg)[:300]
    return f"http_{status}", str(data)[:200]


def _text_of(protocol: str, payload: Any) -> str:
    if not isinstance(payload, dict):
        return ""
    if protocol == "openai":
        parts = []
        for ch in payload.get("choices") or []:
            delta = ch.get("delta") if isinstance(ch, dict) else None
            content = delta.get("content") if isinstance(delta, dict) else None
            if isinstance(content, str):
                parts.append(content)
        return "".join(parts)
    if payload.get("type") == "content_block_delta":
        delta = payload.get("delta")
        text = delta.get("text") if isinstance(delta, dict) else None
        return text if isinstance(text, str) else ""
    return ""


class _Stream:
    """Validation state of one stream."""

    def __init__(self, result: ProbeResult) -> None:
        self.r = result
        self.order = OrderChecker(result.protocol)
        self.text_times: list[float] = []
        self.order_reported = False

    def add(self, v: Violation) -> None:
        if len(self.r.violations) < MAX_VIOLATIONS:
            self.r.violations.append(v)

    def event(self, ev: Any, index: int, started: float) -> None:
        proto = self.r.protocol
        self.r.events += 1
        if ev.data is None:
            self.add(Violation("non_utf8", f"event {index} is not valid UTF-8 ({len(ev.raw)} bytes)", index))
            return
        if proto == "openai" and ev.data.strip() == "[DONE]":
            if self.order.done and not self.order_reported:
                self.order_reported = True
                self.add(Violation("wrong_event_order", "second [DONE]", index))
            self.order.terminate_openai()
            return
        try:
            payload = json.loads(ev.data)
        except ValueError as exc:
            self.add(Violation("malformed_json", f"event {index}: {exc}: {ev.data[:80]!r}", index))
            return
        except RecursionError:  # json.loads raises it, not ValueError, for arrays nested ~1000 deep
            self.add(Violation("malformed_json", f"event {index}: nested too deeply to decode", index))
            return
        try:
            self._payload(payload, ev, index, started)
        except RecursionError:  # decoded, but too deep for the schema validator's recursion
            self.add(Violation("schema", f"event {index}: nested too deeply to validate", index))

    def _payload(self, payload: Any, ev: Any, index: int, started: float) -> None:
        proto = self.r.protocol
        if (
            proto == "anthropic"
            and ev.event is not None
            and isinstance(payload, dict)
            and ev.event != payload.get("type")
        ):
            self.add(
                Violation("schema", f"event name {ev.event!r} differs from data type {payload.get('type')!r}", index)
            )
        for v in validate_payload(proto, payload, index):
            self.add(v)
        problem = self.order.check(payload)
        if problem and not self.order_reported:  # one per stream: later ones are consequences of the first
            self.order_reported = True
            self.add(Violation("wrong_event_order", f"event {index}: {problem}", index))
        if proto == "anthropic" and isinstance(payload, dict) and payload.get("type") == "error":
            err = payload.get("error") or {}
            etype = err.get("type") if isinstance(err, dict) else None
            self.r.error_type = etype.lower() if isinstance(etype, str) and _ERROR_TYPE.match(etype) else "stream_error"
            self.r.error_message = str(err.get("message", ""))[:300] if isinstance(err, dict) else ""
        text = _text_of(proto, payload)
        if text:
            self.r.text += text
            self.text_times.append(ev.arrived_s)
            if self.r.ttft_s is None:
                self.r.ttft_s = ev.arrived_s - started


# Error types under which the probe stopped reading before the stream could end.
STOPPED_READING = frozenset({"timeout", "oversized"})


def run_probe(
    url: str,
    protocol: str,
    *,
    model: str | None = None,
    prompt: str = "Say OK.",
    max_tokens: int = 8,
    timeout_s: float = 10.0,
    max_bytes: int = 1 << 20,
    client: httpx.Client | None = None,
) -> ProbeResult:
    """Run one probe; never raises for runtime misbehaviour (it is reported in the result)."""
    if protocol not in PROTOCOLS:
        raise ValueError(f"protocol must be one of {', '.join(PROTOCOLS)}, got {protocol!r}")
    import httpx

    from inferwatch.agent.common.httpclient import http_client

    target = endpoint(url, protocol)
    result = ProbeResult(protocol, redact_url(target))  # what it reports: never the URL's credentials
    headers = {"accept": "text/event-stream", "content-type": "application/json"}
    if protocol == "anthropic":
        headers["anthropic-version"] = ANTHROPIC_VERSION
    own = client is None
    # a client of its own per probe: its first request (GET /v1/models, or the POST) opens the connection, and a
    # POST is never sent twice, so nothing here is retried or counted; it keeps the agent's keep-alive expiry
    http = client or http_client("probe", timeout=httpx.Timeout(timeout_s), trust_env=True)
    if model is None:
        model = discover_model(http, url, timeout_s) or FALLBACK_MODEL
    body = request_body(protocol, model, prompt, max_tokens)
    stream = _Stream(result)
    parser = SSEParser()
    started = time.monotonic()
    deadline = started + timeout_s
    received = 0
    index = 0
    try:
        with http.stream("POST", target, json=body, headers=headers, timeout=timeout_s) as r:
            result.status_code = r.status_code
            if r.status_code != 200:
                data = bytearray()
                for chunk in r.iter_raw():
                    data += chunk
                    if len(data) > MAX_ERROR_BODY_BYTES:
                        break
                result.error_type, result.error_message = error_type_of(r.status_code, bytes(data))
                return result
            for chunk in r.iter_bytes():
                received += len(chunk)
                now = time.monotonic()
                for ev in parser.feed(chunk, now):
                    stream.event(ev, index, started)
                    index += 1
                if received > max_bytes:
                    result.error_type, result.error_message = "oversized", f"stream exceeded {max_bytes} bytes"
                    break
                if now > deadline:
                    result.error_type, result.error_message = "timeout", f"stream not finished within {timeout_s:g}s"
                    break
    except httpx.TimeoutException:
        result.error_type = "timeout"
        result.error_message = f"no answer within {timeout_s:g}s ({result.events} events received)"
    except httpx.RemoteProtocolError as exc:
        result.error_message = f"stream ended mid-way: {exc}"
    except httpx.TransportError as exc:
        result.error_type = "connect"
        result.error_message = f"cannot reach {result.url}: {type(exc).__name__}: {exc}"
    finally:
        if own:
            http.close()
        result.duration_s = time.monotonic() - started
    if result.status_code == 200:
        if parser.crlf:
            stream.add(
                Violation("crlf_framing", "events are framed with CRLF, not LF (clients splitting on \\n\\n break)")
            )
        # A stream the probe stopped reading (its deadline passed, as in a hang; or it grew too large) says
        # nothing about the terminator: that is counted as its error_type, never as a schema violation.
        if not stream.order.done and result.error_type not in STOPPED_READING:
            term = "data: [DONE]" if protocol == "openai" else "event: message_stop"
            cut = f", cut mid-event ({len(parser.rest())} bytes after the last event)" if parser.rest().strip() else ""
            stream.add(
                Violation("missing_terminator", f"stream ended after {result.events} events without {term}{cut}")
            )
        times = stream.text_times
        result.text_events = len(times)
        if len(times) > 1:
            result.itl_s = (times[-1] - times[0]) / (len(times) - 1)
        if result.error_message is None and result.error_type is None and result.text_events == 0:
            result.error_message = "stream carried no generated text"
    result.ok = result.status_code == 200 and result.error_type is None and not result.violations
    if result.error_message:  # may quote the runtime's error body or an exception naming the URL
        result.error_message = redact_text(result.error_message)
    return result
