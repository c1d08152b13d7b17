"""The shipped rule files, ``alerts/*.rules.yml``: the one source of alert names.

Everything else that names an alert (runbooks, promtool tests, dashboard panels, findings' ``runbook``,
Alertmanager routes) is checked against :func:`alert_names`, never kept as a second list.
"""

from __future__ import annotations

from functools import cache
from pathlib import Path
from typing import Any

import yaml

from inferwatch.agent.errors import ConfigError

ROOT = Path(__file__).resolve().parents[2]
ALERTS_DIR = ROOT / "alerts"
GENERATED_MARK = "# DO NOT EDIT: generated"  # first line of a rule file another generator writes


def rule_files(directory: Path = ALERTS_DIR) -> list[Path]:
    return sorted(directory.glob("*.rules.yml"))


def is_generated(text: str) -> bool:
    return text.startswith(GENERATED_MARK)


def load(path: Path) -> dict[str, Any]:
    try:
        data = yaml.safe_load(path.read_text(encoding="utf-8"))
    except (OSError, yaml.YAMLError) as exc:
        raise ConfigError(f"cannot read rule file {path}: {exc}") from exc
    if not isinstance(data, dict) or not isinstance(data.get("groups"), list):
        raise ConfigError(f"{path}: expected a mapping with a list of groups")
    return data


def rules(directory: Path = ALERTS_DIR) -> list[dict[str, Any]]:
    """Every rule of every rule file, with ``_file`` and ``_group`` added."""
    out = []
    for path in rule_files(directory):
        for group in load(path)["groups"]:
            for rule in group["rules"]:
                out.append({**rule, "_file": path.name, "_group": group["name"]})
    return out


@cache
def alert_names(directory: Path = ALERTS_DIR) -> frozenset[str]:
    names = frozenset(r["alert"] for r in rules(directory) if "alert" in r)
    if not names:
        raise ConfigError(f"no alerting rules in {directory}/*.rules.yml")
    return names


def check_alert(name: str) -> str:
    """``name`` if a rule file defines that alert, else ConfigError (for code that links a runbook)."""
    if name not in alert_names():
        raise ConfigError(f"{name!r} is not an alert in alerts/*.rules.yml (runbooks are named after alerts)")
    return name
