"""The node's hardware identity, read once at start for OTLP resource attributes and the status API.

Reads ``<procfs>/cpuinfo`` (through :mod:`inferwatch.agent.node.host.cpucap`, so arm64 nodes, which print no
"model name", are named from implementer/part: "Arm Neoverse-V1", with the product only on DMI evidence),
``<procfs>/sys/kernel/osrelease`` and ``<sysfs>/class/dmi/id/product_name`` (the instance type on AWS).
Attribute names follow the OpenTelemetry host.* / os.* conventions. Missing files leave fields out.
"""

from __future__ import annotations

import platform
import socket
from pathlib import Path

from inferwatch.agent.errors import InferwatchError
from inferwatch.agent.node.host.cpucap import read_cpu_capability

# The kernel's architecture (inferwatch.agent.node.host.cpuinfo.normalise_arch) -> OpenTelemetry host.arch values.
_OTEL_ARCH = {"x86_64": "amd64", "aarch64": "arm64", "arm": "arm32", "ppc64le": "ppc64", "ppc": "ppc32", "i686": "x86"}


def _read(path: Path) -> str:
    try:
        return path.read_text(encoding="utf-8", errors="replace").strip()
    except OSError:
        return ""


def node_identity(procfs: Path, sysfs: Path) -> dict[str, str]:
    """OpenTelemetry resource attributes describing this node (host.*, os.*)."""
    ident = {
        "host.name": socket.gethostname(),
        "host.arch": platform.machine(),
        "host.type": _read(sysfs / "class" / "dmi" / "id" / "product_name"),
        "os.type": "linux",
        "os.version": _read(procfs / "sys" / "kernel" / "osrelease") or platform.release(),
    }
    try:
        cap = read_cpu_capability(procfs, sysfs)
    except InferwatchError:
        pass
    else:
        info = cap.info
        ident["host.arch"] = _OTEL_ARCH.get(info.arch, info.arch if info.arch != "unknown" else ident["host.arch"])
        ident["host.cpu.model.name"] = cap.cpu_model
        ident["host.cpu.vendor.id"] = info.vendor
        if info.family is not None:
            ident["host.cpu.family"] = str(info.family)
            ident["host.cpu.model.id"] = str(info.model)
            ident["host.cpu.stepping"] = str(info.stepping)
        elif info.core_types:
            ident["host.cpu.model.id"] = ",".join(f"0x{c.implementer:02x}/0x{c.part:03x}" for c in info.core_types)
    return {k: v for k, v in ident.items() if v}
