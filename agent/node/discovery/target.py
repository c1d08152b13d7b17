"""The value every discoverer returns: :class:`EngineTarget`, and a :class:`TargetSet` of them with its diff.

A target is one engine process to watch: where its metrics, health probe and runtime profile are, which kind of
engine it is, and its identity. The identity is the ENGINE's (its namespace, pod and container on Kubernetes),
never the agent's: :meth:`EngineTarget.prometheus_labels` gives the labels kube-prometheus-stack users filter on
(``namespace``, ``pod``, ``container``) and :meth:`EngineTarget.resource_attributes` the OpenTelemetry ones
(``k8s.namespace.name``, ``k8s.pod.name``, ``k8s.container.name``, ``k8s.pod.uid``, ``k8s.node.name``).
"""

from __future__ import annotations

from collections.abc import Iterable, Iterator, Mapping
from dataclasses import dataclass, field

from inferwatch.agent.errors import ConfigError

ENGINE_KIND_AUTO = "auto"


@dataclass(frozen=True, slots=True)
class TargetIdentity:
    """Who the engine is. Empty strings where the platform has no such thing (a static target off Kubernetes)."""

    namespace: str = ""
    pod: str = ""
    container: str = ""
    pod_uid: str = ""
    node: str = ""
    container_id: str = ""  # the runtime's id without its scheme (``containerd://`` removed); changes on restart


@dataclass(frozen=True, slots=True)
class EngineTarget:
    """One engine to watch. ``name`` is unique in a :class:`TargetSet` (``namespace/pod/container`` on Kubernetes).

    ``health_url`` None: the engine's default (``metrics_url``'s origin + ``/health``); ``profile_url`` None: none.
    ``labels`` are extra target labels (a ``file_sd`` group's, or a pod's ``inferwatch.io/label-*``), sorted pairs.
    """

    name: str
    kind: str
    metrics_url: str
    health_url: str | None = None
    profile_url: str | None = None
    identity: TargetIdentity = field(default_factory=TargetIdentity)
    labels: tuple[tuple[str, str], ...] = ()
    source: str = "static"  # static | file | kubernetes
    # the pod's spec.readinessGates[].conditionType, sorted: the agent sets readiness.pod_condition where it is one
    readiness_gates: tuple[str, ...] = ()

    def prometheus_labels(self) -> dict[str, str]:
        """The target's labels plus the engine's ``namespace``/``pod``/``container`` where it has them."""
        out = dict(self.labels)
        ident = self.identity
        for key, value in (("namespace", ident.namespace), ("pod", ident.pod), ("container", ident.container)):
            if value:
                out[key] = value
        return out

    def resource_attributes(self) -> dict[str, str]:
        """OpenTelemetry resource attributes (semantic conventions ``k8s.*``) of the engine, where known."""
        ident = self.identity
        pairs = (
            ("k8s.namespace.name", ident.namespace),
            ("k8s.pod.name", ident.pod),
            ("k8s.container.name", ident.container),
            ("k8s.pod.uid", ident.pod_uid),
            ("k8s.node.name", ident.node),
        )
        return {key: value for key, value in pairs if value}


@dataclass(frozen=True, slots=True)
class TargetChanges:
    """What changed between two target sets, each list sorted by name. A changed target (new IP, new container id
    after a restart, new annotations) is in ``changed`` with its new value: its collectors restart."""

    added: tuple[EngineTarget, ...] = ()
    changed: tuple[EngineTarget, ...] = ()
    removed: tuple[EngineTarget, ...] = ()

    def __bool__(self) -> bool:
        return bool(self.added or self.changed or self.removed)


class TargetSet(Mapping[str, EngineTarget]):
    """An immutable mapping name → target. Two targets with one name are a :class:`ConfigError`."""

    __slots__ = ("_by_name",)

    def __init__(self, targets: Iterable[EngineTarget] = ()) -> None:
        by_name: dict[str, EngineTarget] = {}
        for target in targets:
            if target.name in by_name:
                raise ConfigError(f"two engine targets are named {target.name!r}: names must be unique")
            by_name[target.name] = target
        self._by_name = dict(sorted(by_name.items()))

    def __getitem__(self, name: str) -> EngineTarget:
        return self._by_name[name]

    def __iter__(self) -> Iterator[str]:
        return iter(self._by_name)

    def __len__(self) -> int:
        return len(self._by_name)

    def __eq__(self, other: object) -> bool:
        return isinstance(other, TargetSet) and self._by_name == other._by_name

    def __hash__(self) -> int:
        return hash(tuple(self._by_name.items()))

    def __repr__(self) -> str:
        return f"TargetSet({list(self._by_name)!r})"

    def diff(self, new: TargetSet) -> TargetChanges:
        """From this set to ``new``."""
        added = tuple(t for name, t in new.items() if name not in self._by_name)
        changed = tuple(t for name, t in new.items() if name in self._by_name and self._by_name[name] != t)
        removed = tuple(t for name, t in self._by_name.items() if name not in new)
        return TargetChanges(added, changed, removed)

    def merged(self, *others: TargetSet) -> TargetSet:
        """This set and ``others`` as one (static, file and Kubernetes targets side by side); a name in two of
        them is a :class:`ConfigError`."""
        return TargetSet([*self.values(), *(t for other in others for t in other.values())])
