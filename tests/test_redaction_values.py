"""Secret detection, table-driven: keys and values that must be redacted and real engine configuration
that must be kept (issue 14: the denylist missed ``pass``/``pw``, URLs with credentials, PEM keys, token
formats, env lists and argv pairs, and hid ``max_num_batched_tokens``).

The "must keep" keys are vLLM ``EngineArgs``/``CacheConfig`` and SGLang ``ServerArgs`` field names, HF
model/tokenizer/generation config keys, and the labels of a real ``vllm:cache_config_info`` series
(tests/fixtures/engines/vllm-0.5.x-with-v1-families.prom, see its SOURCE note).
"""

from __future__ import annotations

import json
import logging
import re
import time

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from inferwatch.agent.common.redact import MASK, RedactingFormatter, redact_text, redact_url, secret_name
from inferwatch.agent.node.debugprofile.redaction import MARKER_PREFIX, RedactionPolicy
from tests.conftest import ROOT

KEY = b"v" * 32
S = "s3cretpw"  # the secret planted in every "must redact" case

MUST_REDACT_KEYS = [
    "api_key", "API_KEY", "OPENAI_API_KEY", "apiKey", "x-api-key", "admin_api_key", "hf_token", "HF_TOKEN",
    "hfToken", "access_token", "refresh_token", "token", "auth_token", "X-Amz-Security-Token", "api_tokens",
    "password", "db_password", "passwd", "pass", "db_pass", "pw", "pwd", "passphrase", "secret", "client_secret",
    "secretKey", "private_key", "ssh_key", "key", "signing_key", "Authorization", "proxy_authorization", "auth",
    "bearer", "cookie", "set_cookie", "credentials", "session_id", "env", "environ", "environment",
    "env_vars", "dsn", "connection_string", "cpu_affinity_mask", "affinity", "cpus_allowed_list",
    "Cpus_allowed_list", "mems_allowed_list",
]  # fmt: skip

MUST_KEEP_KEYS = [
    # vLLM EngineArgs / SamplingParams
    "model", "tokenizer", "tokenizer_mode", "tokenizer_revision", "skip_tokenizer_init", "max_num_batched_tokens",
    "max_num_seqs", "max_model_len", "max_tokens", "min_tokens", "max_new_tokens", "truncate_prompt_tokens",
    "allowed_token_ids", "stop_token_ids", "return_tokens_as_token_ids", "detokenize", "num_gpu_blocks",
    "num_gpu_blocks_override", "block_size", "kv_cache_dtype", "cache_dtype", "gpu_memory_utilization",
    "swap_space", "enable_prefix_caching", "prefix_caching_hash_algo", "enable_chunked_prefill",
    "long_prefill_token_threshold", "num_lookahead_slots", "served_model_name", "tensor_parallel_size",
    "pipeline_parallel_size", "data_parallel_size", "ssl_keyfile", "ssl_certfile", "compilation_config",
    "pass_config", "enable_prompt_tokens_details", "otlp_traces_endpoint", "disable_log_stats", "hf_overrides",
    # SGLang ServerArgs
    "model_path", "tokenizer_path", "mem_fraction_static", "max_running_requests", "max_total_tokens",
    "max_prefill_tokens", "chunked_prefill_size", "context_length", "page_size", "tp_size", "dp_size",
    "schedule_policy", "stream_interval", "speculative_num_draft_tokens", "speculative_token_map",
    "ds_heavy_token_num", "enable_tokenizer_batch_encode", "tokenizer_worker_num", "attention_backend",
    "disable_radix_cache", "allow_auto_truncate", "enable_metrics",
    # HF config.json / tokenizer_config.json / generation_config.json
    "num_key_value_heads", "num_attention_heads", "vocab_size", "bos_token_id", "eos_token_id", "pad_token_id",
    "decoder_start_token_id", "bos_token", "eos_token", "pad_token", "unk_token", "add_bos_token",
    "skip_special_tokens", "spaces_between_special_tokens", "model_max_length", "tokenizer_class",
    # the agent's own and common neighbours
    "gpu_memory_used_bytes", "num_running_requests", "engine", "passes", "bypass_cache", "author", "keyboard",
]  # fmt: skip


