"""Helpers shared by the alerting tests: rule files, the Debian tools, rule-file parsing, a real Alertmanager."""

from __future__ import annotations

import contextlib
import re
import shutil
import subprocess
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from inferwatch.agent.alerts import rulefiles
from tests.conftest import ROOT, free_port
from tests.procs import running, wait_http

ALERTS_DIR = ROOT / "alerts"
RULE_TESTS_DIR = ROOT / "tests" / "rules"
RUNBOOKS_DIR = ROOT / "runbooks"
ALERTMANAGER_YML = ALERTS_DIR / "alertmanager.yml"
TOOL_TIMEOUT_S = 600  # a hang guard: promtool over one rule-test file takes 5-13 s of CPU alone, minutes at CI's load


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


def run_tool(
    *args: str | Path, cwd: Path = ROOT, timeout_s: float = TOOL_TIMEOUT_S
) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [str(a) for a in args], cwd=cwd, capture_output=True, text=True, timeout=timeout_s, check=False
    )


@contextlib.contextmanager
def alertmanager(cfg: Path, workdir: Path) -> Iterator[str]:
    """The real Alertmanager on 127.0.0.1 with the configuration ``cfg``, alone (no cluster); yields its URL."""
    port = free_port()
    cmd = [tool("prometheus-alertmanager"), f"--config.file={cfg}", f"--storage.path={workdir / 'am'}"]
    cmd += [f"--web.listen-address=127.0.0.1:{port}", "--cluster.listen-address="]
    with running(cmd, workdir / "am.log") as am:
        wait_http(f"http://127.0.0.1:{port}/-/ready", ok=lambda r: r.status_code == 200, proc=am, timeout_s=60)
        yield f"http://127.0.0.1:{port}"


PLACEHOLDER_RE = re.compile(r"\bTODO\b|\bTBD\b|\bXXX\b|\bFIXME\b|<[A-Za-z_][A-Za-z0-9_ -]*>|\{\{|\bplaceholder\b", re.I)
