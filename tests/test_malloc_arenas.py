"""The agent caps glibc's malloc arenas before its threads start, unless the user set MALLOC_ARENA_MAX."""

from __future__ import annotations

import os
import platform
import subprocess
import sys

PROBE = "from inferwatch.agent.cli.serve import cap_malloc_arenas; print(cap_malloc_arenas())"


def _run(env: dict[str, str]) -> str:
    r = subprocess.run([sys.executable, "-c", PROBE], capture_output=True, text=True, env=env, timeout=60)
    assert r.returncode == 0, r.stderr
    return r.stdout.strip()


def test_arenas_capped_on_glibc_and_the_users_setting_wins() -> None:
    env = {k: v for k, v in os.environ.items() if k != "MALLOC_ARENA_MAX"}
    glibc = sys.platform.startswith("linux") and platform.libc_ver()[0] == "glibc"
    # mallopt returns 1 on success: on glibc the cap must take; elsewhere nothing is asked.
    assert _run(env) == str(glibc)
    assert _run({**env, "MALLOC_ARENA_MAX": "4"}) == "False"
