"""Property-based tests (hypothesis) for the parsers of what runtimes and senders stream at the agent.

- SSE (agent/node/probe/): any byte stream, in any chunking, through the real probe client (httpx with its
  MockTransport handing the bytes over): a ProbeResult with violations from the known kinds, never an
  exception; the events are the same however the stream is cut; a stream that trickles in byte by byte is
  parsed in linear time.
- OTLP protobuf (agent/node/receiver/): any bytes, and real ExportTraceServiceRequests with hostile attribute
  values, truncated or with bytes flipped: decoded and recorded, or PayloadError; timings always in range.
- runtime_profile JSON (agent/node/debugprofile/): any JSON document (deep, wide, odd keys and values), and any
  bytes, served over real HTTP to the real reader: a snapshot whose outcome says what happened, never an
  exception; a document nested past the limit is refused as oversized.

Each property runs a bounded number of examples with a deadline, and memory is checked with tracemalloc.
"""

from __future__ import annotations

import itertools
import json
import tempfile
import threading
import time
import tracemalloc
from collections.abc import Iterator
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path
from typing import Any

import httpx
import pytest
from hypothesis import HealthCheck, example, given, settings
from hypothesis import strategies as st
from opentelemetry.proto.collector.trace.v1.trace_service_pb2 import ExportTraceServiceRequest
from opentelemetry.proto.common.v1.common_pb2 import AnyValue, KeyValue

from inferwatch.agent.config import RuntimeProfileSettings, RuntimeSettings
from inferwatch.agent.node.analytics.latency import LatencyAnalytics
from inferwatch.agent.node.debugprofile.fetch import FETCH_REASONS, MAX_PROFILE_DEPTH, ProfileFetchError, parse_profile
from inferwatch.agent.node.debugprofile.reader import ProfileReader
from inferwatch.agent.node.host.procfs import DEFAULT_READ_LIMITS
from inferwatch.agent.node.host.runtime import RuntimeLocator
from inferwatch.agent.node.probe.client import run_probe
from inferwatch.agent.node.probe.schema import VIOLATION_KINDS
from inferwatch.agent.node.probe.sse import SSEParser
from inferwatch.agent.node.receiver.intake import SpanIntake
from inferwatch.agent.node.receiver.spans import (
    LATENCY_KEYS,
    MAX_LATENCY_S,
    MAX_MODEL_NAME_CHARS,
    PayloadError,
    decode,
    extract,
)

PROPERTY = settings(max_examples=100, deadline=2000, suppress_health_check=[HealthCheck.too_slow])
# The reader's examples each make a real HTTP fetch (a new client per fetch, as the reader does): fewer of them.
OVER_HTTP = settings(max_examples=40, deadline=3000, suppress_health_check=[HealthCheck.too_slow])
MAX_PEAK_BYTES_PER_INPUT_BYTE = 40  # tracemalloc peak over input size: parsed objects, never a runaway copy
MAX_PEAK_FLOOR_BYTES = 4 << 20

# --- SSE ----------------------------------------------------------------------------------------------------

SSE_PIECES = st.sampled_from(
    [
        b"data: ", b"event: ", b": keep-alive", b"\n", b"\r\n", b"\r", b"\n\n", b"\r\n\r\n", b"[DONE]", b"{", b"}",
        b'{"choices":[{"delta":{"content":"hi"}}]}', b'{"type":"content_block_delta","delta":{"text":"x"}}',
        b'{"type":"message_stop"}', b'{"type":"error","error":{"type":"overloaded_error","message":"m"}}',
        b'{"choices":[{"delta":{"content":null},"finish_reason":"stop"}]}', b"\xff\xfe", b"\xc3", b"retry: 10",
        b'{"choices":"x"}', b"null", b"1e999", b'"' + b"x" * 300 + b'"', b"data:" + b"[" * 200,
    ]
)  # fmt: skip
STREAM = st.one_of(st.lists(SSE_PIECES, max_size=60).map(b"".join), st.binary(max_size=2000))


