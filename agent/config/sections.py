"""The settings sections: one struct per part of the agent, each with its named defaults and its own validation.

A part is built from its section (``EngineSettings`` for the engine collector, ``SnapshotSettings`` for the snapshot
store ...), never from the whole :class:`~inferwatch.agent.config.settings.Settings`; the composition root
(agent/node/wiring.py, agent/node/app.py) hands each one out. Every section is a frozen ``msgspec.Struct`` that
refuses unknown keys: its types and bounds (``Meta``) are checked when the settings are converted from their sources
(:func:`~inferwatch.agent.config.convert.convert`), its own checks (``__post_init__``) whenever one is made. The
settings were pydantic models until issue 38 measured what that cost every agent: ~12 MB of its ~50 (pydantic's
machinery, built at start), against ~1.5 MB for msgspec (docs/benchmarks.md, "Where the megabytes go").
"""

from __future__ import annotations

import math
import re
from collections.abc import Callable
from pathlib import Path
from typing import Annotated, Any, Literal

from msgspec import Meta, Struct, field
from msgspec.structs import force_setattr

from inferwatch.agent.catalog.engine import ENGINE_KINDS

# Engine exposition limits (agent/node/engine/limits.py applies them; docs/engine.md)
DEFAULT_ENGINE_MAX_SERIES = 100_000  # a 20,000-series vLLM exposition is ~2 MB; 10 MiB holds ~100k lines
DEFAULT_ENGINE_MAX_LABEL_VALUE_BYTES = 1024  # model names and paths are far shorter
DEFAULT_ENGINE_MAX_LABEL_BYTES = 4096  # all names and values of one series together
DEFAULT_ENGINE_MAX_MODELS = 64  # as receiver.max_models (the span path)

# One read of a procfs/sysfs file (agent/node/host/procfs.py). meminfo is ~1.5 KiB, vmstat ~5 KiB, PSI ~150 B,
# cgroup memory.stat ~2 KiB: 1 MiB is hundreds of times any real one. cpuinfo grows with the CPUs: the
# largest block in tests/fixtures/cpuinfo is 2,187 bytes (Sapphire Rapids, every AVX-512/AMX flag), so a
# 256-thread host is ~0.55 MiB and 1 MiB would refuse hosts past ~480 threads; 16 MiB fits ~7,600 such
# CPUs, past the 4,096 of distribution kernels' NR_CPUS (8,192 with MAXSMP is ~17 MiB: raise it there).
DEFAULT_MAX_PROCFS_READ_BYTES = 1 << 20
DEFAULT_MAX_CPUINFO_READ_BYTES = 16 << 20

DEFAULT_INACTIVE_FILE_THRESHOLD_BYTES = 1 << 30  # 1 GiB; relative to the model size, see runbooks

# Below the runner's default collector timeout (DEFAULT_TIMEOUT_S), so a slow engine is reported as a
# slow engine (reason "timeout" on the engine collector), not as a hung collector.
DEFAULT_ENGINE_TIMEOUT_S = 1.5
DEFAULT_ENGINE_MAX_BYTES = 10 * 1024 * 1024  # 10 MiB; a 20,000-series vLLM exposition is ~2.5 MB
# Where alert runbook links point: the agent serves runbooks/<AlertName>.md at /runbooks/<AlertName>. Rule files
# fall back to the same default; set the Prometheus external label runbook_base to this value (docs/alerts.md).
DEFAULT_RUNBOOKS_BASE_URL = "http://127.0.0.1:9435/runbooks"


def http_url(v: str | None) -> str | None:
    """``v`` when it is an http(s) URL (or unset); ValueError otherwise (file://, gopher://, a bare host)."""
    if v and not v.lower().startswith(("http://", "https://")):
        raise ValueError("must be an http:// or https:// URL")
    return v


class SettingError(ValueError):
    """A section's own check refused ``field``'s value (``field`` None: the section as a whole). The conversion
    names the setting from where the section sits (``engine.metrics_url: must be ...``)."""

    def __init__(self, field: str | None, message: str) -> None:
        super().__init__(f"{field}: {message}" if field else message)
        self.field = field
        self.message = message


