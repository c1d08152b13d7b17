"""Per-protocol validation of streamed payloads and of the event order.

Schemas live in ``agent/node/probe/schemas/`` (JSON Schema 2020-12); jsonschema is the validator of record. Each
problem becomes a :class:`Violation` with a kind from :data:`VIOLATION_KINDS` and, for schema problems, the schema path
and instance path jsonschema reports.

The common chunks are first checked by :func:`plain`: a payload in one of the documented shapes (an OpenAI chunk, an
Anthropic ``message_start``, ``content_block_*``, ``message_delta``, ``message_stop`` or ``ping``), every field the
schema constrains holding a value it allows, is one jsonschema would pass, and is not given to it. Anything else (a
field of an unusual type or value, another event, a violation) goes to jsonschema, which is imported then: a probe of a
well-formed runtime never loads it (~2.9 MB of RSS with its referencing stack). :func:`plain` only ever says "passes";
it reports nothing itself. tests/test_probe_schema.py holds it to jsonschema's verdicts.
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
    # Imported on the first payload that is not plain(), not with the agent: jsonschema and its referencing stack
    # are ~2.9 MB of RSS above the agent's imports, which an agent probing a well-formed runtime never uses.
    import jsonschema

    schema = json.loads((SCHEMA_DIR / SCHEMA_FILES[protocol]).read_text())
    cls = jsonschema.validators.validator_for(schema)
    cls.check_schema(schema)
    return cls(schema)


def _count(v: Any) -> bool:  # "type": "integer", "minimum": 0 (an int only: 1.0, also an integer there, is left to it)
    return type(v) is int and v >= 0


def _text(v: Any) -> bool:  # "type": ["string", "null"]
    return v is None or type(v) is str


def _texts(obj: dict[str, Any], keys: tuple[str, ...]) -> bool:
    return all(_text(obj[k]) for k in keys if k in obj)


# the schemas' enums, as tuples: membership by equality, so an unhashable value is simply not in them
_ROLES = ("assistant", "system", "user", "tool", "developer")
_FINISH_REASONS = (None, "stop", "length", "tool_calls", "content_filter", "function_call", "abort")
_DELTA_TYPES = ("text_delta", "input_json_delta", "thinking_delta", "signature_delta", "citations_delta")
_USAGE_KEYS = ("prompt_tokens", "completion_tokens", "total_tokens")


def _openai_plain(p: dict[str, Any]) -> bool:
    """openai_chat_chunk.json, field by field; a field it leaves free is free here."""
    choices = p.get("choices")
    if not (type(p.get("id")) is str and p["id"] and p.get("object") == "chat.completion.chunk"):
        return False
    if not (_count(p.get("created")) and type(p.get("model")) is str and type(choices) is list):
        return False
    if not _texts(p, ("system_fingerprint", "service_tier")):
        return False
    for ch in choices:
        if type(ch) is not dict or not _count(ch.get("index")) or type(delta := ch.get("delta")) is not dict:
            return False
        if "role" in delta and delta["role"] not in _ROLES:
            return False
        if not _texts(delta, ("content", "reasoning_content", "refusal")):
            return False
        if "tool_calls" in delta and type(delta["tool_calls"]) is not list:
            return False
        if ch.get("logprobs") is not None and type(ch["logprobs"]) is not dict:
            return False
        if "finish_reason" in ch and ch["finish_reason"] not in _FINISH_REASONS:
            return False
    usage = p.get("usage")  # null or absent; an object only on the final chunk, whose choices are empty
    return usage is None or (not choices and type(usage) is dict and all(_count(usage.get(k)) for k in _USAGE_KEYS))


def _anthropic_usage(u: Any) -> bool:  # $defs/usage
    if type(u) is not dict:
        return False
    return ("input_tokens" not in u or u["input_tokens"] is None or _count(u["input_tokens"])) and (
        "output_tokens" not in u or _count(u["output_tokens"])
    )


def _anthropic_plain(p: dict[str, Any]) -> bool:
    """anthropic_event.json's $defs, by event type; ``error`` and unknown types are left to jsonschema."""
    t = p.get("type")
    if t in ("ping", "message_stop"):
        return True
    if t == "content_block_stop":
        return _count(p.get("index"))
    if t == "content_block_delta":
        d = p.get("delta")
        if "usage" in p or not _count(p.get("index")) or type(d) is not dict or d.get("type") not in _DELTA_TYPES:
            return False
        return "text" not in d or type(d["text"]) is str
    if t == "content_block_start":
        block = p.get("content_block")
        return _count(p.get("index")) and type(block) is dict and type(block.get("type")) is str
    if t == "message_delta":
        d = p.get("delta")
        if type(d) is not dict or not _texts(d, ("stop_reason", "stop_sequence")):
            return False
        return "usage" not in p or _anthropic_usage(p["usage"])
    if t == "message_start":
        m = p.get("message")
        if type(m) is not dict or m.get("type") != "message" or m.get("role") != "assistant":
            return False
        if not (type(m.get("id")) is str and type(m.get("content")) is list and type(m.get("model")) is str):
            return False
        return _texts(m, ("stop_reason",)) and ("usage" not in m or _anthropic_usage(m["usage"]))
    return False


def plain(protocol: str, payload: Any) -> bool:
    """True if ``payload`` is one of the protocol's common chunks in its documented shape, each field the schema
    constrains holding a value the schema allows: jsonschema would report nothing. False says only "ask jsonschema"."""
    if type(payload) is not dict:
        return False
    return _openai_plain(payload) if protocol == "openai" else _anthropic_plain(payload)


def _kind(schema_path: list[Any]) -> str:
    parts = [str(p) for p in schema_path]
    if "usage" in parts and ("then" in parts or "not" in parts):
        return "empty_delta_with_usage"
    return "schema"


def validate_payload(protocol: str, payload: Any, index: int) -> list[Violation]:
    """Validate one decoded payload; one violation per distinct kind (first error's paths). A :func:`plain` payload
    passes without jsonschema."""
    if plain(protocol, payload):
        return []
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
