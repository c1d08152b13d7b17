from __future__ import annotations

import subprocess

import pytest

from agent.config import load_settings
from agent.errors import ConfigError
from tests.conftest import PYTHON, ROOT


def test_precedence_flags_over_env_over_yaml(tmp_path, monkeypatch) -> None:
    cfg = tmp_path / "c.yaml"
    cfg.write_text("interval_s: 7\nlisten_port: 1111\npagecache: {inactive_file_threshold_bytes: 5}\n")
    monkeypatch.setenv("INFERWATCH_LISTEN_PORT", "2222")
    monkeypatch.setenv("INFERWATCH_COLLECTORS__PAGECACHE__INTERVAL_S", "3")
    s = load_settings(cfg, {"collectors": {"pagecache": {"enabled": False}}})
    assert s.interval_s == 7 and s.listen_port == 2222
    assert s.pagecache.inactive_file_threshold_bytes == 5
    assert s.collector("pagecache").enabled is False and s.collector("pagecache").interval_s == 3
    assert load_settings(cfg, {"listen_port": 3333}).listen_port == 3333


@pytest.mark.parametrize(
    ("yaml_text", "needle"),
    [
        ("interval_s: -1\n", "interval_s"),
        ("bogus: 1\n", "bogus"),
        ("runtime: {cmdline_pattern: '(['}\n", "runtime.cmdline_pattern"),
        ("collectors: {cpu: {interval_s: 0}}\n", "collectors.cpu.interval_s"),
        ("- a list\n", "mapping"),
        ("a: [unclosed\n", "not valid YAML"),
    ],
)
def test_bad_config_names_the_field(tmp_path, yaml_text: str, needle: str) -> None:
    cfg = tmp_path / "c.yaml"
    cfg.write_text(yaml_text)
    with pytest.raises(ConfigError) as exc:
        load_settings(cfg)
    assert needle in str(exc.value)


def test_cli_exits_2_with_one_clear_line(tmp_path) -> None:
    cfg = tmp_path / "c.yaml"
    cfg.write_text("listen_port: 99999\n")
    proc = subprocess.run(
        [PYTHON, "-m", "agent", "run", "--config", str(cfg)], cwd=ROOT, capture_output=True, text=True, timeout=60
    )
    assert proc.returncode == 2
    assert proc.stderr.strip().splitlines() == [
        "inferwatch: invalid configuration: listen_port: Input should be less than or equal to 65535 (got 99999)"
    ]
    proc = subprocess.run(
        [PYTHON, "-m", "agent", "run", "--no-collector.nonesuch"], cwd=ROOT, capture_output=True, text=True, timeout=60
    )
    assert proc.returncode == 2 and "unknown collector 'nonesuch'" in proc.stderr
