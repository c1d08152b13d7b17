"""Detecting secrets by name and by value, and taking them out of URLs, free text and log lines.

The one place the agent decides what a secret looks like; everything that logs, exports or serves text
uses it: :func:`redact_url` for a URL it holds (``engine.metrics_url``, ``probe.url``,
``runtime_profile.url``), :func:`redact_text` for free text (error messages, log records, runtime-profile
strings), :func:`secret_name` for a name (a JSON key, an environment variable, a command-line flag, a
query parameter) and :class:`RedactingFormatter` for every log line.

Names are split into words (``hfToken``, ``HF_TOKEN``, ``--hf-token`` → ``hf token``) and matched as
words, so ``api_key``, ``hf_token``, ``db_pass`` and ``pw`` are secret while ``max_num_batched_tokens``,
``tokenizer``, ``eos_token_id`` and ``num_key_value_heads`` are not (:data:`SECRET_NAME_PATTERNS`,
:data:`NOT_SECRET_NAME_PATTERNS`).

Values are found wherever they sit in a string (:data:`TOKEN_PATTERNS`): URL userinfo and secret query
parameters (only that part is replaced, the rest of the URL stays readable), PEM private-key blocks,
``Authorization``-style values (``Bearer …``, ``Basic <base64 of user:pass>``), ``NAME=VALUE`` and
``--flag VALUE`` pairs whose name is secret, and well-known token formats (OpenAI/Anthropic ``sk-``,
Hugging Face ``hf_``, GitHub, GitLab ``glpat-``, Slack ``xox?-`` and webhooks, Google ``AIza``, AWS
``AKIA``/``ASIA``, Stripe, npm, JWTs). What is not caught (a bare random secret with no name and no
known shape) is listed in docs/diagnostics.md.

Only the standard library: every layer may import this module.
"""

from __future__ import annotations

import base64
import binascii
import logging
import re
from collections.abc import Callable
from urllib.parse import unquote

MASK = "REDACTED"  # what replaces a secret in a URL, an error message or a log line
Mask = Callable[[str], str]  # the secret found -> its replacement


def _plain(_: str) -> str:
    return MASK


# --- names --------------------------------------------------------------------------------------------

# Matched against the normalised name: its words, lower case, joined and surrounded by "_" ("_hf_token_").
SECRET_NAME_PATTERNS: tuple[str, ...] = (
    r"affinity",  # CPU placement (cpu_affinity_mask): reveals the host's layout
    r"_(cpus|mems)_allowed(_list)?_",  # /proc/PID/status Cpus_allowed_list, Mems_allowed_list
    r"_token_$",  # hf_token, access_token, HF_TOKEN, x-auth-token, token (not max_tokens, tokenizer)
    r"_(api|auth|access|bearer|refresh|id|session|secret|service)_tokens_$",
    r"_keys?_$",  # api_key, private_key, OPENAI_API_KEY, key (not num_key_value_heads)
    r"_apikey_|_(api|access|private|secret|signing|encryption|master)_keys?_",  # ... wherever they sit
    r"secret",
    r"passw(or)?d|passphrase|_pass_$|_pw_$|_pwd_$|_passcode_",  # not pass_config
    r"authori[sz]ation|_auth_|bearer",
    r"cookie",
    r"credential",
    r"session",
    r"^_env_$|^_environ_$|environment|_env_?vars?_",
    r"_dsn_|connection_?string|_conn_str_",
)
# Names that match a pattern above but hold configuration people need (tokenizer special tokens).
NOT_SECRET_NAME_PATTERNS: tuple[str, ...] = (
    r"_(bos|eos|pad|unk|sep|cls|mask|bot|eot|image|video|audio|start|end|stop|special|think)_token_$",
)
# Query parameters that carry a credential although their name says nothing (presigned URLs, OAuth).
SECRET_QUERY_NAMES: frozenset[str] = frozenset(
    {"sig", "signature", "x_amz_signature", "x_goog_signature", "code", "client_secret", "sas", "jwt"}
)

_WORD_BREAK = re.compile(r"(?<=[a-z0-9])(?=[A-Z])|(?<=[A-Z])(?=[A-Z][a-z])")
_NON_WORD = re.compile(r"[^A-Za-z0-9]+")