def _check(section: Struct, name: str, check: Callable[[Any], Any]) -> None:
    """Run ``check`` on the field ``name``; keep what it returns (a normalised value) and name the field when it
    refuses."""
    value = getattr(section, name)
    try:
        checked = check(value)
    except SettingError:
        raise
    except ValueError as exc:
        raise SettingError(name, str(exc)) from None
    if checked is not value:
        force_setattr(section, name, checked)


class _Section(Struct, frozen=True, forbid_unknown_fields=True, kw_only=True):
    pass


class CollectorSettings(_Section, frozen=True, kw_only=True):
    """Per-collector switches and timing, the one place a collector's interval and timeout are configured;
    ``None`` means the collector's own default (its registry entry, agent/node/collectors/__init__.py)."""

    enabled: bool | None = None
    interval_s: Annotated[float, Meta(gt=0, le=86400)] | None = None  # a day: runtime_profile's old bound
    timeout_s: Annotated[float, Meta(gt=0, le=600)] | None = None


def _uname_machine(v: str | None) -> str | None:
    if v is not None and not re.fullmatch(r"[a-z][a-z0-9_]{0,31}", v := v.strip().lower()):
        raise ValueError("must be a `uname -m` name such as x86_64, aarch64, armv7l, s390x, ppc64le, riscv64")
    return v


class PathSettings(_Section, frozen=True, kw_only=True):
    procfs: Path = Path("/proc")
    sysfs: Path = Path("/sys")
    # The kernel architecture (``uname -m``: x86_64, aarch64, armv7l ...) of a recorded procfs tree. None: the
    # running kernel's when procfs is its own, else what the tree records or its cpuinfo says
    # (agent/node/host/machine.py).
    machine: str | None = None

    def __post_init__(self) -> None:
        _check(self, "machine", _uname_machine)


class ReadLimitSettings(_Section, frozen=True, kw_only=True):
    """Bytes one read of a procfs/sysfs file may take (see the defaults' comment); more is refused, counted."""

    max_file_bytes: Annotated[int, Meta(ge=4096, le=1 << 30)] = DEFAULT_MAX_PROCFS_READ_BYTES
    max_cpuinfo_bytes: Annotated[int, Meta(ge=4096, le=1 << 30)] = DEFAULT_MAX_CPUINFO_READ_BYTES


def _valid_regex(v: str | None) -> str | None:
    if v is not None:
        try:
            re.compile(v)
        except re.error as exc:
            raise ValueError(f"not a valid regular expression: {exc}") from exc
    return v


class RuntimeSettings(_Section, frozen=True, kw_only=True):
    """How to find the inference runtime process on this host (first match wins: pid, pidfile, pattern)."""

    name: str = "runtime"
    pid: Annotated[int, Meta(gt=0)] | None = None
    pidfile: Path | None = None
    cmdline_pattern: str | None = None

    def __post_init__(self) -> None:
        _check(self, "cmdline_pattern", _valid_regex)


class NodeSettings(_Section, frozen=True, kw_only=True):
    environment: str = "unknown"  # e.g. production, staging: DebugProfileEnabledInProduction reads it


class CPUSettings(_Section, frozen=True, kw_only=True):
    expect_features: list[str] = field(default_factory=list)


class PageCacheSettings(_Section, frozen=True, kw_only=True):
    inactive_file_threshold_bytes: Annotated[int, Meta(ge=0)] = DEFAULT_INACTIVE_FILE_THRESHOLD_BYTES


DEFAULT_SIMD_BUSY_CPU_CORES = 0.05  # runtime CPU below this over a window is "idle": no SIMD verdict


class SimdSettings(_Section, frozen=True, kw_only=True):
    """SIMD utilisation (collector ``simd``): the CPU use above which the runtime counts as serving."""

    busy_cpu_cores: Annotated[float, Meta(ge=0, le=4096)] = DEFAULT_SIMD_BUSY_CPU_CORES


class OTLPSettings(_Section, frozen=True, kw_only=True):
    """Only the switch lives here; endpoint, protocol, headers and resource come from ``OTEL_*``."""

    enabled: bool | None = None  # None: on when OTEL_EXPORTER_OTLP_(METRICS_)ENDPOINT is set


ENGINE_KIND_CHOICES = (
    "auto",
    *ENGINE_KINDS,
)  # the catalogued engines, one adapter each (agent/node/engine/adapters.py)


