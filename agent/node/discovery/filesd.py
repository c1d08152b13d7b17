"""Engine targets from a file in Prometheus ``file_sd`` shape, re-read when it changes.

The file (YAML or JSON; JSON is YAML) is a list of groups, as Prometheus' ``file_sd_configs`` reads::

    - targets: ["10.0.0.5:8000", "10.0.0.6:8000"]
      labels:
        model: llama-3-70b                    # any label: carried on the engine's series
        __scheme__: http                      # Prometheus' reserved labels: scheme and path of the metrics URL
        __metrics_path__: /metrics
        __inferwatch_engine__: vllm           # inferwatch's: the engine kind (default auto),
        __inferwatch_name__: gpu0             #   the target's name (default host:port; one target per group then),
        __inferwatch_health_path__: /health   #   the health probe's and the runtime profile's paths
        __inferwatch_profile_path__: /debug/profile
        namespace: serving                    # namespace / pod / container fill the target's identity

:meth:`FileTargets.poll` stats the file (mtime, inode, size) and parses it only when one of them changed, so a
poll every interval costs one ``stat``; an edit in place and an atomic rename (a new inode) are both seen. A file
that cannot be read or parsed keeps the last good targets and is reported as :attr:`FilePoll.error`, a
:class:`~inferwatch.agent.errors.ConfigError` naming the file and what is wrong.
"""

from __future__ import annotations

import os
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from inferwatch.agent.catalog.engine import ENGINE_KINDS
from inferwatch.agent.errors import ConfigError, InferwatchError
from inferwatch.agent.node.discovery.target import ENGINE_KIND_AUTO, EngineTarget, TargetIdentity, TargetSet

MAX_GROUPS = 10_000
MAX_TARGETS = 10_000
_IDENTITY_LABELS = ("namespace", "pod", "container")
_KINDS_OK = frozenset({ENGINE_KIND_AUTO, *ENGINE_KINDS})


@dataclass(frozen=True, slots=True)
class FilePoll:
    """The targets in force (the last good ones when the file is bad), whether they changed on this poll, and the
    file's error (None when the last read was good)."""

    targets: TargetSet
    changed: bool
    error: InferwatchError | None


class FileTargets:
    """Not thread-safe: one poller (the discovery loop) calls :meth:`poll`."""

    def __init__(self, path: Path, max_bytes: int) -> None:
        self.path = path
        self.max_bytes = max_bytes
        self._stamp: tuple[int, int, int] | None = None
        self._targets = TargetSet()
        self._error: InferwatchError | None = None

    def poll(self) -> FilePoll:
        try:
            st = os.stat(self.path)
        except OSError as exc:
            self._stamp = None  # read again as soon as it is back
            self._error = ConfigError(f"discovery.file {self.path} cannot be read ({exc.strerror})")
            return FilePoll(self._targets, False, self._error)
        stamp = (st.st_mtime_ns, st.st_ino, st.st_size)
        if stamp == self._stamp:
            return FilePoll(self._targets, False, self._error)
        self._stamp = stamp
        try:
            new = parse_file_sd(self._read(), str(self.path))
        except ConfigError as exc:
            self._error = exc
            return FilePoll(self._targets, False, exc)
        changed = new != self._targets
        self._targets, self._error = new, None
        return FilePoll(new, changed, None)

    def _read(self) -> str:
        try:
            with open(self.path, "rb") as fh:
                raw = fh.read(self.max_bytes + 1)
        except OSError as exc:
            raise ConfigError(f"discovery.file {self.path} cannot be read ({exc.strerror})") from None
        if len(raw) > self.max_bytes:
            raise ConfigError(f"discovery.file {self.path} is larger than discovery.file_max_bytes ({self.max_bytes})")
        try:
            return raw.decode("utf-8")
        except UnicodeDecodeError:
            raise ConfigError(f"discovery.file {self.path} is not UTF-8 text") from None


