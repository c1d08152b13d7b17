"""The optional C extension ``_fastparse`` (``_fastparse.c``, built by ``pip install`` where a C compiler and the
Python headers are there): loaded here, below every module that selects a compiled step (bulkparse.py, seriesmaps.py,
limits.py), so none of them imports another for it."""

from __future__ import annotations

import os
from typing import Any

PURE_ENV = "INFERWATCH_PURE_PARSER"  # set (not "" or "0"): the pure-Python steps even where the extension is built


def compiled_module() -> Any:
    """The extension, or None where it is not built or the environment asks for the pure-Python steps."""
    if os.environ.get(PURE_ENV, "") not in ("", "0"):
        return None
    try:
        from inferwatch.agent.node.engine import _fastparse  # type: ignore[attr-defined]
    except ImportError:
        return None
    return _fastparse
