"""Where the agent's megabytes go: the resident memory each dependency's import and a running agent take.

Run: ``python benchmarks/import_cost.py --python VENV/bin/python [--python OTHER/bin/python] [--out FILE]``, each
interpreter a runtime-only install (``requirements.lock`` and a build's wheel, as the image installs them;
engine_scale.py's ``--runtime-venv`` makes one). For each: the RSS of a fresh interpreter after ``import asyncio``
(the floor every agent pays: asyncio loads ssl), then of that plus each dependency alone (what its import adds),
then of the agent's own imports in the order ``inferwatch run`` makes them (:data:`CHAIN`: what each step adds above
the steps before, about what leaving it out would save; a dependency alone overstates that when the agent loads the
same modules elsewhere: httpx alone 10.6 MB, 1.7 MB in the agent, 2026-12-07), then ``python -m inferwatch.agent
run`` with the default collectors, read after 20 s and again after three ``/metrics`` and three status-page requests.
A dependency absent from a venv is reported as absent.
"""

from __future__ import annotations

import argparse
import json
import os
import platform
import socket
import subprocess
import tempfile
import time
import urllib.request
from pathlib import Path

DEPENDENCIES = [
    "msgspec",
    "pydantic",
    "pydantic_settings",
    "fastapi",
    "starlette.applications",
    "uvicorn",
    "httpx",
    "typer",
    "prometheus_client",
    "opentelemetry.sdk.metrics",
    "grpc",
    "psutil",
    "yaml",
    "markdown_it",
    "ddsketch",
    "pynvml",
    "inferwatch.agent.node.app",
]
# What `inferwatch run` imports, in its order: the CLI's root (typer; a command's module is imported when it runs),
# the settings (msgspec, or pydantic in builds before it, then the models), the run command's module, the HTTP API
# (Starlette) with the actions it serves, the collectors, the composition root, the HTTP server (uvicorn). A module
# a build lacks reads as absent (null) and is left out of the steps after it.
CHAIN = [
    "typer",
    "inferwatch.agent.cli.main",
    "pydantic",
    "msgspec",
    "inferwatch.agent.config",
    "inferwatch.agent.cli.run",
    "starlette.applications",
    "inferwatch.agent.node.api.server",
    "inferwatch.agent.node.collectors",
    "inferwatch.agent.node.app",
    "inferwatch.agent.node.quietserver",
]
# What `inferwatch run` calls between those imports (cli/serve.py's serve, before the server's module): uvicorn's
# package __init__ deferred (in cli/serve.py since 9e76476, cli/run.py before). A build without the call skips it.
_HOLDER = "sys.modules.get('inferwatch.agent.cli.serve', inferwatch.agent.cli.run)"
CHAIN_CALLS = {"inferwatch.agent.cli.run": f"import sys\ngetattr({_HOLDER}, 'defer_uvicorn_package_init', bool)()"}


def chain_step(module: str) -> str:
    """One step of :data:`CHAIN` as code: the import, then what the command calls after it."""
    return "\n".join(filter(None, [f"import {module}", CHAIN_CALLS.get(module)]))


RSS = "import sys; print(next(l.split()[1] for l in open('/proc/self/status') if l.startswith('VmRSS')))"


def rss_after(python: str, code: str) -> float | None:
    out = subprocess.run([python, "-c", f"{code}\n{RSS}"], capture_output=True, text=True, cwd=tempfile.gettempdir())
    return round(int(out.stdout.split()[-1]) / 1024, 1) if out.returncode == 0 else None


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


def running_agent(python: str) -> dict[str, float]:
    port = free_port()
    env = {k: v for k, v in os.environ.items() if not k.startswith("INFERWATCH_")}
    proc = subprocess.Popen(
        [python, "-m", "inferwatch.agent", "run", "--port", str(port)],
        cwd=tempfile.gettempdir(),
        env=env,
        stdout=subprocess.DEVNULL,
        stderr=subprocess.DEVNULL,
    )

    def rss() -> float:
        line = next(ln for ln in Path(f"/proc/{proc.pid}/status").read_text().splitlines() if ln.startswith("VmRSS"))
        return round(int(line.split()[1]) / 1024, 1)

    try:
        time.sleep(20)
        started = rss()
        for _ in range(3):
            for path in ("/metrics", "/"):
                urllib.request.urlopen(f"http://127.0.0.1:{port}{path}", timeout=30).read()
        time.sleep(6)
        return {"after_start_mb": started, "after_requests_mb": rss()}
    finally:
        proc.terminate()
        proc.wait(15)


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--python", action="append", required=True, help="a runtime venv's interpreter (repeatable)")
    ap.add_argument("--out", type=Path)
    args = ap.parse_args()
    record = {
        "benchmark": "import_cost",
        "date": time.strftime("%Y-%m-%d %H:%M UTC", time.gmtime()),
        "machine": f"{platform.machine()}, {os.cpu_count()} CPUs",
        "load_average": [round(x, 2) for x in os.getloadavg()],
        "venvs": [],
    }
    for given in args.python:
        python = os.path.abspath(given)  # the venv's own path (not resolved: that would leave the venv); run elsewhere
        floor = rss_after(python, "import asyncio")
        adds = {}
        for dep in DEPENDENCIES:
            total = rss_after(python, f"import asyncio, {dep}")
            adds[dep] = None if total is None or floor is None else round(total - floor, 1)
        version = subprocess.run([python, "-c", "import sys; print(sys.version.split()[0])"], capture_output=True,
                                 text=True).stdout.strip()  # fmt: skip
        chain, before, imported = {}, floor, "import asyncio"
        for module in CHAIN:
            total = rss_after(python, imported + "\n" + chain_step(module))
            if total is None:  # not in this build: the chain goes on without it
                chain[module] = None
                continue
            imported += "\n" + chain_step(module)
            chain[module] = None if before is None else round(total - before, 1)
            before = total
        entry = {"python": python, "version": version, "asyncio_floor_mb": floor, "import_adds_mb": adds}
        entry["chain_adds_mb"] = chain
        entry |= running_agent(python)
        entry["load_average_end"] = [round(x, 2) for x in os.getloadavg()]
        print(json.dumps(entry, indent=1), flush=True)
        record["venvs"].append(entry)  # type: ignore[attr-defined]
    if args.out:
        args.out.write_text(json.dumps(record, indent=1) + "\n")


if __name__ == "__main__":
    main()
