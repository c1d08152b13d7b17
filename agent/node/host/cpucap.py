"""The node's CPU capability: identity, features present / expected / missing, and why one may be missing.

Reads ``<procfs>/cpuinfo`` for the kernel's architecture (:mod:`inferwatch.agent.node.host.machine`: ``machine`` when
given, the running kernel's when the tree is its own, else what the tree recorded or what its cpuinfo's
layout says; ``arch_source`` names which), ``<procfs>/sys/kernel/osrelease``, ``<procfs>/cmdline``,
``<procfs>/sys/abi/sve_default_vector_length`` (bytes), ``<procfs>/self/auxv`` (AT_HWCAP/AT_HWCAP2,
:mod:`inferwatch.agent.node.host.hwcap`), ``<procfs>/sys/kernel/random/boot_id`` and
``<sysfs>/class/dmi/id/{product_name,sys_vendor,board_vendor}``; when procfs is the running kernel's, also
asks that kernel (:mod:`inferwatch.agent.node.host.cpuprobe`) whether AMX is enabled (x86_64) and the SVE vector length
(arm64). Shared by the ``cpu`` collector and ``inferwatch doctor``, so the agent and the CI gate agree.

Missing = expected − present, where expected = the built-in table for this CPU model ∪ the user's
``cpu.expect_features``. Features are exact tokens (``sve`` is not ``sve2``). A missing feature is either
kernel-gated (every ARM hwcap; x86 XSAVE state and AMX: the runtime cannot use it) or, on x86, one that
runtimes read from CPUID themselves (the file may merely not name it):
:func:`inferwatch.agent.node.host.cpumodels.kernel_gated`. An architecture without a table (s390x, ppc64le, riscv64,
loongarch64, 32-bit ARM ...) is an "unknown CPU" note (``skip``), never a failure.
"""

from __future__ import annotations

import re
from dataclasses import dataclass, field
from pathlib import Path

from inferwatch.agent.common.samples import Finding
from inferwatch.agent.errors import SourceFormatError
from inferwatch.agent.node.host.cpuinfo import LAYOUT_BLOCKS, CpuInfo, cpuinfo_of, scan_file
from inferwatch.agent.node.host.cpumodels import CpuIdentity, Dmi, identify, kernel_gated
from inferwatch.agent.node.host.cpuprobe import CpuProbe, LiveKernel, read_live
from inferwatch.agent.node.host.hwcap import Hwcaps, compare, read_hwcaps
from inferwatch.agent.node.host.machine import resolve
from inferwatch.agent.node.host.procfs import DEFAULT_READ_LIMITS, ReadLimits

RUNBOOK = "CPUFeatureMissing"
# Kernels before these releases do not report the feature even on silicon that has it.
ARM_BF16_I8MM_MIN_KERNEL = (5, 10)  # Graviton: bf16/i8mm hwcaps (aws-graviton-getting-started)
ARM_SVE_MIN_KERNEL = (4, 15)  # arm64 SVE support merged in 4.15
X86_AMX_MIN_KERNEL = (5, 16)  # AMX (XFD dynamic xstate) support merged in 5.16
_NOSVE = ("arm64.nosve", "id_aa64pfr0.sve=0")
_HYPERVISOR_DMI = ("kvm", "qemu", "vmware", "virtualbox", "xen", "hvm domu", "firecracker", "microsoft")
TABLE_ARCHES = ("x86_64", "aarch64")  # architectures with a table of expected features


@dataclass(frozen=True, slots=True)
class CpuCapability:
    info: CpuInfo
    identity: CpuIdentity
    kernel_release: str
    machine_type: str  # DMI product_name: the instance type on AWS ("c7g.8xlarge")
    sys_vendor: str  # DMI sys_vendor ("Amazon EC2")
    cmdline: str
    sve_vector_length_bytes: int | None
    expected: frozenset[str]
    user_expected: frozenset[str]
    hwcaps: Hwcaps | None = None  # from <procfs>/self/auxv; None when absent (recorded trees)
    hwcap_error: str = ""  # auxv present but unreadable as pairs
    live: LiveKernel | None = None  # the running kernel's answers; None when procfs is not its tree
    live_note: str = ""  # why ``live`` is None ("" when no probe was given)
    arch_source: str = ""  # where the architecture came from: inferwatch.agent.node.host.machine.SOURCES
    arch_evidence: str = ""  # what that source read ("<procfs>/sys/kernel/arch", "Features: asimd fp ...")
    dmi: Dmi = field(default_factory=Dmi)

    @property
    def present(self) -> frozenset[str]:
        return self.info.flags

    @property
    def missing(self) -> frozenset[str]:
        return self.expected - self.info.flags

    @property
    def cpu_model(self) -> str:
        return self.identity.name


