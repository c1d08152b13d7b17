"""The layout says what runs where, and each part sees only what it needs (issue 32).

- agent/'s root holds the shared pieces and one folder per kind of program (node daemon, doctor, fleet tools, CLI,
  rule tooling), nothing else: a new module goes into the folder of the program it belongs to;
- only the composition (the node daemon's wiring, app and engine-target supervisor, the collector registry and its
  docs generator, the doctor and the CLI, which build the daemon's parts) takes the whole ``Settings``; every other
  function or constructor takes its section or the values it reads, so it cannot read the API tokens and a test
  builds it without building the world.
"""

from __future__ import annotations

import ast

from tests.conftest import ROOT

AGENT = ROOT / "agent"
ROOT_ENTRIES = {
    "__init__.py", "__main__.py", "config", "errors.py", "clienttrace.py", "catalog", "common", "cli", "doctor",
    "fleet", "node", "alerts", "_assets",
}  # fmt: skip
# modules allowed a parameter annotated Settings: the composition and its direct clients (paths under agent/)
COMPOSITION = (
    "config/",
    "cli/",
    "doctor/",
    "node/app.py",
    "node/wiring.py",
    "node/targets.py",
    "node/collectors/__init__.py",
    "node/collectors/registry.py",
    "node/collectordocs.py",
)


def test_agent_root_holds_only_the_shared_pieces_and_one_folder_per_program() -> None:
    entries = {p.name for p in AGENT.iterdir() if p.name != "__pycache__"}
    assert entries == ROOT_ENTRIES, f"unexpected in agent/: {sorted(entries - ROOT_ENTRIES)}"


def _settings_params(tree: ast.AST) -> list[tuple[int, str]]:
    out = []
    for node in ast.walk(tree):
        if isinstance(node, ast.FunctionDef | ast.AsyncFunctionDef):
            args = [*node.args.posonlyargs, *node.args.args, *node.args.kwonlyargs]
            for a in args:
                if (
                    isinstance(a.annotation, ast.Name | ast.Constant)
                    and (a.annotation.id if isinstance(a.annotation, ast.Name) else a.annotation.value) == "Settings"
                ):
                    out.append((node.lineno, f"{node.name}({a.arg}: Settings)"))
        if (
            isinstance(node, ast.AnnAssign)
            and isinstance(node.annotation, ast.Name)
            and node.annotation.id == "Settings"
        ):
            out.append((node.lineno, "a field or variable of type Settings"))
    return out


def test_only_the_composition_takes_the_whole_settings() -> None:
    found = []
    for path in sorted(AGENT.rglob("*.py")):
        rel = path.relative_to(AGENT).as_posix()
        if rel.startswith(COMPOSITION):
            continue
        for lineno, what in _settings_params(ast.parse(path.read_text(encoding="utf-8"))):
            found.append(f"agent/{rel}:{lineno}: {what}")
    assert not found, "take the settings section (or the values) instead:\n" + "\n".join(found)


def test_the_check_finds_a_part_that_takes_the_whole_settings() -> None:
    tree = ast.parse("def f(x: int, settings: Settings) -> None: ...\nclass A:\n    settings: Settings\n")
    assert [w for _, w in _settings_params(tree)] == ["f(settings: Settings)", "a field or variable of type Settings"]
