"""Run the simulator under uvicorn until SIGINT/SIGTERM.

The event loop and HTTP parser are chosen explicitly for this server only (``--loop``, ``--http``):
``auto`` takes uvloop and httptools when they are installed (the ``sim`` extra) and falls back to
asyncio and h11 otherwise; the choice is logged and shown in ``GET /sim/stats``. Why uvloop + httptools:
docs/benchmarks.md, "Simulator server".
"""

from __future__ import annotations

import importlib.util
import logging

import uvicorn

from inferwatch.simulator.config import SimConfig
from inferwatch.simulator.server import create_app

log = logging.getLogger("simulator")

LOOPS = ("auto", "uvloop", "asyncio")
HTTPS = ("auto", "httptools", "h11")


def _installed(module: str) -> bool:
    return importlib.util.find_spec(module) is not None


def server_impl(loop: str = "auto", http: str = "auto") -> tuple[str, str]:
    """The uvicorn ``(loop, http)`` to run: ``auto`` prefers uvloop / httptools when importable."""
    if loop not in LOOPS or http not in HTTPS:
        raise ValueError(f"--loop must be one of {LOOPS} and --http one of {HTTPS}")
    if loop == "auto":
        loop = "uvloop" if _installed("uvloop") else "asyncio"
    if http == "auto":
        http = "httptools" if _installed("httptools") else "h11"
    for name in (loop, http):
        if name in ("uvloop", "httptools") and not _installed(name):
            raise ValueError(f"{name} is not installed (pip install {name}, or the 'sim' extra)")
    return loop, http


def serve(config: SimConfig) -> None:
    """Build the app (raises ValueError on an impossible deployment) and serve it."""
    loop, http = server_impl(config.loop, config.http)
    app, sim = create_app(config)
    sim.server_impl = {"loop": loop, "http": http}
    for name, dep in sim.runtime.deployments.items():
        log.info(
            "simulating %s on %s (%s, %.1fB params, %d KV blocks, %d engine(s)) at http://%s:%d scenarios=%s",
            name, dep.hardware.name, dep.quantization, dep.size.params / 1e9, dep.num_gpu_blocks, config.engines,
            config.host, config.port, [s.name for s in config.scenarios] or "none",
        )  # fmt: skip
    log.info("server: loop=%s http=%s", loop, http)
    uvicorn.run(
        app, host=config.host, port=config.port, log_level="warning", access_log=False, lifespan="on",
        loop=loop, http=http,
    )  # fmt: skip
