"""cgroup v2 memory files of a process: ``<procfs>/<pid>/cgroup`` → ``<sysfs>/fs/cgroup/<path>/memory.*``.

``memory.stat`` holds sizes in bytes and event counts (kernel ``Documentation/admin-guide/cgroup-v2.rst``);
``memory.pressure`` is a PSI file. Hybrid hosts mount the v2 hierarchy at ``/sys/fs/cgroup/unified``;
both places are tried. A v1-only host has no ``0::`` line and is reported as absent.
"""

from __future__ import annotations

import re
from collections.abc import Iterable
from dataclasses import dataclass
from pathlib import Path

from inferwatch.agent.errors import NoDataError, SourceFormatError
from inferwatch.agent.node.host.pressure import PressureLine, read_pressure
from inferwatch.agent.node.host.procfs import DEFAULT_READ_LIMITS, MAX_FIELDS, ReadLimits, text_lines

SIZE_FIELDS = ("anon", "file", "inactive_file", "active_file", "shmem", "file_mapped", "file_dirty")
EVENT_FIELDS = ("workingset_refault_file", "pgmajfault", "pgscan", "pgsteal")


@dataclass(frozen=True, slots=True)
class CgroupMemory:
    path: str  # the cgroup path, e.g. /system.slice/vllm.service
    directory: Path
    stat: dict[str, int]  # every memory.stat field (bytes or counts)
    pressure: dict[str, PressureLine] | None  # None: no memory.pressure (no PSI)


def cgroup_v2_path(procfs: Path, pid: int, limits: ReadLimits = DEFAULT_READ_LIMITS) -> str:
    path = procfs / str(pid) / "cgroup"
    try:
        for line in limits.lines(path, "cgroup"):
            if line.startswith("0::"):
                return line[3:].strip() or "/"
    except OSError as exc:
        raise NoDataError(
            f"{path} cannot be read ({exc.strerror})", hint="run the agent in the host PID namespace"
        ) from None
    raise NoDataError(
        f"process {pid} is in no cgroup v2 hierarchy", hint="boot with cgroup v2 (systemd.unified_cgroup_hierarchy=1)"
    )


_MAX_DIGITS = 40  # a u64 counter has 20; longer is not a counter (and int() refuses over 4300 digits)


def parse_memory_stat(text: str | Iterable[str]) -> dict[str, int]:
    """Every ``name value`` field of a memory.stat text (or its lines); at most MAX_FIELDS."""
    out: dict[str, int] = {}
    for line in text_lines(text):
        parts = line.split()
        if len(parts) == 2 and parts[1].isascii() and parts[1].isdigit() and len(parts[1]) <= _MAX_DIGITS:
            out[parts[0]] = int(parts[1])
            if len(out) > MAX_FIELDS:
                raise SourceFormatError(f"memory.stat has more than {MAX_FIELDS} fields: not a memory.stat")
    return out


def read_cgroup_memory(procfs: Path, sysfs: Path, pid: int, limits: ReadLimits = DEFAULT_READ_LIMITS) -> CgroupMemory:
    cg = cgroup_v2_path(procfs, pid, limits)
    rel = cg.lstrip("/")
    for base in (sysfs / "fs" / "cgroup", sysfs / "fs" / "cgroup" / "unified"):
        directory = base / rel if rel else base
        stat_file = directory / "memory.stat"
        try:
            stat = parse_memory_stat(limits.lines(stat_file, "memory.stat"))
        except OSError:
            continue
        try:
            pressure: dict[str, PressureLine] | None = read_pressure(directory / "memory.pressure", limits)
        except NoDataError:
            pressure = None
        return CgroupMemory(cg, directory, stat, pressure)
    raise NoDataError(
        f"no cgroup v2 memory.stat for cgroup {cg} under {sysfs / 'fs' / 'cgroup'}",
        hint="enable the memory controller for the runtime's cgroup (cgroup v2), "
        "or point --path.sysfs at the host's /sys",
    )


# -- Kubernetes containers: which pod and container a process is in ------------------------------------------
#
# kubelet names a container's cgroup (pkg/kubelet/cm/cgroup_manager_linux.go; SystemdPathPrefixOfRuntime):
#   cgroupfs driver: /kubepods[/burstable|/besteffort]/pod<uid>/<container id>
#   systemd driver:  /kubepods.slice[/kubepods-<qos>.slice]/kubepods[-<qos>]-pod<uid, '-' as '_'>.slice/
#                    <cri-containerd|crio|docker>-<container id>.scope
# Guaranteed pods have no QoS level. Container ids are 64 hex digits. CRI-O's monitor (crio-conmon-<id>.scope) is
# not the container and does not match.

_POD_SYSTEMD = re.compile(
    r"kubepods(?:-(?P<qos>burstable|besteffort))?-pod(?P<uid>[0-9a-fA-F_]{32,36})\.slice/"
    r"(?P<runtime>cri-containerd|crio|docker)-(?P<id>[0-9a-f]{64})\.scope(?:/|$)"
)
_POD_CGROUPFS = re.compile(
    r"/kubepods(?:/(?P<qos>burstable|besteffort))?/pod(?P<uid>[0-9a-fA-F-]{32,36})/(?P<id>[0-9a-f]{64})(?:/|$)"
)


@dataclass(frozen=True, slots=True)
class PodCgroup:
    """A Kubernetes container's cgroup: its pod's UID (with dashes), its container id, the pod's QoS level
    (``guaranteed`` when the path has none) and the runtime the systemd scope names (``""`` under cgroupfs)."""

    pod_uid: str
    container_id: str
    qos: str
    runtime: str


def parse_pod_cgroup(path: str) -> PodCgroup | None:
    """The pod and container of a cgroup path (either driver), None when the path is not a pod container's."""
    m = _POD_SYSTEMD.search(path)
    if m is not None:
        uid = m["uid"].replace("_", "-").lower()
        return PodCgroup(uid, m["id"], m["qos"] or "guaranteed", m["runtime"])
    m = _POD_CGROUPFS.search(path)
    if m is not None:
        return PodCgroup(m["uid"].lower(), m["id"], m["qos"] or "guaranteed", "")
    return None


def process_pod_cgroup(procfs: Path, pid: int, limits: ReadLimits = DEFAULT_READ_LIMITS) -> PodCgroup | None:
    """The pod container ``pid`` is in, from ``<procfs>/<pid>/cgroup``: the v2 line or any v1 hierarchy's line.
    None when it is in none (a host process) or gone; NoDataError when the file cannot be read otherwise."""
    path = procfs / str(pid) / "cgroup"
    try:
        for line in limits.lines(path, "cgroup"):
            parts = line.split(":", 2)
            if len(parts) == 3 and (found := parse_pod_cgroup(parts[2])) is not None:
                return found
    except (FileNotFoundError, ProcessLookupError):  # gone meanwhile
        return None
    except OSError as exc:
        raise NoDataError(
            f"{path} cannot be read ({exc.strerror})", hint="run the agent in the host PID namespace"
        ) from None
    return None
