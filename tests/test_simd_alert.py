"""SIMDUnusedWhileServing: promtool checks the rule file and runs its firing and near-miss unit tests."""

from __future__ import annotations

import re
import shutil
import subprocess

import pytest
import yaml

from inferwatch.agent import catalog
from tests.conftest import ROOT

RULES = ROOT / "alerts" / "simd.rules.yml"
TESTS = ROOT / "tests" / "rules" / "simd.test.yml"


def _promtool() -> str:
    exe = shutil.which("promtool")
    if exe is None:
        pytest.fail("promtool not installed (Debian package prometheus; scripts/test.sh installs it)")
    return exe


def test_rules_check_and_unit_tests() -> None:
    promtool = _promtool()
    check = subprocess.run([promtool, "check", "rules", str(RULES)], capture_output=True, text=True, timeout=60)
    assert check.returncode == 0, check.stdout + check.stderr
    test = subprocess.run(
        [promtool, "test", "rules", str(TESTS)], capture_output=True, text=True, timeout=120, cwd=TESTS.parent
    )
    assert test.returncode == 0, test.stdout + test.stderr


def test_unit_test_catches_a_broken_rule(tmp_path) -> None:
    """The unit tests can fail: with the threshold removed, the near-miss cases must fire."""
    promtool = _promtool()
    rules = yaml.safe_load(RULES.read_text())
    rule = rules["groups"][0]["rules"][0]
    rule["expr"] = "inferwatch_runtime_simd_used == 0"
    (tmp_path / "alerts").mkdir()
    (tmp_path / "alerts" / "simd.rules.yml").write_text(yaml.safe_dump(rules))
    tests_dir = tmp_path / "tests" / "rules"
    tests_dir.mkdir(parents=True)
    (tests_dir / "simd.test.yml").write_text(TESTS.read_text())
    test = subprocess.run(
        [promtool, "test", "rules", "simd.test.yml"], capture_output=True, text=True, timeout=120, cwd=tests_dir
    )
    assert test.returncode != 0


def test_rule_uses_catalog_metrics_and_has_runbook() -> None:
    rules = yaml.safe_load(RULES.read_text())
    (rule,) = [r for r in rules["groups"][0]["rules"] if r.get("alert") == "SIMDUnusedWhileServing"]
    for name in ("inferwatch_runtime_simd_used", "inferwatch_runtime_simd_capable"):
        assert name in rule["expr"] and name in catalog.prometheus_series_names()
    runbook = ROOT / "runbooks" / "SIMDUnusedWhileServing.md"
    text = runbook.read_text()
    for section in ("## Meaning", "## Impact", "## Diagnosis", "## Mitigation"):
        assert section in text
    assert "TODO" not in text and not re.search(r"<[A-Za-z_-]+>", text)