def _read(path: Path, limit: int = 65536) -> str:
    try:
        with path.open("rb") as fh:
            return fh.read(limit).decode("utf-8", errors="replace").strip()
    except OSError:
        return ""


def kernel_version(release: str) -> tuple[int, int] | None:
    m = re.match(r"(\d+)\.(\d+)", release)
    return (int(m.group(1)), int(m.group(2))) if m else None


def read_dmi(sysfs: Path) -> Dmi:
    dmi = sysfs / "class" / "dmi" / "id"
    return Dmi(_read(dmi / "sys_vendor", 256), _read(dmi / "product_name", 256), _read(dmi / "board_vendor", 256))


def read_cpu_capability(
    procfs: Path,
    sysfs: Path,
    expect_features: list[str] | tuple[str, ...] = (),
    probe: CpuProbe | None = None,
    machine: str | None = None,
    limits: ReadLimits = DEFAULT_READ_LIMITS,
) -> CpuCapability:
    """Read everything above; ``probe`` (the live-kernel boundary) is consulted only when given.

    ``machine``: the kernel's ``uname -m`` for a recorded tree; by default
    :func:`inferwatch.agent.node.host.machine.resolve`.
    """
    sections = scan_file(procfs, limits)
    arch = resolve(procfs, sections, probe, machine)
    info = cpuinfo_of(sections, arch.machine)
    dmi = read_dmi(sysfs)
    product, vendor = dmi.product_name, dmi.sys_vendor
    identity = identify(info, dmi)
    vl_text = _read(procfs / "sys" / "abi" / "sve_default_vector_length")
    user = frozenset(f.strip().lower() for f in expect_features if f.strip())
    hwcaps, hwcap_error = None, ""
    try:
        hwcaps = read_hwcaps(procfs, info.arch)
    except SourceFormatError as exc:
        hwcap_error = str(exc)
    live, live_note = None, ""
    if probe is not None:
        live, live_note = read_live(probe, _read(procfs / "sys" / "kernel" / "random" / "boot_id"), info.arch)
    return CpuCapability(
        info=info,
        identity=identity,
        kernel_release=_read(procfs / "sys" / "kernel" / "osrelease"),
        machine_type=product,
        sys_vendor=vendor,
        cmdline=_read(procfs / "cmdline").replace("\x00", " "),
        sve_vector_length_bytes=int(vl_text) if vl_text.isdigit() else None,
        expected=identity.expected | user,
        user_expected=user,
        hwcaps=hwcaps,
        hwcap_error=hwcap_error,
        live=live,
        live_note=live_note,
        arch_source=arch.source,
        arch_evidence=arch.evidence,
        dmi=dmi,
    )