def cache_config_labels() -> list[str]:
    text = (ROOT / "tests/fixtures/engines/vllm-0.5.x-with-v1-families.prom").read_text()
    (labels,) = re.findall(r"^vllm:cache_config_info\{([^}]*)\}", text, re.M)
    return re.findall(r'(\w+)="', labels)


@pytest.mark.parametrize("key", MUST_REDACT_KEYS)
def test_secret_keys_lose_their_value(key: str) -> None:
    out, paths = RedactionPolicy.build(KEY).redact({"config": {key: S}})
    assert out["config"][key].startswith(MARKER_PREFIX) and paths == [f"config.{key}"]
    assert secret_name(key)


@pytest.mark.parametrize("key", MUST_KEEP_KEYS + cache_config_labels())
def test_engine_configuration_keys_are_kept(key: str) -> None:
    config = {key: 8192, f"{key}_str": "auto"} if not key.endswith("_str") else {key: "auto"}
    out, paths = RedactionPolicy.build(KEY).redact({"config": config})
    assert out == {"config": config} and paths == []
    assert not secret_name(key)


def test_the_real_cache_config_labels_were_read() -> None:
    assert {"block_size", "num_gpu_blocks", "gpu_memory_utilization", "cache_dtype"} <= set(cache_config_labels())


# (value, what must remain): S must be gone, the rest of the value kept where it is useful.
MUST_REDACT_VALUES = [
    (f"postgres://app:{S}@db.internal:5432/serving", "postgres://app:"),
    (f"postgres://app:p/q{S}@db.internal/serving", "@db.internal/serving"),  # "/" in the password, unencoded
    (f"redis://:{S}@cache:6379/0", "@cache:6379/0"),
    (f"http://user:{S}@127.0.0.1:8000/metrics", "@127.0.0.1:8000/metrics"),
    (f"https://{S}x0123456789abcdef@github.com/org/repo.git", "@github.com/org/repo.git"),
    (f"https://h.example/v1/x?token={S}&model=m", "model=m"),
    (f"https://h.example/cb#access_token={S}&state=1", "state=1"),
    (f"https://h.example/x?api_key={S}", "https://h.example/x?api_key="),
    (f"https://h.example/maps?key={S}", "/maps?key="),
    (f"https://b.s3.amazonaws.com/o?X-Amz-Algorithm=AWS4-HMAC-SHA256&X-Amz-Signature={S}", "X-Amz-Algorithm="),
    (f"https://b.s3.amazonaws.com/o?X-Amz-Credential={S}%2F20240101&X-Amz-Expires=60", "X-Amz-Expires=60"),
    (f"https://storage.googleapis.com/b/o?X-Goog-Signature={S}&X-Goog-Date=20240101T000000Z", "X-Goog-Date"),
    (f"https://acct.blob.core.windows.net/c/b?sv=2022-11-02&sig={S}", "sv=2022-11-02"),
    (f"-----BEGIN PRIVATE KEY-----\nMII{S}\n-----END PRIVATE KEY-----", ""),
    (f"-----BEGIN RSA PRIVATE KEY-----\nMII{S}\n-----END RSA PRIVATE KEY-----", ""),
    (f"-----BEGIN OPENSSH PRIVATE KEY-----\nb3Bl{S}", ""),  # cut off: still a key
    (f"xoxb-123456789012-{S}abcdef", ""),
    (f"xoxp-123456789012-{S}abcdef", ""),
    (f"glpat-{S}abcdefghijklmn", ""),
    (f"AIzaSy{S}abcdefghijklmnopqrstuvwxy", ""),
    (f"ghp_{S}abcdefghijklmnopqrstuvwxyz01", ""),
    (f"github_pat_11ABCDEFG0{S}abcdefghijklmnop", ""),
    (f"sk-{S}0123456789abcdef", ""),
    (f"sk-proj-{S}0123456789abcdef", ""),
    (f"sk-ant-api03-{S}0123456789", ""),
    (f"hf_{S}abcdefghijklmnopqrs", ""),
    (f"AKIA{S.upper()}ABCDEFGH", ""),
    (f"eyJhbGciOiJIUzI1NiJ9.eyJzdWIiOiJ{S}.sig{S}", ""),
    (f"Bearer {S}-abc", ""),
    (f"Authorization: Bearer {S}", "Authorization: Bearer "),
    ("Basic dXNlcjpzM2NyZXRwdw==", ""),  # base64("user:s3cretpw")
    (f"curl -H 'x-api-key: {S}' http://h/v1", "curl -H 'x-api-key: "),
    (f"HF_TOKEN={S} vllm serve m", " vllm serve m"),
    (f"vllm serve m --api-key {S} --port 8000", "--port 8000"),
    (f"vllm serve m --api-key={S}", "vllm serve m --api-key="),
    (f"openssl enc -k {S} -in f", "-in f"),
    (f"vllm serve m --db-url postgres://u:{S}@h/db", "--db-url postgres://u:"),
    (f"--db-url=postgres://u:{S}@h/db", "--db-url=postgres://u:"),
    (f'{{"api_key": "{S}", "model": "m"}}', '"model": "m"'),
    (f"https://hooks.slack.com/services/T000/B000/{S}XXXXXX", "https://hooks.slack.com/services/"),
]
MUST_KEEP_VALUES = [
    "http://127.0.0.1:8000/metrics",
    "https://registry.npmjs.org/@scope/pkg",
    "http://127.0.0.1:8000/users/@me",
    "sha256:abc==",
    "https://huggingface.co/meta-llama/Llama-3.1-8B-Instruct?revision=main",
    "meta-llama/Llama-3.1-8B-Instruct",
    "vllm serve m --max-num-batched-tokens 8192 --tokenizer-mode auto --kv-cache-dtype fp8",
    "the basic configuration: bearer tokens are checked by the proxy",
    "token limit",
    "Bearer tokens",
    "sha256",
    "0-31",
    "max_tokens=16",
    "skip-tokenizer-init",
    "sk-short",
    "-----BEGIN CERTIFICATE-----\nMIIB\n-----END CERTIFICATE-----",
]


