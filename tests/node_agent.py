"""Run the real agent (settings from INFERWATCH_* like ``inferwatch run``) with an optional fake NVML.

Used by tests/test_dashboards_data.py to stand up several "nodes" on one machine: each agent gets its own
port, sysfs root (DMI product_name = machine type) and, for a GPU hardware profile, a fake NVML device
named like that GPU (no GPU exists here; NVML is the hardware boundary, faked as tests/fake_nvml.py does
for the GPU collector's own tests). Everything else is the agent as shipped.

    python -m tests.node_agent            (env: INFERWATCH_*, DASH_FAKE_GPU="NVIDIA H100 80GB HBM3")
"""

from __future__ import annotations

import os

from inferwatch.agent.config import load_settings
from inferwatch.agent.node import quietserver
from inferwatch.agent.node.app import Agent
from inferwatch.agent.node.wiring import build_deps


def main() -> None:
    settings = load_settings()
    nvml = None
    gpu = os.environ.get("DASH_FAKE_GPU")
    if gpu:
        from tests.fake_nvml import FakeGPU, FakeNVML

        nvml = FakeNVML([FakeGPU(name=gpu)])
    agent = Agent(settings, build_deps(settings, nvml=nvml))
    agent.start()
    try:
        quietserver.serve(  # the server `inferwatch run` uses
            agent.asgi(),
            host=settings.listen_address,
            port=settings.listen_port,
            log_level="warning",
            access_log=False,
        )
    finally:
        agent.stop()


if __name__ == "__main__":
    main()
