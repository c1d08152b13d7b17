"""The shipped assets (agent/common/assets.py): one source in the repository, every file reachable, ``assets
export``."""

from __future__ import annotations

import re
from pathlib import Path

import pytest
from typer.testing import CliRunner

from inferwatch.agent.cli.main import app
from inferwatch.agent.common import assets
from inferwatch.agent.common.runbooks import Runbooks
from inferwatch.agent.errors import AssetError
from tests.alerting import alert_names, run_tool
from tests.conftest import ROOT
from tests.tools import require

RULE_FILES = sorted((ROOT / "alerts").glob("*.rules.yml"))  # the shipped rule files


def repository_assets() -> dict[str, Path]:
    """Export path → the repository file it must be a byte-exact copy of (the single source)."""
    out = {f"rules/{p.name}": p for p in sorted((ROOT / "alerts").glob("*.rules.yml"))}
    out["alertmanager.yml"] = ROOT / "alerts" / "alertmanager.yml"
    out["slo.yml"] = ROOT / "alerts" / "slo.yml"
    out |= {f"dashboards/{p.name}": p for p in sorted((ROOT / "dashboards" / "json").glob("*.json"))}
    out |= {f"runbooks/{p.name}": p for p in sorted((ROOT / "runbooks").glob("*.md"))}
    return out


def test_package_links_are_the_top_level_directories_not_copies() -> None:
    for name in ("alerts", "runbooks"):
        link = ROOT / "agent" / "_assets" / name
        assert link.is_symlink(), f"agent/_assets/{name} must be a symlink to {name}/ (no committed copy)"
        assert link.resolve() == (ROOT / name).resolve()
    for directory, pattern in (("alerts", "*.yml"), ("runbooks", "*.md"), ("dashboards/json", "*.json")):
        present = {p.name for p in (ROOT / directory).iterdir()}
        shipped = {p.name for p in (ROOT / directory).glob(pattern)}  # pyproject.toml's package-data patterns
        assert present == shipped, f"{directory}/ holds {sorted(present - shipped)}, which the package omits"


def test_catalog_is_every_repository_asset_byte_for_byte() -> None:
    expected = repository_assets()
    got = {a.path: a for a in assets.catalog()}
    assert sorted(got) == sorted(expected)
    assert len([p for p in got if p.startswith("rules/")]) == len(RULE_FILES) >= 5 and len(got) >= 25
    for path, source in expected.items():
        assert got[path].read_bytes() == source.read_bytes(), path


def test_runbooks_served_from_the_package_cover_every_alert() -> None:
    runbooks = Runbooks.load()
    assert set(runbooks.names()) == alert_names()  # runbooks/README.md is about the runbooks, not one of them
    assert runbooks.read("Watchdog") == (ROOT / "runbooks" / "Watchdog.md").read_text(encoding="utf-8")


def test_find_by_path_name_or_stem() -> None:
    assert assets.find("rules/slo.rules.yml").path == "rules/slo.rules.yml"
    assert assets.find("slo.rules.yml").path == "rules/slo.rules.yml"
    assert assets.find("AgentDown").path == "runbooks/AgentDown.md"
    assert assets.find("inferwatch-engine").path == "dashboards/inferwatch-engine.json"
    with pytest.raises(AssetError, match=re.escape("ambiguous: rules/slo.rules.yml, slo.yml")):
        assets.find("slo")
    for bad in ("NoSuchAlert", "../pyproject.toml", "runbooks/../../pyproject.toml", ""):
        with pytest.raises(AssetError, match="no shipped asset"):
            assets.find(bad)


def test_a_missing_asset_says_the_install_is_incomplete(tmp_path: Path) -> None:
    with pytest.raises(AssetError, match=r"no \*\.md in .*installation is incomplete"):
        assets._listing(tmp_path, ".md")
    with pytest.raises(AssetError, match=r"slo\.yml not found"):
        assets._file(tmp_path, "slo.yml")


def test_export_writes_the_layout_and_never_clobbers(tmp_path: Path) -> None:
    out = tmp_path / "out"
    written = assets.export(out)
    expected = repository_assets()
    assert sorted(p.relative_to(out).as_posix() for p in written) == sorted(expected)
    for rel, source in expected.items():
        assert (out / rel).read_bytes() == source.read_bytes(), rel

    (out / "runbooks" / "AgentDown.md").write_text("edited by the user\n")
    (out / "rules" / "mine.rules.yml").write_text("groups: []\n")
    with pytest.raises(AssetError, match=r"would overwrite .*pass --force"):
        assets.export(out)
    assert (out / "runbooks" / "AgentDown.md").read_text() == "edited by the user\n"
    assets.export(out, overwrite=True)
    assert (out / "runbooks" / "AgentDown.md").read_bytes() == expected["runbooks/AgentDown.md"].read_bytes()
    assert (out / "rules" / "mine.rules.yml").read_text() == "groups: []\n", "export must not delete files"


def test_cli_list_show_export(tmp_path: Path) -> None:
    runner = CliRunner()
    listed = runner.invoke(app, ["assets", "list"])
    assert listed.exit_code == 0, listed.output
    assert listed.output.splitlines() == [a.path for a in assets.catalog()]

    shown = runner.invoke(app, ["assets", "show", "TTFTErrorBudgetBurn"])
    assert shown.exit_code == 0
    assert shown.stdout_bytes == (ROOT / "runbooks" / "TTFTErrorBudgetBurn.md").read_bytes()
    for bad in ("slo", "NoSuchThing"):
        r = runner.invoke(app, ["assets", "show", bad])
        assert r.exit_code == 1 and "inferwatch: " in r.output, bad

    out = tmp_path / "exported"
    first = runner.invoke(app, ["assets", "export", str(out)])
    assert first.exit_code == 0, first.output
    assert (
        f"to {out}: rules/ ({len(RULE_FILES)}), alertmanager.yml, slo.yml, dashboards/ (4), runbooks/ (" in first.output
    )
    again = runner.invoke(app, ["assets", "export", str(out)])
    assert again.exit_code == 1 and "--force" in again.output
    assert runner.invoke(app, ["assets", "export", str(out), "--force"]).exit_code == 0


@pytest.mark.integration
def test_exported_rules_and_alertmanager_config_pass_promtool_and_amtool(tmp_path: Path) -> None:
    promtool, amtool = require("promtool"), require("amtool")
    out = tmp_path / "exported"
    assets.export(out)
    rules = sorted((out / "rules").glob("*.yml"))
    checked = run_tool(promtool, "check", "rules", *rules, cwd=tmp_path)
    assert checked.returncode == 0, checked.stdout + checked.stderr
    assert checked.stdout.count("SUCCESS") == len(rules) == len(RULE_FILES)
    am = run_tool(amtool, "check-config", out / "alertmanager.yml", cwd=tmp_path)
    assert am.returncode == 0 and "SUCCESS" in am.stdout, am.stdout + am.stderr