@pytest.mark.parametrize(("value", "kept"), MUST_REDACT_VALUES)
def test_secret_values_are_found_under_any_key(value: str, kept: str) -> None:
    out, paths = RedactionPolicy.build(KEY).redact({"note": value, "args": [value]})
    text = json.dumps(out)
    assert S not in text and S.upper() not in text and "dXNlcjpzM2NyZXRwdw" not in text
    assert MARKER_PREFIX in out["note"] and kept in out["note"], out["note"]
    assert "note" in paths
    plain = redact_text(value)  # the same detector without markers (error messages, log lines)
    assert S not in plain and MASK in plain and kept in plain, plain


@pytest.mark.parametrize("value", MUST_KEEP_VALUES)
def test_ordinary_values_are_kept(value: str) -> None:
    out, paths = RedactionPolicy.build(KEY).redact({"note": value})
    assert out == {"note": value} and paths == []
    assert redact_text(value) == value


def test_env_list_values_go_when_the_name_is_secret() -> None:
    env = [
        {"name": "OPENAI_API_KEY", "value": S},
        {"name": "HF_TOKEN", "value": S},
        {"key": "db_pass", "value": S},
        {"name": "VLLM_WORKER_MULTIPROC_METHOD", "value": "spawn"},
        {"name": "MAX_NUM_BATCHED_TOKENS", "value": "8192"},
        {"name": "AWS_SECRET_ACCESS_KEY", "valueFrom": {"secretKeyRef": {"name": "aws", "key": "secret"}}},
    ]
    out, paths = RedactionPolicy.build(KEY).redact({"spec": {"containers": [{"env": env}]}, "pod_env": env})
    kept = out["pod_env"]
    assert S not in json.dumps(out)
    assert [e.get("value", "").startswith(MARKER_PREFIX) for e in kept[:3]] == [True, True, True]
    assert kept[3] == env[3] and kept[4] == env[4]
    assert kept[5]["name"] == "AWS_SECRET_ACCESS_KEY"  # a reference to a secret, not the secret
    assert "pod_env[0].value" in paths


