"""The node's CPU capability: identity, features present / expected / missing, and why one may be missing.

Reads ``<procfs>/cpuinfo``, ``<procfs>/sys/kernel/osrelease``, ``<procfs>/cmdline``,
``<procfs>/sys/abi/sve_default_vector_length`` (bytes) and ``<sysfs>/class/dmi/id/{product_name,sys_vendor}``.
Shared by the ``cpu`` collector and ``inferwatch doctor``, so the agent and the CI gate agree.

Missing = expected − present, where expected = the built-in table for this CPU model ∪ the user's
``cpu.expect_features``. Features are exact tokens (``sve`` is not ``sve2``).
"""

from __future__ import annotations

import re
from dataclasses import dataclass
from pathlib import Path

from agent.host.cpuinfo import CpuInfo, read_cpuinfo
from agent.host.cpumodels import CpuIdentity, identify
from agent.samples import Finding

RUNBOOK = "CPUFeatureMissing"
# Kernels before these releases do not report the feature even on silicon that has it.
ARM_BF16_I8MM_MIN_KERNEL = (5, 10)  # Graviton: bf16/i8mm hwcaps (aws-graviton-getting-started)
ARM_SVE_MIN_KERNEL = (4, 15)  # arm64 SVE support merged in 4.15
X86_AMX_MIN_KERNEL = (5, 16)  # AMX (XFD dynamic xstate) support merged in 5.16
_NOSVE = ("arm64.nosve", "id_aa64pfr0.sve=0")
_HYPERVISOR_DMI = ("kvm", "qemu", "vmware", "virtualbox", "xen", "hvm domu", "firecracker", "microsoft")


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


def read_cpu_capability(procfs: Path, sysfs: Path, expect_features: list[str] | tuple[str, ...] = ()) -> CpuCapability:
    info = read_cpuinfo(procfs)
    dmi = sysfs / "class" / "dmi" / "id"
    product, vendor = _read(dmi / "product_name"), _read(dmi / "sys_vendor")
    identity = identify(info, f"{vendor} {product}")
    vl_text = _read(procfs / "sys" / "abi" / "sve_default_vector_length")
    user = frozenset(f.strip().lower() for f in expect_features if f.strip())
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
    )


def cause_hints(cap: CpuCapability, missing: frozenset[str]) -> list[str]:
    """Likely reasons, in check order, why ``missing`` features are absent on this node."""
    hints: list[str] = []
    words = cap.cmdline.split()
    sve_like = {f for f in missing if f.startswith("sve")}
    if sve_like:
        hit = [w for w in words if w in _NOSVE]
        if hit:
            hints.append(f"kernel command line has {' '.join(hit)}: SVE is disabled at boot; remove it and reboot")
        elif cap.sve_vector_length_bytes is None and cap.info.arch == "aarch64":
            hints.append(
                "no /proc/sys/abi/sve_default_vector_length: the kernel runs without SVE support "
                "(CONFIG_ARM64_SVE=n), or firmware/hypervisor hides SVE from this CPU"
            )
    clear = [w for w in words if w.startswith("clearcpuid=")]
    if clear:
        hints.append(f"kernel command line has {' '.join(clear)}: those CPUID features are masked at boot")
    version = kernel_version(cap.kernel_release)
    if version is not None:
        if cap.info.arch == "aarch64" and sve_like and version < ARM_SVE_MIN_KERNEL:
            hints.append(f"kernel {cap.kernel_release} is older than 4.15, which first supports SVE")
        arm_mm = missing & {"bf16", "i8mm", "svebf16", "svei8mm"}
        if cap.info.arch == "aarch64" and arm_mm and version < ARM_BF16_I8MM_MIN_KERNEL:
            hints.append(f"kernel {cap.kernel_release} is older than 5.10, which first reports bf16/i8mm")
        if cap.info.arch == "x86_64" and any(f.startswith("amx") for f in missing) and version < X86_AMX_MIN_KERNEL:
            hints.append(f"kernel {cap.kernel_release} is older than 5.16, which first supports AMX")
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
    if info.family is not None:
        ev["x86_family_model_stepping"] = f"{info.family}/{info.model}/{info.stepping}"
    if info.core_types:
        ev["arm_implementer_part"] = [f"0x{c.implementer:02x}/0x{c.part:03x}" for c in info.core_types]
    if cap.machine_type:
        ev["machine_type"] = cap.machine_type
    if cap.sve_vector_length_bytes is not None:
        ev["sve_vector_length_bytes"] = cap.sve_vector_length_bytes
    return ev


def cpu_feature_verdict(cap: CpuCapability) -> Finding:
    """ok: every expected feature present; fail: some missing; warn: no expectation known for this model."""
    ev = _evidence(cap)
    missing = cap.missing
    if missing:
        ev["missing"] = sorted(missing)
        ev["hints"] = cause_hints(cap, missing)
        return Finding(
            "cpu.features",
            "fail",
            f"{cap.cpu_model}: expected SIMD features missing: {', '.join(sorted(missing))} "
            "(runtimes fall back to slower kernels without an error)",
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
