"""Wiring: settings → collectors → runner → state → sinks (Prometheus registry, OTLP, API server)."""

from __future__ import annotations

import logging
import threading
from typing import Any

from agent.collectors import CollectContext, enabled_collectors
from agent.config import Settings
from agent.identity import node_identity
from agent.runner import Runner
from agent.state import AgentState
from exporters.prometheus import make_registry

log = logging.getLogger(__name__)


class Agent:
    """The running agent. ``start``/``stop`` are idempotent; ``stop`` is bounded in time."""

    def __init__(self, settings: Settings, services: dict[str, Any] | None = None) -> None:
        from agent.diag.services import build_services, collector_timing

        settings = collector_timing(settings)
        services = {**build_services(settings), **(services or {})}
        self.settings = settings
        self.state = AgentState(environment=settings.node.environment)
        self.state.identity = node_identity(settings.path.procfs, settings.path.sysfs)
        self.ctx = CollectContext(settings=settings, services=dict(services or {}))
        self.runner = Runner(settings, self.state, enabled_collectors(self.ctx))
        for collector in self.runner.collectors:  # status a collector exports even while failing (engine up)
            status = getattr(collector, "status_samples", None)
            if callable(status):
                self.state.add_source(f"{collector.name}.status", status)
        self.registry = make_registry(self.state)
        self.otlp: Any = None
        self.otlp_logs: Any = None
        self.analytics: Any = None  # LatencyAnalytics when the OTLP trace receiver is on
        self.receiver: Any = None
        if settings.receiver.enabled:
            from agent.analytics.latency import LatencyAnalytics
            from agent.engine.board import latency_board
            from agent.receiver import Receiver

            self.analytics = LatencyAnalytics(
                max_models=settings.receiver.max_models,
                histograms=settings.receiver.emit_histograms,
                board=latency_board(self.ctx.services),  # shared with the engine collector
            )
            self.receiver = Receiver(settings.receiver, self.analytics)
            self.state.add_source("spans", self.analytics.samples)
            self.state.add_source("receiver", self.receiver.samples)
        self._started = False
        self._stopped = False
        self._lock = threading.Lock()

    def start(self) -> None:
        with self._lock:
            if self._started:
                return
            self._started = True
        if self.settings.otlp_enabled():
            from exporters.otlp import OTLPExporter, build_resource, make_exporter

            self.otlp = OTLPExporter(
                self.state, build_resource(self.state.identity, self.settings.node.environment), make_exporter()
            )
            from agent.diag.services import start_sinks

            self.otlp_logs = start_sinks(
                self.ctx.services, self.settings, build_resource(self.state.identity, self.settings.node.environment)
            )
        if self.receiver is not None:
            self.receiver.start()  # raises ConfigError when an endpoint cannot be bound
        self.runner.start()
        log.info("agent started: collectors %s", ", ".join(c.name for c in self.runner.collectors) or "(none)")

    def stop(self) -> None:
        with self._lock:
            if self._stopped:
                return
            self._stopped = True
        self.runner.stop()
        if self.receiver is not None:
            self.receiver.stop()
        if self.otlp is not None:
            self.otlp.shutdown()
        if self.otlp_logs is not None:
            self.otlp_logs.shutdown()
        log.info("agent stopped")