DEFAULT_HANG_MIN_STALL_S = 30.0  # a working engine emits a token every few 10 ms while it has requests
DEFAULT_HANG_MAX_STALL_S = 600.0  # the longest prefill the allowance may wait for
# No token for this long with >= 2 requests running (or some waiting and none running) is a hang without waiting for
# the allowance (agent/node/engine/hang.py): a long prefill cannot explain it; a GC pause or slow step is far shorter.
DEFAULT_HANG_FAST_STALL_S = 6.0
DEFAULT_ENGINE_INTERVAL_S = 2.0  # the engine collector's cadence: a fast-path hang is seen <= 2 s + 6 s after it starts


def known_kind(v: str) -> str:
    """``v`` when it is one of :data:`ENGINE_KIND_CHOICES`; ValueError listing them otherwise."""
    if v not in ENGINE_KIND_CHOICES:
        raise ValueError("Input should be " + ", ".join(repr(k) for k in ENGINE_KIND_CHOICES))
    return v


class EngineSettings(_Section, frozen=True, kw_only=True):
    """The inference engine's own /metrics (vLLM, SGLang, TGI, llama.cpp, TensorRT-LLM)."""

    metrics_url: str | None = None  # None: the engine collector reports absence
    kind: str = "auto"  # one of ENGINE_KIND_CHOICES: "auto" (detect) or an adapter's kind
    timeout_s: Annotated[float, Meta(gt=0, le=600)] = DEFAULT_ENGINE_TIMEOUT_S
    max_bytes: Annotated[int, Meta(gt=0)] = DEFAULT_ENGINE_MAX_BYTES
    model_name: str | None = None  # model label for engines whose series have none (TGI, llama.cpp)
    # Limits (agent/node/engine/limits.py, docs/engine.md): over the first three the scrape is rejected with that
    # reason; past max_models the first models are kept and the rest dropped and counted.
    max_series: Annotated[int, Meta(ge=1, le=100_000_000)] = DEFAULT_ENGINE_MAX_SERIES  # sample_limit
    max_label_value_bytes: Annotated[int, Meta(ge=1, le=1 << 20)] = DEFAULT_ENGINE_MAX_LABEL_VALUE_BYTES
    max_label_bytes: Annotated[int, Meta(ge=1, le=1 << 24)] = DEFAULT_ENGINE_MAX_LABEL_BYTES
    max_models: Annotated[int, Meta(ge=1, le=100_000)] = DEFAULT_ENGINE_MAX_MODELS
    # Hang detection (agent/node/engine/hang.py, docs/diagnostics.md): a rank with requests and no token progress for
    # max(hang_min_stall_s, 2 × max_model_len × prefill s/token) — capped at hang_max_stall_s — whose health_url
    # still answers 200 is hung. health_url None: metrics_url's origin + /health; "" turns the probe off.
    health_url: str | None = None
    max_model_len: Annotated[int, Meta(ge=0, le=100_000_000)] = 0  # 0: ask the engine (/v1/models, llama.cpp /props)
    hang_min_stall_s: Annotated[float, Meta(gt=0, le=3600)] = DEFAULT_HANG_MIN_STALL_S
    hang_max_stall_s: Annotated[float, Meta(gt=0, le=86400)] = DEFAULT_HANG_MAX_STALL_S
    hang_fast_stall_s: Annotated[float, Meta(ge=0, le=3600)] = DEFAULT_HANG_FAST_STALL_S  # 0: the allowance only
    # Progress passes ask prometheus_client's /metrics app (vLLM, SGLang) for their families alone (name[]=...);
    # False: every pass reads the whole exposition (agent/node/engine/progress.py)
    progress_filter: bool = True
    # The engine's name in GET /engines/{name}/ready (agent/node/api/readiness.py)
    name: Annotated[str, Meta(pattern=r"^[A-Za-z0-9][A-Za-z0-9._-]{0,62}$")] = "default"

    def __post_init__(self) -> None:
        _check(self, "metrics_url", http_url)
        _check(self, "health_url", http_url)
        _check(self, "kind", known_kind)


