"""Helpers shared by the alerting tests: rule files, the Debian tools, rule-file parsing."""

from __future__ import annotations

import re
import shutil
import subprocess
from pathlib import Path
from typing import Any

import pytest

from inferwatch.agent.alerts import rulefiles
from tests.conftest import ROOT

ALERTS_DIR = ROOT / "alerts"
RULE_TESTS_DIR = ROOT / "tests" / "rules"
RUNBOOKS_DIR = ROOT / "runbooks"
ALERTMANAGER_YML = ALERTS_DIR / "alertmanager.yml"
TOOL_TIMEOUT_S = 120


def rule_files() -> list[Path]:
    return rulefiles.rule_files(ALERTS_DIR)


def rule_test_files() -> list[Path]:
    return sorted(RULE_TESTS_DIR.glob("*.test.yml"))


def load_rules() -> list[dict[str, Any]]:
    """Every rule of every rule file, with ``_file`` and ``_group`` added."""
    return rulefiles.rules(ALERTS_DIR)


def alert_names() -> set[str]:
    return set(rulefiles.alert_names(ALERTS_DIR))


def tool(name: str) -> str:
    path = shutil.which(name)
    if path is None:
        pytest.fail(f"{name} not found: apt-get install -y --no-install-recommends prometheus prometheus-alertmanager")
    return path


def run_tool(*args: str | Path, cwd: Path = ROOT) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [str(a) for a in args], cwd=cwd, capture_output=True, text=True, timeout=TOOL_TIMEOUT_S, check=False
    )


PLACEHOLDER_RE = re.compile(r"\bTODO\b|\bTBD\b|\bXXX\b|\bFIXME\b|<[A-Za-z_][A-Za-z0-9_ -]*>|\{\{|\bplaceholder\b", re.I)
