"""Incremental Server-Sent Events framing over raw bytes.

Events end with a blank line. ``\\n\\n`` is the framing clients split on; a stream framed with
``\\r\\n`` is flagged (``crlf_framing``) and still parsed so the payloads are checked. Bytes are decoded
per event, so one non-UTF-8 event is reported without losing the rest of the stream.
"""

from __future__ import annotations

import re
from dataclasses import dataclass

_BOUNDARY = re.compile(rb"\r\n\r\n|\n\n|\r\r")


@dataclass(frozen=True, slots=True)
class RawEvent:
    event: str | None  # the "event:" field, if any
    data: str | None  # joined "data:" lines; None when the bytes were not UTF-8
    raw: bytes
    arrived_s: float  # monotonic time the event completed


_LONGEST_BOUNDARY = 4  # bytes of \r\n\r\n


class SSEParser:
    """Feed chunks, get complete events. Each byte is searched a bounded number of times, so a stream that
    trickles in one byte per chunk costs linear time, not quadratic."""

    def __init__(self) -> None:
        self._buf = bytearray()
        self._searched = 0  # bytes of _buf already searched without a boundary (less a boundary's overlap)
        self.crlf = False

    def feed(self, chunk: bytes, now_s: float) -> list[RawEvent]:
        self._buf += chunk
        out = []
        while True:
            m = _BOUNDARY.search(self._buf, self._searched)
            if not m:
                self._searched = max(0, len(self._buf) - (_LONGEST_BOUNDARY - 1))
                break
            self._searched = 0
            block = bytes(self._buf[: m.start()])
            if b"\r" in m.group(0) or b"\r" in block:
                self.crlf = True
            del self._buf[: m.end()]
            ev = parse_block(block, now_s) if block.strip() else None
            if ev is not None:
                out.append(ev)
        return out

    def rest(self) -> bytes:
        """Bytes after the last complete event (a stream cut mid-event leaves them here)."""
        return bytes(self._buf)


def parse_block(block: bytes, now_s: float) -> RawEvent | None:
    """One event; None for a block without data (comments such as ``: keep-alive``, a lone ``retry:``)."""
    try:
        text = block.decode("utf-8")
    except UnicodeDecodeError:
        return RawEvent(None, None, block, now_s)
    event: str | None = None
    data: list[str] = []
    for line in text.replace("\r\n", "\n").replace("\r", "\n").split("\n"):
        if not line or line.startswith(":"):
            continue
        name, _, value = line.partition(":")
        value = value[1:] if value.startswith(" ") else value
        if name == "event":
            event = value
        elif name == "data":
            data.append(value)
    if not data:
        return None
    return RawEvent(event, "\n".join(data), block, now_s)
