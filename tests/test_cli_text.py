"""What the command line prints, as a new user reads it (issue 15, "CLI and docs a new user trips over")."""

from __future__ import annotations

import os
import re
import subprocess

import click
import pytest
import typer.main
from typer.testing import CliRunner

from inferwatch.agent.cli.main import app
from tests.conftest import FIXTURES, PYTHON, ROOT

# Characters rich's emoji codes produce (":M:" → Ⓜ, ":smile:" → 😄): enclosed alphanumerics, symbols, emoji.
_EMOJI = re.compile("[\u2460-\u24ff\u2600-\u27bf\U0001f000-\U0001faff]")


def _commands(group: click.Group, prefix: tuple[str, ...] = ()) -> list[tuple[tuple[str, ...], click.Command]]:
    out: list[tuple[tuple[str, ...], click.Command]] = []
    for name, cmd in sorted(group.commands.items()):
        out.append(((*prefix, name), cmd))
        if isinstance(cmd, click.Group):
            out += _commands(cmd, (*prefix, name))
    return out


def _squash(text: str) -> str:
    return " ".join(text.split())


def test_loadgen_help_shows_the_distribution_forms_literally() -> None:
    env = {**os.environ, "COLUMNS": "100", "TERM": "xterm-256color", "FORCE_COLOR": "1"}
    out = subprocess.run(
        [PYTHON, "-m", "inferwatch.agent", "loadgen", "--help"],
        cwd=ROOT,
        env=env,
        capture_output=True,
        text=True,
        timeout=60,
    )
    assert out.returncode == 0, out.stderr
    text = _squash(out.stdout)
    assert "normal:MEAN:SD" in text and "lognormal:MEDIAN:SIGMA" in text and "uniform:LO:HI" in text
    assert not _EMOJI.search(out.stdout), out.stdout


COMMANDS = _commands(typer.main.get_command(app))  # type: ignore[arg-type]


@pytest.mark.parametrize(("path", "command"), COMMANDS, ids=[" ".join(p) for p, _ in COMMANDS])
def test_every_help_text_is_printed_as_written(path: tuple[str, ...], command: click.Command) -> None:
    """No markup or emoji processing anywhere: each option's help appears verbatim in its command's --help."""
    result = CliRunner().invoke(app, [*path, "--help"], env={"COLUMNS": "100"})
    assert result.exit_code == 0, result.output
    text = _squash(result.output)
    assert not _EMOJI.search(text), (path, text)
    assert "\u2502" not in result.output, "rich's boxed help (its markup and emoji codes) is on"
    for param in command.params:
        help_text = getattr(param, "help", None)
        if help_text and not getattr(param, "hidden", False):
            # compared without whitespace: the formatter wraps, and may break a long word at a hyphen
            assert "".join(help_text.split()) in "".join(text.split()), (path, param.name, help_text)


def _inspect(*args: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [PYTHON, "-m", "inferwatch.agent", "engine", "inspect", *args],
        cwd=ROOT,
        capture_output=True,
        text=True,
        timeout=60,
    )


def test_engine_inspect_prints_counts_as_integers_and_names_the_first_bucket(tmp_path) -> None:
    """Issue 15: counts printed as 6.801e+04, and queue/prefill P50 0.15 s beside TTFT P50 0.033 s without
    saying that vLLM's first phase bucket is 0.3 s (a P50 in it is interpolated, not measured)."""
    recorded = (FIXTURES / "engines" / "vllm-v1-dp2-synthetic.prom").read_text()

    def scaled(line: str) -> str:  # every request count × 1700: 40 requests become 68000
        name, _, value = line.rpartition(" ")
        if re.match(r"vllm:\w+_(bucket|count)\{", line):
            return f"{name} {float(value) * 1700}"
        return line

    (tmp_path / "big.prom").write_text("\n".join(scaled(x) for x in recorded.splitlines()) + "\n")
    out = _inspect("--metrics-file", str(tmp_path / "big.prom"))
    assert out.returncode == 0, out.stderr
    rows = {line.split()[1]: line for line in out.stdout.splitlines() if line.startswith("│")}
    assert "68000" in rows["ttft"] and "e+0" not in out.stdout, out.stdout
    notes = [line for line in out.stdout.splitlines() if "first bucket" in line]
    assert [n.split()[0] for n in notes] == ["queue", "prefill"], out.stdout
    assert all("le=0.3 s" in n and "interpolated" in n for n in notes)


