"""Runbooks: one per alert with the four sections and no placeholders, served by the agent at /runbooks/<name>."""

from __future__ import annotations

import re

import httpx
import pytest

from agent.runbooks import Runbooks, to_html
from tests.alerting import PLACEHOLDER_RE, RUNBOOKS_DIR, alert_names
from tests.conftest import PYTHON, ROOT, free_port
from tests.procs import running, wait_http

SECTIONS = ("Meaning", "Impact", "Diagnosis", "Mitigation")


def test_every_alert_has_a_complete_runbook() -> None:
    names = alert_names()
    assert len(names) >= 15
    for name in sorted(names):
        path = RUNBOOKS_DIR / f"{name}.md"
        assert path.is_file(), f"{name}: no runbooks/{name}.md"
        text = path.read_text(encoding="utf-8")
        assert text.startswith(f"# {name}\n"), f"{name}: the alert name must be the H1"
        headings = re.findall(r"^## (.+)$", text, re.M)
        assert [h for h in headings if h in SECTIONS] == list(SECTIONS), f"{name}: sections {headings}"
        for section in SECTIONS:
            body = text.split(f"## {section}\n", 1)[1].split("\n## ", 1)[0]
            assert len(body.split()) >= 15, f"{name}: section {section} is too thin"
        assert "```" in text.split("## Diagnosis\n", 1)[1], f"{name}: Diagnosis needs copy-pasteable commands"
        hit = PLACEHOLDER_RE.search(text)
        assert hit is None, f"{name}: placeholder text {hit.group(0)!r}"


def test_runbooks_named_by_the_agent_exist() -> None:
    """Findings name a runbook (``RUNBOOK... = "AlertName"`` in agent/); each must be a real runbook file."""
    named = set()
    for path in (ROOT / "agent").rglob("*.py"):
        named |= set(re.findall(r'^RUNBOOK\w* = "([A-Z][A-Za-z0-9]+)"', path.read_text(), re.M))
    assert named, "no runbook constants found: did the convention change?"
    missing = sorted(n for n in named if not (RUNBOOKS_DIR / f"{n}.md").is_file())
    assert not missing, f"findings link runbooks that do not exist: {missing}"


def test_no_orphan_runbooks() -> None:
    files = {p.stem for p in RUNBOOKS_DIR.glob("*.md")} - {"README"}
    assert files <= alert_names(), f"runbooks without an alert: {sorted(files - alert_names())}"


@pytest.mark.parametrize("text", ["Run it. TODO: add command", "see <pid>", "XXX", "value {{ $labels.x }}", "TBD"])
def test_placeholder_lint_catches(text: str) -> None:
    assert PLACEHOLDER_RE.search(text)


def test_runbook_facts_that_are_easy_to_get_wrong() -> None:
    cpu = (RUNBOOKS_DIR / "CPUFeatureMissing.md").read_text()
    assert "Graviton3 (Neoverse V1) has SVE but not SVE2" in cpu
    assert "arm64.nosve" in cpu and "id_aa64pfr0.sve=0" in cpu and "CONFIG_ARM64_SVE" in cpu
    pc = (RUNBOOKS_DIR / "PageCachePressureTailLatency.md").read_text()
    assert "model size" in pc and "140 GB" in pc and "INFERWATCH_PAGECACHE__INACTIVE_FILE_THRESHOLD_BYTES" in pc


def test_lookup_never_leaves_the_directory(tmp_path) -> None:
    (tmp_path / "Good.md").write_text("# Good\n")
    (tmp_path / "secret.txt").write_text("secret")
    rb = Runbooks.load(tmp_path)
    assert rb.names() == ["Good"] and rb.read("Good") == "# Good\n"
    for bad in ("../secret", "secret.txt", "Good.md", "..", "/etc/passwd", "Good/../Good", "good", "", "A" * 300):
        assert rb.read(bad) is None, bad
    assert "<script>" not in to_html("X", "<script>alert(1)</script>")


def test_agent_serves_runbooks(tmp_path) -> None:
    port = free_port()
    cmd = [PYTHON, "-m", "agent", "run", "--port", str(port), "--interval", "5"]
    env = {"INFERWATCH_RUNBOOKS__BASE_URL": "https://runbooks.example.org/inferwatch/"}
    with running(cmd, tmp_path / "agent.log", cwd=ROOT, env=env) as proc:
        base = f"http://127.0.0.1:{port}"
        wait_http(f"{base}/healthz", proc=proc)
        r = httpx.get(f"{base}/runbooks/CPUFeatureMissing")
        assert r.status_code == 200 and r.headers["content-type"] == "text/markdown; charset=utf-8"
        assert r.text == (RUNBOOKS_DIR / "CPUFeatureMissing.md").read_text()
        h = httpx.get(f"{base}/runbooks/CPUFeatureMissing", headers={"Accept": "text/html,*/*"})
        assert h.headers["content-type"].startswith("text/html") and "<pre" in h.text and "arm64.nosve" in h.text
        assert httpx.get(f"{base}/runbooks/CPUFeatureMissing?format=html").text == h.text
        index = httpx.get(f"{base}/runbooks").json()["runbooks"]
        assert {"alert": "Watchdog", "url": "https://runbooks.example.org/inferwatch/Watchdog"} in index
        for bad in ("NoSuchAlert", "..%2F..%2Fetc%2Fpasswd", "%2e%2e", "CPUFeatureMissing.md", "..%2Fpyproject"):
            assert httpx.get(f"{base}/runbooks/{bad}").status_code == 404, bad
        raw = httpx.get(f"{base}/runbooks/../pyproject.toml")  # a client normalises ..; must not be the file
        assert "[project]" not in raw.text
        assert httpx.get(f"{base}/metrics").status_code == 200  # still serving