def probe_stream(stream: bytes, cuts: list[int], protocol: str) -> Any:
    """``run_probe`` on a response whose body is ``stream``, delivered in the chunks ``cuts`` makes."""
    bounds = sorted({c % (len(stream) + 1) for c in cuts} | {0, len(stream)})
    chunks = [stream[a:b] for a, b in itertools.pairwise(bounds) if b > a]

    def handler(request: httpx.Request) -> httpx.Response:
        return httpx.Response(200, headers={"content-type": "text/event-stream"}, content=iter(chunks))

    with httpx.Client(transport=httpx.MockTransport(handler)) as client:
        return run_probe("http://runtime.test", protocol, model="m", timeout_s=5.0, client=client)


@PROPERTY
@given(STREAM, st.lists(st.integers(min_value=0), max_size=30), st.sampled_from(["openai", "anthropic"]))
@example(b"data: " + b"[" * 5000 + b"\n\n", [], "openai")
@example(b'data: {"choices":[{"delta":{"content":"a"}}]}\r\n\r\ndata: [DONE]\r\n\r\n', [3, 40], "openai")
def test_any_sse_stream_gives_a_probe_result_never_an_exception(stream: bytes, cuts: list[int], protocol: str) -> None:
    tracemalloc.start()
    try:
        result = probe_stream(stream, cuts, protocol)
        peak = tracemalloc.get_traced_memory()[1]
    finally:
        tracemalloc.stop()
    assert peak <= max(MAX_PEAK_FLOOR_BYTES, MAX_PEAK_BYTES_PER_INPUT_BYTE * len(stream))
    assert result.status_code == 200 and result.text_events <= result.events
    assert {v.kind for v in result.violations} <= set(VIOLATION_KINDS)
    assert result.ok == (result.error_type is None and not result.violations)


@PROPERTY
@given(STREAM, st.lists(st.integers(min_value=0), max_size=30))
def test_sse_events_do_not_depend_on_where_the_stream_is_cut(stream: bytes, cuts: list[int]) -> None:
    def events(pieces: list[bytes]) -> tuple[list[tuple[str | None, str | None, bytes]], bytes, bool]:
        parser = SSEParser()
        out = [(e.event, e.data, e.raw) for p in pieces for e in parser.feed(p, 0.0)]
        return out, parser.rest(), parser.crlf

    bounds = sorted({c % (len(stream) + 1) for c in cuts} | {0, len(stream)})
    assert events([stream[a:b] for a, b in itertools.pairwise(bounds)]) == events([stream])


def test_a_stream_trickling_in_byte_by_byte_is_parsed_in_linear_time() -> None:
    """200 kB with no event boundary, one byte per chunk: each byte searched a bounded number of times."""
    parser = SSEParser()
    started = time.thread_time()  # CPU seconds of this thread: the work, not the machine's load
    for _ in range(200_000):
        assert parser.feed(b"x", 0.0) == []
    assert parser.feed(b"\n\n", 0.0) == []  # no data: field, no event
    # 0.6 s here; the quadratic re-scan it replaced took 33 s for 50 kB (~9 minutes for these 200 kB)
    assert time.thread_time() - started < 15.0


# --- OTLP protobuf ------------------------------------------------------------------------------------------

ATTR_KEYS = st.sampled_from(
    [*LATENCY_KEYS, "gen_ai.request.model", "gen_ai.response.model", "gen_ai.usage.completion_tokens",
     "gen_ai.usage.prompt_tokens", "gen_ai.usage.output_tokens", "gen_ai.system", "http.route", ""]
)  # fmt: skip
ANY_VALUE = st.one_of(
    st.floats(allow_nan=True, allow_infinity=True).map(lambda x: AnyValue(double_value=x)),
    st.integers(min_value=-(2**63), max_value=2**63 - 1).map(lambda x: AnyValue(int_value=x)),
    st.text(max_size=400).map(lambda x: AnyValue(string_value=x)),
    st.booleans().map(lambda x: AnyValue(bool_value=x)),
    st.binary(max_size=50).map(lambda x: AnyValue(bytes_value=x)),
    st.just(AnyValue()),
)
SPAN_ATTRS = st.lists(st.tuples(ATTR_KEYS, ANY_VALUE), max_size=12)


