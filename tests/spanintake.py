"""A real span receiver fed by a test: started on 127.0.0.1, spans sent, the analytics' samples in an AgentState."""

from __future__ import annotations

import contextlib
from collections.abc import Callable, Iterator

from agent.analytics.latency import LatencyAnalytics
from agent.config import ReceiverSettings
from agent.receiver import Receiver
from agent.samples import Collection
from agent.state import AgentState, CollectorHealth


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
