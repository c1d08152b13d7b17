"""The node's hardware identity, read once at start for OTLP resource attributes and the status API.

Reads ``<procfs>/cpuinfo`` (first CPU's model), ``<procfs>/sys/kernel/osrelease`` and
``<sysfs>/class/dmi/id/product_name`` (the instance type on AWS). Missing files leave fields empty.
"""

from __future__ import annotations

import platform
import socket
from pathlib import Path


def _read(path: Path) -> str:
    try:
        return path.read_text(encoding="utf-8", errors="replace").strip()
    except OSError:
        return ""


def _cpu_model(cpuinfo: str) -> str:
    for line in cpuinfo.splitlines():
        key, _, value = line.partition(":")
        if key.strip() in ("model name", "Model Name"):
            return value.strip()
    return ""


def node_identity(procfs: Path, sysfs: Path) -> dict[str, str]:
    """OpenTelemetry resource attributes describing this node (host.*, os.*)."""
    ident = {
        "host.name": socket.gethostname(),
        "host.arch": platform.machine(),
        "host.cpu.model.name": _cpu_model(_read(procfs / "cpuinfo")),
        "host.type": _read(sysfs / "class" / "dmi" / "id" / "product_name"),
        "os.type": "linux",
        "os.version": _read(procfs / "sys" / "kernel" / "osrelease") or platform.release(),
    }
    return {k: v for k, v in ident.items() if v}
