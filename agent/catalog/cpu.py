"""CPU capability: identity, SIMD features expected for this CPU model and present, SVE vector length."""

from inferwatch.agent.catalog.spec import Kind, MetricSpec

METRICS = (
    MetricSpec(
        "inferwatch.node.info",
        Kind.GAUGE,
        "",
        "Always 1; the node's hardware and OS identity as labels (CPU model, kernel release, machine type "
        "from DMI, which is the instance type on AWS).",
        ("arch", "cpu_vendor", "cpu_model", "kernel_release", "machine_type"),
    ),
    MetricSpec(
        "inferwatch.cpu.feature.present",
        Kind.GAUGE,
        "",
        "1 when the SIMD feature is reported by every CPU of the node (/proc/cpuinfo flags), else 0.",
        ("feature",),
    ),
    MetricSpec(
        "inferwatch.cpu.feature.expected",
        Kind.GAUGE,
        "",
        "1 when this CPU model is expected to have the feature (built-in table or expect_features config).",
        ("feature", "cpu_model"),
    ),
    MetricSpec(
        "inferwatch.cpu.feature.missing",
        Kind.GAUGE,
        "",
        "1 when the feature is expected for this CPU model but absent from /proc/cpuinfo: the silent fallback "
        "that costs ~20% latency with no errors. detected_by says what the absence means: kernel (the kernel "
        "must enable it: every ARM hwcap, x86 avx and avx512f register state, AMX; the kernel clears the flag "
        "when it does not, so no runtime can use it) or cpuid (x86 flags runtimes read from CPUID themselves, "
        "avx512_vnni, avx512_bf16, avx512_fp16, avx_vnni ...: a kernel too old to name one hides it from the "
        "file only; a hypervisor CPU model or clearcpuid= hides it from the runtime too).",
        ("feature", "cpu_model", "detected_by"),
    ),
    MetricSpec(
        "inferwatch.cpu.sve.vector_length",
        Kind.GAUGE,
        "By",
        "Default SVE vector length (/proc/sys/abi/sve_default_vector_length), where the kernel exposes it.",
    ),
    MetricSpec(
        "inferwatch.cpu.amx.permitted",
        Kind.GAUGE,
        "",
        "1 when the running kernel enables AMX tile state for processes (arch_prctl ARCH_GET_XCOMP_SUPP has "
        "XTILECFG and XTILEDATA), so a runtime's ARCH_REQ_XCOMP_PERM can succeed; 0 when it does not (or the "
        "kernel predates 5.16). x86_64 only, and only when --path.procfs is the running kernel's. With "
        'inferwatch_cpu_feature_present{feature="amx_tile"} == 1 a 0 here means AMX the CPU has is unusable.',
    ),
    MetricSpec("system.cpu.logical.count", Kind.UPDOWNCOUNTER, "{cpu}", "Logical CPUs in /proc/cpuinfo."),
)
