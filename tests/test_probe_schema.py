"""The probe's cheap pass (schema.plain) against jsonschema, the validator of record: whatever it lets through without
jsonschema, jsonschema passes too, over the probe's and the simulator's chunks and thousands of their mutations."""

from __future__ import annotations

import copy
import json
import random
from collections.abc import Iterator
from typing import Any

import pytest

from inferwatch.agent.node.probe import schema
from tests.fake_runtime import anthropic_events, openai_events

MODES = ("ok", "usage_only", "wrong_order", "cut")
# The simulator's chunks (simulator/server.py, _openai_stream and _anthropic_stream), as it writes them.
SIMULATOR = {
    "openai": [
        '{"id":"chatcmpl-1","object":"chat.completion.chunk","created":1764000000,"model":"m","choices":[{"index":0,'
        '"delta":{"role":"assistant","content":""},"logprobs":null,"finish_reason":null}],"usage":null}',
        '{"id":"chatcmpl-1","object":"chat.completion.chunk","created":1764000000,"model":"m","choices":[{"index":0,'
        '"delta":{"content":" the"},"logprobs":null,"finish_reason":null}]}',
        '{"id":"chatcmpl-1","object":"chat.completion.chunk","created":1764000000,"model":"m","choices":[{"index":0,'
        '"delta":{},"logprobs":null,"finish_reason":"length","stop_reason":null}],"usage":null}',
        '{"id":"chatcmpl-1","object":"chat.completion.chunk","created":1764000000,"model":"m","choices":[],'
        '"usage":{"prompt_tokens":5,"completion_tokens":3,"total_tokens":8}}',
    ],
    "anthropic": [
        '{"type":"message_start","message":{"id":"msg_1","type":"message","role":"assistant","model":"m","content":[],'
        '"stop_reason":null,"stop_sequence":null,"usage":{"input_tokens":5,"output_tokens":1}}}',
        '{"type":"content_block_start","index":0,"content_block":{"type":"text","text":""}}',
        '{"type":"content_block_delta","index":0,"delta":{"type":"text_delta","text":" the"}}',
        '{"type":"content_block_stop","index":0}',
        '{"type":"message_delta","delta":{"stop_reason":"max_tokens","stop_sequence":null},"usage":{"output_tokens":3}}',
        '{"type":"message_stop"}',
        '{"type":"ping"}',
    ],
}
ODD = [
    None,
    -1,
    0,
    7,
    1.5,
    2.0,
    True,
    False,
    "",
    "x",
    "stop",
    "assistant",
    "text_delta",
    "message",
    [],
    [1],
    {},
    {"a": 1},
]


def _payloads(protocol: str) -> list[Any]:
    events = openai_events if protocol == "openai" else anthropic_events
    out: list[Any] = [json.loads(s) for s in SIMULATOR[protocol]]
    for mode in MODES:
        for raw in events(mode):
            data = raw.split(b"data: ", 1)[1]
            if data != b"[DONE]":
                out.append(json.loads(data))
    return out


def _paths(value: Any, path: tuple[Any, ...] = ()) -> Iterator[tuple[Any, ...]]:
    yield path
    if isinstance(value, dict):
        for k, v in value.items():
            yield from _paths(v, (*path, k))
    elif isinstance(value, list):
        for i, v in enumerate(value):
            yield from _paths(v, (*path, i))


def _mutants(payload: Any, rng: random.Random) -> Iterator[Any]:
    """Each field replaced by odd values, removed, or beside an extra field; then random double mutations."""
    paths = list(_paths(payload))
    for path in paths:
        for odd in ODD:
            yield _set(payload, path, odd)
        if path:
            yield _set(payload, path, _DELETE)
        yield _set(payload, (*path, "extra"), 1)
    for _ in range(60):
        once = _set(payload, rng.choice(paths), rng.choice(ODD))
        yield _set(once, rng.choice(list(_paths(once))), rng.choice(ODD))


_DELETE = object()


def _set(payload: Any, path: tuple[Any, ...], value: Any) -> Any:
    if not path:
        return value
    out = copy.deepcopy(payload)
    parent = out
    for key in path[:-1]:
        parent = parent[key]
    key = path[-1]
    if value is _DELETE:
        del parent[key]
    elif isinstance(parent, dict) or (isinstance(parent, list) and isinstance(key, int)):
        parent[key] = value
    else:
        return payload  # an "extra" key asked of a list or a leaf: nothing to add
    return out


def _jsonschema_errors(protocol: str, payload: Any) -> list[Any]:
    validator = schema._validator(protocol)
    if protocol == "anthropic" and isinstance(payload, dict) and payload.get("type") in schema.ANTHROPIC_EVENTS:
        validator = validator.evolve(schema={"$ref": f"{validator.schema['$id']}#/$defs/{payload['type']}"})
    return list(validator.iter_errors(payload))


@pytest.mark.parametrize("protocol", ["openai", "anthropic"])
def test_what_passes_without_jsonschema_jsonschema_passes(protocol: str) -> None:
    rng = random.Random(38)
    passed = checked = 0
    for payload in _payloads(protocol):
        for mutant in [payload, *_mutants(payload, rng)]:
            checked += 1
            if schema.plain(protocol, mutant):
                passed += 1
                assert _jsonschema_errors(protocol, mutant) == [], mutant
    # both sides were exercised: many mutants pass (free fields, allowed values), many are left to jsonschema
    assert checked > 2_000 and 0.05 * checked < passed < 0.9 * checked, (passed, checked)


@pytest.mark.parametrize("protocol", ["openai", "anthropic"])
def test_the_common_chunks_pass_and_the_violations_still_reach_jsonschema(protocol: str) -> None:
    for raw in SIMULATOR[protocol]:
        assert schema.plain(protocol, json.loads(raw)), raw
    events = openai_events if protocol == "openai" else anthropic_events
    for raw in events("ok"):
        data = raw.split(b"data: ", 1)[1]
        if data != b"[DONE]" and not (protocol == "anthropic" and b'"error"' in data):
            assert schema.plain(protocol, json.loads(data)), data
    # the usage_only pitfall: the chunks with usage beside a delta are not plain, and validate_payload names them
    found = []
    for raw in events("usage_only"):
        data = raw.split(b"data: ", 1)[1]
        if data != b"[DONE]":
            payload = json.loads(data)
            kinds = [v.kind for v in schema.validate_payload(protocol, payload, 0)]
            assert not (kinds and schema.plain(protocol, payload)), payload
            found += kinds
    assert "empty_delta_with_usage" in found
