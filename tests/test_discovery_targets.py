"""Engine targets off Kubernetes (agent/node/discovery/): the target set's diff, the static list, and the file_sd file
re-read on change, a bad file keeping the last good targets with a ConfigError that says what is wrong."""

from __future__ import annotations

import os
from pathlib import Path

import pytest

from inferwatch.agent.config import DiscoverySettings, DiscoveryTargetSettings
from inferwatch.agent.config.convert import convert
from inferwatch.agent.errors import ConfigError
from inferwatch.agent.node.discovery.combined import Discovery
from inferwatch.agent.node.discovery.filesd import FileTargets, parse_file_sd
from inferwatch.agent.node.discovery.static import static_targets
from inferwatch.agent.node.discovery.target import EngineTarget, TargetIdentity, TargetSet


def t(name: str, url: str = "http://10.0.0.1:8000/metrics", **kw: object) -> EngineTarget:
    return EngineTarget(name=name, kind="vllm", metrics_url=url, **kw)  # type: ignore[arg-type]


def test_diff_names_added_changed_and_removed() -> None:
    old = TargetSet([t("a"), t("b"), t("c")])
    new = TargetSet([t("a"), t("b", "http://10.0.0.2:8000/metrics"), t("d")])
    d = old.diff(new)
    assert [x.name for x in d.added] == ["d"]
    assert [x.name for x in d.changed] == ["b"] and d.changed[0].metrics_url.startswith("http://10.0.0.2")
    assert [x.name for x in d.removed] == ["c"]
    assert not new.diff(TargetSet([t("a"), t("b", "http://10.0.0.2:8000/metrics"), t("d")]))
    with pytest.raises(ConfigError, match="two engine targets are named 'a'"):
        TargetSet([t("a"), t("a")])
    with pytest.raises(ConfigError, match="'b'"):
        old.merged(TargetSet([t("b")]))


def test_identity_becomes_the_engines_labels_and_resource_attributes() -> None:
    ident = TargetIdentity(namespace="serving", pod="llama-0", container="vllm", pod_uid="u-1", node="n1")
    target = t("serving/llama-0/vllm", identity=ident, labels=(("model", "llama"),))
    assert target.prometheus_labels() == {
        "model": "llama",
        "namespace": "serving",
        "pod": "llama-0",
        "container": "vllm",
    }
    assert target.resource_attributes() == {
        "k8s.namespace.name": "serving",
        "k8s.pod.name": "llama-0",
        "k8s.container.name": "vllm",
        "k8s.pod.uid": "u-1",
        "k8s.node.name": "n1",
    }
    assert t("x").prometheus_labels() == {} and t("x").resource_attributes() == {}


def test_static_targets_from_settings() -> None:
    entries = [
        DiscoveryTargetSettings(name="gpu0", kind="vllm", metrics_url="http://127.0.0.1:8000/metrics"),
        DiscoveryTargetSettings(
            name="gpu1", metrics_url="http://127.0.0.1:8001/metrics", labels={"model": "qwen"}, health_url=None
        ),
    ]
    targets = static_targets(entries)
    assert sorted(targets) == ["gpu0", "gpu1"]
    assert targets["gpu1"].kind == "auto" and targets["gpu1"].labels == (("model", "qwen"),)
    with pytest.raises(ConfigError, match="metrics_url"):
        convert({"name": "x", "metrics_url": "file:///etc/passwd"}, DiscoveryTargetSettings)
    with pytest.raises(ConfigError, match="'gpu0'"):
        static_targets([entries[0], entries[0]])


FILE_SD = """\
- targets: ["10.0.0.5:8000", "10.0.0.6:8000"]
  labels:
    model: llama-3-70b
    __inferwatch_engine__: vllm
    __inferwatch_health_path__: /health
- targets: ["[fd00::7]:30000"]
  labels:
    __scheme__: https
    __metrics_path__: /sglang/metrics
    __inferwatch_name__: sglang-a
    __inferwatch_profile_path__: /debug/profile
    namespace: research
    pod: sglang-a-0
"""


def test_file_sd_groups_become_targets() -> None:
    targets = parse_file_sd(FILE_SD)
    assert sorted(targets) == ["10.0.0.5:8000", "10.0.0.6:8000", "sglang-a"]
    a = targets["10.0.0.5:8000"]
    assert (a.kind, a.metrics_url, a.health_url, a.labels) == (
        "vllm",
        "http://10.0.0.5:8000/metrics",
        "http://10.0.0.5:8000/health",
        (("model", "llama-3-70b"),),
    )
    s = targets["sglang-a"]
    assert s.metrics_url == "https://[fd00::7]:30000/sglang/metrics" and s.kind == "auto"
    assert s.profile_url == "https://[fd00::7]:30000/debug/profile" and s.health_url is None
    assert s.prometheus_labels() == {"namespace": "research", "pod": "sglang-a-0"}
    assert parse_file_sd("") == TargetSet()
    assert sorted(parse_file_sd('[{"targets": ["h:1"]}]')) == ["h:1"]  # JSON, as Prometheus reads it


