"""Dashboards as code: regeneration is exact, and every panel follows the house rules.

Static checks only; tests/test_dashboards_data.py proves every panel against a real Prometheus.
"""

from __future__ import annotations

import json
import re
import subprocess

import pytest
import yaml

from inferwatch.agent.catalog import prometheus_series_names
from inferwatch.agent.fleet.prices import PRICE_RECORD
from inferwatch.dashboards import JSON_DIR, load_all
from inferwatch.dashboards.generate import render, render_docs
from inferwatch.dashboards.prove import (
    format_values,
    interpolate,
    panel_queries,
    panels,
    parse_label_values,
    series_names,
    variable_queries,
)
from tests.conftest import PYTHON, ROOT

DASHBOARDS = load_all()
PANEL_TYPES = {"timeseries", "stat", "table", "heatmap"}
# Grafana unit ids used here (public/app/features/.../valueFormats categories), or a custom "suffix:<text>".
GRAFANA_UNITS = {"s", "bytes", "percentunit", "reqps", "short", "none", "hertz", "celsius", "watt", "string"}
# up, and the price series the user's price rules record (agent/fleet/prices.py: generated from their price file by
# `inferwatch prices FILE --rules`, not shipped; tests/test_dashboards_data.py loads the example's).
ALLOWED_EXTRA_SERIES = {"up", PRICE_RECORD}


def _recording_rules() -> set[str]:
    """Names recorded by the repository's rule files (alerts/*.rules.yml)."""
    out: set[str] = set()
    for path in sorted((ROOT / "alerts").glob("*.yml")):
        data = yaml.safe_load(path.read_text()) or {}
        for group in data.get("groups", []) if isinstance(data, dict) else []:
            out |= {r["record"] for r in group.get("rules", []) if "record" in r}
    return out


def _is_allowed(name: str) -> bool:
    return name in prometheus_series_names() or name in ALLOWED_EXTRA_SERIES or name in _recording_rules()


def test_committed_json_matches_generator() -> None:
    rendered = render()
    committed = {p.name: p.read_text(encoding="utf-8") for p in JSON_DIR.glob("*.json")}
    assert sorted(committed) == sorted(rendered), "dashboards/json holds files the generator does not produce"
    for name, text in rendered.items():
        assert committed[name] == text, f"dashboards/json/{name} is stale: run python -m inferwatch.dashboards.generate"


def test_docs_page_matches_the_dashboards() -> None:
    page = ROOT / "docs" / "dashboards.md"
    assert page.read_text(encoding="utf-8") == render_docs(render()), "run python -m inferwatch.dashboards.generate"
    text = page.read_text(encoding="utf-8")
    for d in DASHBOARDS.values():
        for p in panels(d):
            assert f"**{p['title']}**" in text


def test_generate_check_detects_a_hand_edit(tmp_path) -> None:
    for name, text in render().items():
        (tmp_path / name).write_text(text)
    cmd = [PYTHON, "-m", "inferwatch.dashboards.generate", "--check", "--out", str(tmp_path)]
    assert subprocess.run(cmd, cwd=ROOT, capture_output=True).returncode == 0
    victim = tmp_path / "inferwatch-slo.json"
    victim.write_text(victim.read_text().replace('"refresh": "30s"', '"refresh": "5s"'))
    r = subprocess.run(cmd, cwd=ROOT, capture_output=True, text=True)
    assert r.returncode == 1
    assert "inferwatch-slo.json is out of date" in r.stderr


def test_four_dashboards_with_stable_uids() -> None:
    assert sorted(DASHBOARDS) == ["inferwatch-engine", "inferwatch-matrix", "inferwatch-node", "inferwatch-slo"]
    for uid, d in DASHBOARDS.items():
        assert 8 <= len(uid) <= 40
        assert d["schemaVersion"] == 41  # Grafana 11.6 (grafana-foundation-sdk 1769699379!11.6.0)
        assert "id" not in d or d["id"] is None


