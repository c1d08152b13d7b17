"""The readiness gate's setter, built from the readiness answer: ``readiness.pod_condition`` on each discovered engine
pod that declares it (agent/node/discovery/podcondition.py), set from the same answer as ``GET
/engines/<target>/ready`` (:func:`~inferwatch.agent.node.api.readiness.readiness`), so the gate, a router and a probe
never disagree."""

from __future__ import annotations

from inferwatch.agent.config import EngineSettings, ReadinessSettings
from inferwatch.agent.node.api.readiness import readiness
from inferwatch.agent.node.discovery.kubernetes import PodWatcher
from inferwatch.agent.node.discovery.podcondition import PodConditions, Verdict, verdict_of
from inferwatch.agent.node.state import AgentState


def pod_conditions(
    readiness_cfg: ReadinessSettings, engine_cfg: EngineSettings, state: AgentState, pods: PodWatcher
) -> PodConditions:
    """``pods``: the Kubernetes watcher (its targets and its API server)."""

    def verdict(name: str) -> Verdict:
        return verdict_of(*readiness(readiness_cfg, engine_cfg, state, name))

    return PodConditions(pods.api, readiness_cfg.pod_condition, lambda: pods.snapshot()[0].values(), verdict)