def export_request(spans: list[list[tuple[str, AnyValue]]], resource: list[tuple[str, AnyValue]]) -> bytes:
    req = ExportTraceServiceRequest()
    rs = req.resource_spans.add()
    rs.resource.attributes.extend(KeyValue(key=k, value=v) for k, v in resource)
    ss = rs.scope_spans.add()
    for attributes in spans:
        span = ss.spans.add(name="chat", trace_id=b"\x01" * 16, span_id=b"\x02" * 8)
        span.attributes.extend(KeyValue(key=k, value=v) for k, v in attributes)
    return req.SerializeToString()


def _field(number: int, payload: bytes) -> bytes:
    """One length-delimited protobuf field, encoded by hand (a message too deep to build with the library)."""
    size, varint = len(payload), bytearray()
    while True:
        byte, size = size & 0x7F, size >> 7
        varint.append(byte | (0x80 if size else 0))
        if not size:
            break
    return bytes([number << 3 | 2]) + bytes(varint) + payload


def deeply_nested(depth: int) -> bytes:
    """An export request whose one span attribute is an AnyValue array nested ``depth`` times."""
    value = _field(1, b"leaf")  # AnyValue.string_value
    for _ in range(depth):
        value = _field(5, _field(1, value))  # AnyValue.array_value -> ArrayValue.values
    kv = _field(1, b"gen_ai.request.model") + _field(2, value)
    span = _field(1, b"\x01" * 16) + _field(2, b"\x02" * 8) + _field(5, b"chat") + _field(9, kv)
    return _field(1, _field(2, _field(2, span)))  # resource_spans -> scope_spans -> spans


def intake_takes_or_refuses(payload: bytes) -> None:
    intake = SpanIntake(LatencyAnalytics(max_models=64))
    intake.up["http"] = True
    tracemalloc.start()
    try:
        intake.handle(payload, "http")
    except PayloadError:
        assert intake.rejected[("http", "bad_protobuf")] == 1
        return
    finally:
        peak = tracemalloc.get_traced_memory()[1]
        tracemalloc.stop()
        assert peak <= max(MAX_PEAK_FLOOR_BYTES, MAX_PEAK_BYTES_PER_INPUT_BYTE * len(payload))
    got = extract(decode(payload))
    for t in got.timings:
        assert len(t.model) <= MAX_MODEL_NAME_CHARS
        assert all(0.0 <= s <= MAX_LATENCY_S or q == "itl" for q, s in t.seconds.items())
    assert intake.samples()


@PROPERTY
@given(st.binary(max_size=3000))
@example(deeply_nested(300))
@example(b"\x0a\xff\xff\xff\xff\x0f")  # a length prefix far past the end
def test_any_bytes_are_decoded_or_refused_as_payload_errors(payload: bytes) -> None:
    intake_takes_or_refuses(payload)


@settings(PROPERTY, max_examples=60)  # three payloads an example
@given(st.lists(SPAN_ATTRS, min_size=1, max_size=8), SPAN_ATTRS, st.data())
def test_real_export_requests_with_hostile_values_truncated_or_flipped(
    spans: list[list[tuple[str, AnyValue]]], resource: list[tuple[str, AnyValue]], data: st.DataObject
) -> None:
    payload = export_request(spans, resource)
    intake_takes_or_refuses(payload)
    cut = data.draw(st.integers(0, len(payload)))
    intake_takes_or_refuses(payload[:cut])
    flips = data.draw(st.lists(st.tuples(st.integers(0, max(0, len(payload) - 1)), st.integers(0, 255)), max_size=4))
    mutated = bytearray(payload)
    for pos, byte in flips:
        if mutated:
            mutated[pos] = byte
    intake_takes_or_refuses(bytes(mutated))


# --- runtime_profile JSON -----------------------------------------------------------------------------------

