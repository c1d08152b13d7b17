"""A small real HTTP runtime for diagnostics tests: OpenAI and Anthropic SSE streams and a debug profile.

Each behaviour the diagnostics must recognise is reproduced byte for byte (``http.server``, so the
tests control framing, encoding and where a stream stops). ``FakeRuntime.mode`` selects it:

stream modes: ok, usage_only (text-less delta chunks carrying usage), crlf, non_utf8, malformed_json,
cut (stops mid-way without terminator), wrong_order, hardware_mismatch (HTTP 400, OpenAI error JSON),
hang (never answers).  profile modes: debug, disabled ({}), oversized, not_json, hang.
"""

from __future__ import annotations

import json
import threading
import time
from collections.abc import Iterator
from contextlib import contextmanager
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from typing import Any

PROFILE_HEADER = ("X-Runtime-Debug", "runtime_profile=1")
CREATED = 1_764_000_000


def openai_chunk(content: str | None, finish: str | None = None, usage: Any = None, role: bool = False) -> dict:
    delta: dict[str, Any] = {}
    if role:
        delta["role"] = "assistant"
    if content is not None:
        delta["content"] = content
    return {
        "id": "chatcmpl-probe",
        "object": "chat.completion.chunk",
        "created": CREATED,
        "model": "m",
        "choices": [{"index": 0, "delta": delta, "logprobs": None, "finish_reason": finish}],
        "usage": usage,
    }


USAGE = {"prompt_tokens": 4, "completion_tokens": 2, "total_tokens": 6}


def openai_events(mode: str) -> list[bytes]:
    chunks = [openai_chunk("", role=True), openai_chunk("O"), openai_chunk("K"), openai_chunk(None, "stop")]
    if mode == "usage_only":
        # the pitfall: usage rides on chunks whose delta text is empty (instead of a final choices=[] chunk)
        chunks = [openai_chunk("", role=True), openai_chunk("O"), openai_chunk("", usage=USAGE)]
        chunks.append(openai_chunk("", "stop", usage=USAGE))
    else:
        final = openai_chunk(None)
        final["choices"] = []
        final["usage"] = USAGE
        chunks.append(final)
    if mode == "wrong_order":
        chunks.append(openai_chunk("late"))
    events = [b"data: " + json.dumps(c).encode() for c in chunks]
    if mode == "malformed_json":
        events.insert(2, b'data: {"id": "chatcmpl-probe", "choices": [')
    if mode == "non_utf8":
        events.insert(2, b'data: {"text": "\xff\xfe"}')
    if mode != "cut":
        events.append(b"data: [DONE]")
    return events


def anthropic_events(mode: str) -> list[bytes]:
    evs: list[dict[str, Any]] = [
        {
            "type": "message_start",
            "message": {
                "id": "msg_probe",
                "type": "message",
                "role": "assistant",
                "content": [],
                "model": "m",
                "stop_reason": None,
                "usage": {"input_tokens": 4, "output_tokens": 1},
            },
        },
        {"type": "content_block_start", "index": 0, "content_block": {"type": "text", "text": ""}},
        {"type": "ping"},
        {"type": "content_block_delta", "index": 0, "delta": {"type": "text_delta", "text": "O"}},
        {"type": "content_block_delta", "index": 0, "delta": {"type": "text_delta", "text": "K"}},
        {"type": "content_block_stop", "index": 0},
        {
            "type": "message_delta",
            "delta": {"stop_reason": "end_turn", "stop_sequence": None},
            "usage": {"output_tokens": 2},
        },
        {"type": "message_stop"},
    ]
    if mode == "usage_only":
        evs[4] = {
            "type": "content_block_delta",
            "index": 0,
            "delta": {"type": "text_delta", "text": ""},
            "usage": {"output_tokens": 2},
        }
    if mode == "wrong_order":
        evs.insert(1, evs.pop(6))  # message_delta before the content block
    if mode == "cut":
        evs = evs[:4]
    out = [f"event: {e['type']}\ndata: {json.dumps(e)}".encode() for e in evs]
    if mode == "malformed_json":
        out.insert(3, b"event: content_block_delta\ndata: {not json")
    if mode == "non_utf8":
        out.insert(3, b'event: content_block_delta\ndata: {"type": "\xff"}')
    return out


