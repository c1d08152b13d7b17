"""``INFERWATCH_`` environment variables as settings values: the source between the flags and the config file.

Read as pydantic-settings' ``EnvSettingsSource`` reads them (the agent used that package until it measured what it
cost: ~1.3 MB of every agent's memory for sources it never used, docs/benchmarks.md "Where the megabytes go"):

- names are case-insensitive; ``INFERWATCH_<FIELD>`` sets a top-level setting and ``INFERWATCH_<FIELD>__<KEY>``
  (``__`` between levels, any depth) a key below it, named as written, lower-cased;
- a value for a list, a mapping or a section (a *complex* setting) is JSON; any other value is the string, which
  the settings' validation converts. A JSON object for a section is merged with the section's ``__`` variables,
  which win. A complex value that is not JSON raises :class:`EnvJSONError`, unless the setting is a union that
  also takes a scalar (then the string is kept, and validation judges it);
- a key below a section that the section does not declare is passed on as written, so the section's struct
  rejects it (``forbid_unknown_fields``) with the setting's name;
- a number's text is read without the spaces around it, and a switch's as pydantic read it: ``true``, ``1``,
  ``yes``, ``on``, ``y``, ``t`` and their opposites, in any case.
"""

from __future__ import annotations

import dataclasses
import json
import types
import typing
from collections import deque
from collections.abc import Mapping, Sequence, Set
from typing import Any, TypeGuard, get_args, get_origin

from msgspec import Struct

from inferwatch.agent.config.convert import strip as _strip
from inferwatch.agent.config.convert import struct_fields


@dataclasses.dataclass(frozen=True)
class FieldInfo:
    """A settings struct's field, as the reader walks them: its annotation."""

    annotation: Any


def _fields(model: Any) -> dict[str, FieldInfo]:
    return {name: FieldInfo(annotation) for name, annotation in struct_fields(model).items()}


class EnvJSONError(ValueError):
    """A complex setting's variable does not hold JSON (message: the variable, the setting, where it fails)."""


def deep_update(mapping: Mapping[str, Any], *updates: Mapping[str, Any]) -> dict[str, Any]:
    """``mapping`` with each of ``updates`` laid over it in turn, mappings merged key by key at every depth."""
    out = dict(mapping)
    for update in updates:
        for key, value in update.items():
            if isinstance(out.get(key), dict) and isinstance(value, dict):
                out[key] = deep_update(out[key], value)
            else:
                out[key] = value
    return out


def _is_union(annotation: Any) -> bool:
    return get_origin(annotation) in (typing.Union, types.UnionType)


def _is_model(annotation: Any) -> TypeGuard[type[Struct]]:
    return isinstance(annotation, type) and issubclass(annotation, Struct) and annotation is not Struct


def _complex_class(cls: Any) -> bool:
    if not isinstance(cls, type) or issubclass(cls, (str, bytes)):
        return False
    return issubclass(cls, (Struct, Mapping, Sequence, Set, tuple, deque)) or dataclasses.is_dataclass(cls)


def _is_complex(annotation: Any) -> bool:
    """A list, set, tuple, mapping, model or dataclass (and not str or bytes): its variable holds JSON."""
    origin = get_origin(annotation)
    if origin is typing.Annotated:
        return _is_complex(get_args(annotation)[0])
    return _complex_class(annotation) or _complex_class(origin)


def _union_is_complex(annotation: Any) -> bool:
    return _is_union(annotation) and any(_is_complex(a) or _union_is_complex(a) for a in get_args(annotation))


def _complexity(annotation: Any) -> tuple[bool, bool]:
    """(the variable holds JSON, a value that is not JSON is kept as the string)."""
    if _is_complex(annotation):
        return True, False
    if _union_is_complex(annotation):
        return True, True
    return False, False


def _next_field(target: Any, key: str, prefix: str) -> Any:
    """What ``key`` names below ``target`` (a FieldInfo or a type): a model's field, a dict's value type, else None."""
    if target is None:
        return None
    annotation = target.annotation if isinstance(target, FieldInfo) else target
    origin = get_origin(annotation)
    if isinstance(origin, type) and issubclass(origin, dict):
        args = get_args(annotation)
        return args[-1] if args else None
    for member in get_args(annotation):
        found = _next_field(member, key, prefix)
        if found is not None:
            return found
    if _is_model(annotation):
        for name, field in _fields(annotation).items():
            if key in (name.lower(), f"{prefix}{name}".lower()):
                return field
    return None


_TRUE = frozenset({"1", "on", "t", "true", "y", "yes"})
_FALSE = frozenset({"0", "off", "f", "false", "n", "no"})


