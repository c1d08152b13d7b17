"""All configured target sources as one: :class:`Discovery` polls them and says what changed.

Built from :class:`~inferwatch.agent.config.DiscoverySettings`; the composition root calls :meth:`Discovery.poll` once
per interval and applies the :class:`~inferwatch.agent.node.discovery.target.TargetChanges` (start, restart, stop
per-engine collectors). A source in error keeps its last good targets and its error is reported per source, so one bad
file or an unreachable API server never removes the engines the other sources found.
"""

from __future__ import annotations

from dataclasses import dataclass

from inferwatch.agent.config import DiscoverySettings
from inferwatch.agent.errors import ConfigError, InferwatchError
from inferwatch.agent.node.discovery.filesd import FileTargets
from inferwatch.agent.node.discovery.kubernetes import ApiServer, PodWatcher
from inferwatch.agent.node.discovery.static import static_targets
from inferwatch.agent.node.discovery.target import TargetChanges, TargetSet


@dataclass(frozen=True, slots=True)
class DiscoveryPoll:
    targets: TargetSet
    changes: TargetChanges
    errors: dict[str, str]  # source ("file", "kubernetes:<namespace or *>", "merge") → its error, while it lasts
    problems: dict[str, str]  # pod (namespace/name) → why its annotations gave no target


class Discovery:
    """Not thread-safe: one caller polls. :meth:`start` starts the Kubernetes watch threads, :meth:`stop` ends them."""

    def __init__(self, settings: DiscoverySettings, api: ApiServer | None = None) -> None:
        self.static = static_targets(settings.targets)
        self.file = FileTargets(settings.file, settings.file_max_bytes) if settings.file is not None else None
        self.pods: PodWatcher | None = None
        if settings.kubernetes:
            if not settings.node_name:
                raise ConfigError("discovery.kubernetes needs discovery.node_name (NODE_NAME, spec.nodeName)")
            self.pods = PodWatcher(
                api or ApiServer.in_cluster(),
                settings.node_name,
                settings.namespaces,
                image_fallback=settings.image_fallback,
                watch_timeout_s=settings.watch_timeout_s,
            )
        self._last = TargetSet()

    def start(self) -> None:
        if self.pods is not None:
            self.pods.start()

    def stop(self) -> None:
        if self.pods is not None:
            self.pods.stop()

    def poll(self) -> DiscoveryPoll:
        errors: dict[str, str] = {}
        problems: dict[str, str] = {}
        parts = [self.static]
        if self.file is not None:
            polled = self.file.poll()
            parts.append(polled.targets)
            if polled.error is not None:
                errors["file"] = str(polled.error)
        if self.pods is not None:
            pod_targets, problems = self.pods.snapshot()
            parts.append(pod_targets)
            with self.pods.lock:
                errors |= {f"kubernetes:{scope}": message for scope, message in self.pods.errors.items()}
        try:
            merged = parts[0].merged(*parts[1:])
        except InferwatchError as exc:  # one name from two sources: keep what was in force
            errors["merge"] = str(exc)
            merged = self._last
        changes = self._last.diff(merged)
        self._last = merged
        return DiscoveryPoll(merged, changes, errors, problems)