@pytest.mark.parametrize("uid", sorted(DASHBOARDS))
def test_panel_rules(uid: str) -> None:
    d = DASHBOARDS[uid]
    ids = [p["id"] for p in d["panels"]] + [q["id"] for p in d["panels"] for q in p.get("panels", [])]
    assert len(ids) == len(set(ids)), "panel ids must be unique"
    for p in panels(d):
        where = f"{uid} / {p['title']}"
        assert p["type"] in PANEL_TYPES, where
        assert p["datasource"] == {"type": "prometheus", "uid": "${datasource}"}, where
        unit = p["fieldConfig"]["defaults"].get("unit", "")
        assert unit in GRAFANA_UNITS or unit.startswith("suffix:"), f"{where}: unit {unit!r}"
        desc = p.get("description", "")
        assert len(desc) > 60 and "\n\nRunbook: " in desc, f"{where}: description must say how to read it + runbook"
        assert 0 < p["gridPos"]["w"] <= 24 and p["gridPos"]["x"] + p["gridPos"]["w"] <= 24, where
        refs = [t["refId"] for t in p["targets"]]
        assert refs and len(refs) == len(set(refs)) and all(refs), f"{where}: refIds"
        for t in p["targets"]:
            assert t.get("instant") or p["type"] not in ("stat", "table") or t.get("format") == "heatmap", where


@pytest.mark.parametrize("uid", sorted(DASHBOARDS))
def test_variables(uid: str) -> None:
    d = DASHBOARDS[uid]
    variables = d["templating"]["list"]
    assert variables[0] == {**variables[0], "name": "datasource", "type": "datasource", "query": "prometheus"}
    names = [v["name"] for v in variables]
    assert "job" in names and ("instance" in names if uid != "inferwatch-matrix" else "model" in names)
    if uid in ("inferwatch-slo", "inferwatch-engine"):
        assert {"engine", "instance", "model"} <= set(names)
    defined: set[str] = {"datasource"}
    for v in variable_queries(d):
        assert v["datasource"]["uid"] == "${datasource}"
        expr, label = parse_label_values(v["query"])
        assert expr is not None and label
        used = set(re.findall(r"\$(\w+)", expr))
        assert used <= defined, f"{v['name']} uses a variable defined after it: {used - defined}"
        assert series_names(expr) <= prometheus_series_names()
        defined.add(v["name"])
    for q in panel_queries(d):
        used = {m for m in re.findall(r"\$(\w+)", q.expr) if not m.startswith("__")}
        assert used <= defined, f"{q.panel}: undefined variables {used - defined}"


ALL_QUERIES = [q for d in DASHBOARDS.values() for q in panel_queries(d)]


@pytest.mark.parametrize("q", ALL_QUERIES, ids=[f"{q.dashboard}/{q.panel}/{q.ref_id}" for q in ALL_QUERIES])
def test_every_query_parses_and_names_only_catalog_series(q) -> None:
    names = series_names(q.expr)  # raises on a parse error
    assert names, "a panel query must select at least one series"
    unknown = {n for n in names if not _is_allowed(n)}
    assert not unknown, f"not in agent/catalog: {sorted(unknown)}"
    if "rate(" in q.expr or "increase(" in q.expr:
        assert "$__rate_interval" in q.expr or "$__range" in q.expr or re.search(r"\[\d+[mh]\]", q.expr)


def test_lint_catches_an_unknown_series_and_a_parse_error() -> None:
    assert not _is_allowed("vllm:time_to_first_token_seconds_bucket")
    assert series_names('rate(nope_total{job=~"$job"}[$__rate_interval])') == {"nope_total"}
    with pytest.raises(Exception, match=r"unclosed|unexpected"):
        series_names("sum(rate(up[5m])")


def test_variable_interpolation_matches_grafana() -> None:
    assert format_values(["127.0.0.1:9435"]) == r"127\\.0\\.0\\.1:9435"
    assert format_values(["a", "b+c"]) == r"(a|b\\+c)"
    assert interpolate(
        'x{m=~"$model", i=~"${node}"}[$__rate_interval]', {"model": "(a|b)", "node": "n", "__rate_interval": "1m"}
    ) == ('x{m=~"(a|b)", i=~"n"}[1m]')


def test_runbooks_referenced_exist_once_runbooks_are_present() -> None:
    runbooks = ROOT / "runbooks"
    referenced = {
        m for d in DASHBOARDS.values() for p in panels(d) for m in re.findall(r"runbooks/(\w+)\.md", p["description"])
    }
    assert referenced
    assert runbooks.is_dir(), f"{runbooks} is missing"
    missing = sorted(r for r in referenced if not (runbooks / f"{r}.md").exists())
    assert not missing, f"panels reference runbooks that do not exist: {missing}"


def test_json_is_plain_provisionable_dashboard() -> None:
    for path in JSON_DIR.glob("*.json"):
        data = json.loads(path.read_text())
        assert "dashboard" not in data  # provisioning wants bare dashboard JSON
        assert data["uid"] == path.stem
