"""Run the simulator under uvicorn until SIGINT/SIGTERM."""

from __future__ import annotations

import logging

import uvicorn

from simulator.config import SimConfig
from simulator.server import create_app

log = logging.getLogger("simulator")


def serve(config: SimConfig) -> None:
    """Build the app (raises ValueError on an impossible deployment) and serve it."""
    app, sim = create_app(config)
    for name, dep in sim.runtime.deployments.items():
        log.info(
            "simulating %s on %s (%s, %.1fB params, %d KV blocks, %d engine(s)) at http://%s:%d scenarios=%s",
            name, dep.hardware.name, dep.quantization, dep.size.params / 1e9, dep.num_gpu_blocks, config.engines,
            config.host, config.port, [s.name for s in config.scenarios] or "none",
        )  # fmt: skip
    uvicorn.run(app, host=config.host, port=config.port, log_level="warning", access_log=False, lifespan="on")
