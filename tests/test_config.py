from __future__ import annotations

import os
import re
import subprocess

import pytest

from inferwatch.agent.config import check_env_names, load_settings
from inferwatch.agent.errors import ConfigError
from inferwatch.agent.node.collectors import REGISTRY
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
        [PYTHON, "-m", "inferwatch.agent", "run", "--config", str(cfg)],
        cwd=ROOT,
        capture_output=True,
        text=True,
        timeout=60,
    )
    assert proc.returncode == 2
    assert proc.stderr.strip().splitlines() == [
        "inferwatch: invalid configuration: listen_port: Input should be less than or equal to 65535 (got 99999)"
    ]
    proc = subprocess.run(
        [PYTHON, "-m", "inferwatch.agent", "run", "--no-collector.nonesuch"],
        cwd=ROOT,
        capture_output=True,
        text=True,
        timeout=60,
    )
    assert proc.returncode == 2 and "unknown collector 'nonesuch'" in proc.stderr


@pytest.mark.parametrize(
    ("yaml_text", "env", "needle"),
    [
        ("collectors: {pagecach: {enabled: false}}\n", {}, "collectors.pagecach: unknown collector 'pagecach'"),
        ("collectors: {cpu: {enable: false}}\n", {}, "collectors.cpu.enable"),
        ("pagecache: {inactive_file_treshold_bytes: 5}\n", {}, "pagecache.inactive_file_treshold_bytes"),
        ("engine: {kind: auto, metric_url: x}\n", {}, "engine.metric_url"),
        ("{}\n", {"INFERWATCH_COLLECTORS__PAGECACH__ENABLED": "false"}, "collectors.pagecach"),
        ("{}\n", {"INFERWATCH_PAGECACHE__BOGUS": "1"}, "pagecache.bogus"),
        ("{}\n", {"INFERWATCH_PAGECACH__INACTIVE_FILE_THRESHOLD_BYTES": "5"}, "INFERWATCH_PAGECACH__"),
        ("{}\n", {"INFERWATCH_LISTEN_PROT": "1"}, "did you mean INFERWATCH_LISTEN_PORT?"),
    ],
)
def test_unknown_names_are_rejected(tmp_path, monkeypatch, yaml_text: str, env: dict, needle: str) -> None:
    cfg = tmp_path / "c.yaml"
    cfg.write_text(yaml_text)
    for k, v in env.items():
        monkeypatch.setenv(k, v)
    with pytest.raises(ConfigError) as exc:
        load_settings(cfg, collectors=REGISTRY)
    assert needle in str(exc.value)


def test_every_registered_collector_name_is_accepted(tmp_path) -> None:
    cfg = tmp_path / "c.yaml"
    cfg.write_text("collectors:\n" + "".join(f"  {n}: {{enabled: true}}\n" for n in REGISTRY))
    assert set(load_settings(cfg, collectors=REGISTRY).collectors) == set(REGISTRY)


def test_inferwatch_variables_of_other_tools_do_not_stop_the_agent() -> None:
    """Every INFERWATCH_ name the repository uses is a setting or one the agent leaves alone (simulator, scripts)."""
    names: set[str] = set()
    # the repository's own files (tracked, or new and not ignored): not the venvs, builds and caches beside them
    listed = subprocess.run(
        ["git", "ls-files", "-z", "--cached", "--others", "--exclude-standard"],
        cwd=ROOT, capture_output=True, check=True, timeout=60,
    ).stdout.decode().split("\0")  # fmt: skip
    for path in (ROOT / name for name in listed if name and not name.endswith(".pyc")):
        if path.is_file():
            try:
                names |= set(re.findall(r"\bINFERWATCH_[A-Z0-9_]*[A-Z0-9]\b", path.read_text(encoding="utf-8")))
            except (UnicodeDecodeError, OSError):
                continue
    assert {"INFERWATCH_SCENARIO", "INFERWATCH_ENGINE__METRICS_URL"} <= names
    for name in sorted(names - {"INFERWATCH_LISTEN_PROT", "INFERWATCH_PAGECACH__INACTIVE_FILE_THRESHOLD_BYTES"}):
        check_env_names({name: "1"})


def test_cli_exits_2_on_an_unknown_collector_in_yaml_or_env(tmp_path) -> None:
    cfg = tmp_path / "c.yaml"
    cfg.write_text("collectors: {pagecach: {enabled: false}}\n")
    for args, env in (
        (["--config", str(cfg)], {}),
        ([], {"INFERWATCH_COLLECTORS__PAGECACH__INTERVAL_S": "3"}),
    ):
        proc = subprocess.run(
            [PYTHON, "-m", "inferwatch.agent", "run", *args],
            cwd=ROOT,
            capture_output=True,
            text=True,
            timeout=60,
            env={**os.environ, **env},
        )
        assert proc.returncode == 2, proc.stderr
        lines = proc.stderr.strip().splitlines()
        assert len(lines) == 1 and "collectors.pagecach: unknown collector 'pagecach'" in lines[0], lines


@pytest.mark.parametrize(
    ("yaml_text", "env", "name", "interval_s"),
    [
        ("probe: {interval_s: 7}\n", {}, "probe", 7.0),
        ("{}\n", {"INFERWATCH_RUNTIME_PROFILE__INTERVAL_S": "0.5"}, "runtime_profile", 0.5),
        ("runtime_profile: {interval_s: 7200, url: 'http://127.0.0.1:1/p'}\n", {}, "runtime_profile", 7200.0),
    ],
)
def test_old_timing_keys_are_read_as_collectors_name_with_one_warning(
    tmp_path, monkeypatch, caplog, yaml_text: str, env: dict, name: str, interval_s: float
) -> None:
    """issue 13: a collector's timing lives in ``collectors.NAME`` only; the old section keys are aliases."""
    from inferwatch.agent.node.collectors import schedule

    cfg = tmp_path / "c.yaml"
    cfg.write_text(yaml_text)
    for k, v in env.items():
        monkeypatch.setenv(k, v)
    with caplog.at_level("WARNING", logger="inferwatch.agent.config"):
        s = load_settings(cfg, collectors=REGISTRY)
    assert s.collector(name).interval_s == interval_s and schedule(name, s).interval_s == interval_s
    assert [r.getMessage() for r in caplog.records] == [
        f"{name}.interval_s is deprecated: read as collectors.{name}.interval_s; set that instead"
    ]
    assert "interval_s" not in type(getattr(s, name)).__struct_fields__  # not a setting of the section any more