def cause_hints(cap: CpuCapability, missing: frozenset[str]) -> list[str]:
    """Likely reasons, in check order, why ``missing`` features are absent on this node."""
    hints: list[str] = []
    words = cap.cmdline.split()
    sve_like = {f for f in missing if f.startswith("sve")}
    sve_listed = "sve" in cap.info.flags  # the kernel runs SVE: never say otherwise
    if sve_like and sve_listed:
        hints.append(
            f"the kernel lists sve, so SVE is enabled; it does not list {', '.join(sorted(sve_like))}: the kernel "
            "is too old to report these hwcaps (bf16/i8mm ones need 5.10 on Graviton) or a hypervisor/firmware "
            "CPU template masks them"
        )
    elif sve_like:
        hit = [w for w in words if w in _NOSVE]
        if hit:
            hints.append(f"kernel command line has {' '.join(hit)}: SVE is disabled at boot; remove it and reboot")
        elif cap.sve_vector_length_bytes is None and cap.info.arch == "aarch64":
            vl = cap.live.sve_vl if cap.live is not None else None
            if vl is not None and vl.bytes is not None:
                hints.append(
                    f"no /proc/sys/abi/sve_default_vector_length, yet prctl(PR_SVE_GET_VL) answers {vl.bytes} bytes: "
                    "this kernel runs SVE; the cpuinfo and /proc/sys read are not this kernel's (check --path.procfs)"
                )
            else:
                confirm = f" (prctl(PR_SVE_GET_VL) answers {vl.error}, which confirms it)" if vl is not None else ""
                hints.append(
                    "no /proc/sys/abi/sve_default_vector_length: the kernel runs without SVE support "
                    f"(CONFIG_ARM64_SVE=n), or firmware/hypervisor hides SVE from this CPU{confirm}"
                )
    hints.extend(_hwcap_hints(cap, missing))
    clear = [w for w in words if w.startswith("clearcpuid=")]
    if clear:
        hints.append(f"kernel command line has {' '.join(clear)}: those CPUID features are masked at boot")
    version = kernel_version(cap.kernel_release)
    if version is not None:
        if cap.info.arch == "aarch64" and sve_like and not sve_listed and version < ARM_SVE_MIN_KERNEL:
            hints.append(f"kernel {cap.kernel_release} is older than 4.15, which first supports SVE")
        arm_mm = missing & {"bf16", "i8mm", "svebf16", "svei8mm"}
        if cap.info.arch == "aarch64" and arm_mm and version < ARM_BF16_I8MM_MIN_KERNEL:
            hints.append(f"kernel {cap.kernel_release} is older than 5.10, which first reports bf16/i8mm")
        if cap.info.arch == "x86_64" and any(f.startswith("amx") for f in missing) and version < X86_AMX_MIN_KERNEL:
            hints.append(f"kernel {cap.kernel_release} is older than 5.16, which first supports AMX")
    amx = cap.live.amx if cap.live is not None else None
    amx_gone = sorted(f for f in missing if f.startswith("amx") and f not in cap.info.flags)
    if amx is not None and amx_gone:
        if amx.os_enabled:
            hints.append(
                f"the kernel enables AMX tile state (arch_prctl ARCH_GET_XCOMP_SUPP={amx.supported_mask:#x}) yet "
                f"/proc/cpuinfo lacks {', '.join(amx_gone)}: CPUID is masked (clearcpuid=, hypervisor CPU model)"
            )
        else:
            why = amx.error or f"ARCH_GET_XCOMP_SUPP={amx.supported_mask:#x} has no XTILECFG/XTILEDATA"
            hints.append(f"the kernel does not enable AMX tile state either ({why})")
    virt = "hypervisor" in cap.info.flags or any(w in cap.sys_vendor.lower() for w in _HYPERVISOR_DMI)
    if virt or "firecracker" in cap.machine_type.lower():
        who = cap.sys_vendor or "a hypervisor"
        hints.append(
            f"this is a virtual machine ({who}): the hypervisor's CPU template/model may not pass the feature "
            "through (e.g. Firecracker's default arm64 template has no sve; QEMU -cpu without the feature)"
        )
    if missing and not hints:
        hints.append(
            "no cause found on this host: compare firmware settings and the image's kernel with a healthy node"
        )
    return hints


def _hwcap_hints(cap: CpuCapability, missing: frozenset[str]) -> list[str]:
    """AT_HWCAP is the kernel's own record of what cpuinfo prints: name where the two disagree."""
    hw = cap.hwcaps
    if hw is None or hw.features is None:
        return []
    both = sorted(missing & hw.features)
    if not both:
        return []
    return [
        f"AT_HWCAP/AT_HWCAP2 (<procfs>/self/auxv) report {', '.join(both)} although /proc/cpuinfo lacks "
        "it: the cpuinfo read is not this kernel's, or is filtered (LXCFS, a recorded file); check --path.procfs"
    ]


