"""Redaction policy: denylist and allowlist modes, stable keyed markers, command lines."""

from __future__ import annotations

import json
import stat

from inferwatch.agent.node.debugprofile.redaction import MARKER_PREFIX, RedactionPolicy, load_or_create_key

KEY = b"k" * 32
PROFILE = {
    "engine": "vllm",
    "cpu_affinity_mask": "0-31",
    "gpu_memory_used_bytes": 1024,
    "config": {
        "hf_token": "hf_abcdefghijklmnopqrstuvwx",
        "api_key": "plain-value",
        "db_password": "pw",
        "Authorization": "Bearer abc.def",
        "cookie_jar": ["a=b"],
        "environment_variables": {"PATH": "/usr/bin", "HOME": "/root"},
        "env": {"X": "1"},
        "model": "llama",
        "note": "Bearer sk-0123456789abcdef0123",
        "kv_cache_usage": 0.5,
    },
    "workers": [{"session_id": "s1", "rank": 0}],
}
SENSITIVE = [
    "0-31",
    "hf_abcdefghijklmnopqrstuvwx",
    "plain-value",
    "pw",
    "Bearer abc.def",
    "a=b",
    "/root",
    "s1",
    "sk-0123",
]


def test_denylist_replaces_every_sensitive_value_and_keeps_the_rest() -> None:
    policy = RedactionPolicy.build(KEY)
    out, paths = policy.redact(PROFILE)
    text = json.dumps(out)
    for secret in SENSITIVE:
        assert secret not in text, secret
    assert out["engine"] == "vllm" and out["gpu_memory_used_bytes"] == 1024
    assert out["config"]["model"] == "llama" and out["config"]["kv_cache_usage"] == 0.5
    assert out["workers"][0]["rank"] == 0
    assert out["cpu_affinity_mask"].startswith(MARKER_PREFIX)
    assert set(paths) >= {"cpu_affinity_mask", "config.hf_token", "config.note", "workers[0].session_id"}


def test_markers_are_stable_comparable_and_keyed() -> None:
    a, _ = RedactionPolicy.build(KEY).redact(PROFILE)
    b, _ = RedactionPolicy.build(KEY).redact(json.loads(json.dumps(PROFILE)))
    assert a == b  # same key, same values: snapshots compare equal
    changed = json.loads(json.dumps(PROFILE))
    changed["cpu_affinity_mask"] = "0-15"
    c, _ = RedactionPolicy.build(KEY).redact(changed)
    assert c["cpu_affinity_mask"] != a["cpu_affinity_mask"]
    d, _ = RedactionPolicy.build(b"z" * 32).redact(PROFILE)
    assert d["cpu_affinity_mask"] != a["cpu_affinity_mask"]  # another install's key: not guessable across


def test_allowlist_keeps_only_named_fields() -> None:
    policy = RedactionPolicy.build(
        KEY, mode="allowlist", allow_keys=["engine", "config.model", "gpu_memory_used_bytes"]
    )
    out, paths = policy.redact(PROFILE)
    assert out["engine"] == "vllm" and out["config"]["model"] == "llama" and out["gpu_memory_used_bytes"] == 1024
    assert out["config"]["kv_cache_usage"].startswith(MARKER_PREFIX)
    assert out["workers"][0]["rank"].startswith(MARKER_PREFIX)
    assert "config.kv_cache_usage" in paths
    # an allowlisted key that is also a credential-looking value is still replaced
    out2, _ = RedactionPolicy.build(KEY, mode="allowlist", allow_keys=["note"]).redact(
        {"note": "Bearer sk-0123456789abcdef0123"}
    )
    assert out2["note"].startswith(MARKER_PREFIX)


def test_extra_deny_patterns() -> None:
    out, _ = RedactionPolicy.build(KEY, extra_deny=[r"^hostname$"]).redact({"hostname": "node-7", "engine": "x"})
    assert out["hostname"].startswith(MARKER_PREFIX) and out["engine"] == "x"


def test_cmdline_flag_values_and_assignments_are_redacted() -> None:
    policy = RedactionPolicy.build(KEY)
    argv = ["python", "-m", "vllm", "--model", "llama", "--api-key", "CANARY1", "--hf-token=CANARY2"]
    argv += ["HF_TOKEN=CANARY3", "--port", "8000", "sk-CANARY4CANARY4CANARY4"]
    out = policy.redact_cmdline(argv)
    assert "CANARY" not in " ".join(out)
    assert out[:6] == ["python", "-m", "vllm", "--model", "llama", "--api-key"]
    assert out[8].startswith("HF_TOKEN=" + MARKER_PREFIX)
    assert out[9:11] == ["--port", "8000"]


def test_key_file_is_private_and_reused(tmp_path) -> None:
    k1 = load_or_create_key(tmp_path / "snap")
    k2 = load_or_create_key(tmp_path / "snap")
    assert k1 == k2 and len(k1) == 32
    assert stat.S_IMODE((tmp_path / "snap" / "redaction.key").stat().st_mode) == 0o600
