"""The streaming probe (blackbox-exporter style): a synthetic streamed request per configured protocol.

Off unless ``probe.url`` is set. Per protocol: ``inferwatch.probe.success``, ``.ttft``, ``.itl``,
``.duration`` of the last run; cumulative ``inferwatch.probe.schema_violations{kind}`` (every kind
exported, zeros included) and ``inferwatch.probe.http_errors{error_type}`` (``hardware_mismatch`` on
its own). The interval is ``collectors.probe.interval_s`` (30 s).
"""

from __future__ import annotations

from typing import ClassVar

from inferwatch.agent.common.samples import Finding, Sample, attrs
from inferwatch.agent.config import DEFAULT_PROBE_INTERVAL_S, ProbeSettings
from inferwatch.agent.errors import NoDataError
from inferwatch.agent.node.collectors.base import BaseCollector, CollectContext, Collection
from inferwatch.agent.node.collectors.registry import TIMING_MARGIN_S, Entry
from inferwatch.agent.node.probe.client import ProbeResult, run_probe
from inferwatch.agent.node.probe.schema import VIOLATION_KINDS

# Runbooks are named after the alerts that watch the same signal (alerts/inferwatch.rules.yml).
RUNBOOK_MISMATCH = "RuntimeHardwareMismatch"
RUNBOOK_SCHEMA = "StreamSchemaViolation"
MAX_ERROR_TYPES = 32  # bound on distinct error_type values per protocol; beyond it: "other"


def probe_findings(result: ProbeResult) -> list[Finding]:
    """What one probe run means (shared with doctor)."""
    p = result.protocol
    ev: dict[str, object] = {"url": result.url, "status_code": result.status_code}
    out: list[Finding] = []
    if result.error_type == "hardware_mismatch":
        out.append(
            Finding(
                "runtime.hardware_mismatch",
                "fail",
                f"{p} probe: the runtime refused with hardware_mismatch: its build does not match this host "
                f"({result.error_message})",
                ev,
                RUNBOOK_MISMATCH,
            )
        )
    elif result.error_type is not None:
        out.append(
            Finding(f"probe.{p}.error", "fail", f"{p} probe failed ({result.error_type}): {result.error_message}", ev)
        )
    counts = result.violation_counts()
    if counts:
        first = result.violations[0]
        out.append(
            Finding(
                f"probe.{p}.stream_schema",
                "fail",
                f"{p} stream off-schema: "
                + ", ".join(f"{k}×{n}" for k, n in sorted(counts.items()))
                + (f" (first at {first.schema_path})" if first.schema_path else f" ({first.message})"),
                {**ev, "violations": counts},
                RUNBOOK_SCHEMA,
            )
        )
    if not out:
        out.append(Finding(f"probe.{p}", "ok", f"{p} stream clean: ttft {result.ttft_s or 0:.3f}s", ev))
    return out


class ProbeCollector(BaseCollector):
    name: ClassVar[str] = "probe"
    description: ClassVar[str] = "Synthetic streamed requests: client TTFT/ITL, stream schema, HTTP error types."
    reads: ClassVar[str] = "synthetic streamed requests to the runtime's API ([diagnostics.md](diagnostics.md))"

    def __init__(self, ctx: CollectContext, cfg: ProbeSettings) -> None:
        super().__init__(ctx)
        self.cfg = cfg
        self.violations: dict[tuple[str, str], int] = {}
        self.http_errors: dict[tuple[str, str], int] = {}

    def collect(self) -> Collection:
        cfg = self.cfg
        if not cfg.url:
            raise NoDataError("probe.url is not set", hint="set probe.url to the runtime's base URL to probe it")
        samples: list[Sample] = []
        findings: list[Finding] = []
        details: dict[str, object] = {}
        for protocol in dict.fromkeys(str(p) for p in cfg.protocols):
            result = run_probe(
                cfg.url,
                protocol,
                model=cfg.model,
                prompt=cfg.prompt,
                max_tokens=cfg.max_tokens,
                timeout_s=cfg.timeout_s,
                max_bytes=cfg.max_bytes,
            )
            for kind, n in result.violation_counts().items():
                self.violations[(protocol, kind)] = self.violations.get((protocol, kind), 0) + n
            if result.error_type is not None:
                etype = result.error_type
                known = {t for (p, t) in self.http_errors if p == protocol}
                if etype not in known and len(known) >= MAX_ERROR_TYPES:
                    etype = "other"
                self.http_errors[(protocol, etype)] = self.http_errors.get((protocol, etype), 0) + 1
            a = attrs(protocol=protocol)
            samples.append(Sample("inferwatch.probe.success", 1 if result.ok else 0, a))
            for name, value in (
                ("inferwatch.probe.ttft", result.ttft_s),
                ("inferwatch.probe.itl", result.itl_s),
                ("inferwatch.probe.duration", result.duration_s),
            ):
                if value is not None:
                    samples.append(Sample(name, value, a))
            for kind in VIOLATION_KINDS:
                samples.append(
                    Sample(
                        "inferwatch.probe.schema_violations",
                        self.violations.get((protocol, kind), 0),
                        attrs(protocol=protocol, kind=kind),
                    )
                )
            findings += probe_findings(result)
            details[protocol] = result.as_dict()
        for (protocol, etype), n in sorted(self.http_errors.items()):
            samples.append(Sample("inferwatch.probe.http_errors", n, attrs(protocol=protocol, error_type=etype)))
        return Collection(samples, findings, details)


ENTRY = Entry(
    ProbeCollector,
    order=70,
    sections=lambda s: (s.probe,),
    enabled=lambda s: bool(s.probe.url),
    needs="on when `probe.url` is set",
    interval_s=lambda s: DEFAULT_PROBE_INTERVAL_S,
    timeout_s=lambda s: s.probe.timeout_s * len(s.probe.protocols) + TIMING_MARGIN_S,
    lane=None,
)
