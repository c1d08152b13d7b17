"""The process of a Kubernetes container on this node, found by its cgroup, not by its command line.

Given a pod UID and a container id (a target's identity, agent/node/discovery/), every ``<procfs>/<pid>/cgroup`` is read
and the processes whose cgroup path names that pod and container are kept
(:func:`inferwatch.agent.node.host.cgroup.parse_pod_cgroup`: cgroup v1 and v2, systemd and cgroupfs drivers, containerd,
CRI-O and Docker). The engine is the container's top process: the one whose parent is outside the container (the
container's pid 1 as the host sees it); its workers are the rest. Two engine pods on one node are thus never confused,
whatever their command lines.

The agent must see the host's processes (``hostPID``, or ``--path.procfs`` at the host's /proc): another PID
namespace's /proc has none of the engine's.
"""

from __future__ import annotations

import os
from dataclasses import dataclass
from pathlib import Path

from inferwatch.agent.errors import NoDataError, SourceFormatError
from inferwatch.agent.node.host.cgroup import process_pod_cgroup
from inferwatch.agent.node.host.procfs import DEFAULT_READ_LIMITS, ReadLimits

MAX_SCAN_PIDS = 100_000
MAX_STAT_BYTES = 4096  # /proc/<pid>/stat is one line of ~300 bytes


@dataclass(frozen=True, slots=True)
class ContainerProcesses:
    """``pid``: the container's top process (the engine); ``pids``: every process in the container, sorted."""

    pid: int
    pids: tuple[int, ...]


def normalize_container_id(container_id: str) -> str:
    """``containerd://<id>`` / ``cri-o://<id>`` / ``docker://<id>`` (as ``containerStatuses`` has it) → ``<id>``."""
    return container_id.split("://", 1)[-1].strip().lower()


def _ppid(procfs: Path, pid: int) -> int | None:
    try:
        with open(procfs / str(pid) / "stat", "rb") as fh:
            raw = fh.read(MAX_STAT_BYTES)
    except OSError:
        return None
    fields = raw[raw.rfind(b")") + 2 :].split()  # after "pid (comm) ": state, ppid, ...
    return int(fields[1]) if len(fields) > 1 and fields[1].isdigit() else None


def find_container_processes(
    procfs: Path, pod_uid: str, container_id: str, limits: ReadLimits = DEFAULT_READ_LIMITS
) -> ContainerProcesses:
    """The processes of one container; NoDataError (with a hint) when none is found."""
    uid = pod_uid.strip().lower().replace("_", "-")
    cid = normalize_container_id(container_id)
    if not uid or not cid:
        raise NoDataError("no pod UID or container id to look for", hint="the target has no Kubernetes identity")
    try:
        entries = sorted((e for e in os.listdir(procfs) if e.isdigit()), key=int)[:MAX_SCAN_PIDS]
    except OSError as exc:
        raise NoDataError(f"{procfs} cannot be listed ({exc.strerror})", hint="point --path.procfs at /proc") from None
    pids = []
    for entry in entries:
        try:
            found = process_pod_cgroup(procfs, int(entry), limits)
        except (NoDataError, SourceFormatError):  # one unreadable process does not hide the others
            continue
        if found is not None and found.pod_uid == uid and found.container_id == cid:
            pids.append(int(entry))
    if not pids:
        raise NoDataError(
            f"no process of pod {uid} container {cid[:12]} under {procfs}",
            hint="run the agent with the host's PID namespace (hostPID, or --path.procfs at the host's /proc); "
            "the container may also have just restarted",
        )
    members = set(pids)
    tops = [p for p in pids if _ppid(procfs, p) not in members]
    return ContainerProcesses(min(tops) if tops else pids[0], tuple(pids))
