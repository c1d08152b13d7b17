"""A user's own files (the config, a price table) read with a size limit: never more than the limit in memory."""

from __future__ import annotations

from pathlib import Path

from inferwatch.agent.errors import ConfigError


def read_text_bounded(path: Path, max_bytes: int, what: str, limit_hint: str = "") -> str:
    """A user's file (config, price table) as text: ConfigError when it cannot be read, is over ``max_bytes``
    (never more than ``max_bytes + 1`` bytes are read) or is not UTF-8. ``limit_hint`` names how to raise the
    limit, after the figure."""
    try:
        with path.open("rb") as f:
            raw = f.read(max_bytes + 1)
    except OSError as exc:
        raise ConfigError(f"cannot read {what} {path}: {exc.strerror or exc}") from exc
    if len(raw) > max_bytes:
        raise ConfigError(f"{what} {path} is over {max_bytes} bytes{limit_hint}; refused")
    try:
        return raw.decode("utf-8")
    except UnicodeDecodeError as exc:
        raise ConfigError(f"{what} {path} is not UTF-8 (invalid byte at offset {exc.start})") from None
