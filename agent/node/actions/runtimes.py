"""Which runtime process an action acts on: the node's configured one, or a discovered engine target's.

The actions (py-spy profiles, evidence capture, the binary check) act on one engine's process at a time. Without
discovery that is the runtime of ``runtime.*`` (or the listener of ``engine.metrics_url``'s port); with it, each
engine target has its own, found through its container's cgroup or its loopback port
(:mod:`inferwatch.agent.node.targets`, which registers a target here once its process is found and drops it when the
target or its process goes). A request names the target (``target`` in the API, ``--target`` in the CLI); none names
the configured runtime, as before discovery.
"""

from __future__ import annotations

import threading
from dataclasses import dataclass
from typing import TYPE_CHECKING

from inferwatch.agent.common.samples import Attributes
from inferwatch.agent.errors import NoDataError
from inferwatch.agent.node.debugprofile.reader import ProfileReader
from inferwatch.agent.node.host.runtime import RuntimeLocator

if TYPE_CHECKING:  # a target's binary check is built by the composition (agent/node/targets.py)
    from inferwatch.agent.node.actions.binary import BinaryCheck

DEFAULT = ""  # the name of the configured runtime: what a request without a target acts on


class UnknownTargetError(NoDataError):
    """A request named an engine target whose process the agent does not know (no such target, or its process not
    found yet); ``known`` lists the targets it does know."""

    def __init__(self, name: str, known: list[str]) -> None:
        super().__init__(
            f"no engine target {name!r} with a known process (known: {', '.join(known) or 'none'})",
            hint="name a target of GET /api/v1/status's discovery details; a target's process is found within a "
            "minute of its start",
        )
        self.name = name
        self.known = known


@dataclass(frozen=True, slots=True)
class Runtime:
    """One engine's runtime process as an action reaches it.

    ``locator``: finds the process (a target's holds its pid); ``port``: where ``locator`` has no process configured,
    the port whose listener is the runtime (``engine.metrics_url``'s); ``reader``: its runtime profile (None: it has
    none); ``identity``: the target's attributes (``inferwatch.engine.name``, ``k8s.*``), empty for the configured
    runtime; ``binary``: its binary check, where one runs for it.
    """

    locator: RuntimeLocator
    port: int | None = None
    reader: ProfileReader | None = None
    identity: Attributes = ()
    binary: BinaryCheck | None = None

    def pids(self) -> list[int]:
        """The runtime and its descendants, sorted; empty when it is not found."""
        try:
            if self.locator.configured:
                return sorted(self.locator.pids())
            proc = self.locator.find_serving(self.port)
            return sorted({proc.pid} | {c.pid for c in proc.children(recursive=True)})
        except Exception:
            return []


class Runtimes:
    """The configured runtime and each engine target's, by target name. Thread-safe: the supervisor registers and
    drops targets while the API and the evidence listener read."""

    def __init__(self, default: Runtime) -> None:
        self.default = default
        self._lock = threading.Lock()
        self._targets: dict[str, Runtime] = {}

    def register(self, name: str, runtime: Runtime) -> None:
        with self._lock:
            self._targets[name] = runtime

    def drop(self, name: str) -> Runtime | None:
        with self._lock:
            return self._targets.pop(name, None)

    def names(self) -> list[str]:
        with self._lock:
            return sorted(self._targets)

    def get(self, name: str | None = None) -> Runtime:
        """Target ``name``'s runtime; None or ``""``: the configured one. UnknownTargetError for a name not known."""
        if not name:
            return self.default
        with self._lock:
            runtime = self._targets.get(name)
            if runtime is None:
                raise UnknownTargetError(name, sorted(self._targets))
            return runtime
