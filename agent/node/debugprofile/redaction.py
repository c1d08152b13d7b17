"""Redaction of runtime profiles and process details, applied before anything is stored or exported.

Two modes:

* ``denylist`` (default): every key whose name is secret (:func:`inferwatch.agent.common.redact.secret_name`:
``api_key``,
  ``hf_token``, ``password``, ``pass``, ``pw``, ``authorization``, cookies, sessions, environment
  variables, CPU affinity — not ``max_num_batched_tokens`` or ``tokenizer``) or matches a configured
  extra pattern has its whole value replaced; every string anywhere is scanned for secret *values*
  (:func:`inferwatch.agent.common.redact.redact_text`: URL passwords and token query parameters, PEM private keys,
  ``Bearer``/``Basic`` credentials, well-known token formats, ``NAME=VALUE`` and ``--flag VALUE`` pairs
  with a secret name), and only the secret part is replaced; ``{"name": "OPENAI_API_KEY", "value": …}``
  entries lose their value, and lists of strings are read as command lines (``["--api-key", X]``).
* ``allowlist``: only keys named in ``allow_keys`` (a leaf key or a dotted path) keep their value (still
  scanned for secret values); every other scalar is replaced.

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

from inferwatch.agent.common.redact import (
    NOT_SECRET_NAME_PATTERNS,
    SECRET_NAME_PATTERNS,
    SECRET_SHORT_FLAGS,
    compile_names,
    flag_secret,
    normalize_name,
    redact_text,
)

MARKER_PREFIX = "[REDACTED hmac:"
KEY_FILE_NAME = "redaction.key"
KEY_BYTES = 32
KEY_CACHE_MAX = 10_000

# Matched against the key's normalised words (inferwatch.agent.common.redact.normalize_name); configured extra patterns
# (runtime_profile.deny_keys) against the key as written, case-insensitive.
DEFAULT_DENY_PATTERNS: tuple[str, ...] = SECRET_NAME_PATTERNS
# A value that is an Authorization header's value as a whole is replaced whole, scheme included.
# (Its credential looks like one: not a plain word shorter than 16 letters, so "token limit" stays.)
_AUTH_VALUE = re.compile(r"^\s*(?i:bearer|basic|digest|token|apikey|negotiate)\s+(?P<cred>\S{6,})\s*$")
# Fields that name an environment variable or setting next to its value ({"name": "HF_TOKEN", "value": …}).
PAIR_NAME_FIELDS = ("name", "key")
PAIR_VALUE_FIELD = "value"


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
    extra_deny: tuple[str, ...] = ()
    allow_keys: frozenset[str] = frozenset()
    short_flags: frozenset[str] = SECRET_SHORT_FLAGS
    _deny: re.Pattern[str] = field(init=False, repr=False, compare=False)
    _keep: re.Pattern[str] = field(init=False, repr=False, compare=False)
    _extra: re.Pattern[str] | None = field(init=False, repr=False, compare=False)
    _key_cache: dict[str, bool] = field(init=False, repr=False, compare=False)

    def __post_init__(self) -> None:
        object.__setattr__(self, "_deny", compile_names(self.deny_patterns))
        object.__setattr__(self, "_keep", compile_names(NOT_SECRET_NAME_PATTERNS))
        extra = re.compile("|".join(f"(?:{p})" for p in self.extra_deny), re.I) if self.extra_deny else None
        object.__setattr__(self, "_extra", extra)
        object.__setattr__(self, "_key_cache", {})  # profiles repeat their keys: decide each once

    @classmethod
    def build(
        cls, key: bytes, mode: str = "denylist", extra_deny: Iterable[str] = (), allow_keys: Iterable[str] = ()
    ) -> RedactionPolicy:
        return cls(key=key, mode=mode, extra_deny=tuple(extra_deny), allow_keys=frozenset(allow_keys))

    def marker(self, value: Any) -> str:
        canonical = json.dumps(value, sort_keys=True, separators=(",", ":"), default=str).encode()
        digest = hmac.new(self.key, canonical, hashlib.sha256).hexdigest()[:16]
        return f"{MARKER_PREFIX}{digest}]"

    def key_denied(self, key: str) -> bool:
        """Whether a key (also an environment variable's or a flag's name) holds a secret."""
        hit = self._key_cache.get(key)
        if hit is None:
            norm = normalize_name(key)
            hit = bool(self._deny.search(norm)) and not self._keep.search(norm)
            hit = hit or bool(self._extra is not None and self._extra.search(key))
            if len(self._key_cache) < KEY_CACHE_MAX:
                self._key_cache[key] = hit
        return hit

    def redact_string(self, value: str) -> str:
        """``value`` with its secret parts replaced by markers (unchanged when it holds none)."""
        auth = _AUTH_VALUE.match(value)
        if auth is not None and (len(auth["cred"]) >= 16 or not auth["cred"].isalpha()):
            return self.marker(value)
        return redact_text(value, self.marker, self.key_denied, self.short_flags)

    def redact(self, obj: Any) -> tuple[Any, list[str]]:
        """Return the redacted copy and the dotted paths that were replaced (wholly or in part)."""
        paths: list[str] = []
        return self._walk(obj, "", paths), paths

    def _allowed(self, path: str, key: str) -> bool:
        return key in self.allow_keys or path in self.allow_keys

    def _pair_secret(self, obj: dict[Any, Any]) -> bool:
        """``{"name": "OPENAI_API_KEY", "value": …}``: the value is secret because the name is."""
        if PAIR_VALUE_FIELD not in obj:
            return False
        for field_name in PAIR_NAME_FIELDS:
            name = obj.get(field_name)
            if isinstance(name, str) and self.key_denied(name):
                return True
        return False

    def _walk(self, obj: Any, path: str, paths: list[str]) -> Any:
        if isinstance(obj, dict):
            out: dict[str, Any] = {}
            pair_secret = self.mode == "denylist" and self._pair_secret(obj)
            for k, v in obj.items():
                key = str(k)
                child = f"{path}.{key}" if path else key
                if self.mode == "denylist" and (
                    self.key_denied(key) or (pair_secret and key == PAIR_VALUE_FIELD and v is not None)
                ):
                    out[key] = self.marker(v)
                    paths.append(child)
                elif self.mode == "allowlist" and self._allowed(child, key) and not isinstance(v, (dict, list)):
                    out[key] = self._scalar_denylist(v, child, paths)
                else:
                    out[key] = self._walk(v, child, paths)
            return out
        if isinstance(obj, list):
            if self.mode == "denylist" and _argv_like(obj):
                redacted = self._argv(obj, every_assignment=False)
                paths.extend(f"{path}[{i}]" for i, (a, b) in enumerate(zip(obj, redacted, strict=True)) if a != b)
                return redacted
            return [self._walk(v, f"{path}[{i}]", paths) for i, v in enumerate(obj)]
        if self.mode == "allowlist":
            if obj is None:
                return None
            paths.append(path)
            return self.marker(obj)
        return self._scalar_denylist(obj, path, paths)

    def _scalar_denylist(self, value: Any, path: str, paths: list[str]) -> Any:
        if isinstance(value, str):
            redacted = self.redact_string(value)
            if redacted != value:
                paths.append(path)
            return redacted
        return value

    def redact_cmdline(self, argv: list[str]) -> list[str]:
        """A process's command line: the values of secret flags (``--api-key X``, ``--hf-token=X``, ``-k X``)
        and of every ``NAME=VALUE`` argument are replaced, and every argument is scanned for secret values
        (``--db-url postgres://u:p@h`` keeps all but the password)."""
        return self._argv(argv, every_assignment=True)

    def _argv(self, argv: list[str], every_assignment: bool) -> list[str]:
        out: list[str] = []
        hide_next = False
        for arg in argv:
            if hide_next:
                out.append(self.marker(arg))
                hide_next = False
                continue
            flag, eq, value = arg.partition("=")
            if _FLAG_SHAPE.fullmatch(flag) and self._flag_secret(flag):
                if eq:
                    out.append(f"{flag}={self.marker(value)}")
                else:
                    out.append(arg)
                    hide_next = True
            elif every_assignment and eq and not arg.startswith("-") and _ENV_NAME.fullmatch(flag):
                out.append(f"{flag}={self.marker(value)}")
            else:
                out.append(self.redact_string(arg))
        return out

    def _flag_secret(self, flag: str) -> bool:
        return flag_secret(flag, self.key_denied, self.short_flags)


_ENV_NAME = re.compile(r"[A-Za-z_][A-Za-z0-9_]*")
_FLAG_SHAPE = re.compile(r"--?[A-Za-z][A-Za-z0-9_.-]*")


def _argv_like(items: list[Any]) -> bool:
    """A list of strings with at least one flag in it: read as a command line."""
    return bool(items) and all(isinstance(i, str) for i in items) and any(i.startswith("-") for i in items)
