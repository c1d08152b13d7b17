"""Which SIMD features a CPU model is expected to have, keyed by CPU identity (not by flags).

ARM is keyed on (implementer, part) from /proc/cpuinfo (util-linux ``lscpu-arm.c`` names); x86 on
(vendor, family, model, stepping range) (kernel ``intel-family.h``, AMD family/model ranges). Only
features that inference runtimes select kernels on are listed, and only where the fact is documented
(see docs/collectors.md for sources): Graviton2/Neoverse N1 has no SVE; Graviton3/Neoverse V1 has SVE
but **not** SVE2; Neoverse V2 (Graviton4, Grace), N2, V3 have SVE2; Skylake-SP and later Xeons have
avx512f; Cooper Lake and Sapphire Rapids add avx512_bf16; Sapphire Rapids adds AMX; Zen 4 has avx512f.
Optional tokens that vary with kernel and distribution on identical cores (pac, bti, sm3, sm4, rng) are
never expected.

Names: an ARM core is named as Arm names it ("Arm Neoverse-V1"). A product name ("AWS Graviton3",
"Azure Cobalt 100") is given only with DMI evidence (``sys_vendor``, ``product_name``, ``board_vendor``
under ``<sysfs>/class/dmi/id``), because one core is sold in many products: a Cortex-A72 is a Raspberry
Pi 4 as well as a Graviton (1st gen), a Neoverse-N2 is a Yitian 710 as well as a Cobalt 100. Only
aarch64 kernels get expectations: a 32-bit ARM kernel names its features differently (``neon``).
"""

from __future__ import annotations

from dataclasses import dataclass

from inferwatch.agent.node.host.cpuinfo import IMPLEMENTERS, CpuInfo


@dataclass(frozen=True, slots=True)
class Dmi:
    """``<sysfs>/class/dmi/id/{sys_vendor,product_name,board_vendor}`` as read ("" when absent)."""

    sys_vendor: str = ""
    product_name: str = ""
    board_vendor: str = ""

    def field(self, name: str) -> str:
        return str(getattr(self, name))


@dataclass(frozen=True, slots=True)
class CpuIdentity:
    """The node's CPU as a name and the features that model should report."""

    name: str  # "AWS Graviton3 (Arm Neoverse-V1)" (DMI), "Arm Neoverse-V1", "Intel(R) Xeon(R) ... (Sapphire Rapids)"
    expected: frozenset[str]
    known: bool  # False: no table entry, ``expected`` is empty
    product_evidence: str = ""  # the DMI field that named the product: "sys_vendor=Amazon EC2"


# --- ARM ---------------------------------------------------------------------------------------------
_NEON = frozenset({"asimd"})
_NEON_DOT = _NEON | {"asimddp"}
_V8_6 = _NEON_DOT | {"i8mm", "bf16"}  # Armv8.6 makes BF16 and I8MM mandatory
_SVE = _V8_6 | {"sve", "svei8mm", "svebf16"}
_SVE2 = _SVE | {"sve2"}
_ARMV9_MOBILE = _NEON_DOT | {"sve", "sve2"}  # Armv9.0 makes SVE2 mandatory


@dataclass(frozen=True, slots=True)
class _ArmCore:
    core: str  # util-linux lscpu-arm.c spelling
    features: frozenset[str]


ARM_CORES: dict[tuple[int, int], _ArmCore] = {
    (0x41, 0xD08): _ArmCore("Cortex-A72", _NEON),
    (0x41, 0xD0C): _ArmCore("Neoverse-N1", _NEON_DOT | {"fphp", "asimdhp"}),
    (0x41, 0xD40): _ArmCore("Neoverse-V1", _SVE),
    (0x41, 0xD49): _ArmCore("Neoverse-N2", _SVE2),
    (0x41, 0xD4F): _ArmCore("Neoverse-V2", _SVE2),
    (0x41, 0xD83): _ArmCore("Neoverse-V3AE", _SVE2),
    (0x41, 0xD84): _ArmCore("Neoverse-V3", _SVE2),
    (0x41, 0xD8E): _ArmCore("Neoverse-N3", frozenset({"asimd", "sve", "sve2"})),
    (0x41, 0xD46): _ArmCore("Cortex-A510", _ARMV9_MOBILE),
    (0x41, 0xD47): _ArmCore("Cortex-A710", _ARMV9_MOBILE),
    (0x41, 0xD48): _ArmCore("Cortex-X2", _ARMV9_MOBILE),
    (0x41, 0xD4D): _ArmCore("Cortex-A715", _ARMV9_MOBILE),
    (0x41, 0xD4E): _ArmCore("Cortex-X3", _ARMV9_MOBILE),
    (0x41, 0xD80): _ArmCore("Cortex-A520", _ARMV9_MOBILE),
    (0x41, 0xD81): _ArmCore("Cortex-A720", _ARMV9_MOBILE),
    (0x41, 0xD82): _ArmCore("Cortex-X4", _ARMV9_MOBILE),
    (0xC0, 0xAC3): _ArmCore("Ampere-1", _V8_6),
    (0xC0, 0xAC4): _ArmCore("Ampere-1a", _V8_6),
}