DEFAULT_RECEIVER_GRPC_ENDPOINT = "127.0.0.1:4317"
DEFAULT_RECEIVER_HTTP_ENDPOINT = "127.0.0.1:4318"
DEFAULT_RECEIVER_MAX_MESSAGE_BYTES = 4 << 20  # 4 MiB: the OTel Collector's default gRPC receive limit
DEFAULT_RECEIVER_FORWARD_QUEUE_REQUESTS = 256
DEFAULT_RECEIVER_FORWARD_TIMEOUT_S = 5.0
DEFAULT_RECEIVER_MAX_MODELS = 64
MAX_TTFT_EXTRA_BUCKETS = 16
GENAI_TTFT_LAST_BUCKET_S = 10.0  # the GenAI conventions' last TTFT edge; extra edges go above it


def _extra_ttft_edges(v: list[float]) -> list[float]:
    last = GENAI_TTFT_LAST_BUCKET_S
    for edge in v:
        if not math.isfinite(edge) or edge <= last or edge > 86_400:
            raise ValueError(
                f"each edge must be above the previous one and above {last:g} s (the conventions' last TTFT "
                f"edge), at most 86400 s; got {edge!r}"
            )
        last = edge
    return v


def _host_port(v: str | None) -> str | None:
    if v is None or v == "":
        return None
    host, sep, port = v.rpartition(":")
    if not sep or not host or not port.isdigit() or not 0 <= int(port) <= 65535:
        raise ValueError("must be host:port")
    return v


class ReceiverSettings(_Section, frozen=True, kw_only=True):
    """OTLP trace intake (gRPC and HTTP/protobuf) for per-request timing from engine spans.

    An endpoint is ``host:port``; ``None`` turns that transport off. ``forward_endpoint`` sends every
    accepted export request on untouched: ``http(s)://host:port[/v1/traces]`` for OTLP/HTTP, otherwise
    ``[grpc://]host:port`` for OTLP/gRPC; ``forward_phase_spans`` adds a request of phase child spans (queue,
    prefill, decode) after each one with engine request spans (agent/node/receiver/phases.py). ``emit_histograms``
    makes the spans feed the
    ``gen_ai.server.*`` histograms (for engines without their own, e.g. TGI or llama.cpp); leave it off
    when the engine collector already emits them. They follow the OpenTelemetry GenAI semantic conventions
    (agent/catalog/genai.py): ``genai_operation_name`` and ``genai_provider_name`` stand in for a span without
    ``gen_ai.operation.name`` / ``gen_ai.provider.name``, and ``ttft_extra_buckets_s`` adds TTFT bucket edges
    above the conventions' last one (10 s) for long-context prefill (e.g. ``[20, 40, 80, 160]``).
    ``prompt_band_histograms`` makes the spans feed TTFT and time-per-output-token histograms split by prompt-length
    band (``inferwatch.engine.time_to_first_token`` / ``.time_per_output_token``, label ``prompt_band``), which the
    conformance band compares per band (docs/matrix.md); independent of ``emit_histograms``.
    ``trace_url``: where a trace opens, up to the trace id (the id is appended), as the dashboards' ``$trace_url``:
    the tail explainer's slowest requests (``inferwatch explain``, the status page) link there; ``None`` prints ids.
    """

    enabled: bool = False
    grpc_endpoint: str | None = DEFAULT_RECEIVER_GRPC_ENDPOINT
    http_endpoint: str | None = DEFAULT_RECEIVER_HTTP_ENDPOINT
    forward_endpoint: str | None = None
    forward_phase_spans: bool = True
    max_message_bytes: Annotated[int, Meta(ge=1024, le=256 << 20)] = DEFAULT_RECEIVER_MAX_MESSAGE_BYTES
    forward_queue_requests: Annotated[int, Meta(ge=1, le=100_000)] = DEFAULT_RECEIVER_FORWARD_QUEUE_REQUESTS
    forward_timeout_s: Annotated[float, Meta(gt=0, le=300)] = DEFAULT_RECEIVER_FORWARD_TIMEOUT_S
    max_models: Annotated[int, Meta(ge=1, le=10_000)] = DEFAULT_RECEIVER_MAX_MODELS
    emit_histograms: bool = False
    prompt_band_histograms: bool = False
    genai_operation_name: Annotated[str, Meta(min_length=1, max_length=64)] = "chat"
    genai_provider_name: Annotated[str, Meta(min_length=1, max_length=64)] = "vllm"
    ttft_extra_buckets_s: Annotated[list[float], Meta(max_length=MAX_TTFT_EXTRA_BUCKETS)] = field(default_factory=list)
    trace_url: Annotated[str, Meta(max_length=2048, pattern=r"^https?://\S+$")] | None = None

    def __post_init__(self) -> None:
        _check(self, "ttft_extra_buckets_s", _extra_ttft_edges)
        _check(self, "grpc_endpoint", _host_port)
        _check(self, "http_endpoint", _host_port)