def test_collectors_name_wins_over_an_old_timing_key(tmp_path, monkeypatch, caplog) -> None:
    from inferwatch.agent.node.collectors import schedule

    cfg = tmp_path / "c.yaml"
    cfg.write_text("collectors: {runtime_profile: {interval_s: 9}}\n")
    monkeypatch.setenv("INFERWATCH_RUNTIME_PROFILE__INTERVAL_S", "1")
    with caplog.at_level("WARNING", logger="inferwatch.agent.config"):
        s = load_settings(cfg, collectors=REGISTRY)
    assert schedule("runtime_profile", s).interval_s == 9
    assert [r.getMessage() for r in caplog.records] == [
        "runtime_profile.interval_s is deprecated and ignored: collectors.runtime_profile.interval_s is set"
    ]
    monkeypatch.delenv("INFERWATCH_RUNTIME_PROFILE__INTERVAL_S")
    defaults = load_settings()  # the registry's defaults; the request bounds stay in their sections
    assert schedule("runtime_profile", defaults).interval_s == 60
    assert not hasattr(defaults.runtime_profile, "interval_s")  # one place for timing: collectors.NAME
    assert schedule("probe", defaults).interval_s == 30 and defaults.probe.timeout_s == 10


def test_a_bad_old_timing_key_exits_2_naming_the_key_it_is_read_as(tmp_path) -> None:
    proc = subprocess.run(
        [PYTHON, "-m", "inferwatch.agent", "run"],
        cwd=ROOT,
        capture_output=True,
        text=True,
        timeout=60,
        env={**os.environ, "INFERWATCH_PROBE__INTERVAL_S": "0"},
    )
    assert proc.returncode == 2
    assert proc.stderr.strip().splitlines() == [
        "probe.interval_s is deprecated: read as collectors.probe.interval_s; set that instead",
        "inferwatch: invalid configuration: collectors.probe.interval_s: Input should be greater than 0 (got '0')",
    ]


@pytest.mark.parametrize(
    ("env", "read"),
    [
        # names are case-insensitive; a scalar is the string, validated as the setting
        ({"inferwatch_listen_port": "1234"}, lambda s: s.listen_port == 1234),
        # a list is JSON; a section's JSON object is merged with its __ variables, which win, and its keys are
        # matched to the section's fields case-insensitively
        ({"INFERWATCH_CPU__EXPECT_FEATURES": '["avx2", "fma"]'}, lambda s: s.cpu.expect_features == ["avx2", "fma"]),
        (
            {
                "INFERWATCH_ENGINE": '{"METRICS_URL": "http://a/metrics", "kind": "vllm"}',
                "INFERWATCH_ENGINE__KIND": "sglang",
            },
            lambda s: (s.engine.metrics_url, s.engine.kind) == ("http://a/metrics", "sglang"),
        ),
        # a mapping's keys at any depth: a collector's entry, a label
        (
            {"INFERWATCH_COLLECTORS": '{"cpu": {"enabled": false}}', "INFERWATCH_COLLECTORS__CPU__INTERVAL_S": "2"},
            lambda s: (s.collector("cpu").enabled, s.collector("cpu").interval_s) == (False, 2),
        ),
        ({"INFERWATCH_ALERTMANAGER__LABELS__TEAM": "infra"}, lambda s: s.alertmanager.labels == {"team": "infra"}),
        # a switch reads as pydantic read it (yes/on/1 and their opposites, any case); a number without its spaces
        (
            {
                "INFERWATCH_RECEIVER__ENABLED": "Yes",
                "INFERWATCH_COLLECT_ON_SCRAPE": "off",
                "INFERWATCH_LISTEN_PORT": " 1234 ",
            },
            lambda s: (s.receiver.enabled, s.collect_on_scrape, s.listen_port) == (True, False, 1234),
        ),
        ({"INFERWATCH_COLLECTORS__CPU__ENABLED": "n"}, lambda s: s.collector("cpu").enabled is False),
    ],
)
def test_environment_variables_set_nested_and_json_values(monkeypatch, env: dict[str, str], read) -> None:
    for name, value in env.items():
        monkeypatch.setenv(name, value)
    assert read(load_settings(collectors=REGISTRY))


@pytest.mark.parametrize(
    ("env", "message"),
    [
        (
            {"INFERWATCH_CPU__EXPECT_FEATURES": "avx2"},
            "INFERWATCH_CPU__EXPECT_FEATURES (cpu.expect_features): not valid JSON (line 1, column 1); "
            "a list or object setting takes JSON",
        ),
        ({"INFERWATCH_PAGECACHE__BOGUS": "1"}, "pagecache.bogus: Extra inputs are not permitted (got '1')"),
    ],
)
def test_a_bad_environment_value_is_one_config_error(monkeypatch, env: dict[str, str], message: str) -> None:
    for name, value in env.items():
        monkeypatch.setenv(name, value)
    with pytest.raises(ConfigError) as exc:
        load_settings(collectors=REGISTRY)
    assert str(exc.value) == f"invalid configuration: {message}"
