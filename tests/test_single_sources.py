"""Lists that exist once: engine kinds (the adapters), quantities (the catalog), alert names (the rule files).

Where a second copy still exists (a constant in a module another change owns, a doc table, a test), these tests
fail as soon as it drifts from the source.
"""

from __future__ import annotations

import ast
import difflib
import json
import re
from pathlib import Path

import yaml

from inferwatch.agent.alerts import rulefiles
from inferwatch.agent.catalog import engine as engine_catalog
from inferwatch.agent.cli import engine as engine_cli
from inferwatch.agent.config import ENGINE_KIND_CHOICES
from inferwatch.agent.node.analytics import latency
from inferwatch.agent.node.engine import adapters, coverage, inspect
from tests.alerting import ALERTMANAGER_YML, RULE_TESTS_DIR, alert_names, load_rules
from tests.conftest import ROOT

CAMEL_RE = re.compile(r"^[A-Z][a-z0-9]+(?:[A-Z][A-Za-z0-9]*)+$")


def test_engine_kinds_come_from_the_adapters() -> None:
    kinds = tuple(adapters.ADAPTERS)
    assert kinds == tuple(a.kind for a in adapters.ADAPTERS.values())
    assert kinds == engine_catalog.ENGINE_KINDS  # detection order, declared once in the catalog
    assert ("auto", *kinds) == ENGINE_KIND_CHOICES
    assert engine_cli.KINDS is ENGINE_KIND_CHOICES
    # docs/engine.md's generated detection table (python -m inferwatch.agent.node.engine.coverage) lists them in order
    doc = (ROOT / "docs" / "engine.md").read_text().split(coverage.DETECTION_HEAD, 1)[1].split("\n\n", 2)[1]
    assert ("auto", *re.findall(r"^\| `(\w+)` \|", doc, re.M)) == ENGINE_KIND_CHOICES, doc


def test_quantities_come_from_the_catalog() -> None:
    q = engine_catalog.QUANTITIES
    assert latency.QUANTITIES is q
    assert adapters.QUANTITIES is q
    assert set(inspect.INSPECT_QUANTITIES) < set(q)
    for adapter in adapters.ADAPTERS.values():
        assert set(adapter.histograms) <= set(q) | set(engine_catalog.REEXPORTED_ONLY), adapter.kind
    doc = engine_catalog.__doc__ or ""
    assert f"Quantities: {', '.join(q)}." in doc  # the catalog's docstring becomes docs/metrics.md
    assert (
        f"quantity: {', '.join(q)};"
        in {s.name: s for s in engine_catalog.METRICS}["inferwatch.engine.latency"].description
    )


def _runbook_literals(path: Path) -> list[tuple[int, str]]:
    """``RUNBOOK* = "X"`` constants and string literals passed as a Finding's runbook."""
    tree = ast.parse(path.read_text(encoding="utf-8"))
    out: list[tuple[int, str]] = []
    for node in ast.walk(tree):
        constant = (
            isinstance(node, ast.Assign) and isinstance(node.value, ast.Constant) and isinstance(node.value.value, str)
        )
        if constant and any(isinstance(t, ast.Name) and t.id.startswith("RUNBOOK") for t in node.targets):
            out.append((node.lineno, node.value.value))
        if isinstance(node, ast.Call) and getattr(node.func, "id", getattr(node.func, "attr", "")) == "Finding":
            args = [*node.args[4:5], *(k.value for k in node.keywords if k.arg == "runbook")]
            out += [(a.lineno, a.value) for a in args if isinstance(a, ast.Constant) and isinstance(a.value, str)]
    return [(n, v) for n, v in out if v and "/" not in v]


def test_runbooks_named_in_code_are_alerts() -> None:
    names = alert_names()
    found = 0
    for path in sorted((ROOT / "agent").rglob("*.py")):
        for line, value in _runbook_literals(path):
            found += 1
            assert value in names, f"{path.relative_to(ROOT)}:{line}: {value!r} is not an alert in alerts/*.rules.yml"
    assert found >= 8, "no runbook constants found: did the convention change?"


def test_alert_names_in_tests_and_routing_are_alerts() -> None:
    names = alert_names()
    for path in sorted(RULE_TESTS_DIR.glob("*.test.yml")):
        for case in yaml.safe_load(path.read_text())["tests"]:
            for check in case.get("alert_rule_test", []):
                assert check["alertname"] in names, f"{path.name}: {check['alertname']} is not an alert"
    routing = ALERTMANAGER_YML.read_text()
    matched = re.findall(r'alertname=~?"([^"]+)"', routing)
    assert matched
    for alternatives in matched:
        for name in alternatives.split("|"):
            assert name in names, f"alertmanager.yml matches {name!r}, which no rule defines"


def test_dashboard_runbook_links_are_alerts() -> None:
    names = alert_names()
    seen = set()
    for path in sorted((ROOT / "dashboards" / "json").glob("*.json")):
        seen |= set(re.findall(r"runbooks/(\w+)\.md", json.dumps(json.load(path.open()))))
    assert seen and seen <= names, sorted(seen - names)


def test_no_near_miss_of_an_alert_name_anywhere_in_the_code() -> None:
    """A CamelCase string one or two letters off an alert name is a typo or a rename that missed a place."""
    names = sorted(alert_names())
    for top in ("agent", "dashboards", "exporters", "simulator", "tests", "benchmarks"):
        for path in sorted((ROOT / top).rglob("*.py")):
            for node in ast.walk(ast.parse(path.read_text(encoding="utf-8"))):
                if isinstance(node, ast.Constant) and isinstance(node.value, str) and CAMEL_RE.match(node.value):
                    close = difflib.get_close_matches(node.value, names, n=1, cutoff=0.85)
                    assert not close or close[0] == node.value, (
                        f"{path.relative_to(ROOT)}:{node.lineno}: {node.value!r} looks like alert {close[0]!r}"
                    )


def test_docs_list_every_alert_once() -> None:
    """docs/alerts.md's table of alerts (with each rule's for:) has one row per alert, no more."""
    text = (ROOT / "docs" / "alerts.md").read_text()
    table = text.split("## The alerts\n", 1)[1].split("\n### ", 1)[0]
    rows = re.findall(r"^\| ([A-Z][A-Za-z0-9]+) \|", table, re.M)
    assert len(rows) == len(set(rows)) and set(rows) == alert_names(), sorted(set(rows) ^ alert_names())


def test_docs_give_every_alert_its_for_and_detection_time() -> None:
    """Each row: the rule's for: and, beside it, its detection time at production timings (issue 15)."""
    text = (ROOT / "docs" / "alerts.md").read_text()
    table = text.split("## The alerts\n", 1)[1].split("\n### ", 1)[0]
    every_for: dict[str, set[str]] = {}
    for r in load_rules():
        if "alert" in r:
            every_for.setdefault(r["alert"], set()).add(r.get("for", "—"))
    fors = {name: next(iter(f)) for name, f in every_for.items() if len(f) == 1}  # burn alerts: one for per window
    for line in re.findall(r"^\| [A-Z][A-Za-z0-9]+ \|.*$", table, re.M):
        cells = [c.strip() for c in line.strip("|").split(" | ")]
        assert len(cells) == 5, line
        name, _, _, for_, detection = cells
        if name in fors:
            assert for_ == fors[name], (name, for_, fors[name])
        assert re.search(r"\d+m|\d+ s|60 s", detection) and ("computed" in detection or "measured" in detection), line


def test_the_rule_file_reader_is_the_tests_reader() -> None:
    assert alert_names() == set(rulefiles.alert_names())
    assert len(alert_names()) >= 15