# Cores named (util-linux lscpu-arm.c) but without expectations: no documented SIMD set to gate on.
ARM_CORE_NAMES: dict[tuple[int, int], str] = {
    (0x41, 0xB76): "ARM1176",
    (0x41, 0xC07): "Cortex-A7",
    (0x41, 0xC08): "Cortex-A8",
    (0x41, 0xC09): "Cortex-A9",
    (0x41, 0xC0F): "Cortex-A15",
    (0x41, 0xD03): "Cortex-A53",
    (0x41, 0xD04): "Cortex-A35",
    (0x41, 0xD05): "Cortex-A55",
    (0x41, 0xD07): "Cortex-A57",
    (0x41, 0xD09): "Cortex-A73",
    (0x41, 0xD0A): "Cortex-A75",
    (0x41, 0xD0B): "Cortex-A76",
    (0x41, 0xD0D): "Cortex-A77",
    (0x41, 0xD41): "Cortex-A78",
    (0x41, 0xD44): "Cortex-X1",
    (0x43, 0x0A1): "ThunderX-88XX",
    (0x43, 0x0AF): "ThunderX2-99xx",
    (0x46, 0x001): "A64FX",
    (0x48, 0xD01): "TaiShan-v110",
    (0x48, 0xD02): "TaiShan-v120",
    (0x48, 0xD40): "Cortex-A76",  # HiSilicon's own implementer code: not Arm's 0xd40 (Neoverse-V1)
    (0x53, 0x001): "exynos-m1",
    (0x53, 0x002): "exynos-m3",
    (0x4E, 0x000): "Denver",
    (0x4E, 0x003): "Denver 2",
    (0x4E, 0x004): "Carmel",
    (0x51, 0x800): "Kryo-2XX-Gold",
    (0x51, 0x801): "Kryo-2XX-Silver",
    (0x51, 0x802): "Kryo-3XX-Gold",
    (0x51, 0x803): "Kryo-3XX-Silver",
    (0x61, 0x022): "Icestorm-M1",
    (0x61, 0x023): "Firestorm-M1",
    (0x61, 0x032): "Blizzard-M2",
    (0x61, 0x033): "Avalanche-M2",
}
_VENDOR_PREFIX = {0x41: "Arm", 0x43: "Cavium", 0x46: "Fujitsu", 0x48: "HiSilicon", 0x4E: "NVIDIA"}
_VENDOR_PREFIX |= {0x51: "Qualcomm", 0x53: "Samsung", 0x61: "Apple", 0xC0: ""}

# Parts sold in several products: which DMI field, containing which word (any case), names the product.
# First match wins. Sources: docs/collectors.md (AWS Graviton getting-started; lelegard/arm-cpusysregs).
_DMI_PRODUCTS: dict[tuple[int, int], tuple[tuple[str, str, str], ...]] = {
    (0x41, 0xD08): (("sys_vendor", "amazon ec2", "AWS Graviton"),),
    (0x41, 0xD0C): (
        ("sys_vendor", "amazon ec2", "AWS Graviton2"),
        ("sys_vendor", "ampere", "Ampere Altra"),
        ("board_vendor", "ampere", "Ampere Altra"),
    ),
    (0x41, 0xD40): (
        ("product_name", "hpc7g", "AWS Graviton3E"),
        ("sys_vendor", "amazon ec2", "AWS Graviton3"),
    ),
    (0x41, 0xD49): (
        ("sys_vendor", "microsoft", "Azure Cobalt 100"),
        ("sys_vendor", "alibaba", "Alibaba Yitian 710"),
    ),
    (0x41, 0xD4F): (
        ("sys_vendor", "amazon ec2", "AWS Graviton4"),
        ("sys_vendor", "nvidia", "NVIDIA Grace"),
        ("product_name", "grace", "NVIDIA Grace"),
        ("board_vendor", "nvidia", "NVIDIA Grace"),
    ),
    (0x41, 0xD84): (("sys_vendor", "amazon ec2", "AWS Graviton5"),),
}


