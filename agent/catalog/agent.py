"""Metrics about the agent itself: per-collector health (node_exporter's scrape_collector_*)."""

from inferwatch.agent.catalog.spec import Kind, MetricSpec

METRICS = (
    MetricSpec(
        "inferwatch.alertpush.sends",
        Kind.COUNTER,
        "{request}",
        "POSTs of the agent's critical findings to an Alertmanager (alertmanager.urls), by outcome: ok, "
        "http_status (an answer other than 200) or error (no answer).",
        ("outcome",),
    ),
    MetricSpec(
        "inferwatch.evidence.captures",
        Kind.COUNTER,
        "{bundle}",
        "Evidence bundles captured, by outcome: the trigger (hang, alert, api), rate_limited (an automatic "
        "trigger within evidence.min_interval_s of the last bundle) or store_error.",
        ("outcome",),
    ),
    MetricSpec(
        "inferwatch.collector.duration",
        Kind.GAUGE,
        "s",
        "Wall time of the collector's last run.",
        ("collector",),
    ),
    MetricSpec(
        "inferwatch.collector.success",
        Kind.GAUGE,
        "",
        "1 when the collector's last run did not fail (expected absence counts as success), 0 when it failed.",
        ("collector",),
    ),
    MetricSpec(
        "inferwatch.collector.data_absent",
        Kind.GAUGE,
        "",
        "1 when the collector's last run found its data absent on this host (no GPU, no PSI, runtime not "
        "running); the status API carries the hint on how to get it.",
        ("collector",),
    ),
    MetricSpec(
        "inferwatch.collector.errors",
        Kind.COUNTER,
        "{error}",
        "Failed collector runs (exceptions, timeouts, samples that do not match the catalog).",
        ("collector", "reason"),
    ),
    MetricSpec(
        "inferwatch.analytics.errors",
        Kind.COUNTER,
        "{error}",
        "Span analytics steps that raised for one model (stage: latency, explain); that model's series are left "
        "out of the cycle, the other models' are kept (agent/node/analytics/failures.py).",
        ("stage",),
    ),
    MetricSpec(
        "inferwatch.collector.last_success_timestamp",
        Kind.GAUGE,
        "s",
        "Unix time of the collector's last run that did not fail.",
        ("collector",),
    ),
    MetricSpec(
        "inferwatch.source.limit_hits",
        Kind.COUNTER,
        "{read}",
        "Reads of a host file refused by a read limit (source: the file, e.g. cpuinfo, meminfo, "
        "pressure/memory; limit: the setting, read_limits.max_file_bytes or read_limits.max_cpuinfo_bytes). "
        "The collector reading it fails that run; the engine's own limits are inferwatch_engine_limit_hits_total.",
        ("source", "limit"),
    ),
    MetricSpec(
        "inferwatch.collector.stepped_aside",
        Kind.COUNTER,
        "s",
        "Seconds the collections waited at their boundaries while the agent's HTTP API answered a request younger "
        "than 0.25 s (agent/common/precedence.py): what answering first costs the collections, in delay. Its rate "
        "stays far below 1 unless requests come back to back.",
        (),
    ),
    MetricSpec(
        "inferwatch.http.retries",
        Kind.COUNTER,
        "{request}",
        "Idempotent requests to a source (source: engine) sent a second time because the server closed the "
        "reused keep-alive connection under the first before answering (agent/common/httpclient.py). The second try "
        "is the one that counts: a failing one fails the collection.",
        ("source",),
    ),
    MetricSpec(
        "inferwatch.agent.info",
        Kind.GAUGE,
        "",
        "Always 1; carries the agent version and the node's configured environment.",
        ("version", "environment"),
    ),
    # The agent's own cardinality (agent/node/analytics/series.py, docs/cardinality.md).
    MetricSpec(
        "inferwatch.agent.series",
        Kind.GAUGE,
        "{series}",
        "Series in the agent's own /metrics (one per label set; a histogram one per bucket plus _sum and _count), "
        "counted from the state one processing cycle old.",
    ),
    MetricSpec(
        "inferwatch.agent.series.budget",
        Kind.GAUGE,
        "{series}",
        "The configured series_budget; AgentSeriesBudgetExceeded fires while inferwatch_agent_series is above it.",
    ),
    MetricSpec(
        "inferwatch.agent.series.models",
        Kind.GAUGE,
        "{model}",
        "Models (gen_ai.request.model values) with at least one series in the agent's /metrics.",
    ),
    MetricSpec(
        "inferwatch.agent.series.max_per_model",
        Kind.GAUGE,
        "{series}",
        "The most series one model has in the agent's /metrics (docs/cardinality.md states the expected figure).",
    ),
)
