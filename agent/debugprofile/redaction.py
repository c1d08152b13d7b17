"""Redaction of runtime profiles and process details, applied before anything is stored or exported.

Two modes:

* ``denylist`` (default): every key matching a built-in pattern (``cpu_affinity_mask``, tokens, keys,
  secrets, passwords, authorization, cookies, environment variables) or a configured extra pattern is
  replaced, and so is any string value that looks like a credential (``Bearer ...``, ``sk-...``,
  ``hf_...``, JWTs), wherever it sits.
* ``allowlist``: only keys named in ``allow_keys`` (a leaf key or a dotted path) keep their value;
  every other scalar is replaced.

A replaced value becomes ``"[REDACTED hmac:<16 hex>]"``: HMAC-SHA256 of the value's canonical JSON under
a per-install key (kept with the snapshots, mode 0600). Equal values give equal markers, so two
snapshots can be compared, but without the key a marker cannot be checked against guesses.
"""

from __future__ import annotations

import hashlib
import hmac
import json
import os
import re
import secrets
from collections.abc import Iterable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

MARKER_PREFIX = "[REDACTED hmac:"
KEY_FILE_NAME = "redaction.key"
KEY_BYTES = 32
KEY_CACHE_MAX = 10_000

DEFAULT_DENY_PATTERNS: tuple[str, ...] = (
    r"cpu_affinity(_mask)?",
    r"affinity",
    r"token",
    r"(^|[_.-])key($|[_.-])",
    r"api_?key|access_?key|private_?key|secret_?key",
    r"secret",
    r"passw(or)?d|passphrase|pwd",
    r"authori[sz]ation|^auth$|bearer",
    r"cookie",
    r"credential",
    r"session",
    r"^env$|^environ$|environment|env_?vars?",
    r"dsn|connection_?string",
)
# Values that look like credentials whatever key holds them.
DEFAULT_VALUE_PATTERNS: tuple[str, ...] = (
    r"(?i:^bearer\s+\S+)",
    r"\bsk-[A-Za-z0-9_-]{16,}",
    r"\bhf_[A-Za-z0-9]{20,}",
    r"\bgh[pousr]_[A-Za-z0-9]{20,}",
    r"\beyJ[A-Za-z0-9_-]{8,}\.[A-Za-z0-9_-]{8,}\.",
    r"\bAKIA[0-9A-Z]{16}\b",
)
# Command-line flags whose value is secret (``--api-key X`` or ``--api-key=X``) and KEY=VALUE arguments.
_SENSITIVE_FLAG = re.compile(
    r"^--?[A-Za-z0-9_.-]*(token|key|secret|passw|auth|cookie|credential)[A-Za-z0-9_.-]*$", re.I
)


def load_or_create_key(directory: Path) -> bytes:
    """The per-install HMAC key, created (0600) on first use in ``directory``."""
    directory.mkdir(parents=True, exist_ok=True)
    path = directory / KEY_FILE_NAME
    try:
        data = path.read_bytes()
        if len(data) >= KEY_BYTES:
            return data[:KEY_BYTES]
    except FileNotFoundError:
        pass
    key = secrets.token_bytes(KEY_BYTES)
    fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o600)
    with os.fdopen(fd, "wb") as f:
        f.write(key)
    return key


@dataclass(frozen=True)
class RedactionPolicy:
    key: bytes
    mode: str = "denylist"  # denylist | allowlist
    deny_patterns: tuple[str, ...] = DEFAULT_DENY_PATTERNS
    allow_keys: frozenset[str] = frozenset()
    value_patterns: tuple[str, ...] = DEFAULT_VALUE_PATTERNS
    _deny: re.Pattern[str] = field(init=False, repr=False, compare=False)
    _values: re.Pattern[str] = field(init=False, repr=False, compare=False)
    _key_cache: dict[str, bool] = field(init=False, repr=False, compare=False)

    def __post_init__(self) -> None:
        object.__setattr__(self, "_deny", re.compile("|".join(f"(?:{p})" for p in self.deny_patterns), re.I))
        object.__setattr__(self, "_values", re.compile("|".join(f"(?:{p})" for p in self.value_patterns)))
        object.__setattr__(self, "_key_cache", {})  # profiles repeat their keys: decide each once

    @classmethod
    def build(
        cls, key: bytes, mode: str = "denylist", extra_deny: Iterable[str] = (), allow_keys: Iterable[str] = ()
    ) -> RedactionPolicy:
        return cls(
            key=key,
            mode=mode,
            deny_patterns=DEFAULT_DENY_PATTERNS + tuple(extra_deny),
            allow_keys=frozenset(allow_keys),
        )

    def marker(self, value: Any) -> str:
        canonical = json.dumps(value, sort_keys=True, separators=(",", ":"), default=str).encode()
        digest = hmac.new(self.key, canonical, hashlib.sha256).hexdigest()[:16]
        return f"{MARKER_PREFIX}{digest}]"

    def key_denied(self, key: str) -> bool:
        hit = self._key_cache.get(key)
        if hit is None:
            hit = bool(self._deny.search(key))
            if len(self._key_cache) < KEY_CACHE_MAX:
                self._key_cache[key] = hit
        return hit

    def value_looks_secret(self, value: str) -> bool:
        return bool(self._values.search(value))

    def redact(self, obj: Any) -> tuple[Any, list[str]]:
        """Return the redacted copy and the dotted paths that were replaced."""
        paths: list[str] = []
        return self._walk(obj, "", paths), paths

    def _allowed(self, path: str, key: str) -> bool:
        return key in self.allow_keys or path in self.allow_keys

    def _walk(self, obj: Any, path: str, paths: list[str]) -> Any:
        if isinstance(obj, dict):
            out: dict[str, Any] = {}
            for k, v in obj.items():
                key = str(k)
                child = f"{path}.{key}" if path else key
                if self.mode == "denylist" and self.key_denied(key):
                    out[key] = self.marker(v)
                    paths.append(child)
                elif self.mode == "allowlist" and self._allowed(child, key) and not isinstance(v, (dict, list)):
                    out[key] = self._scalar_denylist(v, child, paths)
                else:
                    out[key] = self._walk(v, child, paths)
            return out
        if isinstance(obj, list):
            return [self._walk(v, f"{path}[{i}]", paths) for i, v in enumerate(obj)]
        if self.mode == "allowlist":
            if obj is None:
                return None
            paths.append(path)
            return self.marker(obj)
        return self._scalar_denylist(obj, path, paths)

    def _scalar_denylist(self, value: Any, path: str, paths: list[str]) -> Any:
        if isinstance(value, str) and self.value_looks_secret(value):
            paths.append(path)
            return self.marker(value)
        return value

    def redact_cmdline(self, argv: list[str]) -> list[str]:
        """Replace the values of secret-looking flags and every ``NAME=VALUE`` argument's value."""
        out: list[str] = []
        hide_next = False
        for arg in argv:
            if hide_next:
                out.append(self.marker(arg))
                hide_next = False
                continue
            flag, eq, value = arg.partition("=")
            if arg.startswith("-") and _SENSITIVE_FLAG.match(flag):
                if eq:
                    out.append(f"{flag}={self.marker(value)}")
                else:
                    out.append(arg)
                    hide_next = True
            elif eq and not arg.startswith("-") and re.fullmatch(r"[A-Za-z_][A-Za-z0-9_]*", flag):
                out.append(f"{flag}={self.marker(value)}")
            elif self.value_looks_secret(arg):
                out.append(self.marker(arg))
            else:
                out.append(arg)
        return out
