"""Which SIMD features a CPU model is expected to have, keyed by CPU identity (not by flags).

arm64 is keyed on (implementer, part) from /proc/cpuinfo (util-linux ``lscpu-arm.c`` names); x86 on
(vendor, family, model, stepping range) (kernel ``intel-family.h``, AMD family/model ranges). Only
features that inference runtimes select kernels on are listed, and only where the fact is documented
(see docs/collectors.md for sources): Graviton2/Neoverse N1 has no SVE; Graviton3/Neoverse V1 has SVE
but **not** SVE2; Neoverse V2 (Graviton4, Grace), N2, V3 have SVE2; Skylake-SP and later Xeons have
avx512f; Cooper Lake and Sapphire Rapids add avx512_bf16; Sapphire Rapids adds AMX; Zen 4 has avx512f.
Optional tokens that vary with kernel and distribution on identical cores (pac, bti, sm3, sm4, rng) are
never expected.
"""

from __future__ import annotations

from dataclasses import dataclass

from agent.host.cpuinfo import CpuInfo


@dataclass(frozen=True, slots=True)
class CpuIdentity:
    """The node's CPU as a name and the features that model should report."""

    name: str  # e.g. "Neoverse V1 (AWS Graviton3)", "Intel(R) Xeon(R) Platinum 8480+ (Sapphire Rapids)"
    expected: frozenset[str]
    known: bool  # False: no table entry, ``expected`` is empty


# --- arm64 -------------------------------------------------------------------------------------------
_NEON = frozenset({"asimd"})
_NEON_DOT = _NEON | {"asimddp"}
_V8_6 = _NEON_DOT | {"i8mm", "bf16"}  # Armv8.6 makes BF16 and I8MM mandatory
_SVE = _V8_6 | {"sve", "svei8mm", "svebf16"}
_SVE2 = _SVE | {"sve2"}
_ARMV9_MOBILE = _NEON_DOT | {"sve", "sve2"}  # Armv9.0 makes SVE2 mandatory


@dataclass(frozen=True, slots=True)
class _ArmCore:
    core: str
    products: str  # shown in parentheses; refined from DMI where the core is shared
    features: frozenset[str]


ARM_CORES: dict[tuple[int, int], _ArmCore] = {
    (0x41, 0xD08): _ArmCore("Cortex-A72", "AWS Graviton", _NEON),
    (0x41, 0xD0C): _ArmCore("Neoverse N1", "AWS Graviton2 / Ampere Altra", _NEON_DOT | {"fphp", "asimdhp"}),
    (0x41, 0xD40): _ArmCore("Neoverse V1", "AWS Graviton3", _SVE),
    (0x41, 0xD49): _ArmCore("Neoverse N2", "Azure Cobalt 100", _SVE2),
    (0x41, 0xD4F): _ArmCore("Neoverse V2", "AWS Graviton4 / NVIDIA Grace", _SVE2),
    (0x41, 0xD83): _ArmCore("Neoverse V3AE", "", _SVE2),
    (0x41, 0xD84): _ArmCore("Neoverse V3", "AWS Graviton5", _SVE2),
    (0x41, 0xD8E): _ArmCore("Neoverse N3", "", frozenset({"asimd", "sve", "sve2"})),
    (0x41, 0xD46): _ArmCore("Cortex-A510", "", _ARMV9_MOBILE),
    (0x41, 0xD47): _ArmCore("Cortex-A710", "", _ARMV9_MOBILE),
    (0x41, 0xD48): _ArmCore("Cortex-X2", "", _ARMV9_MOBILE),
    (0x41, 0xD4D): _ArmCore("Cortex-A715", "", _ARMV9_MOBILE),
    (0x41, 0xD4E): _ArmCore("Cortex-X3", "", _ARMV9_MOBILE),
    (0x41, 0xD80): _ArmCore("Cortex-A520", "", _ARMV9_MOBILE),
    (0x41, 0xD81): _ArmCore("Cortex-A720", "", _ARMV9_MOBILE),
    (0x41, 0xD82): _ArmCore("Cortex-X4", "", _ARMV9_MOBILE),
    (0xC0, 0xAC3): _ArmCore("Ampere-1", "AmpereOne", _V8_6),
    (0xC0, 0xAC4): _ArmCore("Ampere-1a", "AmpereOne", _V8_6),
}

