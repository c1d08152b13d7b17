"""``inferwatch engine inspect`` as users run it (a subprocess), on files and on a real HTTP server."""

from __future__ import annotations

import json
import subprocess

from inferwatch.agent.node.engine.histogram import bucket_quantile
from tests import engine_server as es
from tests.conftest import FIXTURES, PYTHON, ROOT
from tests.engine_expo import VllmLike

ENGINES = FIXTURES / "engines"
KEYS = {"p50", "p90", "p95", "p99", "count", "sum", "source"}


def inspect(*args: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [PYTHON, "-m", "inferwatch.agent", "engine", "inspect", *args],
        cwd=ROOT,
        capture_output=True,
        text=True,
        timeout=60,
    )


def test_json_from_a_file() -> None:
    out = inspect("--metrics-file", str(ENGINES / "vllm-v1-dp2-synthetic.prom"), "--json")
    assert out.returncode == 0, out.stderr
    doc = json.loads(out.stdout)
    assert doc["engine"] == "vllm"
    model = doc["models"]["Qwen/Qwen2.5-7B-Instruct"]
    assert set(model) == {"ttft", "itl", "e2e", "queue", "prefill", "decode", "ttft_p99_p50_ratio", "values", "derived"}
    assert doc["schema"] == "vllm-v1-current"  # ITL, no deprecated TPOT or gpu_cache_usage_perc
    assert model["derived"] == {}  # every timing quantity has its histogram
    for quantity in ("ttft", "itl", "e2e", "queue", "prefill", "decode"):
        assert set(model[quantity]) == KEYS and model[quantity]["source"] == "histogram"
        assert model[quantity]["p50"] <= model[quantity]["p90"] <= model[quantity]["p95"] <= model[quantity]["p99"]
    assert model["ttft"]["count"] == 40
    assert model["ttft_p99_p50_ratio"] == model["ttft"]["p99"] / model["ttft"]["p50"]


def test_baseline_gives_quantiles_of_the_increase(tmp_path) -> None:
    gen = VllmLike(["m"], engines=2, seed=9)
    gen.observe(100)
    (tmp_path / "before.prom").write_text(gen.text())
    gen.observe(7, slow=4.0)
    (tmp_path / "after.prom").write_text(gen.text())
    full = json.loads(inspect("--metrics-file", str(tmp_path / "after.prom"), "--json").stdout)
    delta = inspect(
        "--metrics-file", str(tmp_path / "after.prom"), "--baseline", str(tmp_path / "before.prom"), "--json"
    )
    assert delta.returncode == 0, delta.stderr
    doc = json.loads(delta.stdout)
    assert doc["models"]["m"]["e2e"]["count"] == 14 and full["models"]["m"]["e2e"]["count"] == 214
    assert doc["models"]["m"]["ttft"]["p50"] > full["models"]["m"]["ttft"]["p50"]  # the slow requests only
    # the same number by hand: increase per bucket, summed over the two engines
    from inferwatch.agent.node.engine.scrape import EngineParser

    before = EngineParser().parse((tmp_path / "before.prom").read_bytes()).models["m"].histograms["ttft"]
    after = EngineParser().parse((tmp_path / "after.prom").read_bytes()).models["m"].histograms["ttft"]
    inc: dict[float, float] = {}
    for key, hist in after.items():
        prev = dict(before[key].buckets)
        for bound, c in hist.buckets:
            inc[bound] = inc.get(bound, 0.0) + c - prev[bound]
    assert doc["models"]["m"]["ttft"]["p99"] == bucket_quantile(0.99, sorted(inc.items()))


def test_url_table_output_and_absent_quantities() -> None:
    text = (ENGINES / "trtllm-serve-synthetic.prom").read_text()
    with es.EngineServer({"/metrics": es.body(text)}) as srv:
        out = inspect("--metrics-url", srv.url("/metrics"))
        as_json = json.loads(inspect("--metrics-url", srv.url("/metrics"), "--json").stdout)
    assert out.returncode == 0, out.stderr
    assert "engine: trtllm" in out.stdout and "absent" in out.stdout
    model = as_json["models"]["meta-llama/Llama-3.1-8B-Instruct"]
    assert "e2e" not in model and "decode" not in model  # absent, never zero
    assert as_json["absent"]["meta-llama/Llama-3.1-8B-Instruct"] == ["e2e", "decode"]


def test_engine_without_histograms() -> None:
    out = inspect("--metrics-file", str(ENGINES / "llamacpp-synthetic-a.prom"), "--json", "--model-name", "tiny")
    doc = json.loads(out.stdout)
    assert doc["engine"] == "llamacpp" and doc["schema"] == "llamacpp-counters"
    assert doc["absent"] == {"tiny": ["ttft", "itl", "e2e", "queue", "prefill", "decode"]}
    model = doc["models"]["tiny"]
    assert set(model) == {"ttft_p99_p50_ratio", "values", "derived"} and model["ttft_p99_p50_ratio"] is None
    # the file's counters: 2 s for 1000 prompt tokens, 10 s for 500 generated ones
    assert model["derived"] == {"prefill": 2 / 1000, "itl": 10 / 500}
    assert doc["coverage"]["prefill"] == doc["coverage"]["itl"] == "derived (mean only)"
    assert model["values"]["running"] == 2 and model["values"]["waiting"] == 1


def test_usage_and_bad_input_exit_codes(tmp_path) -> None:
    assert inspect().returncode == 2
    both = inspect("--metrics-file", "x", "--metrics-url", "http://127.0.0.1:1/metrics")
    assert both.returncode == 2 and "exactly one" in both.stderr
    (tmp_path / "bad.prom").write_bytes(b"\xff\xfe garbage")
    bad = inspect("--metrics-file", str(tmp_path / "bad.prom"))
    assert bad.returncode == 1 and "reason: not_utf8" in bad.stderr
    missing = inspect("--metrics-file", str(tmp_path / "missing.prom"))
    assert missing.returncode == 1 and "cannot read" in missing.stderr


def test_baseline_without_a_rank_counts_all_of_it(tmp_path) -> None:
    one = VllmLike(["m"], engines=1, seed=4)
    one.observe(10)
    (tmp_path / "before.prom").write_text(one.text())
    two = VllmLike(["m"], engines=2, seed=4)  # restarted with a second rank: every series starts again
    two.observe(3)
    (tmp_path / "after.prom").write_text(two.text())
    out = inspect("--metrics-file", str(tmp_path / "after.prom"), "--baseline", str(tmp_path / "before.prom"), "--json")
    doc = json.loads(out.stdout)
    assert doc["models"]["m"]["e2e"]["count"] == 6  # engine 0 reset (3) + engine 1 new (3)