def normalize_name(name: str) -> str:
    """``"X-Amz-Signature"`` → ``"_x_amz_signature_"``; ``"hfToken"`` → ``"_hf_token_"``."""
    words = _NON_WORD.sub("_", _WORD_BREAK.sub("_", name)).strip("_").lower()
    return f"_{words}_"


def compile_names(patterns: tuple[str, ...]) -> re.Pattern[str]:
    return re.compile("|".join(f"(?:{p})" for p in patterns))


_SECRET_NAME = compile_names(SECRET_NAME_PATTERNS)
_NOT_SECRET_NAME = compile_names(NOT_SECRET_NAME_PATTERNS)


def secret_name(name: str) -> bool:
    """Whether a key, variable, flag or parameter of this name holds a secret (default patterns)."""
    norm = normalize_name(name)
    return bool(_SECRET_NAME.search(norm)) and not _NOT_SECRET_NAME.search(norm)


def _secret_query_name(name: str) -> bool:
    return secret_name(name) or normalize_name(unquote(name)).strip("_") in SECRET_QUERY_NAMES


# --- URLs ---------------------------------------------------------------------------------------------

_URL_PARTS = re.compile(r"(?P<scheme>[A-Za-z][A-Za-z0-9+.-]*:)?//(?P<netloc>[^/?#\s]*)(?P<rest>.*)", re.S)
# user:password@host where the password holds "/", "?" or "#" unencoded (so the authority seems to end early)
_LOOSE_PASSWORD = re.compile(r"(?P<user>[^:/?#\s@\[\]]*):(?P<pw>[^@\s]+)@(?P<host>[^/?#\s@]*)(?P<rest>.*)", re.S)


def _redact_params(params: str, mask: Mask, name_check: Callable[[str], bool] = _secret_query_name) -> str:
    out = []
    for part in params.split("&"):
        name, eq, value = part.partition("=")
        if eq and value and name_check(name):
            out.append(f"{name}={mask(value)}")
        else:
            out.append(part)
    return "&".join(out)


def redact_url(url: str, mask: Mask = _plain) -> str:
    """``url`` without credentials: the password of its userinfo (or a lone user name, often a token),
    the values of secret query parameters (and of such ``#fragment`` parameters), and tokens of known
    formats in its path are replaced; scheme, host, port, path and the other parameters stay.

    ``postgres://u:p@db/x`` → ``postgres://u:REDACTED@db/x``; ``https://h/o?X-Amz-Signature=ab&x=1`` →
    ``https://h/o?X-Amz-Signature=REDACTED&x=1``. Never raises; a string that is no URL comes back unchanged.
    """
    m = _URL_PARTS.match(url)
    if m is None:
        return url
    scheme, netloc, rest = m.group("scheme") or "", m.group("netloc"), m.group("rest")
    port_or_password = netloc.partition(":")[2]
    loose = None if "@" in netloc or port_or_password.isdigit() else _LOOSE_PASSWORD.match(netloc + rest)
    if loose is not None:  # u:pa/ss@h: a password with "/", "?" or "#" in it
        netloc, rest = f"{loose.group('user')}:{loose.group('pw')}@{loose.group('host')}", loose.group("rest")
    userinfo, at, host = netloc.rpartition("@")
    if at and userinfo:
        user, colon, password = userinfo.partition(":")
        # user:password keeps the user; a lone user name is often the token itself (https://TOKEN@host)
        netloc = f"{user}:{mask(password) if password else ''}@{host}" if colon else f"{mask(user)}@{host}"
    path, hash_, fragment = rest.partition("#")
    path, qmark, query = path.partition("?")
    hostpath = _sub_tokens(netloc + path, mask)  # with the host: webhook URLs keep their secret in the path
    if qmark:
        query = _redact_params(query, mask)
    if hash_ and "=" in fragment:
        fragment = _redact_params(fragment, mask)
    return f"{scheme}//{hostpath}{qmark}{query}{hash_}{fragment}"


# --- values in text -----------------------------------------------------------------------------------

