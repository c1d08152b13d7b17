"""The readiness gate: the agent sets a pod condition on each engine pod that declares it, so Kubernetes takes a hung
engine's pod out of its Service's endpoints.

A pod lists condition types in ``spec.readinessGates``; the kubelet counts it Ready only while every one of them is
``"True"`` on the pod (and its containers are ready), else it sets ``Ready`` to ``"False"`` with reason
``ReadinessGatesNotReady``; the EndpointSlice controller publishes each pod's endpoint with ``conditions.ready`` =
the pod's Ready (kubernetes.io/docs/concepts/workloads/pods/pod-lifecycle/#pod-readiness-gate; kubelet
``pkg/kubelet/status/generate.go``, the endpointslice controller's ``podToEndpoint``). Nobody but the agent sets the
gate's condition, so a pod that declares it takes traffic only once the agent has read its engine and found it
serving; nothing is restarted (liveness stays the engine's own ``/health``).

For every discovered Kubernetes target whose pod declares ``readiness.pod_condition``, the verdict the composition root
hands in (the same answer as ``GET /engines/<target>/ready``) becomes that condition:

    PATCH /api/v1/namespaces/NS/pods/NAME/status
    Content-Type: application/strategic-merge-patch+json
    {"status": {"conditions": [{"type": T, "status": "True"|"False", "reason": R, "message": M,
                                "lastTransitionTime": RFC3339}]}}

``PodStatus.conditions`` is merged by its ``type`` key (its patch strategy ``merge``, patch merge key ``type``), so
the patch replaces this one condition and leaves the kubelet's own. It is sent when the verdict or its reason
changes, again every :data:`RESYNC_S` (a condition lost with a pod status rewrite comes back), and after a failure
every :data:`RETRY_S`; ``lastTransitionTime`` moves only when ``status`` does. The RBAC it needs: ``patch`` on
``pods/status`` (deploy/kubernetes/overlays/readiness-gate/). A failure is logged once when it starts and once when it
ends; a 403 names the missing grant.

An agent that is down sets nothing: the condition keeps its last value (a pod that served keeps serving; one that was
hung stays out until an agent says otherwise), and a pod started while no agent runs waits for one.
"""

from __future__ import annotations

import logging
import threading
import time
from collections.abc import Callable, Iterable
from dataclasses import dataclass
from datetime import datetime, timezone
from typing import Any
from urllib.parse import quote

import httpx

from inferwatch.agent.common.samples import Collection
from inferwatch.agent.errors import CollectorError
from inferwatch.agent.node.discovery.kubernetes import ApiServer
from inferwatch.agent.node.discovery.target import EngineTarget

log = logging.getLogger(__name__)

PATCH_CONTENT_TYPE = "application/strategic-merge-patch+json"
PATCH_TIMEOUT_S = 5.0
RESYNC_S = 60.0  # the same condition sent again this often
RETRY_S = 5.0  # after a failed PATCH
TICK_S = 1.0  # the sender looks at least this often (it is also woken by every engine collection)
MESSAGE_MAX_CHARS = 1024
# The readiness answer's reasons (agent/node/api/readiness.py) as condition reasons (UpperCamelCase, as Kubernetes'
# own); an unknown one is passed through as "Engine" + its words.
REASONS = {
    "serving": "EngineServing",
    "hung": "EngineHung",
    "down": "EngineDown",
    "stale": "EngineStale",
    "pending": "EnginePending",
    "probe_failed": "ProbeFailed",
    "saturated": "EngineSaturated",
    "not_configured": "EngineNotConfigured",
}


@dataclass(frozen=True, slots=True)
class Verdict:
    """Whether the engine serves, the readiness answer's reason (``serving``, ``hung``, ...) and its detail."""

    ready: bool
    reason: str
    detail: str = ""


def verdict_of(status: int, body: dict[str, Any]) -> Verdict:
    """The readiness answer (``GET /engines/<target>/ready``: status, JSON body) as a verdict; a target the answer does
    not know yet (404: its collector is not running yet) is ``pending``."""
    reason = str(body.get("reason") or ("serving" if status == 200 else "pending"))
    return Verdict(status == 200, reason, str(body.get("detail") or ""))


def condition_reason(reason: str) -> str:
    return REASONS.get(reason) or "Engine" + "".join(w.capitalize() for w in reason.split("_"))


def _iso(t: float) -> str:
    return datetime.fromtimestamp(int(t), timezone.utc).isoformat().replace("+00:00", "Z")


def condition_patch(condition_type: str, verdict: Verdict, transition_at: float) -> dict[str, Any]:
    """The strategic merge patch of ``pods/status`` that sets one condition (seconds precision, as the API keeps)."""
    message = verdict.detail[:MESSAGE_MAX_CHARS] if verdict.detail else f"engine {verdict.reason}"
    condition = {
        "type": condition_type,
        "status": "True" if verdict.ready else "False",
        "reason": condition_reason(verdict.reason),
        "message": message,
        "lastTransitionTime": _iso(transition_at),
    }
    return {"status": {"conditions": [condition]}}