def test_engine_inspect_names_the_prefixes_of_a_non_engine_exposition(tmp_path) -> None:
    """A valid exposition of another program (node_exporter here) is not 'not_prometheus'."""
    from tests import engine_server as es

    text = "# TYPE node_load1 gauge\nnode_load1 0.5\n# TYPE go_goroutines gauge\ngo_goroutines 7\n"
    (tmp_path / "node.prom").write_text(text)
    with es.EngineServer({"/metrics": es.body(text)}) as srv:
        for out in (
            _inspect("--metrics-file", str(tmp_path / "node.prom")),
            _inspect("--metrics-url", srv.url("/metrics")),
        ):
            assert out.returncode == 1
            assert "no known engine families; prefixes seen: node_, go_" in out.stderr, out.stderr
            assert "not_prometheus" not in out.stderr and "Traceback" not in out.stderr


def test_agent_with_its_port_taken_exits_2_with_one_line_and_never_says_started(tmp_path) -> None:
    """Issue 15: the agent printed "agent started" before failing to bind its port."""
    import socket

    env = {k: v for k, v in os.environ.items() if not k.startswith("INFERWATCH_")}
    with socket.socket() as taken:
        taken.bind(("127.0.0.1", 0))
        taken.listen(1)
        port = taken.getsockname()[1]
        done = subprocess.run(
            [PYTHON, "-m", "inferwatch.agent", "run", "--port", str(port)],
            cwd=ROOT, env=env, capture_output=True, text=True, timeout=60,
        )  # fmt: skip
    assert done.returncode == 2, done.stderr
    assert "agent started" not in done.stderr and "Traceback" not in done.stderr, done.stderr
    lines = [line for line in done.stderr.splitlines() if line.strip()]
    assert lines == [f"inferwatch: cannot listen on 127.0.0.1:{port}: Address already in use"], lines


def test_agent_started_is_logged_once_the_port_answers(tmp_path) -> None:
    """ "agent started" comes after the bind: the first request after that line is served, never refused."""
    import time

    import httpx

    from tests.conftest import free_port

    port = free_port()
    env = {k: v for k, v in os.environ.items() if not k.startswith("INFERWATCH_")}
    log = tmp_path / "agent.log"
    with open(log, "wb") as out:
        proc = subprocess.Popen(
            [PYTHON, "-m", "inferwatch.agent", "run", "--port", str(port)], cwd=ROOT, env=env, stdout=out, stderr=out
        )
    try:
        deadline = time.monotonic() + 60
        while "agent started" not in log.read_text() and time.monotonic() < deadline:
            assert proc.poll() is None, log.read_text()
            time.sleep(0.01)
        assert httpx.get(f"http://127.0.0.1:{port}/healthz", timeout=10).status_code == 200
    finally:
        proc.terminate()
        proc.wait(30)


def test_docs_name_the_rules_directory_of_the_shipped_prometheus_config() -> None:
    """Issue 15: docs named /etc/prometheus/inferwatch/*.rules.yml where the shipped config loads
    /etc/prometheus/rules/. Every Prometheus rules path the docs give is the one deploy/prometheus.yml loads."""
    import yaml

    (rule_glob,) = yaml.safe_load((ROOT / "deploy" / "prometheus.yml").read_text())["rule_files"]
    rules_dir = rule_glob.rsplit("/", 1)[0]
    mounted = yaml.safe_load((ROOT / "docker-compose.yml").read_text())["services"]["prometheus"]["volumes"]
    assert f"./alerts:{rules_dir}:ro" in mounted
    docs = [
        ROOT / "README.md",
        ROOT / "CONTRIBUTING.md",
        *(ROOT / "docs").glob("*.md"),
        *(ROOT / "runbooks").glob("*.md"),
    ]
    seen = []
    for doc in docs:
        for path in re.findall(r"/etc/prometheus/[^\s`'\")\]]*", doc.read_text()):
            if "rules" in path:
                seen.append(path)
                assert path in (rule_glob, rules_dir, rules_dir + "/"), f"{doc.name}: {path} (shipped: {rule_glob})"
    assert seen, "the docs no longer say where Prometheus loads the rules from"