def parse_file_sd(text: str, where: str = "discovery.file") -> TargetSet:
    """The targets of a ``file_sd`` text; ConfigError (naming ``where`` and the group) when it is not one."""
    import yaml  # here: an agent without a discovery file never loads PyYAML

    try:
        data: Any = yaml.safe_load(text)
    except yaml.YAMLError as exc:
        mark = getattr(exc, "problem_mark", None)
        at = f" at line {mark.line + 1}" if mark is not None else ""
        raise ConfigError(f"{where} is not YAML or JSON{at}") from None
    if data is None:
        return TargetSet()
    if not isinstance(data, list):
        raise ConfigError(f"{where} must be a list of groups (targets and labels), not a {_kind(data)}")
    if len(data) > MAX_GROUPS:
        raise ConfigError(f"{where} has more than {MAX_GROUPS} groups")
    targets: list[EngineTarget] = []
    for i, group in enumerate(data):
        targets.extend(_group(group, f"{where} group {i}"))
        if len(targets) > MAX_TARGETS:
            raise ConfigError(f"{where} has more than {MAX_TARGETS} targets")
    return TargetSet(targets)


def _kind(value: object) -> str:
    return {dict: "mapping", str: "string", int: "number", float: "number", bool: "boolean"}.get(type(value), "value")


def _group(group: object, where: str) -> list[EngineTarget]:
    if not isinstance(group, dict):
        raise ConfigError(f"{where} must be a mapping with targets and labels, not a {_kind(group)}")
    unknown = set(group) - {"targets", "labels"}
    if unknown:
        raise ConfigError(f"{where} has unknown keys {sorted(map(str, unknown))} (only targets and labels)")
    hosts = group.get("targets") or []
    labels = group.get("labels") or {}
    if not isinstance(hosts, list) or not all(isinstance(h, str) and h for h in hosts):
        raise ConfigError(f"{where}: targets must be a list of host:port strings")
    if not isinstance(labels, dict) or not all(isinstance(k, str) and isinstance(v, str) for k, v in labels.items()):
        raise ConfigError(f"{where}: labels must map strings to strings")
    scheme = labels.get("__scheme__", "http")
    if scheme not in ("http", "https"):
        raise ConfigError(f"{where}: __scheme__ must be http or https, not {scheme!r}")
    path = _path(labels.get("__metrics_path__", "/metrics"), "__metrics_path__", where)
    kind = labels.get("__inferwatch_engine__", ENGINE_KIND_AUTO)
    if kind not in _KINDS_OK:
        raise ConfigError(f"{where}: __inferwatch_engine__ {kind!r} is not one of {sorted(_KINDS_OK)}")
    health = labels.get("__inferwatch_health_path__")
    profile = labels.get("__inferwatch_profile_path__")
    name = labels.get("__inferwatch_name__")
    if name is not None and len(hosts) > 1:
        raise ConfigError(f"{where}: __inferwatch_name__ names one target, and the group has {len(hosts)}")
    public = tuple(sorted((k, v) for k, v in labels.items() if not k.startswith("__") and k not in _IDENTITY_LABELS))
    identity = TargetIdentity(**{k: labels[k] for k in _IDENTITY_LABELS if k in labels})
    out = []
    for host in hosts:
        if "/" in host or ":" not in host.rsplit("]", 1)[-1]:
            raise ConfigError(f"{where}: target {host!r} is not host:port")
        origin = f"{scheme}://{host}"
        out.append(
            EngineTarget(
                name=name or host,
                kind=kind,
                metrics_url=origin + path,
                health_url=origin + _path(health, "__inferwatch_health_path__", where) if health is not None else None,
                profile_url=origin + _path(profile, "__inferwatch_profile_path__", where) if profile else None,
                identity=identity,
                labels=public,
                source="file",
            )
        )
    return out


def _path(value: str, label: str, where: str) -> str:
    if not value.startswith("/"):
        raise ConfigError(f"{where}: {label} must start with /, not {value!r}")
    return value
