"""docs/metrics.md is generated from the catalog; this fails when it is stale.

Update switch: ``INFERWATCH_UPDATE_GOLDEN=1 pytest tests/test_metrics_docs.py`` (or ``python -m
inferwatch.agent.catalog.docs``).
"""

from __future__ import annotations

import os
import subprocess
from pathlib import Path

from inferwatch.agent import catalog
from inferwatch.agent.catalog.docs import DEFAULT_OUTPUT, render
from tests.conftest import PYTHON, ROOT


def test_metrics_reference_is_current() -> None:
    text = render()
    if os.environ.get("INFERWATCH_UPDATE_GOLDEN") == "1":
        DEFAULT_OUTPUT.write_text(text, encoding="utf-8")
    assert DEFAULT_OUTPUT.read_text(encoding="utf-8") == text, (
        "docs/metrics.md is stale: run `python -m inferwatch.agent.catalog.docs` (or INFERWATCH_UPDATE_GOLDEN=1 pytest)"
    )


def test_every_metric_and_series_is_documented() -> None:
    text = DEFAULT_OUTPUT.read_text(encoding="utf-8")
    for spec in catalog.CATALOG.values():
        assert f"| `{spec.name}` |" in text
        for series in spec.series_names():
            assert f"`{series}`" in text


def test_check_switch_detects_a_stale_file(tmp_path: Path) -> None:
    out = tmp_path / "metrics.md"
    cmd = [PYTHON, "-m", "inferwatch.agent.catalog.docs", "--output", str(out)]
    assert subprocess.run([*cmd, "--check"], cwd=ROOT, capture_output=True, timeout=60).returncode == 1
    assert subprocess.run(cmd, cwd=ROOT, capture_output=True, timeout=60).returncode == 0
    assert subprocess.run([*cmd, "--check"], cwd=ROOT, capture_output=True, timeout=60).returncode == 0
    out.write_text(out.read_text().replace("Wall time", "Wall clock"))
    r = subprocess.run([*cmd, "--check"], cwd=ROOT, capture_output=True, text=True, timeout=60)
    assert r.returncode == 1 and "stale" in r.stderr
