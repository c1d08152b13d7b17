"""inferwatch's Grafana dashboards, generated from code (grafana-foundation-sdk pinned to Grafana 11.6).

``python -m inferwatch.dashboards.generate`` writes ``dashboards/json/<uid>.json``; those committed files are what
Grafana provisioning (docker-compose), ``inferwatch grafana push`` and ``inferwatch assets export`` load (the
wheel ships them as package data, found through ``inferwatch.agent.common.assets.dashboards_dir()``).
tests/test_dashboards.py regenerates them and fails on any difference.
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    from inferwatch.agent.common.assets import Traversable

JSON_DIR = Path(__file__).resolve().parent / "json"  # where the generator writes (the repository's copy)
TARGET_GRAFANA = "11.6"  # grafana-foundation-sdk==1769699379!11.6.0 emits schemaVersion 41


def load_all(directory: Traversable | None = None) -> dict[str, dict[str, Any]]:
    """The dashboards by uid, read from ``directory`` (a Path or package resource; default: those shipped)."""
    if directory is None:
        from inferwatch.agent.common.assets import dashboards_dir

        directory = dashboards_dir()
    out: dict[str, dict[str, Any]] = {}
    for path in sorted((p for p in directory.iterdir() if p.name.endswith(".json")), key=lambda p: p.name):
        data = json.loads(path.read_text(encoding="utf-8"))
        out[str(data["uid"])] = data
    return out
