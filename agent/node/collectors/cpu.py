"""CPU capability collector: identity, SIMD features present / expected / missing, SVE vector length, AMX.

Reads what :mod:`inferwatch.agent.node.host.cpucap` reads (``<procfs>/cpuinfo``, ``osrelease``, ``cmdline``,
``sys/abi/sve_default_vector_length``, ``self/auxv``, DMI under ``<sysfs>``) and, when procfs is the
running kernel's, asks that kernel through ``ctx.cpu_probe`` (:mod:`inferwatch.agent.node.host.cpuprobe`)
whether AMX is enabled and the SVE vector length. CPU features only change across a reboot
(or a CPU hotplug), and reading /proc/cpuinfo on x86 costs an IPI per CPU, so the default interval is
long (:data:`DEFAULT_CPU_INTERVAL_S`).
"""

from __future__ import annotations

from typing import ClassVar

from inferwatch.agent.common.samples import AnySample, Sample, attrs
from inferwatch.agent.config import CPUSettings
from inferwatch.agent.node.collectors.base import BaseCollector, CollectContext, Collection
from inferwatch.agent.node.collectors.registry import Entry
from inferwatch.agent.node.host.cpucap import amx_verdict, cpu_feature_verdict, read_cpu_capability
from inferwatch.agent.node.host.cpumodels import ARM_CORES, X86_MODELS, detected_by

DEFAULT_CPU_INTERVAL_S = 60.0

# Features reported as present (1/0) whether or not this model expects them: every feature any model
# in the table expects, per architecture, so a dashboard can compare nodes of different generations.
TRACKED: dict[str, frozenset[str]] = {
    "aarch64": frozenset().union(*(c.features for c in ARM_CORES.values())),
    "x86_64": frozenset().union(*(r.features for r in X86_MODELS)),
}


class CPUCollector(BaseCollector):
    name: ClassVar[str] = "cpu"
    description: ClassVar[str] = "CPU identity and SIMD features expected for this CPU model (/proc/cpuinfo)"
    reads: ClassVar[str] = (
        "`/proc/cpuinfo`, `/proc/sys/kernel/osrelease`, `/proc/cmdline`, `/proc/sys/abi/sve_default_vector_length`, "
        "`/proc/self/auxv`, `/proc/sys/kernel/random/boot_id`, `/sys/class/dmi/id/{product_name,sys_vendor}`; "
        "`arch_prctl`/`prctl` on the running kernel"
    )

    def __init__(self, ctx: CollectContext, cfg: CPUSettings, machine: str | None = None) -> None:
        """``cfg``: the features expected on top of the model's; ``machine``: ``path.machine`` (a recorded tree's
        ``uname -m``; None: the running kernel's, or what the tree says)."""
        super().__init__(ctx)
        self.cfg = cfg
        self.machine = machine

    def collect(self) -> Collection:
        cap = read_cpu_capability(
            self.ctx.procfs,
            self.ctx.sysfs,
            self.cfg.expect_features,
            self.ctx.cpu_probe,
            machine=self.machine,
            limits=self.ctx.read_limits,
        )
        info = cap.info
        model = cap.cpu_model
        samples: list[AnySample] = [
            Sample(
                "inferwatch.node.info",
                1,
                attrs(
                    arch=info.arch,
                    cpu_vendor=info.vendor,
                    cpu_model=model,
                    kernel_release=cap.kernel_release,
                    machine_type=cap.machine_type,
                ),
            ),
            Sample("system.cpu.logical.count", info.logical_cpus),
        ]
        for feature in sorted(TRACKED.get(info.arch, frozenset()) | cap.expected):
            samples.append(Sample("inferwatch.cpu.feature.present", int(feature in info.flags), attrs(feature=feature)))
        for feature in sorted(cap.expected):
            a = attrs(feature=feature, cpu_model=model)
            samples.append(Sample("inferwatch.cpu.feature.expected", 1, a))
            how = attrs(feature=feature, cpu_model=model, detected_by=detected_by(info.arch, feature))
            samples.append(Sample("inferwatch.cpu.feature.missing", int(feature not in info.flags), how))
        if cap.sve_vector_length_bytes is not None:
            samples.append(Sample("inferwatch.cpu.sve.vector_length", cap.sve_vector_length_bytes))
        amx = cap.live.amx if cap.live is not None else None
        if amx is not None:
            samples.append(Sample("inferwatch.cpu.amx.permitted", int(amx.os_enabled)))
        finding = cpu_feature_verdict(cap)
        findings = [finding]
        amx_finding = amx_verdict(cap)
        if amx_finding is not None:
            findings.append(amx_finding)
        return Collection(samples=samples, findings=findings, details=dict(finding.evidence))


ENTRY = Entry(
    CPUCollector,
    order=20,
    sections=lambda s: (s.cpu, s.path.machine),
    interval_s=lambda s: DEFAULT_CPU_INTERVAL_S,
)
