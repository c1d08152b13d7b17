"""What the test command provides, required rather than skipped.

``scripts/test.sh`` installs every Debian package and builds every binary the suite uses, so a missing one
means the checkout or its install steps are broken: the test fails with the fix in its message. Skips are
only for what the test command cannot provide (an NVIDIA GPU, an ARM or AVX-512 CPU, root, a kernel or sandbox
that forbids ``perf_event_open``: see :func:`skip_if_perf_events_forbidden`); each skip's reason says which, and
``conftest.py`` counts them in the summary.
"""

from __future__ import annotations

import os
import shutil
from pathlib import Path
from typing import NoReturn

import pytest

ROOT = Path(__file__).resolve().parents[1]
PERF_EVENT_PARANOID = Path("/proc/sys/kernel/perf_event_paranoid")
# capability bits (linux/capability.h) that lift perf_event_paranoid
CAP_SYS_ADMIN = 21
CAP_PERFMON = 38

# binary → the Debian package scripts/test.sh installs it from
PACKAGES = {
    "prometheus": "prometheus",
    "promtool": "prometheus",
    "prometheus-alertmanager": "prometheus-alertmanager",
    "amtool": "prometheus-alertmanager",
    "docker-compose": "docker-compose",
    "objdump": "binutils",
    "unshare": "util-linux",
    "kubectl": "kubernetes-client",
    "victoria-metrics": "victoria-metrics",
    "vmagent": "victoria-metrics",
    "vmalert": "victoria-metrics",
    "chromium": "chromium",
    "chromedriver": "chromium-driver",
    "tmux": "tmux",
}
# binary → the virtualenv scripts/test.sh installs it into, for a Python tool whose pins clash with .venv's
VENVS = {
    "checkov": ".venv-tools",
    "phoenix": ".venv-phoenix",
}


def require(binary: str) -> str:
    """The path of ``binary``; fails the test (never skips) when the test command should have installed it."""
    if binary in VENVS:
        candidate = ROOT / VENVS[binary] / "bin" / binary
        if not candidate.is_file():
            pytest.fail(f"{candidate} not found: scripts/test.sh installs {binary} there (pip)", pytrace=False)
        return str(candidate)
    path = shutil.which(binary)
    if path is None:
        package = PACKAGES.get(binary, binary)
        pytest.fail(f"{binary} not found: scripts/test.sh installs it (Debian package {package})", pytrace=False)
    return path


def _effective_caps() -> int:
    for line in Path("/proc/self/status").read_text().splitlines():
        if line.startswith("CapEff:"):
            return int(line.split()[1], 16)
    return 0


def _seccomp_filtered() -> bool:
    for line in Path("/proc/self/status").read_text().splitlines():
        if line.startswith("Seccomp:"):
            return line.split()[1] == "2"
    return False


def skip_if_perf_events_forbidden(exc: BaseException) -> NoReturn:
    """Skip when the kernel or a sandbox forbids ``perf_event_open`` for this process, else fail.

    Whether a process may open a counter is the host's decision, which the test command does not (and should
    not) change: a kernel built without perf events (no ``/proc/sys/kernel/perf_event_paranoid``),
    ``perf_event_paranoid`` above 2 for a process without CAP_PERFMON/CAP_SYS_ADMIN (Debian and Android kernels
    refuse every unprivileged counter at 3), or a seccomp filter (a container's default profile) that refuses
    the syscall. Those skip, with the setting in the reason. A refusal under none of them is a bug in the code
    under test or in this check, so the test fails.
    """
    if not PERF_EVENT_PARANOID.exists():
        pytest.skip("kernel without perf events (no /proc/sys/kernel/perf_event_paranoid)")
    paranoid = int(PERF_EVENT_PARANOID.read_text().split()[0])
    caps = _effective_caps()
    privileged = os.geteuid() == 0 or bool(caps & (1 << CAP_PERFMON | 1 << CAP_SYS_ADMIN))
    if paranoid > 2 and not privileged:
        pytest.skip(f"kernel.perf_event_paranoid={paranoid} forbids perf_event_open for an unprivileged user")
    if _seccomp_filtered():
        pytest.skip("a seccomp filter (container sandbox) refuses perf_event_open")
    pytest.fail(
        f"perf_event_open refused although kernel.perf_event_paranoid={paranoid} permits it "
        f"(euid {os.geteuid()}, no seccomp filter): {exc}",
        pytrace=False,
    )
