"""Engine targets written in the settings file (``discovery.targets``): the list off Kubernetes."""

from __future__ import annotations

from collections.abc import Iterable

from inferwatch.agent.config import DiscoveryTargetSettings
from inferwatch.agent.node.discovery.target import EngineTarget, TargetSet


def static_targets(entries: Iterable[DiscoveryTargetSettings]) -> TargetSet:
    """One target per entry, as written; a name used twice is a ConfigError (from :class:`TargetSet`)."""
    return TargetSet(
        EngineTarget(
            name=e.name,
            kind=e.kind,
            metrics_url=e.metrics_url,
            health_url=e.health_url,
            profile_url=e.profile_url,
            labels=tuple(sorted(e.labels.items())),
            source="static",
        )
        for e in entries
    )
