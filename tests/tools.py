"""What the test command provides, required rather than skipped.

``scripts/test.sh`` installs every Debian package and builds every binary the suite uses, so a missing one
means the checkout or its install steps are broken: the test fails with the fix in its message. Skips are
only for what the test command cannot provide (an NVIDIA GPU, an ARM or AVX-512 CPU, root); each skip's
reason says which, and ``conftest.py`` counts them in the summary.
"""

from __future__ import annotations

import shutil
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]

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
}
# binary → the virtualenv scripts/test.sh installs it into, for a Python tool whose pins clash with .venv's
VENVS = {
    "checkov": ".venv-tools",
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
