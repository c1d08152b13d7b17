"""``inferwatch profile``: record the runtime (or any Python pid) with py-spy into a file.

Exit 0 written, 1 py-spy could not record (permission, not Python, no such pid), 2 usage error.
"""

from __future__ import annotations

import os
from pathlib import Path

import typer

from inferwatch.agent.cli.common import ConfigOpt, ProcfsOpt, build_settings


def register(app: typer.Typer) -> None:
    @app.command()
    def profile(
        runtime: bool = typer.Option(False, "--runtime", help="Profile the configured runtime process."),
        pid: int | None = typer.Option(None, "--pid", min=1, help="Profile this pid."),
        target: str | None = typer.Option(
            None, "--target", help="Profile this discovered engine target's runtime (discovery.*: its name)."
        ),
        duration: float = typer.Option(5.0, "--duration", help="Seconds to record (cap: profiling.max_duration_s)."),
        rate: int = typer.Option(100, "--rate", help="Samples per second (1..1000)."),
        fmt: str = typer.Option("speedscope", "--format", help="speedscope, flamegraph or raw."),
        native: bool = typer.Option(False, "--native", help="Include native (C/C++) frames."),
        nonblocking: bool = typer.Option(False, "--nonblocking", help="Do not pause the target while sampling."),
        output: Path | None = typer.Option(None, "--output", "-o", help="Output file (default profile-PID.EXT)."),
        config: Path | None = ConfigOpt,
        procfs: Path | None = ProcfsOpt,
    ) -> None:
        """Record a py-spy profile of the runtime (--runtime), of a discovered engine target's (--target) or of
        --pid."""
        from inferwatch.agent.errors import InferwatchError
        from inferwatch.agent.node.actions import pyspy
        from inferwatch.agent.node.host.runtime import RuntimeLocator

        if [runtime, pid is not None, target is not None].count(True) != 1:
            typer.echo("inferwatch: give exactly one of --runtime, --target or --pid", err=True)
            raise typer.Exit(2)
        settings = build_settings(config, procfs, None, [])
        opts = pyspy.RecordOptions(duration, rate, fmt, native, nonblocking)
        try:
            opts.validate(settings.profiling.max_duration_s)
        except ValueError as exc:
            typer.echo(f"inferwatch: {exc}", err=True)
            raise typer.Exit(2) from None
        if pid is None:
            try:
                if target is not None:  # its process through its container's cgroup, or its loopback port
                    from inferwatch.agent.node.host.procfs import ReadLimits
                    from inferwatch.agent.node.targets import find_target, target_pid

                    found = find_target(settings.discovery, target)
                    pid = target_pid(found, settings.path.procfs, ReadLimits.of(settings.read_limits))
                else:
                    pid = RuntimeLocator(settings.runtime, settings.path.procfs).find().pid
            except InferwatchError as exc:
                typer.echo(f"inferwatch: {exc}", err=True)
                raise typer.Exit(2) from None
        out = output or Path(f"profile-{pid}{pyspy.FORMATS[fmt]}")
        # A bad --output is the user's mistake: say so before py-spy records for --duration and fails with its own
        # multi-line backtrace.
        try:
            bad = out.is_dir() or not out.parent.is_dir() or not os.access(out.parent, os.W_OK)
            why = "is a directory" if bad and out.is_dir() else f"{out.parent} is not a writable directory"
        except OSError as exc:  # e.g. a parent this user may not even look into
            bad, why = True, exc.strerror or str(exc)
        if bad:
            typer.echo(f"inferwatch profile: cannot write --output {out}: {why}", err=True)
            raise typer.Exit(2)
        try:
            exe = pyspy.resolve_executable(settings.profiling.py_spy)
            typer.echo(f"recording pid {pid} for {duration:g}s at {rate} Hz ({fmt}) ...", err=True)
            pyspy.record(exe, pid, opts, out, settings.profiling.max_duration_s)
        except pyspy.PySpyError as exc:
            typer.echo(f"inferwatch: {exc}", err=True)
            raise typer.Exit(1) from None
        typer.echo(str(out))