JSON_KEYS = st.one_of(
    st.sampled_from(["gpu_memory_used_bytes", "num_running_requests", "kv_cache_usage", "api_key", "token",
                     "password", "cpus_allowed_list", "max_num_batched_tokens", "", "a.b", "[0]"]),
    st.text(max_size=12),
)  # fmt: skip
JSON_LEAVES = st.one_of(
    st.none(),
    st.booleans(),
    st.integers(min_value=-(2**80), max_value=2**80),
    st.floats(allow_nan=False, allow_infinity=False),
    st.text(max_size=60),
    st.sampled_from(["sk-" + "a" * 30, "Bearer abc.def", "http://u:p@h/x", "0-63", "x" * 2000]),
)
JSON_DOCS = st.recursive(
    JSON_LEAVES,
    lambda inner: st.lists(inner, max_size=6) | st.dictionaries(JSON_KEYS, inner, max_size=6),
    max_leaves=60,
)


class _Body:
    data = b"{}"


class _Handler(BaseHTTPRequestHandler):
    protocol_version = "HTTP/1.0"

    def do_GET(self) -> None:
        data = _Body.data
        self.send_response(200)
        self.send_header("Content-Type", "application/json")
        self.send_header("Content-Length", str(len(data)))
        self.end_headers()
        self.wfile.write(data)

    def log_message(self, *args: object) -> None:
        pass


@pytest.fixture(scope="module")
def reader() -> Iterator[ProfileReader]:
    """The real reader against a real HTTP server on 127.0.0.1 that serves ``_Body.data``."""
    server = ThreadingHTTPServer(("127.0.0.1", 0), _Handler)
    thread = threading.Thread(target=server.serve_forever, kwargs={"poll_interval": 0.05}, daemon=True)
    thread.start()
    with tempfile.TemporaryDirectory() as tmp:
        cfg = RuntimeProfileSettings(url=f"http://127.0.0.1:{server.server_address[1]}/debug", max_bytes=1 << 20)
        procfs = Path(tmp) / "proc"
        locator = RuntimeLocator(RuntimeSettings(), procfs)
        try:
            limits = DEFAULT_READ_LIMITS
            yield ProfileReader(
                cfg, locator, key_dir=Path(tmp) / "snap", environment="unknown", procfs=procfs, read_limits=limits
            )
        finally:
            server.shutdown()
            server.server_close()


def read_served(reader: ProfileReader, body: bytes) -> Any:
    _Body.data = body
    snapshot = reader.read("test")
    json.dumps(snapshot.document, default=str)  # what the snapshot store writes
    result = snapshot.result
    assert result.outcome in ("available", "empty", "error")
    if result.outcome == "error":
        assert result.reason in FETCH_REASONS
    return result


@OVER_HTTP
@given(JSON_DOCS)
def test_any_json_profile_is_read_redacted_and_stored(reader: ProfileReader, doc: Any) -> None:
    result = read_served(reader, json.dumps(doc).encode())
    if isinstance(doc, dict):
        assert result.outcome == ("available" if doc else "empty")
        assert all(isinstance(v, float) for v in result.gauges.values())
    else:
        assert result.outcome == "error" and result.reason == "not_json"


@settings(OVER_HTTP, max_examples=30)
@given(st.one_of(st.binary(max_size=500), st.integers(1, 200_000).map(lambda n: b'{"a":' + b"[" * n)))
@example(b'{"a":' + b"[" * 100_000 + b"]" * 100_000 + b"}")  # valid JSON that json.loads cannot recurse into
@example(b"\xef\xbb\xbf{}")
def test_any_body_is_a_snapshot_with_a_reason(reader: ProfileReader, body: bytes) -> None:
    read_served(reader, body)


def test_nesting_past_the_limit_is_refused_before_anything_walks_it() -> None:
    ok = "[" * MAX_PROFILE_DEPTH + "]" * MAX_PROFILE_DEPTH
    assert parse_profile(ok.encode(), "u") == json.loads(ok)
    deep = '{"a":' + "[" * MAX_PROFILE_DEPTH + "]" * MAX_PROFILE_DEPTH + "}"
    with pytest.raises(ProfileFetchError, match=f"deeper than {MAX_PROFILE_DEPTH}") as exc:
        parse_profile(deep.encode(), "u")
    assert exc.value.reason == "oversized"
    with pytest.raises(ProfileFetchError) as exc:
        parse_profile(b"[" * 500_000, "u")  # json.loads itself raises RecursionError here
    assert exc.value.reason in ("oversized", "not_json")
