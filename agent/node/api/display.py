"""Numbers as people read them: seconds, bytes and ages in the status page, its overview's histogram-mode labels
and ``inferwatch top`` ("—" or "never" where there is no value)."""

from __future__ import annotations


def fmt_seconds(v: float | None) -> str:
    if v is None:
        return "—"
    if v >= 10:
        return f"{v:.0f} s"
    if v >= 1:
        return f"{v:.2f} s"
    if v >= 0.001:
        return f"{v * 1e3:.3g} ms"
    return f"{v * 1e6:.3g} µs"


def fmt_bytes(v: float | None) -> str:
    if v is None:
        return "—"
    for unit, size in (("GiB", 1 << 30), ("MiB", 1 << 20), ("KiB", 1 << 10)):
        if v >= size:
            return f"{v / size:.2f} {unit}"
    return f"{v:.0f} B"


def fmt_age(v: float | None) -> str:
    if v is None:
        return "never"
    return f"{v:.0f} s ago" if v < 120 else f"{v / 60:.0f} min ago"
