"""The agent under ``tracemalloc`` for benchmarks/soak.py: a snapshot every ``SOAK_SNAPSHOT_S`` seconds.

Run as ``python benchmarks/soak_agent.py run [agent options]`` with ``SOAK_TRACEMALLOC_DIR`` set; snapshots
are ``snap-<seconds since start>.bin`` there, read back by ``benchmarks/soak.py --diff DIR``. Not a test.
"""

from __future__ import annotations

import gc
import os
import sys
import threading
import time
import tracemalloc
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
if str(ROOT) not in sys.path:
    sys.path.insert(0, str(ROOT))


def _snapshots(folder: Path, every_s: float) -> None:
    t0 = time.monotonic()
    while True:
        time.sleep(every_s)
        gc.collect()
        tracemalloc.take_snapshot().dump(str(folder / f"snap-{round(time.monotonic() - t0)}.bin"))


def main() -> None:
    folder = Path(os.environ["SOAK_TRACEMALLOC_DIR"])
    every_s = float(os.environ.get("SOAK_SNAPSHOT_S", "300"))
    tracemalloc.start(25)
    threading.Thread(target=_snapshots, args=(folder, every_s), daemon=True).start()
    from inferwatch.agent.cli.main import main as agent_main

    sys.argv = ["inferwatch", *sys.argv[1:]]
    agent_main()


if __name__ == "__main__":
    main()