DEFAULT_PROFILE_HEADER = "X-Runtime-Debug: runtime_profile=1"
DEFAULT_PROFILE_INTERVAL_S = 60.0
DEFAULT_PROFILE_TIMEOUT_S = 3.0
DEFAULT_PROFILE_MAX_BYTES = 1 << 20  # 1 MiB: a debug profile is a small JSON document
DEFAULT_GAUGE_FIELDS = ("gpu_memory_used_bytes", "gpu_memory_total_bytes", "num_running_requests", "kv_cache_usage")
DEFAULT_PROBE_INTERVAL_S = 30.0
DEFAULT_PROBE_TIMEOUT_S = 10.0
DEFAULT_PROBE_MAX_TOKENS = 8
DEFAULT_PROBE_MAX_BYTES = 1 << 20
DEFAULT_SNAPSHOT_DIR = Path("~/.local/state/inferwatch/snapshots")
DEFAULT_SNAPSHOT_MAX_COUNT = 32
DEFAULT_SNAPSHOT_MAX_BYTES = 8 << 20
DEFAULT_PROFILE_DURATION_CAP_S = 60.0
DEFAULT_PROFILE_RING_COUNT = 8
DEFAULT_PROFILE_RING_BYTES = 64 << 20
DEFAULT_BINARY_TIMEOUT_S = 10.0
# The binary check again while the runtime is found, so a restored library clears its alert without a restart.
DEFAULT_BINARY_INTERVAL_S = 300.0
API_SCOPES = ("read", "snapshots", "profile", "evidence")
Scope = Literal["read", "snapshots", "profile", "evidence"]
ProbeProtocol = Literal["openai", "anthropic"]


def _default_protocols() -> list[ProbeProtocol]:
    return ["openai"]


def _default_scopes() -> list[Scope]:
    return ["read"]


def _header_shape(v: str) -> str:
    name, sep, _ = v.partition(":")
    if not sep or not name.strip() or any(c.isspace() for c in name.strip()):
        raise ValueError("must look like 'Header-Name: value'")
    return v


class RuntimeProfileSettings(_Section, frozen=True, kw_only=True):
    """The runtime's debug ``runtime_profile`` endpoint (None = collector reports absence).

    ``timeout_s`` bounds one fetch (as ``engine.timeout_s``); how often the collector runs, and how long a run
    may take, are ``collectors.runtime_profile.interval_s`` / ``timeout_s``.
    """

    url: str | None = None  # e.g. http://127.0.0.1:8000/debug/runtime_profile
    header: str = DEFAULT_PROFILE_HEADER  # "Name: value" sent with every fetch
    timeout_s: Annotated[float, Meta(gt=0, le=120)] = DEFAULT_PROFILE_TIMEOUT_S
    max_bytes: Annotated[int, Meta(gt=0, le=64 << 20)] = DEFAULT_PROFILE_MAX_BYTES
    redaction: Literal["denylist", "allowlist"] = "denylist"
    deny_keys: list[str] = field(default_factory=list)  # extra key regexes, added to the built-in denylist
    allow_keys: list[str] = field(default_factory=list)  # allowlist mode: keys (or dotted paths) kept verbatim
    gauge_fields: list[str] = field(default_factory=lambda: list(DEFAULT_GAUGE_FIELDS))

    def __post_init__(self) -> None:
        _check(self, "url", http_url)
        _check(self, "header", _header_shape)


class ProbeSettings(_Section, frozen=True, kw_only=True):
    """Synthetic streaming request against the runtime (off unless ``url`` is set), and against each discovered
    engine target with ``targets`` (agent/node/targets.py).

    ``timeout_s`` bounds one protocol's request; the collector's interval and run timeout are
    ``collectors.probe.interval_s`` / ``timeout_s``.
    """

    url: str | None = None  # base URL of the runtime, e.g. http://127.0.0.1:8000
    # True: each discovered engine target (discovery.*) is probed too, at its metrics URL's origin, its own model
    targets: bool = False
    protocols: list[ProbeProtocol] = field(default_factory=_default_protocols)
    timeout_s: Annotated[float, Meta(gt=0, le=300)] = DEFAULT_PROBE_TIMEOUT_S
    model: str | None = None  # None: the first model of GET /v1/models
    prompt: str = "Say OK."
    max_tokens: Annotated[int, Meta(gt=0, le=256)] = DEFAULT_PROBE_MAX_TOKENS
    max_bytes: Annotated[int, Meta(gt=0, le=64 << 20)] = DEFAULT_PROBE_MAX_BYTES

    def __post_init__(self) -> None:
        _check(self, "url", http_url)