@pytest.mark.parametrize(
    ("text", "message"),
    [
        ("targets: [a]", "must be a list of groups"),
        ("- [a]", "group 0 must be a mapping"),
        ("- {targets: [a:1], lables: {}}", "unknown keys \\['lables'\\]"),
        ("- {targets: [10.0.0.5]}", "'10.0.0.5' is not host:port"),
        ("- {targets: [a:1], labels: {__scheme__: ftp}}", "__scheme__ must be http or https"),
        ("- {targets: [a:1], labels: {__inferwatch_engine__: vlm}}", "__inferwatch_engine__ 'vlm'"),
        ("- {targets: [a:1, b:1], labels: {__inferwatch_name__: x}}", "names one target"),
        ("- {targets: [a:1], labels: {__metrics_path__: metrics}}", "must start with /"),
        ("- {targets: [a:1], labels: {port: 8000}}", "labels must map strings to strings"),
        ("- {targets: [a:1]\n- x: [", "not YAML or JSON at line"),
        ("- {targets: [a:1]}\n- {targets: [a:1]}", "two engine targets are named 'a:1'"),
    ],
)
def test_bad_file_sd_is_a_config_error_naming_the_problem(text: str, message: str) -> None:
    with pytest.raises(ConfigError, match=message):
        parse_file_sd(text, "f.yaml")


def _bump_mtime(path: Path) -> None:
    st = path.stat()
    os.utime(path, ns=(st.st_atime_ns, st.st_mtime_ns + 1_000_000_000))


def test_file_targets_reload_on_change_and_keep_the_last_good_on_error(tmp_path: Path) -> None:
    path = tmp_path / "engines.yaml"
    path.write_text('- targets: ["10.0.0.5:8000"]\n')
    ft = FileTargets(path, max_bytes=4096)
    first = ft.poll()
    assert first.changed and first.error is None and sorted(first.targets) == ["10.0.0.5:8000"]
    again = ft.poll()
    assert not again.changed and again.targets == first.targets

    path.write_text('- targets: ["10.0.0.5:8000", "10.0.0.6:8000"]\n')  # edited in place
    _bump_mtime(path)
    edited = ft.poll()
    assert edited.changed and sorted(edited.targets) == ["10.0.0.5:8000", "10.0.0.6:8000"]

    path.write_text("- targets: [10.0.0.7]\n")  # a bad edit
    _bump_mtime(path)
    bad = ft.poll()
    assert not bad.changed and bad.targets == edited.targets
    assert isinstance(bad.error, ConfigError) and "not host:port" in str(bad.error) and str(path) in str(bad.error)
    assert ft.poll().error is bad.error  # still bad, not re-read

    new = tmp_path / "engines.yaml.tmp"  # an atomic replace: a new inode
    new.write_text('- targets: ["10.0.0.8:8000"]\n')
    os.replace(new, path)
    replaced = ft.poll()
    assert replaced.changed and replaced.error is None and sorted(replaced.targets) == ["10.0.0.8:8000"]

    path.unlink()
    gone = ft.poll()
    assert gone.targets == replaced.targets and gone.error is not None and "cannot be read" in str(gone.error)

    path.write_text("- targets: [a:1]\n" * 400)
    big = FileTargets(path, max_bytes=100).poll()
    assert big.targets == TargetSet() and "larger than discovery.file_max_bytes (100)" in str(big.error)


def test_discovery_merges_sources_and_a_bad_source_keeps_its_last_targets(tmp_path: Path) -> None:
    path = tmp_path / "engines.yaml"
    path.write_text('- targets: ["10.0.0.5:8000"]\n')
    settings = DiscoverySettings(
        targets=[DiscoveryTargetSettings(name="gpu0", metrics_url="http://127.0.0.1:8000/metrics")], file=path
    )
    d = Discovery(settings)
    first = d.poll()
    assert sorted(first.targets) == ["10.0.0.5:8000", "gpu0"] and not first.errors
    assert sorted(t.name for t in first.changes.added) == ["10.0.0.5:8000", "gpu0"]
    assert not d.poll().changes  # nothing changed

    path.write_text("- targets: [oops]\n")
    _bump_mtime(path)
    bad = d.poll()
    assert (
        sorted(bad.targets) == ["10.0.0.5:8000", "gpu0"] and not bad.changes and "not host:port" in bad.errors["file"]
    )

    path.write_text('- targets: ["10.0.0.6:8000"]\n  labels: {__inferwatch_name__: gpu0}\n')  # clashes with static
    _bump_mtime(path)
    clash = d.poll()
    assert sorted(clash.targets) == ["10.0.0.5:8000", "gpu0"] and "'gpu0'" in clash.errors["merge"]

    path.write_text('- targets: ["10.0.0.6:8000"]\n')
    _bump_mtime(path)
    fixed = d.poll()
    assert [t.name for t in fixed.changes.added] == ["10.0.0.6:8000"]
    assert [t.name for t in fixed.changes.removed] == ["10.0.0.5:8000"] and not fixed.errors
    with pytest.raises(ConfigError, match="node_name"):
        Discovery(DiscoverySettings(kubernetes=True))