def _scalar(annotation: Any, text: str) -> str:
    """A scalar variable's text as the conversion reads it (the module docstring's last point)."""
    kind = _strip(annotation)
    if kind is bool:
        word = text.strip().lower()
        return "true" if word in _TRUE else "false" if word in _FALSE else text
    if kind in (int, float):
        return text.strip()
    return text


class _Reader:
    def __init__(self, environ: Mapping[str, str], prefix: str, delimiter: str) -> None:
        self.env = {name.lower(): value for name, value in environ.items()}
        self.prefix = prefix.lower()
        self.delimiter = delimiter
        self.names = {name.lower(): name for name in environ}  # for messages: the variable as the user wrote it

    def fail(self, env_name: str, path: str, exc: ValueError) -> EnvJSONError:
        where = f"line {exc.lineno}, column {exc.colno}" if isinstance(exc, json.JSONDecodeError) else str(exc)
        var = self.names.get(env_name, env_name.upper())
        return EnvJSONError(f"{var} ({path}): not valid JSON ({where}); a list or object setting takes JSON")

    def explode(self, field_name: str, field: FieldInfo) -> dict[str, Any]:
        """The ``INFERWATCH_<FIELD>__...`` variables of one top-level field, as nested mappings."""
        head = f"{self.prefix}{field_name}{self.delimiter}"
        is_dict = field.annotation is dict or get_origin(field.annotation) is dict
        result: dict[str, Any] = {}
        for env_name, env_val in self.env.items():
            if not env_name.startswith(head):
                continue
            *keys, last = env_name[len(head) :].split(self.delimiter)
            value: Any = env_val
            node: Any = result
            target: Any = field
            for key in keys:
                target = _next_field(target, key, self.prefix)
                if isinstance(node, dict):
                    node = node.setdefault(key, {})
            target = _next_field(target, last, self.prefix)
            if (target is not None or is_dict) and env_val:
                if isinstance(target, FieldInfo):
                    is_complex, keep_string = _complexity(target.annotation)
                elif target is not None:  # a type: a dict's value type
                    is_complex, keep_string = _is_complex(target), True
                    if not is_complex and _union_is_complex(_strip(target)):
                        try:
                            decoded = json.loads(env_val)
                        except ValueError:
                            decoded = None
                        value = decoded if isinstance(decoded, (list, dict)) else env_val
                else:  # below a dict of dicts
                    is_complex, keep_string = True, True
                if is_complex:
                    try:
                        value = json.loads(env_val)
                    except ValueError as exc:
                        if not keep_string:
                            path = ".".join((field_name, *keys, last))
                            raise self.fail(env_name, path, exc) from None
            if isinstance(value, str) and isinstance(target, FieldInfo):
                value = _scalar(target.annotation, value)
            if isinstance(node, dict):
                node[last] = value
        return result


def _field_names(annotation: Any, values: dict[str, Any]) -> dict[str, Any]:
    """``values`` with each key that names a field of the model ``annotation`` (case-insensitively) spelt as the
    field is, at every depth; other keys as they are."""
    model = _strip(annotation)
    if not _is_model(model):
        return values
    out: dict[str, Any] = {}
    fields = _fields(model)
    for key, value in values.items():
        name = next((n for n in fields if n.lower() == key.lower()), None)
        if name is None:
            out[key] = value
            continue
        sub = fields[name].annotation
        out[name] = _field_names(sub, value) if _is_model(_strip(sub)) and isinstance(value, dict) else value
    return out


def env_values(model: type[Struct], environ: Mapping[str, str], prefix: str, delimiter: str) -> dict[str, Any]:
    """The values ``environ`` sets for ``model``'s fields (see the module docstring); EnvJSONError when a complex
    setting's variable is not JSON."""
    reader = _Reader(environ, prefix, delimiter)
    out: dict[str, Any] = {}
    for name, field in _fields(model).items():
        env_name = f"{reader.prefix}{name}".lower()
        raw = reader.env.get(env_name)
        is_complex, keep_string = _complexity(field.annotation)
        value: Any = raw
        if is_complex and raw is None:
            value = reader.explode(name, field) or None
        elif is_complex:
            try:
                value = json.loads(raw)  # type: ignore[arg-type]
            except ValueError as exc:
                if not keep_string:
                    raise reader.fail(env_name, name, exc) from None
            if isinstance(value, dict):
                value = deep_update(value, reader.explode(name, field))
        if value is None:
            continue
        if isinstance(value, str):
            value = _scalar(field.annotation, value)
        out[name] = _field_names(field.annotation, value) if isinstance(value, dict) else value
    return out
