"""``load_settings``: the settings from flags, environment and the config file, and the name checks that turn a
misspelt variable, a misspelt collector or a bad value into one :class:`~inferwatch.agent.errors.ConfigError`."""

from __future__ import annotations

import difflib
import json
import os
from collections.abc import Iterable, Mapping
from pathlib import Path
from typing import Any

from inferwatch.agent.config.envsource import EnvJSONError, deep_update, env_values
from inferwatch.agent.config.settings import ENV_NESTED_DELIMITER, ENV_PREFIX, Settings
from inferwatch.agent.config.yamlfile import (
    CONFIG_MAX_ALIASES_ENV,
    CONFIG_MAX_BYTES_ENV,
    config_file_limits,
    read_yaml,
)
from inferwatch.agent.errors import ConfigError

CONFIG_ENV = "INFERWATCH_CONFIG"

_CONFIG_LIMIT_ENVS = {CONFIG_ENV, CONFIG_MAX_BYTES_ENV, CONFIG_MAX_ALIASES_ENV}  # not settings: no name check


def _bad_json_env(environ: Mapping[str, str]) -> str | None:
    """ "VAR (field.path): not valid JSON (where)" for the first INFERWATCH_ variable holding broken JSON."""
    for var in sorted(environ):
        value = environ[var].strip()
        if not var.upper().startswith(ENV_PREFIX) or not value.startswith(("[", "{")):
            continue
        try:
            json.loads(value)
        except ValueError as exc:
            where = f"line {exc.lineno}, column {exc.colno}" if isinstance(exc, json.JSONDecodeError) else str(exc)
            field = var[len(ENV_PREFIX) :].lower().replace(ENV_NESTED_DELIMITER, ".")
            return f"{var} ({field}): not valid JSON ({where}); a list or object setting takes JSON"
    return None


def check_env_names(environ: Mapping[str, str]) -> None:
    """Reject ``INFERWATCH_`` variables that name no setting (see the module docstring for which)."""
    fields = set(Settings.__struct_fields__)
    for var in sorted(environ):
        if not var.upper().startswith(ENV_PREFIX) or var.upper() in _CONFIG_LIMIT_ENVS:
            continue
        name = var[len(ENV_PREFIX) :].lower()
        head, nested, _ = name.partition(ENV_NESTED_DELIMITER)
        if head in fields:
            continue  # keys below a known section are checked by the section's model (extra="forbid")
        near = difflib.get_close_matches(head, fields, n=1, cutoff=0.8)
        if nested or near:
            hint = f" (did you mean {ENV_PREFIX}{near[0].upper()}?)" if near else ""
            raise ConfigError(f"invalid configuration: {var}: {head} is not a setting{hint}")


def check_collector_names(settings: Settings, known: Iterable[str]) -> None:
    """Reject ``collectors.NAME`` entries for a collector the registry does not list."""
    names = sorted(known)
    unknown = sorted(set(settings.collectors) - set(names))
    if unknown:
        parts = [f"collectors.{n}: unknown collector {n!r} (known: {', '.join(names)})" for n in unknown]
        raise ConfigError("invalid configuration: " + "; ".join(parts))


def load_settings(
    config_file: Path | None = None,
    overrides: dict[str, Any] | None = None,
    collectors: Iterable[str] | None = None,
) -> Settings:
    """Build the settings from flags (``overrides``), environment and the YAML file; raise ConfigError.

    ``collectors``: the registry's collector names; when given, a ``collectors`` entry for any other name is
    an error (the CLI passes them; this module cannot import the registry, which imports it).
    """
    check_env_names(os.environ)
    max_bytes, max_aliases = config_file_limits(os.environ)
    if config_file is None and os.environ.get(CONFIG_ENV):
        config_file = Path(os.environ[CONFIG_ENV])
    file_values = read_yaml(config_file, max_bytes, max_aliases) if config_file else {}
    try:
        env = env_values(Settings, os.environ, ENV_PREFIX, ENV_NESTED_DELIMITER)
    except EnvJSONError as exc:  # a complex value (JSON) in the environment that does not parse
        raise ConfigError(f"invalid configuration: {_bad_json_env(os.environ) or exc}") from None
    settings = Settings.from_values(deep_update(file_values, deep_update(env, overrides or {})))
    if collectors is not None:
        check_collector_names(settings, collectors)
    return settings