# Well-known token formats (prefix + body); the whole match is the secret.
TOKEN_PATTERNS: tuple[str, ...] = (
    r"\bsk-[A-Za-z0-9_-]{16,}",  # OpenAI (sk-, sk-proj-), Anthropic (sk-ant-)
    r"\b[sr]k_(?:live|test)_[A-Za-z0-9]{16,}",  # Stripe
    r"\bhf_[A-Za-z0-9]{20,}",  # Hugging Face
    r"\bgh[pousr]_[A-Za-z0-9]{20,}|\bgithub_pat_[A-Za-z0-9_]{22,}",  # GitHub
    r"\bgl(?:pat|dt|rt|soat|ptt|cbt)-[A-Za-z0-9_-]{20,}",  # GitLab
    r"\bxox[abposr]-[A-Za-z0-9-]{10,}|\bxapp-[A-Za-z0-9-]{10,}",  # Slack
    r"(?<=hooks\.slack\.com/services/)[A-Za-z0-9_/-]{8,}",  # Slack incoming webhook (secret path)
    r"(?<=discord\.com/api/webhooks/)[A-Za-z0-9_/-]{8,}",  # Discord webhook
    r"\bAIza[0-9A-Za-z_-]{35}",  # Google API key
    r"\b(?:AKIA|ASIA)[0-9A-Z]{16}\b",  # AWS access key id
    r"\bnpm_[A-Za-z0-9]{36}\b",  # npm
    r"\beyJ[A-Za-z0-9_-]{8,}\.[A-Za-z0-9_-]{8,}\.[A-Za-z0-9_-]*",  # JWT (header.payload.signature)
)
_TOKENS = compile_names(TOKEN_PATTERNS)

_PEM = r"-----BEGIN (?:[A-Z0-9]+ )*PRIVATE KEY(?: BLOCK)?-----(?:.*?-----END [A-Z0-9 ]*-----|.*)"
_URL = r"\b[A-Za-z][A-Za-z0-9+.-]{1,30}://[^\s'\"<>`]+"
_AUTH_HEADER = (
    r"(?i:\b(?:proxy-)?authorization|\bx-api-key|\bapi-key)\s*[:=]\s*[\"']?"
    r"(?:(?i:bearer|basic|digest|token|apikey)\s+)?(?P<auth>[^\s\"',;]+)"
)
_BEARER = r"\b(?i:bearer)\s+(?P<bearer>[A-Za-z0-9._~+/-]{6,}=*)"
_BASIC = r"\b(?i:basic)\s+(?P<basic>[A-Za-z0-9+/]{8,}={0,2})(?![A-Za-z0-9+/=])"
_QUOTED_PAIR = r"(?P<q>[\"'])(?P<qname>[A-Za-z_][\w.-]*)(?P=q)\s*:\s*(?P<q2>[\"'])(?P<qvalue>[^\"']*)(?P=q2)"
_ASSIGN = r"(?<![\w.-])(?P<aname>[A-Za-z_][\w.-]*)=(?P<avalue>\"[^\"]*\"|'[^']*'|[^\s&,;\"'=]+=*)"
_FLAG = r"(?<![\w-])(?P<fname>--?[A-Za-z][\w.-]*)(?:=|[ \t]+)(?P<fvalue>\"[^\"]*\"|'[^']*'|[^\s\"'-][^\s\"']*)"

_SCAN = re.compile(
    "|".join(
        f"(?P<{g}>{p})"
        for g, p in (
            ("pem", _PEM),
            ("url", _URL),
            ("header", _AUTH_HEADER),
            ("bearerv", _BEARER),
            ("basicv", _BASIC),
            ("token", "|".join(f"(?:{p})" for p in TOKEN_PATTERNS)),
            ("pair", _QUOTED_PAIR),
            ("assign", _ASSIGN),
            ("flag", _FLAG),
        )
    ),
    re.S,
)
# Which short flags take a secret value (``-k X``), whatever their name says.
SECRET_SHORT_FLAGS: frozenset[str] = frozenset({"-k"})


def _sub_tokens(text: str, mask: Mask) -> str:
    return _TOKENS.sub(lambda m: mask(m.group(0)), text)