# Parts shared by several products: which DMI sys_vendor / product_name words pick one.
_DMI_PRODUCTS: dict[tuple[int, int], tuple[tuple[str, str], ...]] = {
    (0x41, 0xD0C): (("amazon", "AWS Graviton2"), ("ampere", "Ampere Altra")),
    (0x41, 0xD4F): (("amazon", "AWS Graviton4"), ("nvidia", "NVIDIA Grace"), ("grace", "NVIDIA Grace")),
}


def _arm_identity(info: CpuInfo, dmi: str) -> CpuIdentity:
    names: list[str] = []
    expected: frozenset[str] | None = None
    known = bool(info.core_types)
    for ct in info.core_types:
        key = (ct.implementer, ct.part)
        core = ARM_CORES.get(key)
        if core is None:
            known = False
            names.append(f"{info.vendor or 'arm64'} part 0x{ct.part:03x}")
            continue
        products = core.products
        for word, product in _DMI_PRODUCTS.get(key, ()):
            if word in dmi:
                products = product
                break
        names.append(f"{core.core} ({products})" if products else core.core)
        expected = core.features if expected is None else expected & core.features
    name = " + ".join(dict.fromkeys(names)) or "unknown arm64 CPU"
    if not known:
        return CpuIdentity(name, frozenset(), False)
    return CpuIdentity(name, expected or frozenset(), True)


# --- x86 ---------------------------------------------------------------------------------------------
_AVX2 = frozenset({"avx2", "fma"})
_AVX512 = _AVX2 | {"avx512f", "avx512cd", "avx512bw", "avx512dq", "avx512vl"}
_VNNI = _AVX512 | {"avx512_vnni"}
_ICX = _VNNI | {"avx512ifma", "avx512vbmi", "avx512_vbmi2", "avx512_bitalg", "avx512_vpopcntdq"}
_BF16 = _VNNI | {"avx512_bf16"}
_AMX = _BF16 | {"avx512_fp16", "avx_vnni", "amx_tile", "amx_bf16", "amx_int8"}
_ZEN4 = _BF16


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
    _X86Rule("GenuineIntel", 6, ((0x55, 0x55),), (0, 4), "Skylake-SP", _AVX512),
    _X86Rule("GenuineIntel", 6, ((0x55, 0x55),), (5, 7), "Cascade Lake", _VNNI),
    _X86Rule("GenuineIntel", 6, ((0x55, 0x55),), (10, 11), "Cooper Lake", _BF16),
    _X86Rule("GenuineIntel", 6, ((0x6A, 0x6A), (0x6C, 0x6C)), _ANY, "Ice Lake-SP", _ICX),
    _X86Rule("GenuineIntel", 6, ((0x8F, 0x8F),), _ANY, "Sapphire Rapids", _AMX),
    _X86Rule("GenuineIntel", 6, ((0xCF, 0xCF),), _ANY, "Emerald Rapids", _AMX),
    _X86Rule("GenuineIntel", 6, ((0xAD, 0xAE),), _ANY, "Granite Rapids", _AMX),
    _X86Rule("AuthenticAMD", 0x17, (_ANY,), _ANY, "Zen/Zen 2", _AVX2),
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


def identify(info: CpuInfo, dmi: str = "") -> CpuIdentity:
    """Name the CPU and look up its expected features. ``dmi``: sys_vendor + product_name, any case."""
    if info.arch == "aarch64":
        return _arm_identity(info, dmi.lower())
    if info.arch == "x86_64":
        return _x86_identity(info)
    return CpuIdentity("unknown CPU", frozenset(), False)
