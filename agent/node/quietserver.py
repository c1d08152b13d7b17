"""uvicorn without its 10 Hz housekeeping tick, for an agent that must cost next to nothing while idle.

uvicorn's ``Server.main_loop`` wakes every 100 ms to refresh the ``Date`` header and poll ``should_exit``:
ten wake-ups a second are most of an idle agent's CPU (why a wake-up costs: docs/benchmarks.md, "The agent's
CPU target"). :class:`QuietServer` instead sleeps until it is told to exit (a signal, or
:meth:`QuietServer.request_exit` from another thread); :class:`DateHeader` stamps ``Date`` on each response,
which is what the tick kept fresh.
"""

from __future__ import annotations

import asyncio
import contextlib
import socket
import sys
import time
from email.utils import formatdate
from types import FrameType
from typing import Any

import uvicorn
from uvicorn.config import Config

from inferwatch.agent.errors import ConfigError

# Idle keep-alive connections stay open this long (nginx's default). Prometheus reuses its connection on
# every scrape; uvicorn's 5 s default would close it between scrapes at 5 s and longer intervals, a wake-up
# and a reconnect per scrape.
KEEP_ALIVE_S = 75
STARTUP_FAILURE = 3  # uvicorn.run's exit status when the server could not start
# How long a thread holding the interpreter runs before one waiting for it is let in (CPython's default: 5 ms). The
# serving thread gives the interpreter up at every socket call and poll, and while a collector runs Python code (an
# engine of hundreds of models: a second or more per read) it waited up to the whole interval each time to get it
# back, several times per request. 1 ms bounds that wait five times lower; a thread that waits for nobody is not
# interrupted at all (measured: docs/benchmarks.md, "``/metrics`` and the API while a 200-model engine is read").
SWITCH_INTERVAL_S = 0.001


class DateHeader:
    """ASGI middleware: add the ``Date`` header (RFC 9110 §6.6.1) to every HTTP response."""

    def __init__(self, app: Any) -> None:
        self.app = app
        self._second = -1
        self._value = b""

    def _date(self) -> bytes:
        now = int(time.time())
        if now != self._second:
            self._second, self._value = now, formatdate(now, usegmt=True).encode()
        return self._value

    async def __call__(self, scope: dict[str, Any], receive: Any, send: Any) -> None:
        if scope["type"] != "http":
            await self.app(scope, receive, send)
            return

        async def stamped(message: dict[str, Any]) -> None:
            if message["type"] == "http.response.start":
                message = {**message, "headers": [*message.get("headers", ()), (b"date", self._date())]}
            await send(message)

        await self.app(scope, receive, stamped)


class QuietServer(uvicorn.Server):
    """A uvicorn server whose main loop waits for its exit instead of polling for it."""

    def __init__(self, config: Config) -> None:
        config.date_header = False  # DateHeader stamps it per response instead
        super().__init__(config)
        self._loop: asyncio.AbstractEventLoop | None = None
        self._exit: asyncio.Event | None = None

    async def main_loop(self) -> None:
        await self.on_tick(0)  # sets the default headers once (no Date: see DateHeader)
        self._loop, self._exit = asyncio.get_running_loop(), asyncio.Event()
        if not self.should_exit:
            await self._exit.wait()

    def request_exit(self) -> None:
        """Stop serving (graceful shutdown); safe from any thread."""
        self.should_exit = True
        loop, event = self._loop, self._exit
        if loop is not None and event is not None and not loop.is_closed():
            with contextlib.suppress(RuntimeError):  # the loop closed in between: it is not waiting any more
                loop.call_soon_threadsafe(event.set)

    def handle_exit(self, sig: int, frame: FrameType | None) -> None:
        super().handle_exit(sig, frame)
        self.request_exit()


def bind(host: str, port: int) -> socket.socket:
    """The listening socket on ``host:port``, bound before anything else starts (so "agent started" is only
    logged by an agent that can serve, and a taken port is one ConfigError naming it, not a traceback)."""
    family = socket.AF_INET6 if ":" in host else socket.AF_INET
    # IPPROTO_TCP, not 0: asyncio sets TCP_NODELAY only on sockets whose proto says TCP, and an accepted socket
    # takes the listening one's; with proto 0 Nagle stayed on and every /metrics answer waited ~40 ms for a
    # delayed ACK (1.2 ms -> 48 ms median, back to back).
    sock = socket.socket(family, socket.SOCK_STREAM, socket.IPPROTO_TCP)
    try:
        sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        sock.bind((host, port))
        sock.listen(socket.SOMAXCONN)
    except OSError as exc:
        sock.close()
        raise ConfigError(f"cannot listen on {host}:{port}: {exc.strerror or exc}") from None
    sock.set_inheritable(True)
    return sock


def serve(app: Any, sock: socket.socket | None = None, **config: Any) -> None:
    """``uvicorn.run`` with :class:`QuietServer` and :class:`DateHeader`; on ``sock`` (from :func:`bind`) when
    given, else uvicorn binds ``host``/``port`` itself. Sets the interpreter's switch interval to
    :data:`SWITCH_INTERVAL_S` for the process: the server's answers wait less for the collectors' threads."""
    config.setdefault("timeout_keep_alive", KEEP_ALIVE_S)
    sys.setswitchinterval(SWITCH_INTERVAL_S)
    server = QuietServer(Config(DateHeader(app), **config))
    with contextlib.suppress(KeyboardInterrupt):
        server.run(sockets=[sock] if sock is not None else None)
    if not server.started:
        raise SystemExit(STARTUP_FAILURE)  # as uvicorn.run: the error (port taken...) is already logged
