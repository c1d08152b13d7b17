"""The running agent: dependencies (:mod:`inferwatch.agent.node.wiring`) → collectors → runner → state → sinks.

Sinks: the Prometheus exposition, the OTLP metric exporter, the snapshot store and OTLP log sink (state
listeners), and the HTTP API (:meth:`Agent.asgi`). The binary check is an action started here.
"""

from __future__ import annotations

import logging
import threading
from dataclasses import replace
from typing import Any

from inferwatch.agent.common.precedence import GATE, ServingFirst
from inferwatch.agent.common.samples import Sample, attrs
from inferwatch.agent.config import Settings
from inferwatch.agent.node.collectors import HOST_LANE, Collector, Schedule, enabled_collectors, schedules
from inferwatch.agent.node.gcpolicy import CollectionFreezer, chain
from inferwatch.agent.node.identity import node_identity
from inferwatch.agent.node.runner import Runner
from inferwatch.agent.node.state import CollectorHealth
from inferwatch.agent.node.targets import discovery_configured
from inferwatch.agent.node.wiring import Deps, build_deps
from inferwatch.exporters.prometheus import prerender

log = logging.getLogger(__name__)


class Agent:
    """The running agent. ``start``/``stop`` are idempotent; ``stop`` is bounded in time."""

    def __init__(self, settings: Settings, deps: Deps | None = None) -> None:
        self.settings = settings
        self.deps = deps = deps or build_deps(settings)
        self.state = deps.state
        self.state.identity = node_identity(settings.path.procfs, settings.path.sysfs)
        self.ctx = deps.collect_context()
        self.analytics: Any = None  # LatencyAnalytics when the OTLP trace receiver is on
        self.receiver: Any = None
        self.explainer: Any = None  # TailExplainer when the OTLP trace receiver is on
        self.spans: Any = None  # TargetSpans when the receiver is on with discovery: each engine's spans apart
        processors: list[Collector] = []
        if settings.receiver.enabled:
            from inferwatch.agent.node.analytics.explain import RecordingSink, TailExplainer
            from inferwatch.agent.node.analytics.genai import GenAIOptions
            from inferwatch.agent.node.analytics.latency import LatencyAnalytics
            from inferwatch.agent.node.analytics.processor import SpanAnalytics
            from inferwatch.agent.node.receiver import Receiver

            rs = settings.receiver
            self.analytics = LatencyAnalytics(
                max_models=rs.max_models,
                histograms=rs.emit_histograms,
                prompt_bands=rs.prompt_band_histograms,
                genai_options=GenAIOptions(
                    rs.genai_operation_name, rs.genai_provider_name, tuple(rs.ttft_extra_buckets_s)
                ),
            )
            self.explainer = TailExplainer(
                trace_url=rs.trace_url
            )  # the last 5 minutes of requests, bounded (agent/node/analytics/explain.py)
            sink: Any = RecordingSink(self.analytics, self.explainer)
            if discovery_configured(settings.discovery):  # each engine target's requests apart (analytics/pertarget.py)
                from inferwatch.agent.node.analytics.pertarget import TargetSpans

                def engine_spans() -> tuple[LatencyAnalytics, TailExplainer]:
                    options = GenAIOptions(
                        rs.genai_operation_name, rs.genai_provider_name, tuple(rs.ttft_extra_buckets_s)
                    )
                    analytics = LatencyAnalytics(
                        max_models=rs.max_models,
                        histograms=rs.emit_histograms,
                        prompt_bands=rs.prompt_band_histograms,
                        genai_options=options,
                    )
                    return analytics, TailExplainer(trace_url=rs.trace_url)

                sink = self.spans = TargetSpans(sink, engine_spans)
            self.receiver = Receiver(settings.receiver, sink)
            processors.append(SpanAnalytics(self.analytics, self.state, self.explainer))  # on the runner's schedule
            self.state.add_source("receiver", self.receiver.samples)
        from inferwatch.agent.node.analytics.series import SeriesBudget

        processors.append(SeriesBudget(self.state, settings.series_budget))  # the agent's own series count
        # A processor runs on the host lane at the agent's interval and on every scrape (its input is in memory).
        processing = Schedule(settings.interval_s, min(settings.timeout_s, settings.interval_s), HOST_LANE, True)
        collectors = enabled_collectors(self.ctx, settings)
        self.targets: Any = None  # EngineTargets when discovery is set: collectors per engine target
        if discovery_configured(settings.discovery) and not settings.engine.metrics_url:
            collectors = [c for c in collectors if c.name != "engine"]  # only the discovered engines
        freezer = CollectionFreezer()
        self.runner = Runner(
            self.state,
            [*collectors, *processors],
            {**schedules(collectors, settings), **{p.name: processing for p in processors}},
            # Each collection's exposition text made in its collector's thread, not on a scrape; then what a large
            # collection left behind kept out of full garbage collections, and no collection while it is made
            # (agent/node/gcpolicy.py).
            prepare=chain(prerender, freezer.after),
            around=freezer.around,
        )
        if discovery_configured(settings.discovery):
            from inferwatch.agent.node.discovery.combined import Discovery
            from inferwatch.agent.node.targets import EngineTargets

            discovery = Discovery(settings.discovery)
            self.targets = EngineTargets(
                settings,
                self.ctx,
                self.state,
                self.runner,
                discovery,
                runtimes=deps.runtimes,
                evidence=deps.evidence,
                spans=self.spans,
            )
            self.runner.add(self.targets, self.targets.plan())
        self.pod_conditions: Any = None  # the readiness gate's condition on engine pods (discovery/podcondition.py)
        if self.targets is not None and self.targets.discovery.pods is not None and settings.readiness.pod_condition:
            from inferwatch.agent.node.api.readinessgate import pod_conditions

            pods = self.targets.discovery.pods
            self.pod_conditions = pod_conditions(settings.readiness, settings.engine, self.state, pods)
            self.state.add_listener(self.pod_conditions.on_record)  # a hang's collection patches its pod at once
        for collector in self.runner.collectors:  # status a collector exports even while failing (engine up)
            status = getattr(collector, "status_samples", None)
            if callable(status):
                self.state.add_source(f"{collector.name}.status", status)
        if deps.binary.state is not None:  # the check at start: /readyz waits for it as for a collector
            self.state.register(CollectorHealth("binary", settings.binary.interval_s, settings.binary.timeout_s))
        self.state.add_listener(deps.snapshots.on_record)
        self.state.add_source("snapshots", deps.snapshots.samples)
        if self.ctx.read_limits.hits is not None:
            self.state.add_source("read_limits", self.ctx.read_limits.hits.samples)
        self.state.add_source("http_retries", self.ctx.http_retries.samples)  # agent/common/httpclient.py
        self.state.add_source("stepped_aside", GATE.samples)  # agent/common/precedence.py
        self.state.add_listener(deps.evidence.on_record)  # a capture the moment the hang finding turns on
        if self.receiver is not None:  # a bundle lists the last finished requests' spans
            deps.evidence.attach_spans(self.receiver.recent_spans)
        self.state.add_source(
            "evidence",
            lambda: [Sample("inferwatch.evidence.captures", n, attrs(outcome=k)) for k, n in deps.evidence.counts()],
        )
        if deps.alertpush.enabled:  # critical findings straight to Alertmanager (agent/node/actions/alertpush.py)
            self.state.add_listener(deps.alertpush.on_record)
            self.state.add_source("alertpush", deps.alertpush.samples)
        self.otlp: Any = None
        self.otlp_logs: Any = None
        self._started = False
        self._stopped = False
        self._lock = threading.Lock()

    @property
    def registry(self) -> Any:
        """The state on a prometheus_client registry (:mod:`inferwatch.exporters.openmetrics`), made on request:
        what /metrics writes compared with what prometheus_client's ``generate_latest`` writes."""
        from inferwatch.exporters.openmetrics import make_registry

        return make_registry(self.state)

    def asgi(self) -> Any:
        """The agent's HTTP application (``/metrics`` in front of the API), requests first (:class:`ServingFirst`)."""
        from inferwatch.agent.node.api.server import create_app

        services = replace(self.deps.api_services(), explainer=self.explainer, spans=self.spans)
        s = self.settings
        app = create_app(
            self.state,
            services,
            engine_cfg=s.engine,
            readiness_cfg=s.readiness,
            runbooks_cfg=s.runbooks,
            pull=self.runner.pull_async if s.collect_on_scrape else None,
            scrape_wait_s=s.scrape_wait_s,
            exemplars=s.receiver.enabled and s.receiver.emit_histograms,
        )
        return ServingFirst(app)  # the collections step aside while a request is answered

    def start(self) -> None:
        with self._lock:
            if self._started:
                return
            self._started = True
        swept = self.deps.snapshots.sweep()  # temp files of writes a crash interrupted
        if swept:
            log.info("removed %d unfinished snapshot temp files from %s", swept, self.deps.snapshots.directory)
        if self.settings.otlp_enabled():
            from inferwatch.exporters.otlp import OTLPExporter, build_resource, make_exporter

            resource = build_resource(self.state.identity, self.settings.node.environment)
            self.otlp = OTLPExporter(
                self.state,
                resource,
                make_exporter(),
                ttft_extra_buckets_s=tuple(self.settings.receiver.ttft_extra_buckets_s),
            )
            if self.analytics is not None and self.settings.receiver.emit_histograms:
                self.analytics.set_observer(self.otlp.record_genai)  # gen_ai.server.* per request
            if self.settings.runtime_profile.url:
                from inferwatch.exporters.otlp_logs import SnapshotLogSink, make_log_exporter

                self.otlp_logs = self.deps.snapshots.log_sink = SnapshotLogSink(resource, make_log_exporter())
        if self.receiver is not None:
            self.receiver.start()  # raises ConfigError when an endpoint cannot be bound
        if self.targets is not None:
            self.targets.start()  # the Kubernetes watch threads; targets start at the supervisor's first run
        self.runner.start()
        if self.pod_conditions is not None:
            self.pod_conditions.start()
        self.deps.alertpush.start()
        if self.deps.binary.state is not None:
            self.deps.binary.start()
        log.info("agent started: collectors %s", ", ".join(c.name for c in self.runner.collectors) or "(none)")

    def stop(self) -> None:
        with self._lock:
            if self._stopped:
                return
            self._stopped = True
        self.runner.stop()
        if self.pod_conditions is not None:
            self.pod_conditions.stop()
        self.deps.alertpush.stop()
        self.deps.evidence.wait(self.settings.evidence.time_limit_s)
        self.deps.binary.stop()
        if self.receiver is not None:
            self.receiver.stop()
        if self.otlp is not None:
            if self.analytics is not None:
                self.analytics.set_observer(None)
            self.otlp.shutdown()
        if self.otlp_logs is not None:
            self.otlp_logs.shutdown()
        log.info("agent stopped")
