"""SIMD utilisation collector: does the inference runtime execute its AVX-512 / SVE path while serving?

Finds the runtime process (``runtime.pid`` / ``pidfile`` / ``cmdline_pattern``, else the process listening
on the port of ``engine.metrics_url``), then each cycle reads its threads' ``arch_status`` and CPU time,
its ``GLIBC_TUNABLES``, and (cached per file, so only once per library) the AVX-512 / SVE instructions in
the code it has mapped; on AArch64 it also counts SVE against all retired instructions with the PMU where
the kernel permits. See agent/node/simd/analysis.py for the verdict; the finding ``simd.<feature>`` links the
runbook SIMDUnusedWhileServing.
"""

from __future__ import annotations

from typing import ClassVar

from inferwatch.agent.common.samples import AnySample, Finding, Sample, attrs
from inferwatch.agent.config import SimdSettings
from inferwatch.agent.errors import NoDataError
from inferwatch.agent.node.collectors.base import BaseCollector, CollectContext, Collection
from inferwatch.agent.node.collectors.registry import Entry, runtime_configured
from inferwatch.agent.node.host.runtime import HINT_CONFIGURE, url_port
from inferwatch.agent.node.simd.analysis import FeatureReport, SimdAnalyzer
from inferwatch.agent.node.simd.codescan import CodeScanCache

RUNBOOK = "SIMDUnusedWhileServing"


def report_samples(r: FeatureReport, include_used: bool = True) -> list[AnySample]:
    a = attrs(feature=r.feature)
    out: list[AnySample] = [
        Sample("inferwatch.runtime.simd.capable", int(r.capable), a),
        Sample("inferwatch.runtime.simd.code_present", int(r.code_present), a),
        Sample("inferwatch.runtime.simd.code_instructions", r.code_instructions, a),
        Sample("inferwatch.runtime.simd.attributable", int(r.attributable), a),
    ]
    if r.threads_active is not None:
        out.append(Sample("inferwatch.runtime.simd.threads_active", r.threads_active, a))
    if r.pmu_ratio is not None:
        out.append(Sample("inferwatch.runtime.simd.instructions_ratio", r.pmu_ratio, a))
    if include_used and r.used is not None:
        out.append(Sample("inferwatch.runtime.simd.used", int(r.used), a))
    return out


def report_finding(r: FeatureReport) -> Finding:
    status = {"used": "ok", "unused": "warn", "idle": "ok", "not_capable": "skip", "unknown": "skip"}[r.verdict]
    evidence = {
        "verdict": r.verdict,
        "capable": r.capable,
        "code_instructions": r.code_instructions,
        "libc_instructions": r.libc_instructions,
        "threads_total": r.threads_total,
        "threads_active": r.threads_active,
        "attributable": r.attributable,
        "pmu_ratio": r.pmu_ratio,
        **r.evidence,
    }
    return Finding(f"simd.{r.feature}", status, r.summary, evidence, RUNBOOK if r.verdict == "unused" else "")


class SimdCollector(BaseCollector):
    name: ClassVar[str] = "simd"
    description: ClassVar[str] = "Runtime SIMD utilisation (arch_status, mapped-code scan, PMU)"
    reads: ClassVar[str] = (
        "the runtime's `/proc/<pid>/arch_status`, its mapped code, PMU counters ([llamacpp.md](llamacpp.md))"
    )

    def __init__(
        self,
        ctx: CollectContext,
        cfg: SimdSettings,
        runtime_port: int | None = None,
        cache: CodeScanCache | None = None,
    ) -> None:
        """``runtime_port``: the port of ``engine.metrics_url``, whose listener is the runtime when ``runtime.*`` is
        unset. ``cache``: the mapped-code scans, shared by the checks of several engines on one node (each library
        is scanned once, whichever engine maps it)."""
        super().__init__(ctx)
        self.cfg = cfg
        self.runtime_port = runtime_port
        self._analyzer: SimdAnalyzer | None = None
        self._cache = cache if cache is not None else CodeScanCache()

    def _runtime_pid(self) -> int:
        """The runtime from the agent's one locator: ``runtime.*`` when set, else the engine port's listener."""
        locator = self.ctx.locator
        port = self.runtime_port
        if not locator.configured and port is None:
            raise NoDataError(
                "no runtime process configured",
                hint=HINT_CONFIGURE,
            )
        return int(locator.find_serving(port).pid)

    def collect(self) -> Collection:
        pid = self._runtime_pid()
        if self._analyzer is None or self._analyzer.pid != pid:
            self.close()
            self._analyzer = SimdAnalyzer(self.ctx.procfs, pid, self.cfg.busy_cpu_cores, self._cache)
        reports = self._analyzer.observe()
        if not reports:
            raise NoDataError("no wide-SIMD feature is tracked on this architecture")
        samples: list[AnySample] = [Sample("inferwatch.runtime.simd.runtime_cpu", reports[0].busy_cpu)]
        for r in reports:
            samples.extend(report_samples(r))
        return Collection(
            samples=samples,
            findings=[report_finding(r) for r in reports],
            details={"pid": pid, "files_scanned": self._cache.scans},
        )

    def close(self) -> None:
        if self._analyzer is not None:
            self._analyzer.close()
            self._analyzer = None


ENTRY = Entry(
    SimdCollector,
    order=80,
    sections=lambda s: (s.simd, url_port(s.engine.metrics_url)),
    configured=lambda s: runtime_configured(s) or url_port(s.engine.metrics_url) is not None,
    needs="absent until `runtime.*` is set",
)
