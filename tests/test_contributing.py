"""The lints CONTRIBUTING.md's recipes rely on: a step left out of a recipe fails here (or in the test named).

- host collector: catalog entry (emitted, documented: test_metrics_docs), registry entry, collectors.md row,
  tests/test_<name>.py;
- engine adapter: a recorded fixture it detects, the engine.kind row (test_single_sources);
- alert: runbook (test_runbooks), firing + near-miss promtool cases and generated links (test_alert_rules),
  a row in docs/alerts.md (test_single_sources), metrics from the catalog (test_alert_rules), the runbook's
  expected evidence (test_runbooks_exec).
"""

from __future__ import annotations

import ast
import re
import subprocess

import pytest

from inferwatch.agent.catalog import CATALOG
from inferwatch.agent.catalog.engine import QUANTITIES, REEXPORTED_ONLY
from inferwatch.agent.node.collectors import REGISTRY
from inferwatch.agent.node.engine import adapters
from inferwatch.agent.node.engine.scrape import EngineParser
from tests.conftest import FIXTURES, PYTHON, ROOT

ENGINES = FIXTURES / "engines"


def test_every_collector_is_in_the_docs_table() -> None:
    text = (ROOT / "docs" / "collectors.md").read_text()
    table = text.split("| collector | default | interval | reads |", 1)[1].split("\n\n", 1)[0]
    rows = re.findall(r"^\| `([a-z0-9_]+)` \|", table, re.M)
    assert len(rows) == len(set(rows)) and set(rows) == set(REGISTRY), sorted(set(rows) ^ set(REGISTRY))


@pytest.mark.parametrize("name", sorted(REGISTRY))
def test_every_collector_has_its_test_file_and_a_description(name: str) -> None:
    files = [ROOT / "tests" / f"test_{name}.py", ROOT / "tests" / f"test_{name}_collector.py"]
    assert any(f.is_file() for f in files), f"collector {name}: add tests/test_{name}.py (recorded inputs)"
    assert REGISTRY[name].cls.description.strip(), f"collector {name}: set description (shown by the status API)"


def test_every_catalog_metric_is_emitted_by_some_code() -> None:
    """A metric declared in the catalog but named nowhere else is a half-done collector."""
    literals: set[str] = set()
    for top in ("agent", "exporters"):
        for path in (ROOT / top).rglob("*.py"):
            if "catalog" in path.relative_to(ROOT).parts:
                continue
            for node in ast.walk(ast.parse(path.read_text(encoding="utf-8"))):
                if isinstance(node, ast.Constant) and isinstance(node.value, str):
                    literals.add(node.value)
    unused = sorted(set(CATALOG) - literals)
    assert not unused, f"declared in agent/catalog but emitted nowhere: {unused}"


@pytest.mark.parametrize("kind", list(adapters.ADAPTERS))
def test_every_adapter_has_a_recorded_fixture_it_detects(kind: str) -> None:
    fixtures = sorted(ENGINES.glob(f"{kind}-*.prom")) + sorted(ENGINES.glob(f"*-{kind}-*.prom"))
    assert fixtures, f"adapter {kind}: add tests/fixtures/engines/{kind}-<version>.prom and its .SOURCE.md note"
    for path in fixtures:
        assert path.with_name(path.name + ".SOURCE.md").is_file(), f"{path.name}: no .SOURCE.md note"
        data = path.read_bytes()
        # A capture may have lost the final newline every exporter writes (the DataDog vLLM copy did).
        reading = EngineParser("auto", "unknown").parse(data if data.endswith(b"\n") else data + b"\n")
        assert reading.kind == kind, f"{path.name}: detected as {reading.kind}"
        assert reading.models, f"{path.name}: no model read"
        for model in reading.models.values():
            assert set(model.histograms) <= set(QUANTITIES) | set(REEXPORTED_ONLY)
            mapped = model.histograms or model.gauges or model.counters or model.lora is not None
            assert mapped, f"{path.name}: nothing mapped"


def test_make_generate_runs_every_generator() -> None:
    """A module with a ``--check`` switch is a generator; ``make generate`` / ``check-generated`` must run it."""
    makefile = (ROOT / "Makefile").read_text()
    listed = set(re.search(r"^GENERATORS := (.+)$", makefile, re.M).group(1).split())  # type: ignore[union-attr]
    found = set()
    packages = {"agent": "inferwatch.agent", "dashboards": "inferwatch.dashboards", "deploy": "deploy"}  # setup.py
    for top, name in packages.items():
        for path in (ROOT / top).rglob("*.py"):
            if '"--check"' in path.read_text(encoding="utf-8"):
                found.add(".".join((name, *path.relative_to(ROOT / top).with_suffix("").parts)))
    assert found == listed, f"Makefile GENERATORS: missing {sorted(found - listed)}, extra {sorted(listed - found)}"


@pytest.mark.parametrize(
    "generator",
    re.search(r"^GENERATORS := (.+)$", (ROOT / "Makefile").read_text(), re.M).group(1).split(),  # type: ignore[union-attr]
)
def test_every_generated_file_is_fresh(generator: str) -> None:
    """``make check-generated``, one generator at a time: a hand edit to a generated file, or a source changed
    without ``make generate``, fails here with the generator's name."""
    r = subprocess.run([PYTHON, "-m", generator, "--check"], cwd=ROOT, capture_output=True, text=True, timeout=120)
    assert r.returncode == 0, f"{generator} --check: run make generate\n{r.stdout[-1500:]}{r.stderr[-1500:]}"