def _is_basic_credential(b64: str) -> bool:
    """``Basic`` credentials are base64 of ``user:password``; prose after the word "basic" is not."""
    try:
        raw = base64.b64decode(b64 + "=" * (-len(b64) % 4), validate=True)
    except (binascii.Error, ValueError):
        return False
    return b":" in raw and all(32 <= c < 127 for c in raw)


def flag_secret(
    flag: str, name_check: Callable[[str], bool] = secret_name, short_flags: frozenset[str] = SECRET_SHORT_FLAGS
) -> bool:
    """Whether a command-line flag takes a secret value: a known short flag (``-k``) or a secret name
    (``--api-key``, ``-Dfoo.password``)."""
    return flag in short_flags or (len(flag) > 2 and name_check(flag.lstrip("-")))


def _unquoted(value: str, mask: Mask) -> str:
    if len(value) >= 2 and value[0] == value[-1] and value[0] in "\"'":
        return f"{value[0]}{mask(value[1:-1])}{value[0]}"
    return mask(value)


_PAIR_GROUPS = {"pair": ("qname", "qvalue"), "assign": ("aname", "avalue"), "flag": ("fname", "fvalue")}


def _replace(m: re.Match[str], mask: Mask) -> str:
    """The replacement of one match that is not a NAME/VALUE pair."""
    whole = m.group(0)
    kind = m.lastgroup

    def part(group: str, new: str) -> str:
        return whole[: m.start(group) - m.start()] + new + whole[m.end(group) - m.start() :]

    if kind == "url":
        return redact_url(whole, mask)
    if kind == "header":
        return part("auth", mask(m.group("auth")))
    if kind == "bearerv":
        cred = m.group("bearer")
        return part("bearer", mask(cred)) if len(cred) >= 16 or not cred.isalpha() else whole
    if kind == "basicv":
        return part("basic", mask(m.group("basic"))) if _is_basic_credential(m.group("basic")) else whole
    return mask(whole)  # pem, token


def redact_text(
    text: str,
    mask: Mask = _plain,
    name_check: Callable[[str], bool] = secret_name,
    short_flags: frozenset[str] = SECRET_SHORT_FLAGS,
) -> str:
    """``text`` with every secret value found in it replaced by ``mask(secret)`` (see the module doc).

    NAME/VALUE pairs: the value is replaced when the name is secret; otherwise scanning goes on *inside*
    the value (``url=postgres://u:p@h``, ``--db-url postgres://u:p@h``, ``"note": "Bearer …"``), so each
    character is scanned about once: linear time, no recursion, whatever the input.
    """
    if not text:
        return text
    out: list[str] = []
    pos = 0
    while (m := _SCAN.search(text, pos)) is not None:
        kind = m.lastgroup
        out.append(text[pos : m.start()])
        if kind in _PAIR_GROUPS:
            name_group, value_group = _PAIR_GROUPS[kind]
            name, value = m.group(name_group), m.group(value_group)
            secret = flag_secret(name, name_check, short_flags) if kind == "flag" else name_check(name)
            out.append(text[m.start() : m.start(value_group)])
            if secret and value:
                out.append(_unquoted(value, mask))
                pos = m.end(value_group)
            else:
                pos = m.start(value_group)  # scan the value itself next
            continue
        out.append(_replace(m, mask))
        pos = m.end()
    out.append(text[pos:])
    return "".join(out)


# --- logs ---------------------------------------------------------------------------------------------


class RedactingFormatter(logging.Formatter):
    """A formatter whose every line (message, arguments and traceback) goes through :func:`redact_text`.

    Libraries log URLs as they were given (httpx: ``HTTP Request: GET http://user:pw@host/metrics``),
    so credentials are taken out where every log line passes, whoever wrote it.
    """

    def format(self, record: logging.LogRecord) -> str:
        return redact_text(super().format(record))


def install_log_redaction(logger: logging.Logger | None = None) -> None:
    """Give every handler of ``logger`` (default: the root logger) a :class:`RedactingFormatter`."""
    for handler in (logger or logging.getLogger()).handlers:
        fmt = handler.formatter
        if isinstance(fmt, RedactingFormatter):
            continue
        handler.setFormatter(RedactingFormatter(fmt._fmt if fmt else None, fmt.datefmt if fmt else None))
