"""A real span receiver fed by a test: started on 127.0.0.1, spans sent, the analytics' samples in an AgentState."""

from __future__ import annotations

import contextlib
from collections.abc import Callable, Iterator

from inferwatch.agent.common.samples import Collection
from inferwatch.agent.config import ReceiverSettings
from inferwatch.agent.node.analytics.latency import LatencyAnalytics
from inferwatch.agent.node.receiver import Receiver
from inferwatch.agent.node.state import AgentState, CollectorHealth


@contextlib.contextmanager
def received(
    settings: ReceiverSettings,
    analytics: LatencyAnalytics,
    send: Callable[[int], None],
    state: AgentState | None = None,
) -> Iterator[AgentState]:
    """Start the receiver, ``send(http_port)``, record one ``compute()`` as the spans collector in ``state`` (a
    new one by default; pass the state an exporter reads); stop the receiver on exit."""
    receiver = Receiver(settings, analytics)
    receiver.start()
    try:
        assert receiver.http_port is not None
        send(receiver.http_port)
        state = state if state is not None else AgentState()
        state.register(CollectorHealth("spans", 15.0, 5.0))
        state.record("spans", CollectorHealth("spans", 15.0, 5.0), Collection(samples=analytics.compute()))
        yield state
    finally:
        receiver.stop()
