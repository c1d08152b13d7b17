"""The config file: one bounded read (a size cap and a YAML alias cap, both set by environment variables since
they apply before the settings exist); :func:`~inferwatch.agent.config.loading.load_settings` lays the flags and the
environment over what it reads.

PyYAML is imported by the read: an agent configured by flags and environment alone never loads it."""

from __future__ import annotations

import reprlib
from collections.abc import Mapping
from pathlib import Path
from typing import Any

from inferwatch.agent.common.redact import redact_text
from inferwatch.agent.common.userfiles import read_text_bounded
from inferwatch.agent.errors import ConfigError

# The config file's own limits: read before the settings exist, so set by environment variables only.
DEFAULT_CONFIG_MAX_BYTES = 1 << 20  # 1 MiB: a config file is a few KiB
DEFAULT_CONFIG_MAX_ALIASES = 0  # YAML aliases (*name) refused: 70 of them nest into a 9**9 "billion laughs" bomb
CONFIG_MAX_BYTES_ENV = "INFERWATCH_CONFIG_MAX_BYTES"
CONFIG_MAX_ALIASES_ENV = "INFERWATCH_CONFIG_MAX_ALIASES"


def config_file_limits(environ: Mapping[str, str]) -> tuple[int, int]:
    """(max bytes, max YAML aliases) of the config file: ``INFERWATCH_CONFIG_MAX_BYTES`` (an integer ≥ 1) and
    ``INFERWATCH_CONFIG_MAX_ALIASES`` (an integer ≥ 0; 0 refuses every alias), else the defaults."""
    return (
        _env_int(environ, CONFIG_MAX_BYTES_ENV, DEFAULT_CONFIG_MAX_BYTES, least=1),
        _env_int(environ, CONFIG_MAX_ALIASES_ENV, DEFAULT_CONFIG_MAX_ALIASES, least=0),
    )


def _env_int(environ: Mapping[str, str], var: str, default: int, least: int) -> int:
    """The integer in ``var`` (``default`` when unset); ConfigError naming the variable unless it is ≥ ``least``."""
    raw = environ.get(var)
    if raw is None:
        return default
    try:
        value: int | None = int(raw.strip())
    except ValueError:
        value = None
    if value is None or value < least:
        shown = reprlib.repr(redact_text(raw))
        raise ConfigError(f"invalid configuration: {var}: must be an integer ≥ {least} (got {shown})")
    return value


def _bounded_loader(text: str, max_aliases: int) -> Any:
    """A SafeLoader over ``text`` (what yaml.load uses) that refuses aliases past ``max_aliases`` while composing,
    before anything expands."""
    import yaml

    class BoundedLoader(yaml.SafeLoader):
        aliases = 0

        def compose_node(self, parent: Any, index: Any) -> Any:
            if self.check_event(yaml.AliasEvent):
                self.aliases += 1
                if self.aliases > max_aliases:
                    mark = self.peek_event().start_mark
                    accepted = f"more than {max_aliases} are" if max_aliases else "they are"
                    raise yaml.YAMLError(
                        f"YAML aliases (*name): {accepted} not accepted in a config file (line {mark.line + 1}); "
                        f"write values out, or raise {CONFIG_MAX_ALIASES_ENV}"
                    )
            return super().compose_node(parent, index)

    return BoundedLoader(text)


def read_yaml(
    path: Path, max_bytes: int = DEFAULT_CONFIG_MAX_BYTES, max_aliases: int = DEFAULT_CONFIG_MAX_ALIASES
) -> dict[str, Any]:
    """The config file's top-level mapping; ConfigError when it is over ``max_bytes``, holds more than
    ``max_aliases`` YAML aliases, or is not a UTF-8 YAML mapping."""
    import yaml

    text = read_text_bounded(path, max_bytes, "config file", f" ({CONFIG_MAX_BYTES_ENV})")
    loader = _bounded_loader(text, max_aliases)
    try:
        data = loader.get_single_data()
    except yaml.YAMLError as exc:
        problem = getattr(exc, "problem", None) or str(exc).splitlines()[0]
        mark = getattr(exc, "problem_mark", None)
        where = f" (line {mark.line + 1}, column {mark.column + 1})" if mark is not None else ""
        raise ConfigError(f"config file {path} is not valid YAML: {problem[:200]}{where}") from None
    finally:
        loader.dispose()
    if data is None:
        return {}
    if not isinstance(data, dict):
        raise ConfigError(f"config file {path} must hold a mapping at the top level, not {type(data).__name__}")
    return data
