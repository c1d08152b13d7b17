"""Hostile configuration: a YAML alias bomb, a huge file, non-http engine URLs, bad JSON in the environment.

The file's caps (size, YAML aliases) are named defaults that ``INFERWATCH_CONFIG_MAX_BYTES`` /
``INFERWATCH_CONFIG_MAX_ALIASES`` override.

Each must fail at start, fast, with exit code 2 and a message naming the file or field, never a
traceback and never the expanded input. Run through the CLI in a subprocess (``python -m inferwatch.agent run``).
"""

from __future__ import annotations

import os
import subprocess
import time
from pathlib import Path

import pytest

from inferwatch.agent.config import DEFAULT_CONFIG_MAX_BYTES, load_settings
from inferwatch.agent.errors import ConfigError
from tests.conftest import PYTHON, ROOT

BOMB = "a: &a [x, x, x, x, x, x, x, x, x]\n" + "".join(
    f"{n}: &{n} [{', '.join(['*' + p] * 9)}]\n" for p, n in zip("abcdefgh", "bcdefghi", strict=True)
)


def run_agent(env: dict[str, str], *args: str) -> subprocess.CompletedProcess[str]:
    clean = {k: v for k, v in os.environ.items() if not k.startswith("INFERWATCH_")}
    return subprocess.run(
        [str(PYTHON), "-m", "inferwatch.agent", "run", *args],
        cwd=ROOT,
        env={**clean, **env},
        capture_output=True,
        text=True,
        timeout=60,
    )


def test_yaml_alias_bomb_fails_fast_naming_the_file(tmp_path: Path) -> None:
    path = tmp_path / "bomb.yaml"
    path.write_text(BOMB)
    started = time.monotonic()
    got = run_agent({}, "--config", str(path))
    assert got.returncode == 2, got.stderr
    assert time.monotonic() - started < 30
    assert str(path) in got.stderr and "alias" in got.stderr
    assert "Traceback" not in got.stderr and len(got.stderr) < 2000


def test_an_oversized_config_file_is_refused(tmp_path: Path) -> None:
    path = tmp_path / "big.yaml"
    path.write_text("# padding\n" * (DEFAULT_CONFIG_MAX_BYTES // 10 + 1))
    with pytest.raises(ConfigError, match=r"big\.yaml is over .*INFERWATCH_CONFIG_MAX_BYTES"):
        load_settings(path)


def test_the_config_size_cap_can_be_lowered_and_raised(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    small = tmp_path / "small.yaml"
    small.write_text("interval_s: 7\n" + "#" * 100 + "\n")
    monkeypatch.setenv("INFERWATCH_CONFIG_MAX_BYTES", "64")
    with pytest.raises(ConfigError, match=r"small\.yaml is over 64 bytes \(INFERWATCH_CONFIG_MAX_BYTES\)"):
        load_settings(small)
    big = tmp_path / "big.yaml"
    big.write_text("interval_s: 7\n" + "# padding\n" * (DEFAULT_CONFIG_MAX_BYTES // 10 + 1))
    monkeypatch.setenv("INFERWATCH_CONFIG_MAX_BYTES", str(2 * DEFAULT_CONFIG_MAX_BYTES))
    assert load_settings(big).interval_s == 7


ALIASED = "collectors:\n  cpu: {interval_s: &every 7}\n  pagecache: {interval_s: *every}\n  gpu: {interval_s: *every}\n"


def test_yaml_aliases_are_refused_by_default_and_allowed_up_to_the_cap(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    path = tmp_path / "aliased.yaml"
    path.write_text(ALIASED)
    with pytest.raises(ConfigError, match=r"aliases.*line 3.*INFERWATCH_CONFIG_MAX_ALIASES"):
        load_settings(path)
    monkeypatch.setenv("INFERWATCH_CONFIG_MAX_ALIASES", "1")
    with pytest.raises(ConfigError, match=r"more than 1 are not accepted.*line 4"):
        load_settings(path)
    monkeypatch.setenv("INFERWATCH_CONFIG_MAX_ALIASES", "2")
    settings = load_settings(path)
    assert settings.collectors["pagecache"].interval_s == settings.collectors["gpu"].interval_s == 7


@pytest.mark.parametrize(
    ("var", "value"),
    [
        ("INFERWATCH_CONFIG_MAX_BYTES", "0"),
        ("INFERWATCH_CONFIG_MAX_BYTES", "1MiB"),
        ("INFERWATCH_CONFIG_MAX_ALIASES", "-1"),
        ("INFERWATCH_CONFIG_MAX_ALIASES", ""),
    ],
)
def test_a_bad_config_cap_exits_2_naming_the_variable(var: str, value: str) -> None:
    got = run_agent({var: value})
    assert got.returncode == 2, got.stderr
    assert f"{var}: must be an integer" in got.stderr and "Traceback" not in got.stderr


@pytest.mark.parametrize("url", ["file:///etc/passwd", "gopher://127.0.0.1:70/", "ftp://x/metrics"])
def test_non_http_engine_urls_fail_at_start(url: str) -> None:
    got = run_agent({"INFERWATCH_ENGINE__METRICS_URL": url})
    assert got.returncode == 2, got.stderr
    assert "engine.metrics_url" in got.stderr and "Traceback" not in got.stderr


@pytest.mark.parametrize("field", ["probe.url", "runtime_profile.url"])
@pytest.mark.parametrize("url", ["file:///etc/passwd", "gopher://127.0.0.1:70/"])
def test_non_http_runtime_urls_fail_at_start(field: str, url: str) -> None:
    section, key = field.split(".")
    got = run_agent({f"INFERWATCH_{section.upper()}__{key.upper()}": url})
    assert got.returncode == 2, got.stderr
    assert field in got.stderr and "http://" in got.stderr and "Traceback" not in got.stderr


def test_malformed_tokens_json_names_the_field() -> None:
    got = run_agent({"INFERWATCH_API__TOKENS": '[{"token": '})
    assert got.returncode == 2, got.stderr
    assert "INFERWATCH_API__TOKENS (api.tokens): not valid JSON (line 1, column 11)" in got.stderr, got.stderr
    assert "Traceback" not in got.stderr
