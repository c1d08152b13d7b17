"""Runtime diagnostics: the debug runtime_profile, the streaming probe, binary compatibility, profiles."""

from inferwatch.agent.catalog.spec import Kind, MetricSpec

METRICS = (
    MetricSpec(
        "inferwatch.runtime.profile.available",
        Kind.GAUGE,
        "",
        "1 when the runtime answered the debug runtime_profile request with a non-empty profile, 0 when it "
        "answered {} (debug mode is only enabled at runtime start).",
    ),
    MetricSpec(
        "inferwatch.runtime.profile.fetch.errors",
        Kind.COUNTER,
        "{error}",
        "runtime_profile fetches that failed, by reason (timeout, connect, http_status, oversized, not_json).",
        ("reason",),
    ),
    MetricSpec(
        "inferwatch.runtime.profile.value",
        Kind.GAUGE,
        "",
        "Numeric runtime_profile fields on the allowlist (e.g. gpu_memory_used_bytes), in the field's own unit.",
        ("field",),
    ),
    MetricSpec(
        "inferwatch.snapshot.write_errors",
        Kind.COUNTER,
        "{error}",
        "runtime_profile snapshots that could not be stored (reason: no_space for a full disk, a quota or a "
        "file-size limit; unwritable for a directory that cannot be written; too_large for one snapshot over "
        "snapshots.max_bytes; io_error otherwise). POST /api/v1/snapshots answers 507 or 500 for them.",
        ("reason",),
    ),
    MetricSpec(
        "inferwatch.runtime.profile.simd_inactive",
        Kind.GAUGE,
        "",
        "1 for each SIMD feature the runtime's profile lists as compiled in (simd_features_compiled) but not "
        "active in the kernels it runs (simd_features_active): a fallback to a narrower code path, ~20 % slower "
        "with no error; 0 for the compiled features that are active. Absent when the profile has no such fields.",
        ("feature",),
    ),
    MetricSpec(
        "inferwatch.probe.success", Kind.GAUGE, "", "1 when the last synthetic stream completed cleanly.", ("protocol",)
    ),
    MetricSpec(
        "inferwatch.probe.ttft", Kind.GAUGE, "s", "Client-side time to first token of the last probe.", ("protocol",)
    ),
    MetricSpec(
        "inferwatch.probe.itl",
        Kind.GAUGE,
        "s",
        "Mean client-side inter-token latency of the last probe.",
        ("protocol",),
    ),
    MetricSpec("inferwatch.probe.duration", Kind.GAUGE, "s", "Total time of the last probe.", ("protocol",)),
    MetricSpec(
        "inferwatch.probe.schema_violations",
        Kind.COUNTER,
        "{violation}",
        "Streamed chunks or events off-schema, by kind (empty_delta_with_usage, malformed_json, "
        "missing_terminator, wrong_event_order, non_utf8, crlf_framing, schema).",
        ("protocol", "kind"),
    ),
    MetricSpec(
        "inferwatch.probe.http_errors",
        Kind.COUNTER,
        "{error}",
        "Probe requests answered with an HTTP error, by error type (hardware_mismatch counted on its own).",
        ("protocol", "error_type"),
    ),
    MetricSpec(
        "inferwatch.runtime.binary.missing_libraries",
        Kind.GAUGE,
        "{library}",
        "Shared libraries the runtime binary needs that cannot be found on this host.",
        ("runtime",),
    ),
    MetricSpec(
        "inferwatch.runtime.binary.compatible",
        Kind.GAUGE,
        "",
        "1 when the runtime binary's shared libraries, symbol versions and required glibc all resolve on this "
        "host, 0 when not (checked at start and on demand).",
        ("runtime",),
    ),
    MetricSpec(
        "inferwatch.api.refused",
        Kind.COUNTER,
        "{request}",
        "API requests refused by authentication, by HTTP status (401 no valid token, 403 token lacks the scope).",
        ("status",),
    ),
)
