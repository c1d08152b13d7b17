"""Serving the agent: what ``inferwatch run`` runs once its settings are made, without the command line's modules.

``inferwatch run`` parses its flags with typer (click under it), builds and checks the settings, and then
:func:`reexec` replaces the process's interpreter with a fresh one running this module (``os.execv``: the same PID,
environment, open files and signal dispositions), handed the settings as JSON in a memory file: the agent that
runs never imported typer or click, ~1.9 MB of RSS in every agent (docs/benchmarks.md, "Where the megabytes go").
Where that cannot be done (no ``memfd_create``: not Linux; no known interpreter; ``INFERWATCH_REEXEC=0``) the
command serves in its own interpreter, as before. A bad setting is refused before the exec, by the command.
"""

from __future__ import annotations

import ctypes
import gc
import importlib
import importlib.util
import logging
import os
import platform
import signal
import subprocess
import sys
from pathlib import Path
from typing import Any, NoReturn

SETTINGS_FD = "--settings-fd"
REEXEC_ENV = "INFERWATCH_REEXEC"  # "0": serve in the command's own interpreter
# Set by the ``inferwatch`` program's entry (cli/main.py ``main``): only then is the interpreter the command's own to
# replace (not a test's, running the command in its process)
PROGRAM: list[bool] = [False]
# Libraries that log a line per request at INFO: httpx ("HTTP Request: GET ... 200", one per engine fetch,
# probe and profile read) and httpcore under it, uvicorn's access log (one per API request). The agent says
# what matters itself, once when a source starts failing and once when it recovers (inferwatch.agent.node.runner), so
# these are held at WARNING whatever log_level is: their warnings and errors still show.
QUIET_LIBRARY_LOGGERS = ("httpx", "httpcore", "uvicorn.access", "hpack", "urllib3")
QUIET_LIBRARY_LEVEL = logging.WARNING


def setup_logging(level: str) -> None:
    """The root handler, whose every line loses credentials (a URL's password, token parameters): libraries
    log URLs as given (inferwatch.agent.common.redact.RedactingFormatter)."""
    from inferwatch.agent.common.redact import install_log_redaction

    logging.basicConfig(
        level=getattr(logging, level.upper(), logging.INFO),
        format="%(asctime)s %(levelname)s %(name)s: %(message)s",
    )
    install_log_redaction()
    for name in QUIET_LIBRARY_LOGGERS:
        logging.getLogger(name).setLevel(QUIET_LIBRARY_LEVEL)


def _path(obj: Any) -> Any:
    if isinstance(obj, Path):
        return str(obj)
    raise NotImplementedError(f"cannot encode {type(obj).__name__}")


def reexec(settings: object, argv: list[str]) -> None:
    """Serve ``settings`` in a fresh interpreter of this process (see the module); returns only where it cannot.
    ``argv``: the command's arguments, written after ``--`` so that ``ps`` shows what was run."""
    if not PROGRAM[0] or os.environ.get(REEXEC_ENV, "1") == "0" or not hasattr(os, "memfd_create"):
        return
    if not sys.executable:
        return
    import msgspec

    data = msgspec.json.encode(settings, enc_hook=_path)
    try:
        fd = os.memfd_create("inferwatch-settings", 0)  # no MFD_CLOEXEC: the new interpreter reads it
    except OSError:
        return
    os.set_inheritable(fd, True)
    with os.fdopen(fd, "wb", closefd=False) as f:
        f.write(data)
    os.lseek(fd, 0, os.SEEK_SET)
    flags: list[str] = subprocess._args_from_interpreter_flags()  # type: ignore[attr-defined]  # -X, -W, -O ...
    new = [sys.executable, *flags, "-m", __name__, SETTINGS_FD, str(fd), "--", *argv]
    sys.stdout.flush()
    sys.stderr.flush()
    try:
        os.execv(sys.executable, new)
    except OSError:
        os.close(fd)


def main(args: list[str] | None = None) -> NoReturn:
    """The new interpreter's entry: read the settings from the memory file, serve them."""
    args = sys.argv[1:] if args is None else args
    if len(args) < 2 or args[0] != SETTINGS_FD or not args[1].isdigit():
        print(f"inferwatch: usage: python -m {__name__} {SETTINGS_FD} FD [-- ARGS]", file=sys.stderr)
        raise SystemExit(2)
    import msgspec

    from inferwatch.agent.config import Settings
    from inferwatch.agent.errors import ConfigError

    with os.fdopen(int(args[1]), "rb") as f:
        data = f.read()
    try:
        settings = Settings.from_values(msgspec.json.decode(data))
    except (ConfigError, msgspec.DecodeError) as exc:  # the command checked them: only a broken hand-over
        print(f"inferwatch: {exc}", file=sys.stderr)
        raise SystemExit(2) from None
    setup_logging(settings.log_level)
    serve(settings)
    raise SystemExit(0)


def _stop_requested(signum: int, _frame: object) -> None:
    logging.getLogger("inferwatch.agent.cli.serve").info("received %s: stopping", signal.Signals(signum).name)


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
        print(f"inferwatch: {exc}", file=sys.stderr)
        raise SystemExit(2) from None
    try:
        agent.start()
    except ConfigError as exc:  # e.g. the OTLP receiver's port is taken
        agent.stop()
        sock.close()
        print(f"inferwatch: {exc}", file=sys.stderr)
        raise SystemExit(2) from None
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


if __name__ == "__main__":
    main()
