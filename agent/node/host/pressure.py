"""PSI files (/proc/pressure/*, cgroup ``*.pressure``): ``some avg10=0.00 avg60=0.00 avg300=0.00 total=0``."""

from __future__ import annotations

from collections.abc import Iterable
from dataclasses import dataclass
from pathlib import Path

from inferwatch.agent.errors import NoDataError, SourceFormatError
from inferwatch.agent.node.host.procfs import DEFAULT_READ_LIMITS, ReadLimits, text_lines

PSI_KINDS = ("some", "full")  # the kinds a kernel writes (cpu.pressure has "full" since 5.13)


@dataclass(frozen=True, slots=True)
class PressureLine:
    """One PSI line; ``avg*`` as ratios (0..1, the file's percent / 100), ``total_seconds`` from µs."""

    avg10: float
    avg60: float
    avg300: float
    total_seconds: float


def parse_pressure(text: str | Iterable[str]) -> dict[str, PressureLine]:
    """The ``some`` and ``full`` lines of a PSI text (or its lines); any other kind is checked, not kept."""
    out: dict[str, PressureLine] = {}
    for line in text_lines(text):
        words = line.split()
        if not words:
            continue
        kind = words[0]
        fields: dict[str, str] = {}
        for word in words[1:]:
            k, sep, v = word.partition("=")
            if not sep:
                raise SourceFormatError(f"pressure line {line!r}: {word!r} is not key=value")
            fields[k] = v
        try:
            value = PressureLine(
                avg10=float(fields["avg10"]) / 100.0,
                avg60=float(fields["avg60"]) / 100.0,
                avg300=float(fields["avg300"]) / 100.0,
                total_seconds=int(fields["total"]) / 1e6,
            )
        except (KeyError, ValueError) as exc:
            raise SourceFormatError(f"pressure line {line!r}: {exc}") from None
        if kind in PSI_KINDS:
            out[kind] = value
    if "some" not in out:
        raise SourceFormatError("pressure file has no 'some' line")
    return out


def read_pressure(path: Path, limits: ReadLimits = DEFAULT_READ_LIMITS) -> dict[str, PressureLine]:
    try:
        return parse_pressure(
            limits.lines(path, f"pressure/{path.name}" if path.parent.name == "pressure" else path.name)
        )
    except FileNotFoundError:
        raise NoDataError(
            f"{path} does not exist: this kernel has no PSI",
            hint="use a kernel built with CONFIG_PSI=y (4.20+); some distributions need psi=1 on the kernel "
            "command line",
        ) from None
    except OSError as exc:  # EOPNOTSUPP when PSI is compiled in but disabled
        raise NoDataError(f"{path} cannot be read ({exc.strerror})", hint="boot with psi=1") from None
