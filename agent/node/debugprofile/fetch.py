"""Bounded HTTP fetch of the runtime's debug profile: a byte cap, an overall deadline, JSON only.

Every failure raises :class:`ProfileFetchError` with a ``reason`` from :data:`FETCH_REASONS` (the
``reason`` attribute of ``inferwatch.runtime.profile.fetch.errors``).
"""

from __future__ import annotations

import json
import re
import time
from typing import TYPE_CHECKING, Any

from inferwatch.agent.common.redact import redact_text, redact_url
from inferwatch.agent.errors import CollectorError

if TYPE_CHECKING:  # httpx is imported by the first fetch: a runtime with no debug endpoint, no httpx
    import httpx

FETCH_REASONS = ("timeout", "connect", "http_status", "oversized", "not_json")
# Arrays and objects nested deeper than this are refused (reason ``oversized``) before anything walks them:
# a debug profile is a few levels deep, and 1 MiB of "[" would take json.loads, the redactor and the gauge
# walk past Python's recursion limit (a RecursionError, not the project's error).
MAX_PROFILE_DEPTH = 32


class ProfileFetchError(CollectorError):
    def __init__(self, reason: str, message: str) -> None:
        super().__init__(message)
        self.reason = reason


def parse_header(header: str) -> dict[str, str]:
    name, _, value = header.partition(":")
    return {name.strip(): value.strip()}


def fetch_json(
    url: str, headers: dict[str, str], timeout_s: float, max_bytes: int, client: httpx.Client | None = None
) -> Any:
    """GET ``url``; return the decoded JSON. Bounded by ``max_bytes`` and ``timeout_s`` overall."""
    import httpx

    from inferwatch.agent.common.httpclient import http_client

    deadline = time.monotonic() + timeout_s
    shown = redact_url(url)  # what messages say: never the URL's credentials
    own = client is None
    # a client of its own per fetch: its one GET opens the connection, so nothing is retried or counted here
    http = client or http_client("runtime_profile", timeout=httpx.Timeout(timeout_s), trust_env=True)
    try:
        with http.stream("GET", url, headers=headers, timeout=timeout_s) as r:
            if r.status_code != 200:
                raise ProfileFetchError("http_status", f"{shown} answered HTTP {r.status_code}")
            declared = r.headers.get("content-length")
            if declared and declared.isdigit() and int(declared) > max_bytes:
                raise ProfileFetchError("oversized", f"profile of {declared} bytes exceeds the cap of {max_bytes}")
            body = bytearray()
            for chunk in r.iter_bytes():  # decoded: the cap also bounds a compressed body's expansion
                body += chunk
                if len(body) > max_bytes:
                    raise ProfileFetchError("oversized", f"profile exceeds the cap of {max_bytes} bytes")
                if time.monotonic() > deadline:
                    raise ProfileFetchError("timeout", f"profile not received within {timeout_s:g}s")
    except httpx.TimeoutException as exc:
        raise ProfileFetchError("timeout", f"{shown} did not answer within {timeout_s:g}s") from exc
    except httpx.TransportError as exc:
        raise ProfileFetchError("connect", redact_text(f"cannot reach {shown}: {type(exc).__name__}: {exc}")) from exc
    finally:
        if own:
            http.close()
    return parse_profile(bytes(body), shown)


def parse_profile(body: bytes, url: str) -> Any:
    """The JSON document in ``body``; ProfileFetchError ``not_json``, or ``oversized`` past MAX_PROFILE_DEPTH.
    ``url`` is only named in messages: pass it with its credentials removed
    (inferwatch.agent.common.redact.redact_url)."""
    depth = _nesting_depth(body)
    if depth > MAX_PROFILE_DEPTH:
        raise ProfileFetchError(
            "oversized", f"profile from {url} nests arrays/objects deeper than {MAX_PROFILE_DEPTH} levels ({depth})"
        )
    try:
        return json.loads(body.decode("utf-8"))
    except (UnicodeDecodeError, ValueError, RecursionError) as exc:
        raise ProfileFetchError("not_json", f"profile from {url} is not JSON ({len(body)} bytes): {exc}") from exc


_TOKENS = re.compile(rb'"(?:[^"\\]|\\.)*"?|[\[\]{}]', re.S)  # strings (maybe unterminated) and brackets


def _nesting_depth(body: bytes) -> int:
    """The deepest ``[``/``{`` nesting outside strings (no recursion; stops once past the limit)."""
    if body.count(b"[") + body.count(b"{") <= MAX_PROFILE_DEPTH:
        return 0  # cannot be deeper: skip the scan (every real profile)
    depth = deepest = 0
    for m in _TOKENS.finditer(body):
        tok = m.group()
        if tok in (b"[", b"{"):
            depth += 1
            if depth > deepest:
                deepest = depth
                if deepest > MAX_PROFILE_DEPTH:
                    return deepest
        elif tok in (b"]", b"}"):
            depth -= 1
    return deepest
