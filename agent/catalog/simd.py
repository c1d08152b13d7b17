"""SIMD utilisation of the inference runtime: is the wide vector path (AVX-512, SVE) executed while serving?

``feature`` is ``avx512`` (x86-64) or ``sve`` (AArch64). See agent/node/simd/analysis.py for the evidence and
docs/llamacpp.md for how to read it. ``used`` is absent (never 0) when the runtime is idle or the
evidence cannot decide, so ``used == 0`` always means "capable, serving, and the wide path did not run".
"""

from inferwatch.agent.catalog.spec import Kind, MetricSpec

_F = ("feature",)

METRICS = (
    MetricSpec(
        "inferwatch.runtime.simd.capable",
        Kind.GAUGE,
        "",
        "1 when the CPU supports the feature (avx512f / sve in cpuinfo), else 0.",
        _F,
    ),
    MetricSpec(
        "inferwatch.runtime.simd.code_present",
        Kind.GAUGE,
        "",
        "1 when the executable code the runtime has mapped (outside the C library and loader) contains the "
        "feature's instructions, else 0.",
        _F,
    ),
    MetricSpec(
        "inferwatch.runtime.simd.code_instructions",
        Kind.GAUGE,
        "{instruction}",
        "The feature's instructions counted (heuristic byte scan) in the runtime's mapped code outside the C "
        "library and loader.",
        _F,
    ),
    MetricSpec(
        "inferwatch.runtime.simd.threads_active",
        Kind.GAUGE,
        "{thread}",
        "Runtime threads whose AVX-512 register state was in use during the last window "
        "(/proc/PID/task/TID/arch_status; x86 only).",
        _F,
    ),
    MetricSpec(
        "inferwatch.runtime.simd.attributable",
        Kind.GAUGE,
        "",
        "1 when per-thread activity can be attributed to the runtime's compute (glibc's own AVX-512 string code "
        "disabled through GLIBC_TUNABLES, or a PMU count), else 0.",
        _F,
    ),
    MetricSpec(
        "inferwatch.runtime.simd.used",
        Kind.GAUGE,
        "",
        "1 when the feature's instructions ran while the runtime was serving in the last window, 0 when the CPU "
        "is capable, the runtime was serving and they did not; absent when idle or undecidable.",
        _F,
    ),
    MetricSpec(
        "inferwatch.runtime.simd.instructions_ratio",
        Kind.GAUGE,
        "1",
        "Share of retired instructions that were the feature's over the last window (PMU; AArch64 SVE where "
        "perf_event_open is permitted).",
        _F,
    ),
    MetricSpec(
        "inferwatch.runtime.simd.runtime_cpu",
        Kind.GAUGE,
        "{core}",
        "CPU cores the runtime process used over the last window (the serving test behind the verdict).",
    ),
)
