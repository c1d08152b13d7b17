"""Per-thread PMU counters through ``perf_event_open(2)`` (ctypes; no external program).

On AArch64 the SVE utilisation is measured as ``SVE_INST_RETIRED`` (raw event 0x8002, Armv8.2 SVE PMU
extension) against ``INST_RETIRED`` (0x08), counted in user space only (``exclude_kernel``,
``exclude_hv``) so ``perf_event_paranoid <= 2`` permits it for processes of the same user. Where the
kernel refuses (no PMU in a VM: ENOENT/EOPNOTSUPP; paranoid 3 or another user: EACCES/EPERM) the
counters are absent and :class:`~inferwatch.agent.errors.NoDataError` says why. x86 has no portable "AVX-512
instructions retired" event, so this module is used there only for its software events (tests).
"""

from __future__ import annotations

import contextlib
import ctypes
import errno
import os
import platform
import struct
from dataclasses import dataclass

from inferwatch.agent.errors import NoDataError

PERF_TYPE_HARDWARE = 0
PERF_TYPE_SOFTWARE = 1
PERF_TYPE_RAW = 4
PERF_COUNT_SW_TASK_CLOCK = 1
ARM_INST_RETIRED = 0x08
ARM_SVE_INST_RETIRED = 0x8002
_ATTR_SIZE = 128
_FLAG_EXCLUDE_KERNEL = 1 << 5
_FLAG_EXCLUDE_HV = 1 << 6
_PERF_FLAG_FD_CLOEXEC = 8
_SYSCALL = {"x86_64": 298, "aarch64": 241}
MAX_COUNTERS = 1024


@dataclass(frozen=True, slots=True)
class Event:
    name: str
    type: int
    config: int


SVE_EVENTS = (Event("all", PERF_TYPE_RAW, ARM_INST_RETIRED), Event("sve", PERF_TYPE_RAW, ARM_SVE_INST_RETIRED))


def _open(event: Event, tid: int) -> int:
    nr = _SYSCALL.get(platform.machine())
    if nr is None:
        raise NoDataError(f"perf_event_open is not wired for {platform.machine()}")
    attr = bytearray(_ATTR_SIZE)
    struct.pack_into(
        "<IIQQQQQ", attr, 0, event.type, _ATTR_SIZE, event.config, 0, 0, 0, _FLAG_EXCLUDE_KERNEL | _FLAG_EXCLUDE_HV
    )
    buf = (ctypes.c_char * _ATTR_SIZE).from_buffer(attr)
    libc = ctypes.CDLL(None, use_errno=True)
    fd = libc.syscall(nr, ctypes.byref(buf), tid, -1, -1, _PERF_FLAG_FD_CLOEXEC)
    if fd < 0:
        err = ctypes.get_errno()
        if err in (errno.EACCES, errno.EPERM):
            raise NoDataError(
                f"perf_event_open refused ({errno.errorcode.get(err, err)})",
                hint="lower /proc/sys/kernel/perf_event_paranoid to 2 or give the agent CAP_PERFMON",
            )
        raise NoDataError(
            f"perf_event_open({event.name}) failed: {os.strerror(err)}",
            hint="no usable PMU here (common in VMs); SIMD use then rests on code presence only",
        )
    return int(fd)


class ThreadCounters:
    """One counter per (thread, event) of a process, opened as threads appear; read as sums of deltas."""

    def __init__(self, events: tuple[Event, ...]) -> None:
        self.events = events
        self._fds: dict[tuple[int, str], int] = {}
        self._last: dict[tuple[int, str], int] = {}

    def sample(self, tids: list[int]) -> dict[str, int]:
        """Open counters for new threads, close those of ended threads; return counts since the last call."""
        live = set(tids)
        for key in [k for k in self._fds if k[0] not in live]:
            os.close(self._fds.pop(key))
            self._last.pop(key, None)
        delta = {e.name: 0 for e in self.events}
        for tid in tids:
            for event in self.events:
                key = (tid, event.name)
                if key not in self._fds:
                    if len(self._fds) >= MAX_COUNTERS:
                        continue
                    try:
                        self._fds[key] = _open(event, tid)
                    except NoDataError:
                        if not self._fds:
                            raise
                        continue  # the thread ended meanwhile
                    self._last[key] = 0
                try:
                    value = struct.unpack("<Q", os.read(self._fds[key], 8))[0]
                except OSError:
                    continue
                delta[event.name] += value - self._last[key]
                self._last[key] = value
        return delta

    def close(self) -> None:
        for fd in self._fds.values():
            with contextlib.suppress(OSError):
                os.close(fd)
        self._fds.clear()
        self._last.clear()