class ApiToken(_Section, frozen=True, kw_only=True):
    token: Annotated[str, Meta(min_length=16)]
    scopes: list[Scope] = field(default_factory=_default_scopes)
    name: str = ""


class ApiSettings(_Section, frozen=True, kw_only=True):
    """Bearer tokens and scopes of the JSON API (see docs/diagnostics.md)."""

    tokens: list[ApiToken] = field(default_factory=list)
    tokens_file: Path | None = None  # lines "TOKEN scope,scope [name]"
    open_paths: list[str] = field(
        default_factory=lambda: ["/metrics", "/healthz", "/readyz", "/runbooks", "/runbooks/*"]
    )
    # ^ exact paths, or a prefix ending in "/*"
    anonymous_scopes: list[Scope] = field(default_factory=_default_scopes)


class ProfilingSettings(_Section, frozen=True, kw_only=True):
    """py-spy: off unless enabled; never run on the collection path except the rate-limited dump enrichment."""

    enabled: bool = False
    py_spy: Path | None = None  # None: py-spy next to the agent's Python, else on PATH (resolved once at start)
    max_duration_s: Annotated[float, Meta(gt=0, le=600)] = DEFAULT_PROFILE_DURATION_CAP_S
    ring_count: Annotated[int, Meta(gt=0, le=1000)] = DEFAULT_PROFILE_RING_COUNT
    ring_bytes: Annotated[int, Meta(gt=0)] = DEFAULT_PROFILE_RING_BYTES
    dir: Path | None = None  # None: <snapshots.dir>/../profiles


class SnapshotSettings(_Section, frozen=True, kw_only=True):
    dir: Path = DEFAULT_SNAPSHOT_DIR
    max_count: Annotated[int, Meta(gt=0, le=10000)] = DEFAULT_SNAPSHOT_MAX_COUNT
    max_bytes: Annotated[int, Meta(gt=0)] = DEFAULT_SNAPSHOT_MAX_BYTES


DEFAULT_EVIDENCE_DIR = Path("~/.local/state/inferwatch/evidence")
DEFAULT_EVIDENCE_MAX_COUNT = 20
DEFAULT_EVIDENCE_MAX_BYTES = 64 << 20
DEFAULT_EVIDENCE_MIN_INTERVAL_S = 600.0  # one automatic bundle per runtime process per 10 min
DEFAULT_EVIDENCE_TIME_LIMIT_S = 10.0  # the whole capture, py-spy of every process included


class EvidenceSettings(_Section, frozen=True, kw_only=True):
    """Evidence bundles (agent/node/actions/evidence.py): captured when the agent's hang finding turns on, when a
    critical alert for this node reaches the webhook, and on request (POST /api/v1/evidence)."""

    enabled: bool = True
    dir: Path = DEFAULT_EVIDENCE_DIR
    max_count: Annotated[int, Meta(gt=0, le=10000)] = DEFAULT_EVIDENCE_MAX_COUNT
    max_bytes: Annotated[int, Meta(gt=0)] = DEFAULT_EVIDENCE_MAX_BYTES
    min_interval_s: Annotated[float, Meta(ge=0, le=86400)] = DEFAULT_EVIDENCE_MIN_INTERVAL_S
    time_limit_s: Annotated[float, Meta(gt=0, le=120)] = DEFAULT_EVIDENCE_TIME_LIMIT_S
    on_hang: bool = True  # capture the moment the engine collector's hang finding turns on
    py_spy: bool = True  # include py-spy dumps (needs ptrace: see docs/diagnostics.md); profiling.py_spy is the binary
    # py-spy dump --native (native frames too; pauses the process for the dump); where py-spy cannot, the dump is
    # retried once without it within time_limit_s and the bundle says which mode it got and why
    native: bool = True
    # The webhook acts only on alerts whose instance label is one of these (this node's agent as Prometheus names
    # it, e.g. "node-a:9435"); empty: every alert it receives is for this node (one agent per Alertmanager route).
    instances: list[str] = field(default_factory=list)


