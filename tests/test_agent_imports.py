"""What the agent process leaves unimported: modules it never runs cost RSS in every node's agent.

Each check runs in a fresh interpreter (this one has imported the test suite's own dependencies).
"""

from __future__ import annotations

import subprocess

from tests.conftest import PYTHON, ROOT


def _modules_after(code: str) -> set[str]:
    """Modules imported after `code` in a fresh interpreter (a None entry in sys.modules is a blocked import)."""
    script = f"import sys\n{code}\nprint('\\n'.join(sorted(k for k, m in sys.modules.items() if m is not None)))"
    out = subprocess.run([PYTHON, "-c", script], cwd=ROOT, capture_output=True, text=True, timeout=120, check=True)
    return set(out.stdout.split())


def test_the_agent_imports_jsonschema_only_for_the_probe() -> None:
    assert "jsonschema" not in _modules_after("import inferwatch.agent.node.app")
    first_probe = "from inferwatch.agent.node.probe.schema import validate_payload\nvalidate_payload('openai', {}, 0)"
    assert "jsonschema" in _modules_after(first_probe)


def test_a_served_agent_does_not_import_trio_through_httpcore() -> None:
    # trio comes with selenium, which the test command installs: without it this check would say nothing.
    assert "trio" in _modules_after("import trio"), "trio is not installed: the test command's selenium brings it"
    # What serve() does before it builds the agent, then the agent's first HTTP client.
    code = (
        "from inferwatch.agent.cli.run import block_unused_imports\n"
        "block_unused_imports()\nimport httpx\nhttpx.Client()"
    )
    mods = _modules_after(code)
    assert "httpcore._synchronization" in mods and "trio" not in mods
    # Without the block the same client imports it: the check above is not vacuous.
    assert "trio" in _modules_after("import httpx\nhttpx.Client()")