class FakeRuntime:
    def __init__(self) -> None:
        self.stream_mode = "ok"
        self.profile_mode = "debug"
        self.profile: dict[str, Any] = {
            "engine": "fake",
            "gpu_memory_used_bytes": 123456789,
            "num_running_requests": 3,
            "cpu_affinity_mask": "0-63",
        }
        self.requests: list[tuple[str, str]] = []
        self.stop = threading.Event()
        self.port = 0

    @property
    def url(self) -> str:
        return f"http://127.0.0.1:{self.port}"


def _handler(rt: FakeRuntime) -> type[BaseHTTPRequestHandler]:
    class Handler(BaseHTTPRequestHandler):
        protocol_version = "HTTP/1.0"  # body ends when the connection closes: a cut stream is a real cut

        def log_message(self, *args: Any) -> None:
            pass

        def _hang(self) -> None:
            rt.stop.wait(60)

        def _json(self, code: int, body: Any) -> None:
            data = json.dumps(body).encode()
            self.send_response(code)
            self.send_header("Content-Type", "application/json")
            self.send_header("Content-Length", str(len(data)))
            self.end_headers()
            self.wfile.write(data)

        def do_GET(self) -> None:
            rt.requests.append(("GET", self.path))
            if self.path.partition("?")[0] != "/debug/runtime_profile":  # a query (?token=...) is allowed
                self._json(404, {"error": {"type": "not_found", "message": self.path}})
                return
            mode = rt.profile_mode
            if mode == "hang":
                self._hang()
                return
            if self.headers.get(PROFILE_HEADER[0]) != PROFILE_HEADER[1] or mode == "disabled":
                self._json(200, {})
                return
            if mode == "oversized":
                self._json(200, {"blob": "x" * (3 << 20)})
                return
            if mode == "not_json":
                data = b"<html>debug</html>"
                self.send_response(200)
                self.send_header("Content-Type", "text/html")
                self.send_header("Content-Length", str(len(data)))
                self.end_headers()
                self.wfile.write(data)
                return
            self._json(200, rt.profile)

        def do_POST(self) -> None:
            length = int(self.headers.get("Content-Length", "0") or 0)
            self.rfile.read(length)
            rt.requests.append(("POST", self.path))
            mode = rt.stream_mode
            if self.path not in ("/v1/chat/completions", "/v1/messages"):
                self._json(404, {"error": {"type": "not_found", "message": self.path}})
                return
            if mode == "hang":
                self._hang()
                return
            if mode == "hardware_mismatch":
                self._json(
                    400,
                    {
                        "error": {
                            "message": "model built for sm_90, host GPU is sm_80",
                            "type": "hardware_mismatch",
                            "param": None,
                            "code": 400,
                        }
                    },
                )
                return
            events = openai_events(mode) if self.path == "/v1/chat/completions" else anthropic_events(mode)
            sep = b"\r\n\r\n" if mode == "crlf" else b"\n\n"
            self.send_response(200)
            self.send_header("Content-Type", "text/event-stream")
            self.send_header("Cache-Control", "no-cache")
            self.end_headers()
            for ev in events:
                if mode == "crlf":
                    ev = ev.replace(b"\n", b"\r\n")
                self.wfile.write(ev + sep)
                self.wfile.flush()
                time.sleep(0.005)
            if mode == "cut":
                self.wfile.write(b'data: {"id": "chatcmpl-pro')  # half an event, then the connection drops

    return Handler


@contextmanager
def fake_runtime() -> Iterator[FakeRuntime]:
    rt = FakeRuntime()
    server = ThreadingHTTPServer(("127.0.0.1", 0), _handler(rt))
    server.daemon_threads = True
    rt.port = server.server_address[1]
    thread = threading.Thread(target=server.serve_forever, kwargs={"poll_interval": 0.1}, daemon=True)
    thread.start()
    try:
        yield rt
    finally:
        rt.stop.set()
        server.shutdown()
        server.server_close()
        thread.join(5)
