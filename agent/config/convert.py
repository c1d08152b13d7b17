"""Settings values (mappings from a config file, the environment, flags) converted into the settings structs, and
msgspec's refusal turned into one :class:`~inferwatch.agent.errors.ConfigError` that names the setting.

The conversion is msgspec's (``msgspec.convert``, not strict: ``"5"`` is read as 5 where an int is wanted, ``"true"``
or ``"1"`` as True, as a variable's text must be); paths are read from strings. msgspec stops at the first problem, so
the error names one setting: ``engine.max_series: Input should be greater than or equal to 1 (got 0)``. It is worded
as the agent's settings errors were before (pydantic's phrases), with the value given (bounded, never a secret's), the
nearest known name for an unknown key, and a map's key where msgspec says only ``[...]``.
"""

from __future__ import annotations

import difflib
import re
import reprlib
import types
import typing
from collections.abc import Mapping, Sequence
from pathlib import PurePath
from typing import Any, TypeVar, get_args, get_origin

import msgspec

from inferwatch.agent.common.redact import redact_text, secret_name
from inferwatch.agent.config.sections import SettingError
from inferwatch.agent.errors import ConfigError

T = TypeVar("T")

_MISSING = object()


def _dec_hook(kind: type, value: Any) -> Any:
    if isinstance(kind, type) and issubclass(kind, PurePath):
        if isinstance(value, (str, PurePath)):
            return kind(value)
        raise ValueError(f"Input should be a path, got {type(value).__name__}")
    raise NotImplementedError(f"no conversion to {kind!r}")


def convert(values: Any, cls: type[T]) -> T:
    """``values`` as a ``cls`` (a settings struct), converted and checked; ConfigError naming the setting if not."""
    try:
        return msgspec.convert(values, cls, strict=False, dec_hook=_dec_hook)
    except msgspec.ValidationError as exc:
        raise ConfigError("invalid configuration: " + describe(exc, values, cls)) from None


def strip(annotation: Any) -> Any:
    """``X`` of ``Annotated[X, ...]``, ``X | None`` and ``Optional[X]``."""
    while True:
        origin = get_origin(annotation)
        if origin is typing.Annotated:
            annotation = get_args(annotation)[0]
        elif (
            origin in (typing.Union, types.UnionType)
            and len(args := [a for a in get_args(annotation) if a is not type(None)]) == 1
        ):
            annotation = args[0]
        else:
            return annotation


def struct_fields(cls: Any) -> dict[str, Any]:
    """A settings struct's fields and their annotations, in order; {} for anything else."""
    if not (isinstance(cls, type) and issubclass(cls, msgspec.Struct)):
        return {}
    return {f.name: f.type for f in msgspec.structs.fields(cls)}


def _below(annotation: Any, part: str | int) -> Any:
    """The annotation of what ``part`` names below a value of ``annotation`` (a field, a map's value, an item)."""
    kind = strip(annotation)
    fields = struct_fields(kind)
    if fields:
        return fields.get(str(part))
    origin = get_origin(kind)
    args = get_args(kind)
    if isinstance(origin, type) and issubclass(origin, Mapping) and args:
        return args[-1]
    if isinstance(origin, type) and issubclass(origin, Sequence) and args:
        return args[0]
    return None


def _step(value: Any, part: str | int) -> Any:
    if isinstance(value, Mapping):
        return value.get(part, _MISSING)
    if isinstance(value, msgspec.Struct):
        return getattr(value, str(part), _MISSING)
    if isinstance(value, Sequence) and not isinstance(value, str) and isinstance(part, int):
        return value[part] if -len(value) <= part < len(value) else _MISSING
    return _MISSING


def _failing_key(mapping: Mapping[Any, Any], annotation: Any) -> Any:
    """The first key of ``mapping`` whose value does not convert to ``annotation`` (msgspec says only ``[...]``)."""
    for key, value in mapping.items():
        try:
            msgspec.convert(value, annotation, strict=False, dec_hook=_dec_hook)
        except msgspec.ValidationError:
            return key
    return None