class BinarySettings(_Section, frozen=True, kw_only=True):
    """Binary compatibility of the runtime (at start, every ``interval_s``, and on demand).

    ``path`` overrides /proc/PID/exe; ``interval_s`` is the re-check while the runtime is found (while it is
    not, the lookup is repeated every agent ``interval_s``, a procfs read with no program run).
    """

    path: Path | None = None
    timeout_s: Annotated[float, Meta(gt=0, le=120)] = DEFAULT_BINARY_TIMEOUT_S
    interval_s: Annotated[float, Meta(gt=0, le=86400)] = DEFAULT_BINARY_INTERVAL_S


DEFAULT_ALERTMANAGER_TIMEOUT_S = 2.0  # one POST to one Alertmanager
DEFAULT_ALERTMANAGER_RESEND_S = 60.0  # Prometheus's --rules.alert.resend-delay
PushedAlert = Literal["EngineHungButHealthy", "EngineDown", "RuntimeHardwareMismatch", "CPUFeatureMissing"]
PUSHED_ALERTS: tuple[PushedAlert, ...] = (
    "EngineHungButHealthy",
    "EngineDown",
    "RuntimeHardwareMismatch",
    "CPUFeatureMissing",
)


def _http_urls(v: list[str]) -> list[str]:
    for url in v:
        http_url(url)
    return v


class AlertmanagerSettings(_Section, frozen=True, kw_only=True):
    """Push of the agent's critical node-local findings straight to Alertmanager (agent/node/actions/alertpush.py).

    Off while ``urls`` is empty. Each URL is one Alertmanager (``http://am-0:9093``; the agent POSTs to
    ``/api/v2/alerts`` on every one, as Prometheus does, never through a load balancer). The labels must be those
    the Prometheus rule gives the same alert so that both copies are one alert: ``instance`` and ``job`` of this
    agent's scrape target as Prometheus names them after relabeling, and ``labels`` for every other label the
    target or Prometheus adds (its ``global.external_labels``, e.g. ``runbook_base``, ``dashboard_base``).
    """

    urls: list[str] = field(default_factory=list)
    instance: str | None = None  # required with urls: the `instance` label of this agent's scrape target
    job: str = "inferwatch-agent"
    # Labels the scrape adds to every series of this agent besides instance and job (relabeling: node, pod,
    # namespace ... as a ServiceMonitor adds them); a rule's by (...) drops them as it drops them from the series.
    target_labels: dict[str, str] = field(default_factory=dict)
    labels: dict[str, str] = field(default_factory=dict)  # Prometheus's external labels: on every alert it sends
    alerts: list[PushedAlert] = field(default_factory=lambda: list(PUSHED_ALERTS))
    timeout_s: Annotated[float, Meta(gt=0, le=60)] = DEFAULT_ALERTMANAGER_TIMEOUT_S
    resend_s: Annotated[float, Meta(ge=1, le=3600)] = DEFAULT_ALERTMANAGER_RESEND_S
    bearer_token_file: Path | None = None
    username: str | None = None  # basic auth, with password_file
    password_file: Path | None = None

    def __post_init__(self) -> None:
        _check(self, "urls", _http_urls)
        if self.urls and not self.instance:
            raise SettingError(
                None,
                "alertmanager.instance must be set with alertmanager.urls: the instance label Prometheus gives this "
                "agent's scrape target (e.g. node-a:9435), so pushed alerts and the rules' are one alert",
            )
        if self.bearer_token_file is not None and (self.username or self.password_file):
            raise SettingError(None, "alertmanager: bearer_token_file or username/password_file, not both")
        if bool(self.username) != (self.password_file is not None):
            raise SettingError(None, "alertmanager: username and password_file go together")


