"""inferwatch's Grafana dashboards, generated from code (grafana-foundation-sdk pinned to Grafana 11.6).

``python -m dashboards.generate`` writes ``dashboards/json/<uid>.json``; those committed files are what
Grafana provisioning (docker-compose) and ``inferwatch grafana push`` load. tests/test_dashboards.py
regenerates them and fails on any difference.
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

JSON_DIR = Path(__file__).resolve().parent / "json"
TARGET_GRAFANA = "11.6"  # grafana-foundation-sdk==1769699379!11.6.0 emits schemaVersion 41


def load_all(directory: Path = JSON_DIR) -> dict[str, dict[str, Any]]:
    """The committed dashboards by uid, read from ``directory``."""
    out: dict[str, dict[str, Any]] = {}
    for path in sorted(directory.glob("*.json")):
        data = json.loads(path.read_text(encoding="utf-8"))
        out[str(data["uid"])] = data
    return out
