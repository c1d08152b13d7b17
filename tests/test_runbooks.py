"""Runbooks: one per alert with the four sections and no placeholders, served by the agent at /runbooks/<name>."""

from __future__ import annotations

import contextlib
import re

import httpx
import pytest

from inferwatch.agent.common.runbooks import Runbooks, to_html, wants_markdown
from tests.alerting import PLACEHOLDER_RE, RUNBOOKS_DIR, alert_names, load_rules
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


def test_engine_down_runbook_counts_what_the_rule_and_the_defaults_say() -> None:
    """The Meaning's figures come from the rule's ``for``, Prometheus's evaluation interval (deploy/prometheus.yml)
    and the agent's default interval, not from memory."""
    import yaml

    from inferwatch.agent.config import DEFAULT_INTERVAL_S

    (rule,) = [r for r in load_rules() if r.get("alert") == "EngineDown"]
    for_s = int(rule["for"].removesuffix("s"))
    glob = yaml.safe_load((ROOT / "deploy" / "prometheus.yml").read_text(encoding="utf-8"))["global"]
    eval_s = int(glob["evaluation_interval"].removesuffix("s"))
    reads = for_s // eval_s + 1  # pending at the first evaluation that reads 0, firing once for_s has passed
    words = {3: "three", 4: "four", 5: "five", 6: "six"}
    meaning = (RUNBOOKS_DIR / "EngineDown.md").read_text().split("## Meaning\n", 1)[1].split("\n## ", 1)[0]
    meaning = " ".join(meaning.split())
    assert f"For {for_s} seconds (`for: {rule['for']}`: {words[reads]} rule evaluations in a row" in meaning, meaning
    assert f"at Prometheus's {eval_s} s interval" in meaning
    assert f"The agent reads the engine every {DEFAULT_INTERVAL_S:g} s (`interval_s`)" in meaning


def test_lookup_never_leaves_the_directory(tmp_path) -> None:
    (tmp_path / "Good.md").write_text("# Good\n")
    (tmp_path / "secret.txt").write_text("secret")
    rb = Runbooks.load(tmp_path)
    assert rb.names() == ["Good"] and rb.read("Good") == "# Good\n"
    for bad in ("../secret", "secret.txt", "Good.md", "..", "/etc/passwd", "Good/../Good", "good", "", "A" * 300):
        assert rb.read(bad) is None, bad
    assert "<script>" not in to_html("X", "<script>alert(1)</script>")


def test_wants_markdown_only_when_asked() -> None:
    browser = "text/html,application/xhtml+xml,application/xml;q=0.9,*/*;q=0.8"
    for fmt, accept in ((None, ""), (None, "*/*"), (None, browser), ("html", "text/markdown"), ("x", "")):
        assert not wants_markdown(fmt, accept), (fmt, accept)
    for fmt, accept in (("md", browser), ("markdown", ""), ("MD", ""), (None, "text/markdown"), (None, "text/plain")):
        assert wants_markdown(fmt, accept), (fmt, accept)


def test_runbook_page_is_rendered_markdown() -> None:
    text = (RUNBOOKS_DIR / "EngineDown.md").read_text(encoding="utf-8")
    page = to_html("EngineDown", text)
    assert "<h1>EngineDown</h1>" in page and "<h2>Diagnosis</h2>" in page and '<code class="language-sh">' in page
    assert "# EngineDown" not in page and "```" not in page  # rendered, not Markdown shown as text
    assert '<a href="EngineDown?format=md">' in page
    hostile = to_html("X", "<script>alert(1)</script> [a](javascript:alert(1)) <img src=x onerror=alert(1)>")
    assert "<script" not in hostile and "<img" not in hostile and 'href="javascript:' not in hostile


def test_readme_is_not_a_runbook() -> None:
    rb = Runbooks.load()
    assert "README" not in rb.names() and rb.read("README") is None
    assert set(rb.names()) == alert_names()


def _check_served_runbooks(base: str) -> None:
    r = httpx.get(f"{base}/runbooks/CPUFeatureMissing")  # what curl and a link checker get: the page
    assert r.status_code == 200 and r.headers["content-type"] == "text/html; charset=utf-8"
    assert "<h1>CPUFeatureMissing</h1>" in r.text and "arm64.nosve" in r.text
    browser = {"Accept": "text/html,application/xhtml+xml,application/xml;q=0.9,*/*;q=0.8"}
    assert httpx.get(f"{base}/runbooks/CPUFeatureMissing", headers=browser).text == r.text
    assert httpx.get(f"{base}/runbooks/CPUFeatureMissing?format=html").text == r.text
    raw = (RUNBOOKS_DIR / "CPUFeatureMissing.md").read_text()
    for md in (
        httpx.get(f"{base}/runbooks/CPUFeatureMissing?format=md"),
        httpx.get(f"{base}/runbooks/CPUFeatureMissing", headers={"Accept": "text/markdown"}),
    ):
        assert md.status_code == 200 and md.headers["content-type"] == "text/markdown; charset=utf-8"
        assert md.text == raw
    for bad in ("NoSuchAlert", "..%2F..%2Fetc%2Fpasswd", "%2e%2e", "CPUFeatureMissing.md", "..%2Fpyproject", "README"):
        assert httpx.get(f"{base}/runbooks/{bad}").status_code == 404, bad
    leaked = httpx.get(f"{base}/runbooks/../pyproject.toml")  # a client normalises ..; must not be the file
    assert "[project]" not in leaked.text


def test_agent_serves_runbooks(tmp_path) -> None:
    """Two agents: one with runbooks.base_url set (the index links there), one without (the index links to the
    agent itself, on the port it serves on: not the default's 9435)."""
    ports = free_port(), free_port()
    env = {"INFERWATCH_RUNBOOKS__BASE_URL": "https://runbooks.example.org/inferwatch/"}
    with contextlib.ExitStack() as stack:
        procs = [
            stack.enter_context(
                running(
                    [PYTHON, "-m", "inferwatch.agent", "run", "--port", str(port), "--interval", "5"],
                    tmp_path / f"agent{i}.log", cwd=ROOT, env=env if i == 0 else {},
                )
            )
            for i, port in enumerate(ports)
        ]  # fmt: skip
        for port, proc in zip(ports, procs, strict=True):
            wait_http(f"http://127.0.0.1:{port}/healthz", proc=proc)
        configured, own = (f"http://127.0.0.1:{port}" for port in ports)
        _check_served_runbooks(configured)
        index = httpx.get(f"{configured}/runbooks").json()["runbooks"]
        assert {"alert": "Watchdog", "url": "https://runbooks.example.org/inferwatch/Watchdog"} in index
        assert {e["alert"] for e in index} == alert_names()  # no README
        index = httpx.get(f"{own}/runbooks").json()["runbooks"]
        assert {e["alert"] for e in index} == alert_names()
        for entry in index:
            assert entry["url"] == f"{own}/runbooks/{entry['alert']}", entry
        assert httpx.get(index[0]["url"]).status_code == 200
        assert httpx.get(f"{configured}/metrics").status_code == 200  # still serving