def test_argv_lists_hide_secret_flag_values_only() -> None:
    argv = ["vllm", "serve", "m", "--api-key", S, "-k", S, "--max-num-batched-tokens", "8192"]
    argv += ["--tokenizer", "m-tok", f"--hf-token={S}", "--db-url", f"postgres://u:{S}@h:5432/db", "--port", "8000"]
    out, paths = RedactionPolicy.build(KEY).redact({"argv": argv})
    got = out["argv"]
    assert S not in json.dumps(out)
    assert got[:4] == argv[:4] and got[5] == "-k" and got[7:11] == argv[7:11]
    assert got[4].startswith(MARKER_PREFIX) and got[6].startswith(MARKER_PREFIX)
    assert got[11].startswith("--hf-token=" + MARKER_PREFIX)
    assert got[13].startswith("postgres://u:" + MARKER_PREFIX) and got[13].endswith("@h:5432/db")
    assert got[14:] == ["--port", "8000"]
    assert set(paths) == {"argv[4]", "argv[6]", "argv[11]", "argv[13]"}


def test_process_cmdline_keeps_engine_flags() -> None:
    argv = ["python", "-m", "sglang.launch_server", "--model-path", "m", "--max-total-tokens", "65536"]
    argv += ["--admin-api-key", S, "--mem-fraction-static", "0.8", f"SGLANG_SECRET={S}", "-k", S]
    out = RedactionPolicy.build(KEY).redact_cmdline(argv)
    assert S not in " ".join(out)
    assert out[:7] == argv[:7] and out[9:11] == argv[9:11]


def test_redact_url_keeps_everything_but_the_credentials() -> None:
    assert redact_url(f"http://user:{S}@127.0.0.1:9/metrics?x=1#f") == f"http://user:{MASK}@127.0.0.1:9/metrics?x=1#f"
    assert redact_url("http://127.0.0.1:9/metrics") == "http://127.0.0.1:9/metrics"
    assert redact_url(f"redis://:{S}@r:6379") == f"redis://:{MASK}@r:6379"
    assert redact_url("not a url") == "not a url"
    assert redact_url("http://[::1") == "http://[::1"  # malformed: unchanged, never raises


def test_log_lines_lose_credentials_in_messages_arguments_and_tracebacks() -> None:
    fmt = RedactingFormatter("%(levelname)s %(message)s")
    record = logging.LogRecord("httpx", logging.INFO, __file__, 1, "HTTP Request: GET %s", (f"http://u:{S}@h/m",), None)
    assert fmt.format(record) == f"INFO HTTP Request: GET http://u:{MASK}@h/m"
    try:
        raise RuntimeError(f"cannot reach https://h/x?token={S}")
    except RuntimeError:
        import sys

        record = logging.LogRecord("x", logging.ERROR, __file__, 1, "failed", (), sys.exc_info())
    assert S not in fmt.format(record) and "token=REDACTED" in fmt.format(record)


ADVERSARIAL = [
    "a" * 200_000, "-" * 200_000, "--a " * 50_000, "x=" * 100_000, "x=x" * 60_000, "http://" * 20_000,
    "a:" * 100_000, "http://a:" + "b" * 100_000, "-----BEGIN PRIVATE KEY-----" + "x" * 100_000, "Bearer " * 30_000,
    "'a': '" * 30_000, "--a b " * 30_000, "token=" * 30_000,
]  # fmt: skip


@pytest.mark.parametrize("text", ADVERSARIAL, ids=lambda t: f"{t[:12]!r}x{len(t)}")
def test_hostile_text_is_scanned_in_linear_time(text: str) -> None:
    """No recursion, no backtracking blow-up: 200 kB of any shape in about 0.1-0.4 s here (quadratic would
    take hours); the bound leaves room for a slow CI machine. CPU seconds of this thread (time.thread_time): the
    work done, not how long a machine at load 10-17 on 2 cores left the thread waiting."""
    started = time.thread_time()
    redact_text(text)
    RedactionPolicy.build(KEY).redact({"argv": ["--api-key", text, text]})
    assert time.thread_time() - started < 10.0


@settings(max_examples=300, deadline=None)
@given(st.text(max_size=300), st.sampled_from(["", "token=", "--api-key ", "http://u:", "Bearer ", "sk-"]))
def test_any_text_gives_text_and_keeps_no_planted_secret(prefix: str, lead: str) -> None:
    secret = "Zq7s3cretpwZq7s3cretpw"
    text = f"{prefix} {lead}{secret}@h " if lead == "http://u:" else f"{prefix} {lead}{secret} "
    out = redact_text(text)
    assert isinstance(out, str)
    if lead:
        assert secret not in out, (text, out)
