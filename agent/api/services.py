"""What the API routes use besides the state: the authenticator, the actions and the runtime locator."""

from __future__ import annotations

from dataclasses import dataclass

from agent.actions.binary import BinaryCheck
from agent.actions.evidence import EvidenceStore
from agent.actions.profiles import ProfileManager
from agent.actions.snapshots import SnapshotStore
from agent.analytics.explain import TailExplainer
from agent.api.auth import Authenticator
from agent.host.runtime import RuntimeLocator


@dataclass(frozen=True, slots=True)
class ApiServices:
    """What the routes use besides the state, built once by :mod:`agent.wiring`."""

    auth: Authenticator
    binary: BinaryCheck
    snapshots: SnapshotStore
    profiles: ProfileManager
    locator: RuntimeLocator
    evidence: EvidenceStore
    explainer: TailExplainer | None = None  # the span receiver's tail explainer (agent.app sets it when on)
