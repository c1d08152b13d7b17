"""What the running kernel grants processes, asked by system call: x86 AMX state and arm64 SVE vector length.

Neither question executes an AMX or SVE instruction:

- **AMX** (x86_64): ``arch_prctl(ARCH_GET_XCOMP_SUPP)`` returns the XSAVE features the kernel enables
  for user space; AMX is usable iff XTILECFG (bit 17) and XTILEDATA (bit 18) are both set. TILEDATA is
  a dynamic feature: each process must ask with ``ARCH_REQ_XCOMP_PERM`` before first use or it gets
  SIGILL, so ``ARCH_GET_XCOMP_PERM`` (the agent's own permission) lacking bit 18 is normal. A kernel
  older than 5.16 answers EINVAL (kernel ``Documentation/arch/x86/xstate.rst``).
- **SVE** (arm64): ``prctl(PR_SVE_GET_VL)`` returns the calling thread's vector length in bytes in the
  low 16 bits; EINVAL when the kernel runs without SVE.

The answers describe the kernel this agent runs on, so they are only attributed to the ``--path.procfs``
tree when it is that kernel's (same ``sys/kernel/random/boot_id``), never to a recorded tree. The system
calls sit behind :class:`CpuProbe` (``ctx.cpu_probe``), so tests cover every branch.
"""

from __future__ import annotations

import ctypes
import errno
import os
import platform
from dataclasses import dataclass
from typing import Protocol

from inferwatch.agent.node.host.cpuinfo import normalise_arch

ARCH_GET_XCOMP_SUPP = 0x1021
ARCH_GET_XCOMP_PERM = 0x1022
XFEATURE_XTILECFG = 17
XFEATURE_XTILEDATA = 18
XFEATURE_MASK_XTILE = (1 << XFEATURE_XTILECFG) | (1 << XFEATURE_XTILEDATA)
NR_ARCH_PRCTL_X86_64 = 158
PR_SVE_GET_VL = 51
PR_SVE_VL_LEN_MASK = 0xFFFF
BOOT_ID = "/proc/sys/kernel/random/boot_id"


class CpuProbe(Protocol):
    """The live-kernel boundary. Methods raise OSError (with errno) when the kernel refuses."""

    def machine(self) -> str: ...  # os.uname().machine: x86_64, aarch64

    def boot_id(self) -> str: ...  # the running kernel's boot id ("" when unreadable)

    def arch_prctl_get(self, code: int) -> int: ...  # x86_64 only: ARCH_GET_XCOMP_*

    def sve_get_vl(self) -> int: ...  # arm64 only: raw prctl(PR_SVE_GET_VL) result


class SyscallCpuProbe:
    """The real thing, through libc with ctypes."""

    def __init__(self) -> None:
        self._libc: ctypes.CDLL | None = None

    def _lib(self) -> ctypes.CDLL:
        if self._libc is None:
            self._libc = ctypes.CDLL(None, use_errno=True)
        return self._libc

    def machine(self) -> str:
        return platform.machine()

    def boot_id(self) -> str:
        try:
            with open(BOOT_ID, encoding="ascii", errors="replace") as fh:
                return fh.read(64).strip()
        except OSError:
            return ""

    def arch_prctl_get(self, code: int) -> int:
        if self.machine() != "x86_64":
            raise OSError(errno.ENOSYS, "arch_prctl is x86_64 only")
        value = ctypes.c_uint64(0)
        fn = self._lib().syscall
        fn.restype = ctypes.c_long
        rc = fn(ctypes.c_long(NR_ARCH_PRCTL_X86_64), ctypes.c_long(code), ctypes.byref(value))
        if rc != 0:
            err = ctypes.get_errno()
            raise OSError(err, os.strerror(err))
        return int(value.value)

    def sve_get_vl(self) -> int:
        if self.machine() != "aarch64":
            raise OSError(errno.EINVAL, "SVE is arm64 only")
        fn = self._lib().prctl
        fn.restype = ctypes.c_int
        zero = ctypes.c_ulong(0)
        rc = fn(ctypes.c_int(PR_SVE_GET_VL), zero, zero, zero, zero)
        if rc < 0:
            err = ctypes.get_errno()
            raise OSError(err, os.strerror(err))
        return int(rc)


def _errname(exc: OSError) -> str:
    return errno.errorcode.get(exc.errno or 0, str(exc.errno))


@dataclass(frozen=True, slots=True)
class AmxState:
    """The kernel's answer about AMX. Masks are XSAVE feature bitmaps; None when the call failed."""

    supported_mask: int | None  # ARCH_GET_XCOMP_SUPP: what the kernel enables for user space
    permitted_mask: int | None  # ARCH_GET_XCOMP_PERM: what the agent process itself may use now
    error: str = ""  # errno name of a failed ARCH_GET_XCOMP_SUPP (EINVAL: kernel < 5.16)

    @property
    def os_enabled(self) -> bool:
        """True when a process may request AMX tile data (both tile bits in the supported mask)."""
        m = self.supported_mask
        return m is not None and m & XFEATURE_MASK_XTILE == XFEATURE_MASK_XTILE

    @property
    def agent_permitted(self) -> bool:
        m = self.permitted_mask
        return m is not None and bool(m >> XFEATURE_XTILEDATA & 1)

    def evidence(self) -> dict[str, object]:
        ev: dict[str, object] = {"os_enabled": self.os_enabled}
        if self.supported_mask is not None:
            ev["xcomp_supp"] = hex(self.supported_mask)
        if self.permitted_mask is not None:
            ev["xcomp_perm_agent"] = hex(self.permitted_mask)
        if self.error:
            ev["error"] = f"arch_prctl(ARCH_GET_XCOMP_SUPP): {self.error}"
        return ev


def read_amx(probe: CpuProbe) -> AmxState:
    try:
        supp = probe.arch_prctl_get(ARCH_GET_XCOMP_SUPP)
    except OSError as exc:
        return AmxState(None, None, _errname(exc))
    try:
        perm: int | None = probe.arch_prctl_get(ARCH_GET_XCOMP_PERM)
    except OSError:
        perm = None
    return AmxState(supp, perm)


@dataclass(frozen=True, slots=True)
class SveVl:
    """prctl(PR_SVE_GET_VL) for the agent's thread: ``bytes`` None with ``error`` when refused."""

    bytes: int | None
    error: str = ""


def read_sve_vl(probe: CpuProbe) -> SveVl:
    try:
        raw = probe.sve_get_vl()
    except OSError as exc:
        return SveVl(None, _errname(exc))
    return SveVl(raw & PR_SVE_VL_LEN_MASK)


@dataclass(frozen=True, slots=True)
class LiveKernel:
    """What the probe said, when ``--path.procfs`` is the running kernel's. Fields for the other arch are None."""

    amx: AmxState | None
    sve_vl: SveVl | None


def read_live(probe: CpuProbe, procfs_boot_id: str, arch: str) -> tuple[LiveKernel | None, str]:
    """(answers, "") when procfs is the running kernel's tree on this arch, else (None, why not)."""
    running = probe.boot_id()
    if not running or running != procfs_boot_id:
        return None, "--path.procfs is not the running kernel's (boot_id differs or is absent)"
    machine = probe.machine()
    if normalise_arch(machine) != arch:
        return None, f"cpuinfo says {arch}, the running kernel is {machine}"
    if arch == "x86_64":
        return LiveKernel(read_amx(probe), None), ""
    if arch == "aarch64":
        return LiveKernel(None, read_sve_vl(probe)), ""
    return LiveKernel(None, None), ""