def status_path(target: EngineTarget) -> str:
    ident = target.identity
    return f"/api/v1/namespaces/{quote(ident.namespace, safe='')}/pods/{quote(ident.pod, safe='')}/status"


@dataclass
class _Sent:
    uid: str
    status: str
    reason: str
    transition_at: float
    sent_at: float
    ok: bool


class PodConditions:
    """Sets ``condition_type`` on the pods of the ``targets`` that declare it, from ``verdict(target name)``.

    :meth:`step` does one pass (tests call it); :meth:`start` runs it in a thread of its own, woken after every engine
    collection (:meth:`on_record`) and every :data:`TICK_S`, so a hang found by a collection is patched at once and a
    slow API server never delays a collection. ``stop`` is idempotent and bounded by the PATCH timeout.
    """

    def __init__(
        self,
        api: ApiServer,
        condition_type: str,
        targets: Callable[[], Iterable[EngineTarget]],
        verdict: Callable[[str], Verdict],
        clock: Callable[[], float] = time.time,
        client: httpx.Client | None = None,
    ) -> None:
        self.api = api
        self.condition_type = condition_type
        self.targets = targets
        self.verdict = verdict
        self.clock = clock
        self._own_client = client is None
        verify: Any = str(api.ca_file) if api.ca_file is not None else True
        self.client = client or httpx.Client(
            base_url=api.base_url, verify=verify, timeout=PATCH_TIMEOUT_S, trust_env=False, follow_redirects=False
        )
        self._sent: dict[str, _Sent] = {}  # by target name
        self._failing: dict[str, str] = {}  # target name → the error, while its PATCH fails
        self._wake = threading.Event()
        self._stop = threading.Event()
        self._thread: threading.Thread | None = None

    def on_record(self, name: str, collection: Collection) -> None:
        """A state listener: wake the sender after an engine collection (cheap: no I/O on the collector's thread)."""
        if name == "engine" or name.startswith("engine:"):
            self._wake.set()

    def start(self) -> None:
        if self._thread is None:
            self._thread = threading.Thread(target=self._run, name="pod-conditions", daemon=True)
            self._thread.start()

    def stop(self) -> None:
        self._stop.set()
        self._wake.set()
        if self._thread is not None:
            self._thread.join(PATCH_TIMEOUT_S + 1.0)
        if self._own_client:
            self.client.close()

    def _run(self) -> None:
        while not self._stop.is_set():
            self._wake.wait(TICK_S)
            self._wake.clear()
            if self._stop.is_set():
                break
            try:
                self.step()
            except Exception:  # a bug here must not end the gate for good
                log.exception("pod condition step failed")

    def step(self) -> list[tuple[str, dict[str, Any]]]:
        """Patch every gated pod whose condition is new, changed, due again or failed last time; returns (path, body)
        of each PATCH sent."""
        now = self.clock()
        sent: list[tuple[str, dict[str, Any]]] = []
        live: set[str] = set()
        for target in self.targets():
            ident = target.identity
            if self.condition_type not in target.readiness_gates or not (ident.namespace and ident.pod):
                continue
            live.add(target.name)
            verdict = self.verdict(target.name)
            status = "True" if verdict.ready else "False"
            last = self._sent.get(target.name)
            if last is not None and last.uid != ident.pod_uid:
                last = None  # a new pod under the old name (a StatefulSet's): its conditions start empty
            if last is not None:
                due = RETRY_S if not last.ok else RESYNC_S
                if last.status == status and last.reason == verdict.reason and now - last.sent_at < due:
                    continue
            transition = last.transition_at if last is not None and last.status == status else now
            body = condition_patch(self.condition_type, verdict, transition)
            path = status_path(target)
            ok = self._patch(target.name, path, body)
            self._sent[target.name] = _Sent(ident.pod_uid, status, verdict.reason, transition, now, ok)
            sent.append((path, body))
        for name in set(self._sent) - live:
            del self._sent[name]
            self._failing.pop(name, None)
        return sent

    def _patch(self, name: str, path: str, body: dict[str, Any]) -> bool:
        try:
            headers = {**self.api.headers(), "Content-Type": PATCH_CONTENT_TYPE}
            r = self.client.patch(path, json=body, headers=headers)
            error = None if r.status_code == 200 else f"HTTP {r.status_code}: {r.text[:200]}"
            if r.status_code == 403:
                error = (
                    f"{error} (the agent's service account needs patch on pods/status: "
                    "deploy/kubernetes/overlays/readiness-gate/)"
                )
        except (httpx.HTTPError, CollectorError) as exc:  # CollectorError: the token cannot be read
            error = f"{type(exc).__name__}: {exc}"
        if error is not None:
            if name not in self._failing:
                log.warning("readiness gate of %s: PATCH %s failing: %s", name, path, error)
            self._failing[name] = error
            return False
        if self._failing.pop(name, None) is not None:
            log.info("readiness gate of %s: PATCH %s works again", name, path)
        return True