_PATH = re.compile(r"\.([A-Za-z_][A-Za-z0-9_]*)|\[(\d+|\.\.\.)\]")


def _number(text: str) -> str:
    try:
        number = float(text)
    except ValueError:
        return text
    return str(int(number)) if number.is_integer() and abs(number) < 1e16 else text


_BOUND = {">=": "greater than or equal to", ">": "greater than", "<=": "less than or equal to", "<": "less than"}


def _choices(annotation: Any) -> list[Any]:
    kind = strip(annotation)
    if get_origin(kind) is typing.Literal:
        return list(get_args(kind))
    return []


def _reword(message: str, annotation: Any) -> str:
    """msgspec's message in the words the agent's errors use."""
    if m := re.fullmatch(r"Expected `\w+` (>=|>|<=|<) (\S+)", message):
        return f"Input should be {_BOUND[m[1]]} {_number(m[2])}"
    if m := re.fullmatch(r"Expected `str` matching regex (.+)", message):
        return f"String should match pattern {m[1]}"
    if m := re.fullmatch(r"Expected `(str|array|object)` of length (>=|<=) (\d+)", message):
        what, unit = ("String", "characters") if m[1] == "str" else ("List", "items")
        return f"{what} should have {'at least' if m[2] == '>=' else 'at most'} {m[3]} {unit}"
    if message.startswith("Invalid enum value") and (choices := _choices(annotation)):
        return "Input should be " + " or ".join(repr(c) for c in choices)
    if m := re.fullmatch(r"Expected `(.+)`, got `(.+)`", message):
        return f"Input should be {m[1].replace('array', 'a list').replace('object', 'a mapping')}, got {m[2]}"
    return message


def describe(exc: msgspec.ValidationError, values: Any, cls: type) -> str:
    """``setting.path: what is wrong (got value)`` for msgspec's refusal of ``values`` as a ``cls``."""
    text = str(exc)
    message, sep, where = text.rpartition(" - at `")
    if not sep:
        message, where = text, "$`"
    raw_parts = [m[1] if m[1] else m[2] for m in _PATH.finditer(where.rstrip("`")[1:])]
    loc: list[str | int] = []
    value: Any = values
    annotation: Any = cls
    for raw in raw_parts:
        part: Any = int(raw) if raw.isdigit() else raw
        if raw == "...":  # a map's key: msgspec does not say which
            part = _failing_key(value, _below(annotation, "")) if isinstance(value, Mapping) else None
            if part is None:
                loc.append("*")
                value = _MISSING
                annotation = _below(annotation, "")
                continue
        loc.append(part)
        value = _step(value, part) if value is not _MISSING else _MISSING
        annotation = _below(annotation, part)
    cause = exc.__cause__ or exc.__context__
    if isinstance(cause, SettingError):
        message = cause.message
        if cause.field:
            loc.append(cause.field)
            value = _step(value, cause.field) if value is not _MISSING else _MISSING
    elif m := re.fullmatch(r"Object contains unknown field `(.+)`", message):
        known = list(struct_fields(strip(annotation)))
        near = difflib.get_close_matches(m[1], known, n=1, cutoff=0.8)
        message = "Extra inputs are not permitted" + (f" (did you mean {near[0]}?)" if near else "")
        loc.append(m[1])
        value = _step(value, m[1]) if value is not _MISSING else _MISSING
    elif m := re.fullmatch(r"Object missing required field `(.+)`", message):
        message = "Field required"
        loc.append(m[1])
        value = _MISSING
    else:
        message = _reword(message, annotation)
    name = ".".join(str(p) for p in loc)
    hidden = value is _MISSING or isinstance(value, (Mapping, msgspec.Struct)) or any(secret_name(str(p)) for p in loc)
    shown = "" if hidden else f" (got {reprlib.repr(redact_text(value) if isinstance(value, str) else value)})"
    return f"{name}: {message}{shown}" if name else message