DEFAULT_READINESS_MAX_AGE_S = 10.0  # five engine reads at the 2 s cadence
# The pod condition the agent sets on each discovered engine pod that declares it as a readiness gate
# (agent/node/discovery/podcondition.py, docs/kubernetes.md "Readiness").
DEFAULT_READINESS_POD_CONDITION = "inferwatch.io/engine-serving"
_POD_CONDITION = (
    r"^$|^([a-z0-9]([-a-z0-9]*[a-z0-9])?(\.[a-z0-9]([-a-z0-9]*[a-z0-9])?)*/)?"
    r"[A-Za-z0-9]([-A-Za-z0-9_.]{0,61}[A-Za-z0-9])?$"
)


class ReadinessSettings(_Section, frozen=True, kw_only=True):
    """``GET /engines/{name}/ready`` (agent/node/api/readiness.py): 503 when the engine's last successful read is older
    than ``max_age_s`` (or than two of the engine collector's intervals, when those are longer); with
    ``shed_waiting`` > 0, also once that many requests wait (load shedding, off by
    default: a saturated engine serves)."""

    max_age_s: Annotated[float, Meta(gt=0, le=3600)] = DEFAULT_READINESS_MAX_AGE_S
    shed_waiting: Annotated[int, Meta(ge=0, le=1_000_000)] = 0
    # With discovery.kubernetes: set on every engine pod whose spec.readinessGates names it, True while the engine
    # serves (as GET /engines/<target>/ready answers), else False; "" never sets one. A condition type is a
    # qualified name (an optional DNS prefix and "/", then up to 63 characters).
    pod_condition: Annotated[str, Meta(pattern=_POD_CONDITION)] = DEFAULT_READINESS_POD_CONDITION


def _runbooks_base(v: str) -> str:
    if not v.startswith(("http://", "https://")):
        raise ValueError("must start with http:// or https://")
    return v.rstrip("/")


class RunbooksSettings(_Section, frozen=True, kw_only=True):
    """Base URL of the runbook links (no trailing slash); ``/runbooks/<AlertName>`` on the agent by default
    (``None``: the agent's own, as a request reached it)."""

    base_url: str | None = None

    def __post_init__(self) -> None:
        _check(self, "base_url", lambda v: None if v is None else _runbooks_base(v))

    @property
    def url(self) -> str:
        """The base URL the rule files and links use: ``base_url``, else :data:`DEFAULT_RUNBOOKS_BASE_URL`."""
        return self.base_url or DEFAULT_RUNBOOKS_BASE_URL


DEFAULT_DISCOVERY_FILE_MAX_BYTES = 4 << 20  # a file_sd file of thousands of targets is well under 1 MiB
DEFAULT_DISCOVERY_WATCH_TIMEOUT_S = 300  # the API server ends each watch after this; the agent re-watches


class DiscoveryTargetSettings(_Section, frozen=True, kw_only=True):
    """One engine written in the settings file (agent/node/discovery/static.py)."""

    name: Annotated[str, Meta(pattern=r"^[A-Za-z0-9][A-Za-z0-9._/:-]{0,252}$")]
    kind: str = "auto"
    metrics_url: str
    health_url: str | None = None
    profile_url: str | None = None
    labels: dict[str, str] = field(default_factory=dict)

    def __post_init__(self) -> None:
        _check(self, "metrics_url", http_url)
        _check(self, "health_url", http_url)
        _check(self, "profile_url", http_url)
        _check(self, "kind", known_kind)


class DiscoverySettings(_Section, frozen=True, kw_only=True):
    """Where the engine targets come from (agent/node/discovery/, docs/kubernetes.md "Discovery"): a static list, a
    ``file_sd``-shaped file, and engine pods on this node from the Kubernetes API. With any of them set, the agent
    runs a set of engine collectors per target (agent/node/targets.py), beside the single ``engine.metrics_url``."""

    targets: list[DiscoveryTargetSettings] = field(default_factory=list)
    file: Path | None = None
    file_max_bytes: Annotated[int, Meta(gt=0, le=1 << 30)] = DEFAULT_DISCOVERY_FILE_MAX_BYTES
    kubernetes: bool = False
    node_name: str | None = None  # the Downward API's spec.nodeName (NODE_NAME in the DaemonSet)
    namespaces: list[str] = field(default_factory=list)  # empty: every namespace (needs the ClusterRole)
    image_fallback: bool = True  # pods without inferwatch.io/scrape found by their engine image
    watch_timeout_s: Annotated[int, Meta(ge=10, le=3600)] = DEFAULT_DISCOVERY_WATCH_TIMEOUT_S