def arm_core_name(implementer: int, part: int) -> str | None:
    """ "Arm Neoverse-V1", "HiSilicon TaiShan-v110", "Ampere-1a"; None for a part no table names."""
    core = ARM_CORES.get((implementer, part))
    name = core.core if core is not None else ARM_CORE_NAMES.get((implementer, part))
    if name is None:
        return None
    prefix = _VENDOR_PREFIX.get(implementer, "")
    return f"{prefix} {name}" if prefix else name


def _product(key: tuple[int, int], dmi: Dmi) -> tuple[str, str]:
    for field, word, product in _DMI_PRODUCTS.get(key, ()):
        value = dmi.field(field)
        if word in value.lower():
            return product, f"{field}={value}"
    return "", ""


def _arm_identity(info: CpuInfo, dmi: Dmi) -> CpuIdentity:
    names: list[str] = []
    evidence: list[str] = []
    expected: frozenset[str] | None = None
    known = bool(info.core_types) and info.arch == "aarch64"
    for ct in info.core_types:
        key = (ct.implementer, ct.part)
        vendor = IMPLEMENTERS.get(ct.implementer, f"implementer 0x{ct.implementer:02x}")
        core_name = arm_core_name(*key) or f"{vendor} part 0x{ct.part:03x}"
        product, why = _product(key, dmi)
        names.append(f"{product} ({core_name})" if product else core_name)
        if why:
            evidence.append(why)
        core = ARM_CORES.get(key)
        if core is None:
            known = False
            continue
        expected = core.features if expected is None else expected & core.features
    name = " + ".join(dict.fromkeys(names)) or info.model_name or f"unknown {info.arch} CPU"
    proof = ", ".join(dict.fromkeys(evidence))
    if not known:
        return CpuIdentity(name, frozenset(), False, proof)
    return CpuIdentity(name, expected or frozenset(), True, proof)


# --- x86 ---------------------------------------------------------------------------------------------
_AVX2 = frozenset({"avx2", "fma"})
_AVX512 = _AVX2 | {"avx512f", "avx512cd", "avx512bw", "avx512dq", "avx512vl"}
_VNNI = _AVX512 | {"avx512_vnni"}
_ICX = _VNNI | {"avx512ifma", "avx512vbmi", "avx512_vbmi2", "avx512_bitalg", "avx512_vpopcntdq"}
_BF16 = _VNNI | {"avx512_bf16"}
_AMX = _BF16 | {"avx512_fp16", "avx_vnni", "amx_tile", "amx_bf16", "amx_int8"}
_ZEN4 = _BF16

# What a process needs from the kernel before it may execute these, against flags runtimes read from CPUID
# themselves. The kernel must enable the register state in XCR0 (YMM for avx, opmask/ZMM for avx512f) and
# clears a flag from /proc/cpuinfo when it does not (arch/x86/kernel/fpu/xstate.c); AMX tile data further
# needs each process to ask (arch_prctl ARCH_REQ_XCOMP_PERM, kernel 5.16+). Every other x86 flag (fma, avx2,
# avx512bw, avx512_vnni, avx512_bf16, avx512_fp16, avx_vnni ...) uses state that is already on: oneDNN,
# ggml and PyTorch test the CPUID bit, never /proc/cpuinfo, so a kernel too old to name such a flag hides
# it from the file and not from the runtime.
X86_KERNEL_GATED = frozenset({"avx", "avx512f", "amx_tile", "amx_bf16", "amx_int8", "amx_fp16", "amx_complex"})


def kernel_gated(arch: str, feature: str) -> bool:
    """True when only the kernel can make ``feature`` usable (every ARM hwcap; x86 XSAVE state and AMX)."""
    if arch == "x86_64":
        return feature in X86_KERNEL_GATED
    return True