def _hwcap_evidence(cap: CpuCapability) -> dict[str, object]:
    hw = cap.hwcaps
    if hw is None:
        return {"error": cap.hwcap_error} if cap.hwcap_error else {}
    ev: dict[str, object] = {"at_hwcap": hex(hw.hwcap), "at_hwcap2": hex(hw.hwcap2)}
    if hw.features is None:
        ev["note"] = f"{cap.info.arch}: AT_HWCAP is not a SIMD feature list here (x86: CPUID leaf 1 EDX); not compared"
        return ev
    ev["features"] = sorted(hw.features)
    if hw.unknown_bits:
        ev["unknown_bits"] = list(hw.unknown_bits)
    only_hw, only_cpuinfo = compare(hw, cap.info.flags)
    if only_hw:
        ev["not_in_cpuinfo"] = only_hw
    if only_cpuinfo:
        ev["not_in_hwcap"] = only_cpuinfo
    ev["agrees_with_cpuinfo"] = not only_hw and not only_cpuinfo
    return ev


def _evidence(cap: CpuCapability) -> dict[str, object]:
    info = cap.info
    ev: dict[str, object] = {
        "arch": info.arch,
        "vendor": info.vendor,
        "cpu_model": cap.cpu_model,
        "logical_cpus": info.logical_cpus,
        "expected": sorted(cap.expected),
        "kernel_release": cap.kernel_release,
    }
    if cap.arch_source:
        ev["machine"] = info.machine
        ev["arch_source"] = cap.arch_source
        ev["arch_evidence"] = cap.arch_evidence
    if info.layout != LAYOUT_BLOCKS:
        ev["cpuinfo_layout"] = info.layout
    dmi = {k: cap.dmi.field(k) for k in ("sys_vendor", "product_name", "board_vendor") if cap.dmi.field(k)}
    if dmi:
        ev["dmi"] = dmi
    if cap.identity.product_evidence:
        ev["product_evidence"] = cap.identity.product_evidence
    if info.family is not None:
        ev["x86_family_model_stepping"] = f"{info.family}/{info.model}/{info.stepping}"
    if info.core_types:
        ev["arm_implementer_part"] = [f"0x{c.implementer:02x}/0x{c.part:03x}" for c in info.core_types]
    if cap.machine_type:
        ev["machine_type"] = cap.machine_type
    if cap.sve_vector_length_bytes is not None:
        ev["sve_vector_length_bytes"] = cap.sve_vector_length_bytes
    hw = _hwcap_evidence(cap)
    if hw:
        ev["hwcap"] = hw
    if cap.live is None:
        if cap.live_note:
            ev["kernel_probe"] = f"skipped: {cap.live_note}"
        return ev
    vl = cap.live.sve_vl
    if vl is not None:
        if vl.bytes is not None:
            ev["sve_thread_vector_length_bytes"] = vl.bytes
        else:
            ev["sve_prctl"] = f"prctl(PR_SVE_GET_VL): {vl.error}"
    if cap.live.amx is not None:
        ev["amx"] = cap.live.amx.evidence()
    return ev


def split_missing(cap: CpuCapability, missing: frozenset[str]) -> tuple[list[str], list[str]]:
    """(kernel-gated: the runtime cannot use them, CPUID-read: only the file may lack them), sorted."""
    gated = sorted(f for f in missing if kernel_gated(cap.info.arch, f))
    return gated, sorted(missing - set(gated))


_CPUID_NOTE = (
    "runtimes read these from CPUID themselves, so their absence from /proc/cpuinfo alone does not mean a "
    "slower path: a kernel too old to name a flag hides it from the file only, while a hypervisor CPU model "
    "or clearcpuid= hides it from the runtime too"
)


