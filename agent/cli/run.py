"""``inferwatch run``: start the agent and its API server until interrupted."""

from __future__ import annotations

import ctypes
import gc
import importlib
import importlib.util
import logging
import os
import platform
import signal
import sys
from pathlib import Path

import typer

from inferwatch.agent.cli.common import (
    EXTRA_ARGS,
    ConfigOpt,
    MachineOpt,
    ProcfsOpt,
    SysfsOpt,
    build_settings,
    setup_logging,
)


def register(app: typer.Typer) -> None:
    @app.command(context_settings=EXTRA_ARGS)
    def run(
        ctx: typer.Context,
        config: Path | None = ConfigOpt,
        procfs: Path | None = ProcfsOpt,
        sysfs: Path | None = SysfsOpt,
        machine: str | None = MachineOpt,
        listen_address: str | None = typer.Option(
            None, "--listen-address", help="Address to bind (default 127.0.0.1)."
        ),
        port: int | None = typer.Option(None, "--port", help="Port of the API and /metrics (default 9435)."),
        interval: float | None = typer.Option(None, "--interval", help="Default collection interval, seconds."),
        environment: str | None = typer.Option(None, "--environment", help="Node environment, e.g. production."),
    ) -> None:
        """Run the node agent: collectors, /metrics, the status API and (with OTEL_* set) OTLP export.

        Switch collectors with --collector.NAME / --no-collector.NAME.
        """
        overrides: dict[str, object] = {}
        if listen_address is not None:
            overrides["listen_address"] = listen_address
        if port is not None:
            overrides["listen_port"] = port
        if interval is not None:
            overrides["interval_s"] = interval
        if environment is not None:
            overrides["node"] = {"environment": environment}
        if machine is not None:
            overrides["path"] = {"machine": machine}
        settings = build_settings(config, procfs, sysfs, ctx.args, overrides)
        setup_logging(settings.log_level)
        serve(settings)


def _stop_requested(signum: int, _frame: object) -> None:
    logging.getLogger(__name__).info("received %s: stopping", signal.Signals(signum).name)


def block_unused_imports() -> None:
    """Keep the agent process from importing what it never runs.

    The agent runs on threads and asyncio, never under trio, but httpcore imports trio whenever it is installed
    (selenium pulls it in, and with it ~14 MB of RSS) to tell the two apart. A None in sys.modules makes that
    import fail and httpcore falls back as it does without trio (as agent/__init__.py does for httpx._main).
    Called by :func:`serve`, not at import: a process that also drives trio (a test with selenium) imports the
    agent too. setdefault: a process that already imported trio keeps it.
    """
    sys.modules.setdefault("trio", None)  # type: ignore[arg-type]


# uvicorn's names the agent uses (agent/node/quietserver.py, agent/node/receiver/http_server.py), each from the module
# that defines it; the same objects its package __init__ binds.
UVICORN_NAMES = {"Config": "uvicorn.config", "Server": "uvicorn.server"}


def defer_uvicorn_package_init() -> bool:
    """Import uvicorn's package without running its ``__init__`` until a name other than ``Config`` or ``Server`` is
    asked of it; True if it was done.

    uvicorn's ``__init__`` imports ``uvicorn.main``, its command line: click, and the reloader's and workers'
    supervisors with multiprocessing, ~1.5 MB of RSS in every agent, which runs only ``Config`` and ``Server``.
    The package is put in sys.modules with its path (its submodules import as usual) and a module ``__getattr__``:
    ``uvicorn.Config`` and ``uvicorn.Server`` come from their modules, any other name (``uvicorn.run``,
    ``__version__``) runs the real ``__init__`` first, so every name reads as it would. Called by :func:`serve`
    before the server's module is imported; a process that already imported uvicorn keeps it.
    """
    if "uvicorn" in sys.modules:
        return False
    spec = importlib.util.find_spec("uvicorn")
    if spec is None or spec.loader is None or spec.submodule_search_locations is None:
        return False
    package = importlib.util.module_from_spec(spec)
    loader = spec.loader

    def attribute(name: str) -> object:
        if name in UVICORN_NAMES:
            return getattr(importlib.import_module(UVICORN_NAMES[name]), name)
        del vars(package)["__getattr__"]  # once: the real __init__ binds the rest
        loader.exec_module(package)
        return getattr(package, name)

    vars(package)["__getattr__"] = attribute  # PEP 562: asked only for the names the module lacks
    sys.modules["uvicorn"] = package
    return True


M_ARENA_MAX = -8  # glibc's mallopt(3) parameter (malloc.h)
MALLOC_ARENAS = 2  # the agent's measured steady state is flat at 2 (docs/benchmarks.md, "Soak")


def cap_malloc_arenas() -> bool:
    """Cap glibc's malloc arenas at :data:`MALLOC_ARENAS` for this process; True if it was done.

    glibc gives each thread that allocates an arena of its own (up to 8 per core) and keeps freed memory in
    each, so an agent with collector, HTTP and receiver threads grows its RSS in steps long after its Python
    heap is flat: the 30-minute soak measured ~100 kB/min over its last 15 minutes by default and ~1 kB/min
    with two arenas. Called before any thread starts, as ``MALLOC_ARENA_MAX=2`` would be; a
    ``MALLOC_ARENA_MAX`` the user set wins. Elsewhere (musl, macOS) nothing is done.
    """
    if "MALLOC_ARENA_MAX" in os.environ:
        return False
    if not sys.platform.startswith("linux") or platform.libc_ver()[0] != "glibc":
        return False
    try:
        return bool(ctypes.CDLL(None).mallopt(M_ARENA_MAX, MALLOC_ARENAS))
    except (OSError, AttributeError):
        return False


def serve(settings: object) -> None:
    block_unused_imports()
    defer_uvicorn_package_init()
    from inferwatch.agent.config import Settings
    from inferwatch.agent.errors import ConfigError
    from inferwatch.agent.node import quietserver
    from inferwatch.agent.node.app import Agent

    assert isinstance(settings, Settings)
    cap_malloc_arenas()
    # uvicorn re-raises SIGTERM/SIGINT once its server has stopped; with the default handlers that kills
    # the process before agent.stop() (no OTLP flush). These handlers let the re-raise return instead.
    for sig in (signal.SIGTERM, signal.SIGINT):
        signal.signal(sig, _stop_requested)
    try:
        agent = Agent(settings)
        # The port first: a taken port is one line and exit 2 before any collector, receiver or "agent started".
        sock = quietserver.bind(settings.listen_address, settings.listen_port)
    except ConfigError as exc:
        typer.echo(f"inferwatch: {exc}", err=True)
        raise typer.Exit(2) from None
    try:
        agent.start()
    except ConfigError as exc:  # e.g. the OTLP receiver's port is taken
        agent.stop()
        sock.close()
        typer.echo(f"inferwatch: {exc}", err=True)
        raise typer.Exit(2) from None
    app = agent.asgi()
    # What exists now (modules, settings, the app) lives as long as the process: a full collection need not
    # walk it (why pages touched per cycle matter: docs/benchmarks.md, "The agent's CPU target").
    gc.collect()
    gc.freeze()
    try:
        quietserver.serve(
            app,
            sock,
            host=settings.listen_address,
            port=settings.listen_port,
            log_level="warning",
            access_log=False,
            log_config=None,  # uvicorn's lines go through the root handler too: one format, credentials redacted
        )
    finally:
        agent.stop()
