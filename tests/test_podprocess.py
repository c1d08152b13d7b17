"""The engine process of a pod's container, by cgroup (agent/node/host/podprocess.py, agent/node/host/cgroup.py), on
recorded /proc trees of each shape: cgroup v1 and v2, systemd and cgroupfs drivers, containerd, CRI-O and Docker
(tests/fixtures/k8s/SOURCE.md)."""

from __future__ import annotations

from pathlib import Path

import pytest

from inferwatch.agent.errors import NoDataError
from inferwatch.agent.node.host.cgroup import PodCgroup, parse_pod_cgroup, process_pod_cgroup
from inferwatch.agent.node.host.podprocess import find_container_processes, normalize_container_id

K8S = Path(__file__).resolve().parent / "fixtures" / "k8s"
UID_A = "0b4c5d6e-1111-4a2b-9c3d-000000000001"
UID_B = "0b4c5d6e-2222-4a2b-9c3d-000000000002"
TREES = ("proc-v2-systemd-containerd", "proc-v2-cgroupfs-containerd", "proc-v1-systemd-crio", "proc-v1-cgroupfs-docker")


@pytest.mark.parametrize("tree", TREES)
def test_each_pods_engine_is_its_containers_top_process(tree: str) -> None:
    procfs = K8S / tree
    a = find_container_processes(procfs, UID_A, "containerd://" + "a" * 64)
    assert a.pid == 4100 and a.pids == (4100, 4150)  # the engine, and its worker
    b = find_container_processes(procfs, UID_B.upper(), "cri-o://" + "b" * 64)
    assert b.pid == 5100
    with pytest.raises(NoDataError, match="no process of pod") as err:
        find_container_processes(procfs, UID_B, "a" * 64)  # pod B has no container a
    assert "hostPID" in err.value.hint


@pytest.mark.parametrize(
    ("path", "expected"),
    [
        (
            "/kubepods.slice/kubepods-burstable.slice/kubepods-burstable-pod0b4c5d6e_1111_4a2b_9c3d_000000000001.slice/"
            "cri-containerd-" + "a" * 64 + ".scope",
            PodCgroup(UID_A, "a" * 64, "burstable", "cri-containerd"),
        ),
        (
            "/kubepods.slice/kubepods-pod0b4c5d6e_1111_4a2b_9c3d_000000000001.slice/docker-" + "c" * 64 + ".scope",
            PodCgroup(UID_A, "c" * 64, "guaranteed", "docker"),
        ),
        ("/kubepods/besteffort/pod" + UID_B + "/" + "b" * 64, PodCgroup(UID_B, "b" * 64, "besteffort", "")),
        ("/kubepods/pod" + UID_B + "/" + "b" * 64, PodCgroup(UID_B, "b" * 64, "guaranteed", "")),
        # kind / nested: the kubelet's tree below another cgroup
        (
            "/system.slice/docker-" + "9" * 64 + ".scope/kubelet/kubepods/burstable/pod" + UID_A + "/" + "d" * 64,
            PodCgroup(UID_A, "d" * 64, "burstable", ""),
        ),
        (
            "/kubepods.slice/kubepods-burstable.slice/kubepods-burstable-pod" + UID_A.replace("-", "_") + ".slice/"
            "crio-conmon-" + "a" * 64 + ".scope",
            None,
        ),  # CRI-O's monitor, not the container
        ("/kubepods/burstable/pod" + UID_A, None),  # the pod's own cgroup: no container
        ("/system.slice/containerd.service", None),
        ("/", None),
    ],
)
def test_cgroup_paths_of_each_driver(path: str, expected: PodCgroup | None) -> None:
    assert parse_pod_cgroup(path) == expected


def test_a_process_gone_is_in_no_pod_and_ids_are_normalized(tmp_path: Path) -> None:
    assert process_pod_cgroup(tmp_path, 4242) is None
    assert process_pod_cgroup(K8S / "proc-v1-cgroupfs-docker", 700) is None  # dockerd: a host process
    assert normalize_container_id("containerd://ABC") == "abc" and normalize_container_id("abc") == "abc"
    with pytest.raises(NoDataError, match="no pod UID or container id"):
        find_container_processes(K8S / TREES[0], "", "a" * 64)
    with pytest.raises(NoDataError, match="cannot be listed"):
        find_container_processes(tmp_path / "absent", UID_A, "a" * 64)
