"""Options shared by commands: config file, path roots, and node_exporter-style collector switches."""

from __future__ import annotations

import os
import re
from pathlib import Path
from typing import Any

import typer

from inferwatch.agent.cli.serve import setup_logging
from inferwatch.agent.common.userfiles import read_text_bounded
from inferwatch.agent.config import Settings, load_settings
from inferwatch.agent.errors import ConfigError

EXTRA_ARGS = {"allow_extra_args": True, "ignore_unknown_options": True}
_SWITCH = re.compile(r"^--(no-)?collector\.([a-z0-9_]+)$")

ConfigOpt = typer.Option(None, "--config", "-c", help="YAML configuration file (or INFERWATCH_CONFIG).")
ProcfsOpt = typer.Option(None, "--path.procfs", help="procfs root to read (default /proc).")
SysfsOpt = typer.Option(None, "--path.sysfs", help="sysfs root to read (default /sys).")
MachineOpt = typer.Option(
    None,
    "--machine",
    metavar="ARCH",
    help="Kernel architecture (uname -m: x86_64, aarch64, armv7l ...) of a recorded --path.procfs tree "
    "(default: the running kernel's for the live /proc, else recorded in the tree or inferred from its cpuinfo).",
)


TOKEN_ENV = "INFERWATCH_TOKEN"
MAX_TOKEN_FILE_BYTES = 64 * 1024  # a bearer token is a line; a bigger file is the wrong file


def read_token(token_file: Path | None, command: str) -> str:
    """The API token of ``--token-file`` (stripped), else ``$INFERWATCH_TOKEN``, else "".

    A file that is missing, unreadable, a directory, over 64 KiB or not UTF-8 is the user's mistake: one line
    naming the file and the reason on stderr, exit 2 (never a traceback)."""
    if token_file is None:
        return os.environ.get(TOKEN_ENV, "")
    try:
        return read_text_bounded(token_file, MAX_TOKEN_FILE_BYTES, "--token-file").strip()
    except ConfigError as exc:
        typer.echo(f"inferwatch {command}: {exc}", err=True)
        raise typer.Exit(2) from None


def collector_switches(extra: list[str]) -> dict[str, dict[str, bool]]:
    """Turn ``--collector.NAME`` / ``--no-collector.NAME`` into config overrides; reject anything else."""
    from inferwatch.agent.node.actions.binary import NAME as BINARY
    from inferwatch.agent.node.collectors import REGISTRY

    known = {*REGISTRY, BINARY}  # the binary check is an action, switched like a collector
    out: dict[str, dict[str, bool]] = {}
    for arg in extra:
        m = _SWITCH.match(arg)
        if not m:
            raise typer.BadParameter(f"unknown option {arg!r}", param_hint="options")
        name = m.group(2)
        if name not in known:
            raise typer.BadParameter(f"unknown collector {name!r} (known: {', '.join(sorted(known))})", param_hint=arg)
        out[name] = {"enabled": m.group(1) is None}
    return out


def build_settings(
    config: Path | None,
    procfs: Path | None,
    sysfs: Path | None,
    extra: list[str],
    overrides: dict[str, Any] | None = None,
) -> Settings:
    """Settings from file, environment and flags; on a bad value print one message and exit 2."""
    merged: dict[str, Any] = dict(overrides or {})
    paths = {k: v for k, v in (("procfs", procfs), ("sysfs", sysfs)) if v is not None}
    if paths:
        merged["path"] = {**merged.get("path", {}), **paths}
    switches = collector_switches(extra)
    if switches:
        merged["collectors"] = switches
    from inferwatch.agent.node.collectors import (
        REGISTRY,  # lazily, as in collector_switches: commands that never build settings
    )

    try:
        return load_settings(config, merged, collectors=REGISTRY)
    except ConfigError as exc:
        typer.echo(f"inferwatch: {exc}", err=True)
        raise typer.Exit(2) from None


__all__ = ["setup_logging"]  # the commands import it from here; it lives in cli/serve.py
