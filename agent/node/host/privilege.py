"""Hints that depend on who the agent runs as: "run as root" is no advice to an agent that already is root.

Read once per hint from :func:`os.geteuid` (no caching: tests and a setuid-dropping supervisor may change it).
"""

from __future__ import annotations

import os


def running_as_root() -> bool:
    return os.geteuid() == 0


def unless_root(hint: str, as_root: str) -> str:
    """``hint`` (which may say "run as root") for an unprivileged agent, else ``as_root``."""
    return as_root if running_as_root() else hint