DETECTED_BY_KERNEL = "kernel"  # usable only when the kernel enables it; absent from its report = unusable
DETECTED_BY_CPUID = "cpuid"  # runtimes test the CPUID bit themselves; absent from /proc/cpuinfo alone = maybe unnamed


def detected_by(arch: str, feature: str) -> str:
    """The ``detected_by`` of ``feature``: who decides whether a runtime uses it (see :data:`X86_KERNEL_GATED`)."""
    return DETECTED_BY_KERNEL if kernel_gated(arch, feature) else DETECTED_BY_CPUID


@dataclass(frozen=True, slots=True)
class _X86Rule:
    vendor: str
    family: int
    models: tuple[tuple[int, int], ...]  # inclusive model ranges
    steppings: tuple[int, int]  # inclusive
    uarch: str
    features: frozenset[str]


_ANY = (0, 0xFF)
X86_MODELS: tuple[_X86Rule, ...] = (
    _X86Rule("GenuineIntel", 6, ((0x3C, 0x3C), (0x3F, 0x3F), (0x45, 0x46)), _ANY, "Haswell", _AVX2),
    _X86Rule("GenuineIntel", 6, ((0x3D, 0x3D), (0x47, 0x47), (0x4F, 0x4F), (0x56, 0x56)), _ANY, "Broadwell", _AVX2),
    _X86Rule("GenuineIntel", 6, ((0x55, 0x55),), (0, 4), "Skylake-SP", _AVX512),
    _X86Rule("GenuineIntel", 6, ((0x55, 0x55),), (5, 7), "Cascade Lake", _VNNI),
    _X86Rule("GenuineIntel", 6, ((0x55, 0x55),), (10, 11), "Cooper Lake", _BF16),
    _X86Rule("GenuineIntel", 6, ((0x6A, 0x6A), (0x6C, 0x6C)), _ANY, "Ice Lake-SP", _ICX),
    _X86Rule("GenuineIntel", 6, ((0x8F, 0x8F),), _ANY, "Sapphire Rapids", _AMX),
    _X86Rule("GenuineIntel", 6, ((0xCF, 0xCF),), _ANY, "Emerald Rapids", _AMX),
    _X86Rule("GenuineIntel", 6, ((0xAD, 0xAE),), _ANY, "Granite Rapids", _AMX),
    _X86Rule("AuthenticAMD", 0x17, ((0x00, 0x2F),), _ANY, "Zen", _AVX2),
    _X86Rule("AuthenticAMD", 0x17, ((0x30, 0xFF),), _ANY, "Zen 2", _AVX2),
    _X86Rule("AuthenticAMD", 0x19, ((0x10, 0x1F), (0x60, 0x7F), (0xA0, 0xAF)), _ANY, "Zen 4", _ZEN4),
    _X86Rule("AuthenticAMD", 0x19, ((0x00, 0x0F), (0x20, 0x5F)), _ANY, "Zen 3", _AVX2),
    _X86Rule("AuthenticAMD", 0x1A, (_ANY,), _ANY, "Zen 5", _ZEN4),
)


def _x86_identity(info: CpuInfo) -> CpuIdentity:
    label = info.model_name or f"{info.vendor} family {info.family} model {info.model}"
    if info.family is None or info.model is None:
        return CpuIdentity(label, frozenset(), False)
    stepping = info.stepping if info.stepping is not None else 0
    for rule in X86_MODELS:
        if (
            rule.vendor == info.vendor
            and rule.family == info.family
            and any(lo <= info.model <= hi for lo, hi in rule.models)
            and rule.steppings[0] <= stepping <= rule.steppings[1]
        ):
            return CpuIdentity(f"{label} ({rule.uarch})", rule.features, True)
    return CpuIdentity(label, frozenset(), False)


def identify(info: CpuInfo, dmi: Dmi | None = None) -> CpuIdentity:
    """Name the CPU and look up its expected features; ``dmi`` names a product where the core is shared."""
    if info.arch in ("aarch64", "arm"):
        return _arm_identity(info, dmi or Dmi())
    if info.arch == "x86_64":
        return _x86_identity(info)
    return CpuIdentity(info.model_name or info.vendor or f"unknown {info.arch} CPU", frozenset(), False)
