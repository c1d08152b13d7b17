"""Synthetic tokens: a word-level tokenizer for prompts and well-formed generated text.

Prompt tokens are counted as words and punctuation marks (``\\w+|[^\\w\\s]``), plus a few template
tokens per chat message — close enough to a BPE count for English text, and exact for the load
generator, which builds prompts from whole words. Generated tokens are words from a fixed vocabulary,
pre-escaped for JSON so a streamed chunk is built by concatenation.
"""

from __future__ import annotations

import json
import re
from typing import Any

CHAT_TEMPLATE_TOKENS_PER_MESSAGE = 4
_TOKEN = re.compile(r"\w+|[^\w\s]")

VOCABULARY = [
    "the",
    "model",
    "serves",
    "requests",
    "across",
    "the",
    "batch",
    "while",
    "the",
    "scheduler",
    "keeps",
    "every",
    "sequence",
    "moving",
    "forward",
    "through",
    "prefill",
    "and",
    "decode",
    "so",
    "that",
    "latency",
    "stays",
    "inside",
    "the",
    "budget",
    "agreed",
    "with",
    "the",
    "users",
    "of",
    "this",
    "service",
    "and",
    "throughput",
    "grows",
    "with",
    "the",
    "number",
    "of",
    "concurrent",
    "streams",
    "until",
    "memory",
    "bandwidth",
    "becomes",
    "the",
    "limit",
    "where",
    "each",
    "additional",
    "token",
    "costs",
    "the",
    "same",
    "weight",
    "reads",
    "as",
    "before",
    "but",
    "adds",
    "its",
    "own",
    "cache",
    "entries",
    "to",
    "the",
    "pool",
    "of",
    "blocks",
    "shared",
    "by",
    "all",
    "running",
    "requests",
    "on",
    "this",
    "engine",
]
SENTENCE_WORDS = 14
# Each generated token: " word", with a period closing every sentence; all JSON-safe as they are.
_WORDS = [(" " + w) for w in VOCABULARY]


def count_tokens(text: str) -> int:
    return len(_TOKEN.findall(text))


def content_text(content: Any) -> str:
    """Text of an OpenAI/Anthropic message content: a string or a list of ``{"type": "text"}`` parts."""
    if isinstance(content, str):
        return content
    if isinstance(content, list):
        return " ".join(
            str(p.get("text", "")) for p in content if isinstance(p, dict) and p.get("type") in ("text", None)
        )
    return ""


def chat_prompt_tokens(messages: list[Any], system: Any = None) -> tuple[int, str]:
    """Prompt tokens of a chat request and the text of its leading system prompt (the shared prefix)."""
    total = 0
    system_text = content_text(system) if system is not None else ""
    if system_text:
        total += count_tokens(system_text) + CHAT_TEMPLATE_TOKENS_PER_MESSAGE
    for i, msg in enumerate(messages):
        if not isinstance(msg, dict):
            raise ValueError(f"messages[{i}] must be an object")
        text = content_text(msg.get("content"))
        if i == 0 and msg.get("role") == "system" and not system_text:
            system_text = text
        total += count_tokens(text) + CHAT_TEMPLATE_TOKENS_PER_MESSAGE
    return max(total, 1), system_text


def token_text(index: int, offset: int) -> str:
    """The ``index``-th generated token (0-based) of a request whose text starts at ``offset``."""
    word = _WORDS[(offset + index) % len(_WORDS)]
    if index == 0:
        word = word[1:].capitalize()
    return word + "." if index % SENTENCE_WORDS == SENTENCE_WORDS - 1 else word


def full_text(n: int, offset: int) -> str:
    return "".join(token_text(i, offset) for i in range(n))


def dumps(obj: Any) -> str:
    return json.dumps(obj, separators=(",", ":"), ensure_ascii=False)
