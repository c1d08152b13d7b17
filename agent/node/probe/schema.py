"""Per-protocol validation of streamed payloads and of the event order.

Schemas live in ``agent/node/probe/schemas/`` (JSON Schema 2020-12). Each problem becomes a
:class:`Violation` with a kind from :data:`VIOLATION_KINDS` and, for schema problems, the schema path
and instance path jsonschema reports.
"""

from __future__ import annotations

import json
from dataclasses import dataclass
from functools import cache
from pathlib import Path
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    import jsonschema

SCHEMA_DIR = Path(__file__).with_name("schemas")
SCHEMA_FILES = {"openai": "openai_chat_chunk.json", "anthropic": "anthropic_event.json"}
VIOLATION_KINDS = (
    "empty_delta_with_usage",
    "malformed_json",
    "missing_terminator",
    "wrong_event_order",
    "non_utf8",
    "crlf_framing",
    "schema",
)
ANTHROPIC_EVENTS = (
    "message_start",
    "content_block_start",
    "content_block_delta",
    "content_block_stop",
    "message_delta",
    "message_stop",
    "ping",
    "error",
)


@dataclass(frozen=True, slots=True)
class Violation:
    kind: str
    message: str
    event_index: int | None = None
    schema_path: str | None = None  # e.g. openai_chat_chunk.json#/allOf/0/then/properties/usage/type
    instance_path: str | None = None  # e.g. $.usage


@cache
def _validator(protocol: str) -> jsonschema.protocols.Validator:
    # Imported on the first probe, not with the agent: jsonschema and its referencing stack are ~12 MB of RSS
    # that an agent without a probe URL never uses.
    import jsonschema

    schema = json.loads((SCHEMA_DIR / SCHEMA_FILES[protocol]).read_text())
    cls = jsonschema.validators.validator_for(schema)
    cls.check_schema(schema)
    return cls(schema)


def _kind(schema_path: list[Any]) -> str:
    parts = [str(p) for p in schema_path]
    if "usage" in parts and ("then" in parts or "not" in parts):
        return "empty_delta_with_usage"
    return "schema"


def validate_payload(protocol: str, payload: Any, index: int) -> list[Violation]:
    """Validate one decoded payload; one violation per distinct kind (first error's paths)."""
    validator = _validator(protocol)
    fname = SCHEMA_FILES[protocol]
    prefix = ""
    if protocol == "anthropic" and isinstance(payload, dict) and payload.get("type") in ANTHROPIC_EVENTS:
        sid = validator.schema["$id"]
        validator = validator.evolve(schema={"$ref": f"{sid}#/$defs/{payload['type']}"})
        prefix = f"$defs/{payload['type']}/"
    seen: dict[str, Violation] = {}
    for err in sorted(validator.iter_errors(payload), key=lambda e: list(e.absolute_schema_path).__len__()):
        kind = _kind(list(err.absolute_schema_path))
        if kind in seen:
            continue
        path = prefix + "/".join(str(p) for p in err.absolute_schema_path)
        seen[kind] = Violation(kind, err.message[:300], index, f"{fname}#/{path}", err.json_path)
    return list(seen.values())


class OrderChecker:
    """Event-order state machine; ``check`` returns an error message or None; ``finish`` the terminator."""

    def __init__(self, protocol: str) -> None:
        self.protocol = protocol
        self.done = False  # terminator seen
        self.started = False
        self.open_block: int | None = None
        self.finished_choice = False
        self.message_delta = False

    def check(self, payload: Any) -> str | None:
        if self.done:
            return "event after the stream's terminator"
        if self.protocol == "openai":
            return self._openai(payload)
        return self._anthropic(payload)

    def terminate_openai(self) -> None:
        self.done = True

    def _openai(self, payload: Any) -> str | None:
        if not isinstance(payload, dict):
            return None
        choices = payload.get("choices") or []
        for ch in choices if isinstance(choices, list) else []:
            if not isinstance(ch, dict):
                continue
            delta = ch.get("delta") or {}
            content = delta.get("content") if isinstance(delta, dict) else None
            if self.finished_choice and content:
                return "content after a chunk with finish_reason"
            if ch.get("finish_reason"):
                self.finished_choice = True
        return None

    def _anthropic(self, payload: Any) -> str | None:
        if not isinstance(payload, dict):
            return None
        t = payload.get("type")
        if t in ("ping", "error"):
            return None
        if not self.started:
            if t != "message_start":
                return f"{t} before message_start"
            self.started = True
            return None
        idx = payload.get("index")
        if t == "message_start":
            return "second message_start"
        if t == "content_block_start":
            if self.open_block is not None:
                return f"content_block_start while block {self.open_block} is open"
            if self.message_delta:
                return "content_block_start after message_delta"
            self.open_block = idx if isinstance(idx, int) else -1
        elif t in ("content_block_delta", "content_block_stop"):
            if self.open_block is None or self.open_block != idx:
                return f"{t} for block {idx} which is not open"
            if t == "content_block_stop":
                self.open_block = None
        elif t == "message_delta":
            if self.open_block is not None:
                return f"message_delta while block {self.open_block} is open"
            self.message_delta = True
        elif t == "message_stop":
            if self.open_block is not None:
                return f"message_stop while block {self.open_block} is open"
            self.done = True
        return None
