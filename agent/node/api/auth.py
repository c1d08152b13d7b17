"""Bearer-token authentication and scopes for the JSON API.

Tokens come from ``api.tokens`` (YAML or ``INFERWATCH_API__TOKENS`` as JSON) and ``api.tokens_file``
(one ``TOKEN scope,scope [name]`` per line, ``#`` comments). Scopes: ``read`` (status, findings),
``snapshots`` (runtime_profile snapshots), ``profile`` (start and download py-spy profiles, re-run the
binary check). Every presented token is compared with every configured one using
:func:`hmac.compare_digest`, so timing does not reveal which prefix matched. While no token is
configured (only possible on a loopback address) ``api.anonymous_scopes`` apply; ``profile`` never
does anonymously.
"""

from __future__ import annotations

import hmac
from dataclasses import dataclass
from pathlib import Path

from inferwatch.agent.config import API_SCOPES, ApiSettings
from inferwatch.agent.errors import ConfigError

MIN_TOKEN_CHARS = 16


@dataclass(frozen=True, slots=True)
class Credential:
    token: bytes
    scopes: frozenset[str]
    name: str


def read_tokens_file(path: Path) -> list[Credential]:
    try:
        text = path.read_text(encoding="utf-8")
    except OSError as exc:
        raise ConfigError(f"api.tokens_file {path}: cannot read: {exc.strerror or exc}") from None
    out = []
    for n, line in enumerate(text.splitlines(), 1):
        line = line.strip()
        if not line or line.startswith("#"):
            continue
        parts = line.split()
        token = parts[0]
        scopes = frozenset(parts[1].split(",")) if len(parts) > 1 else frozenset({"read"})
        bad = scopes - set(API_SCOPES)
        if len(token) < MIN_TOKEN_CHARS:
            raise ConfigError(f"api.tokens_file {path}:{n}: token shorter than {MIN_TOKEN_CHARS} characters")
        if bad:
            raise ConfigError(f"api.tokens_file {path}:{n}: unknown scope(s) {sorted(bad)} (known: {API_SCOPES})")
        out.append(Credential(token.encode(), scopes, parts[2] if len(parts) > 2 else f"file:{n}"))
    return out


class Authenticator:
    def __init__(self, cfg: ApiSettings) -> None:
        creds = [
            Credential(t.token.encode(), frozenset(t.scopes), t.name or f"token{i}") for i, t in enumerate(cfg.tokens)
        ]
        if cfg.tokens_file is not None:
            creds += read_tokens_file(cfg.tokens_file)
        self.credentials = creds
        self.open_paths = frozenset(p for p in cfg.open_paths if not p.endswith("/*"))
        self.open_prefixes = tuple(p[:-1] for p in cfg.open_paths if p.endswith("/*"))
        self.anonymous = frozenset(cfg.anonymous_scopes) - {"profile"} if not creds else frozenset()
        self.refused = {401: 0, 403: 0}  # counted by decide(); exported as inferwatch.api.refused

    def is_open(self, path: str) -> bool:
        return path in self.open_paths or path.startswith(self.open_prefixes)

    def identify(self, authorization: str | None) -> Credential | None:
        """The credential a header presents, or None (no header, wrong scheme, unknown token)."""
        if not authorization:
            return None
        scheme, _, token = authorization.partition(" ")
        if scheme.lower() != "bearer" or not token.strip():
            return None
        presented = token.strip().encode()
        match = None
        for cred in self.credentials:  # no early exit: the same work whichever token matches
            if hmac.compare_digest(presented, cred.token):
                match = cred
        return match

    def check(self, authorization: str | None, scope: str) -> int:
        """200 allowed, 401 no valid token, 403 valid token without the scope (not counted: see decide)."""
        cred = self.identify(authorization)
        if cred is None:
            return 200 if scope in self.anonymous and not authorization else 401
        return 200 if scope in cred.scopes else 403

    def decide(self, authorization: str | None, scope: str) -> int:
        """:meth:`check`, counting each refusal in ``refused``."""
        code = self.check(authorization, scope)
        if code != 200:
            self.refused[code] += 1
        return code