def cpu_feature_verdict(cap: CpuCapability) -> Finding:
    """ok: every expected feature present; fail: a kernel-gated one missing; warn: only CPUID-read ones
    missing (x86), or no expectation known for this model; skip: an architecture without a table (unknown CPU).
    """
    ev = _evidence(cap)
    missing = cap.missing
    if missing:
        ev["missing"] = sorted(missing)
        ev["hints"] = cause_hints(cap, missing)
        gated, cpuid_read = split_missing(cap, missing)
        if cap.info.arch == "x86_64":
            ev["missing_kernel_gated"] = gated
            ev["missing_cpuid_read"] = cpuid_read
        if gated:
            also = f"; not listed, read from CPUID by runtimes: {', '.join(cpuid_read)}" if cpuid_read else ""
            return Finding(
                "cpu.features",
                "fail",
                f"{cap.cpu_model}: expected SIMD features missing: {', '.join(gated)} "
                f"(runtimes fall back to slower kernels without an error){also}",
                ev,
                RUNBOOK,
            )
        return Finding(
            "cpu.features",
            "warn",
            f"{cap.cpu_model}: /proc/cpuinfo does not list {', '.join(cpuid_read)}; {_CPUID_NOTE}",
            ev,
            RUNBOOK,
        )
    if not cap.expected and cap.info.arch not in TABLE_ARCHES:
        return Finding(
            "cpu.features",
            "skip",
            f"unknown CPU: {cap.cpu_model} ({cap.info.machine or cap.info.arch} kernel); no built-in SIMD "
            "expectations for this architecture (list them in cpu.expect_features to gate on them)",
            ev,
            RUNBOOK,
        )
    if not cap.expected:
        return Finding(
            "cpu.features",
            "warn",
            f"{cap.cpu_model}: no built-in feature expectations for this CPU model; "
            "list them in cpu.expect_features to gate on them",
            ev,
            RUNBOOK,
        )
    return Finding(
        "cpu.features",
        "ok",
        f"{cap.cpu_model}: all {len(cap.expected)} expected SIMD features present",
        ev,
        RUNBOOK,
    )


def require_verdict(cap: CpuCapability, required: list[str]) -> Finding:
    """``doctor --require FEATURE``: fail when a named feature is not reported by every CPU."""
    wanted = sorted({r.strip().lower() for r in required if r.strip()})
    absent = [f for f in wanted if f not in cap.info.flags]
    ev: dict[str, object] = {"required": wanted, "cpu_model": cap.cpu_model}
    if absent:
        ev["absent"] = absent
        ev["hints"] = cause_hints(cap, frozenset(absent))
        return Finding("cpu.require", "fail", f"required CPU features absent: {', '.join(absent)}", ev, RUNBOOK)
    return Finding("cpu.require", "ok", f"required CPU features present: {', '.join(wanted)}", ev, RUNBOOK)


AMX_FLAGS = ("amx_tile", "amx_bf16", "amx_int8")


def amx_verdict(cap: CpuCapability) -> Finding | None:
    """x86_64, live kernel only: does the kernel let processes use the AMX that /proc/cpuinfo shows?

    ok: AMX present and enabled, or absent everywhere; fail: present in cpuinfo but the kernel does not
    enable tile state (runtimes that trust CPUID fault with SIGILL or fall back); warn: the kernel enables
    tile state while cpuinfo shows no AMX flag. None when there is no live x86 answer.
    """
    amx = cap.live.amx if cap.live is not None else None
    if amx is None:
        return None
    flags = sorted(f for f in AMX_FLAGS if f in cap.info.flags)
    ev: dict[str, object] = {"cpu_model": cap.cpu_model, "cpuinfo_amx": flags, **amx.evidence()}
    if flags and amx.os_enabled:
        return Finding(
            "cpu.amx",
            "ok",
            f"AMX present ({', '.join(flags)}) and enabled by the kernel; a runtime must still request it "
            "(arch_prctl ARCH_REQ_XCOMP_PERM)",
            ev,
            RUNBOOK,
        )
    if flags:
        if amx.error:
            why = f"no dynamic XSTATE support in the kernel (arch_prctl ARCH_GET_XCOMP_SUPP: {amx.error}; Linux < 5.16)"
        else:
            why = f"arch_prctl ARCH_GET_XCOMP_SUPP={amx.supported_mask:#x} lacks XTILECFG/XTILEDATA (bits 17-18)"
        ev["hints"] = cause_hints(cap, frozenset(flags))
        return Finding(
            "cpu.amx",
            "fail",
            f"AMX present in /proc/cpuinfo but not enabled by the OS: {why}; runtimes that trust CPUID "
            "fault (SIGILL) or fall back to AVX-512",
            ev,
            RUNBOOK,
        )
    if amx.os_enabled:
        return Finding(
            "cpu.amx",
            "warn",
            "the kernel enables AMX tile state but /proc/cpuinfo shows no amx flag: CPUID is masked "
            "(clearcpuid=, hypervisor CPU model), so runtimes will not use AMX",
            ev,
            RUNBOOK,
        )
    return Finding("cpu.amx", "ok", "no AMX on this CPU (no amx flags, no AMX tile state in the kernel)", ev, RUNBOOK)
