"""What the API routes use besides the state: the authenticator, the actions and the runtime locator."""

from __future__ import annotations

from dataclasses import dataclass

from inferwatch.agent.node.actions.binary import BinaryCheck
from inferwatch.agent.node.actions.evidence import EvidenceStore
from inferwatch.agent.node.actions.profiles import ProfileManager
from inferwatch.agent.node.actions.snapshots import SnapshotStore
from inferwatch.agent.node.analytics.explain import TailExplainer
from inferwatch.agent.node.analytics.pertarget import TargetSpans
from inferwatch.agent.node.api.auth import Authenticator
from inferwatch.agent.node.host.runtime import RuntimeLocator


@dataclass(frozen=True, slots=True)
class ApiServices:
    """What the routes use besides the state, built once by :mod:`inferwatch.agent.node.wiring`."""

    auth: Authenticator
    binary: BinaryCheck
    snapshots: SnapshotStore
    profiles: ProfileManager
    locator: RuntimeLocator
    evidence: EvidenceStore
    explainer: TailExplainer | None = (
        None  # the span receiver's tail explainer (inferwatch.agent.node.app sets it when on)
    )
    spans: TargetSpans | None = None  # each engine target's span analytics (receiver on with discovery)
