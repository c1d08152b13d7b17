"""Every engine capture read as ``inferwatch engine inspect`` reads it, against values read by hand.

Each real capture in tests/fixtures/engines has, in its ``.SOURCE.md`` note, an ``expected`` block written
by reading the capture (not by running this code): the engine, the release range and schema it matches,
which claimed quantities it maps and which it derives (mean only), and per model the values of its
gauges and counters, histogram counts and sums, and the derived means. The block's format::

    engine: KIND
    release_range: TEXT
    schema: ID
    mapped: QUANTITY ...
    derived: QUANTITY ...
    model NAME: KEY=VALUE ...

A KEY is a gauge or counter (``running``, ``prompt_tokens``, ``finished``: summed over ranks and
dimensions), ``QUANTITY.count`` / ``QUANTITY.sum`` of a histogram, or ``QUANTITY.mean`` of a derived one.
"""

from __future__ import annotations

import json
import math
import re
import subprocess
from pathlib import Path

import pytest

from inferwatch.agent.node.engine.inspect import inspect
from inferwatch.agent.node.engine.scrape import EngineParser
from tests.conftest import FIXTURES, PYTHON, ROOT

ENGINES = FIXTURES / "engines"
BLOCK = re.compile(r"```expected\n(.*?)```", re.S)
# Captures with no hand-read block: written or generated for inferwatch (their notes say so), compared elsewhere
# against an independent parse of the same file.
MADE_HERE = ("synthetic", "signals")


def captures() -> list[str]:
    return sorted(p.name for p in ENGINES.glob("*.prom") if not any(m in p.name for m in MADE_HERE))


def expected(name: str) -> dict[str, object]:
    note = (ENGINES / (name + ".SOURCE.md")).read_text(encoding="utf-8")
    found = BLOCK.findall(note)
    assert len(found) == 1, f"{name}.SOURCE.md: one ```expected block, read by hand from the capture"
    out: dict[str, object] = {"models": {}}
    for line in found[0].strip().splitlines():
        key, _, rest = line.partition(":") if not line.startswith("model ") else line.rpartition(": ")
        if line.startswith("model "):
            values = dict(pair.split("=", 1) for pair in rest.split())
            out["models"][key[len("model ") :]] = {k: float(v) for k, v in values.items()}  # type: ignore[index]
        elif key in ("mapped", "derived"):
            out[key] = set(rest.split())
        else:
            out[key] = rest.strip()
    return out


def read(name: str) -> dict[str, object]:
    body = (ENGINES / name).read_bytes()
    body = body if body.endswith(b"\n") else body + b"\n"  # the DataDog vLLM copy lost its final newline
    return inspect(EngineParser("auto", "unknown").parse(body))


def test_every_real_capture_has_a_hand_read_block() -> None:
    names = captures()
    assert len(names) >= 27
    for name in names:
        expected(name)


@pytest.mark.parametrize("name", captures())
def test_inspect_reads_the_capture_as_read_by_hand(name: str) -> None:
    want = expected(name)
    got = read(name)
    assert got["engine"] == want["engine"]
    assert got["release_range"] == want["release_range"]
    assert got["schema"] == want["schema"]
    coverage = got["coverage"]
    assert isinstance(coverage, dict)
    assert {q for q, s in coverage.items() if s == "mapped"} == want["mapped"]
    assert {q for q, s in coverage.items() if s == "derived (mean only)"} == want["derived"]
    models = got["models"]
    assert isinstance(models, dict)
    assert set(want["models"]) <= set(models)  # type: ignore[arg-type]  (a note may read a few of many models)
    for model, values in want["models"].items():  # type: ignore[attr-defined]
        entry = models[model]
        for key, value in values.items():
            quantity, _, field = key.partition(".")
            if field == "mean":
                have = entry["derived"][quantity]
            elif field:
                have = entry[quantity][field]
            else:
                have = entry["values"][key]
            assert have is not None and math.isclose(have, value, rel_tol=1e-5, abs_tol=1e-12), (model, key, have)


def test_the_trtllm_collector_is_told_apart_by_what_serves_it() -> None:
    """The same ``trtllm_`` families: beside Dynamo's ``dynamo_component_*`` runtime families they are a Dynamo
    TRT-LLM worker; the real worker capture with those lines taken out reads as trtllm-serve, values unchanged."""
    name = "trtllm-worker-via-dynamo.prom"
    want = expected(name)
    text = (ENGINES / name).read_text(encoding="utf-8")
    kept = [line for line in text.splitlines(keepends=True) if "dynamo_component_" not in line]
    assert len(kept) < len(text.splitlines()) and all("dynamo" not in line for line in kept)
    alone = inspect(EngineParser("auto", "unknown").parse("".join(kept).encode()))
    assert (alone["engine"], alone["schema"]) == ("trtllm", "trtllm-serve")
    assert alone["release_range"] != want["release_range"]
    model = alone["models"]["Qwen/Qwen3-0.6B"]
    for key, value in want["models"]["Qwen/Qwen3-0.6B"].items():  # type: ignore[index]
        quantity, _, field = key.partition(".")
        have = model[quantity][field] if field else model["values"][key]
        assert math.isclose(have, value, rel_tol=1e-9), (key, have)


def test_dynamo_counts_the_frontends_failed_requests_only() -> None:
    """The real frontend capture answered one request with success: no finished count. The same scrape after two
    failed streamed requests (a second ``requests_total`` series, as the frontend labels it) counts two errors."""
    text = (ENGINES / "dynamo-frontend-metrics-examples.prom").read_text(encoding="utf-8")
    ok = (
        'dynamo_frontend_requests_total{endpoint="chat_completions",model="qwen/qwen3-0.6b",'
        'request_type="unary",status="success"} 1\n'
    )
    failed = ok.replace('"unary",status="success"} 1', '"stream",status="error"} 2')
    assert text.count(ok) == 1
    parser = EngineParser("auto", "unknown")
    assert "finished" not in parser.parse(text.encode()).models["qwen/qwen3-0.6b"].counters
    later = parser.parse(text.replace(ok, ok + failed).encode()).models["qwen/qwen3-0.6b"]
    assert later.counters["finished"] == {"error": 2.0}


def test_the_command_prints_the_release_and_the_means(tmp_path: Path) -> None:
    """As users run it: the release range, what is mapped and derived, and the means with their unit."""
    capture = ENGINES / "llamacpp-ik-pr695.prom"
    text = subprocess.run(
        [PYTHON, "-m", "inferwatch.agent", "engine", "inspect", "--metrics-file", str(capture)],
        cwd=ROOT,
        capture_output=True,
        text=True,
        timeout=60,
    )
    assert text.returncode == 0, text.stderr
    assert "release: <= PR #13660 (kv_cache_usage_ratio)   schema: llamacpp-kv   unmapped families: 3" in text.stdout
    assert "derived (mean only): itl, prefill" in text.stdout
    assert "prefill mean (from counters, no quantile): 0.4217 s per token" in text.stdout  # 2903.63 / 6886
    doc = subprocess.run(
        [PYTHON, "-m", "inferwatch.agent", "engine", "inspect", "--metrics-file", str(capture), "--json"],
        cwd=ROOT,
        capture_output=True,
        text=True,
        timeout=60,
    )
    assert doc.returncode == 0, doc.stderr
    parsed = json.loads(doc.stdout)
    assert parsed["coverage"]["itl"] == "derived (mean only)" and parsed["coverage"]["kv_usage"] == "mapped"
    # the two throughput gauges and kv_cache_tokens: declared, read by no source
    assert parsed["unmapped_families"] == 3


def test_a_baseline_gives_the_mean_of_the_increase(tmp_path: Path) -> None:
    """Two scrapes of a counters-only llama.cpp: the mean over the window, not since the server started."""
    before = (ENGINES / "llamacpp-ik-pr695.prom").read_text()
    after = before.replace("prompt_tokens_total 6886", "prompt_tokens_total 7886").replace(
        "prompt_seconds_total 2903.63", "prompt_seconds_total 2953.63"
    )
    parser = EngineParser("auto", "unknown")
    got = inspect(parser.parse(after.encode()), parser.parse(before.encode()))
    assert got["models"]["unknown"]["derived"]["prefill"] == pytest.approx(50.0 / 1000.0)  # type: ignore[index]
    assert got["models"]["unknown"]["derived"]["itl"] is None  # no token generated in between  # type: ignore[index]


def test_the_collector_exports_the_schema_and_its_shrink_after_an_upgrade() -> None:
    """The agent against a real HTTP server: a mixed V0/V1 vLLM, then (an "upgrade") the V1-early capture that maps
    three quantities; the info gauge follows the release, the count drops as the two notes' blocks say."""
    from inferwatch.agent.config import Settings
    from inferwatch.agent.node.collectors.engine import EngineCollector
    from inferwatch.agent.node.runner import validate
    from inferwatch.agent.node.wiring import collect_context
    from tests import engine_server as es

    before, after = "vllm-0.5.x-with-v1-families.prom", "vllm-0.7-v1-prodstack-318.prom"
    want = {name: expected(name) for name in (before, after)}
    with es.EngineServer() as srv:
        srv.routes["/metrics"] = es.body((ENGINES / before).read_text() + "\n")
        settings = Settings.from_values(
            dict(engine={"metrics_url": srv.url("/metrics"), "timeout_s": 30})
        )  # generous: a loaded machine
        c = EngineCollector(collect_context(settings), settings.engine)
        try:
            seen = []
            for name in (before, after):
                srv.routes["/metrics"] = es.body((ENGINES / name).read_text() + "\n")
                seen.append(validate(c.collect()))
        finally:
            c.close()
    for name, collection in zip((before, after), seen, strict=True):
        w = want[name]
        by = {s.name: s for s in collection.samples if s.name.startswith("inferwatch.engine.") and "schema" in s.name}
        info = dict(by["inferwatch.engine.schema.info"].attributes)
        assert info == {"engine": "vllm", "release_range": w["release_range"], "schema": w["schema"]}
        count = [s for s in collection.samples if s.name == "inferwatch.engine.quantities.recognised"]
        assert [s.value for s in count] == [len(w["mapped"]) + len(w["derived"])]  # type: ignore[arg-type]
        assert collection.details["schema"]["release_range"] == w["release_range"]


def test_the_collector_exports_triton_means_per_request_over_the_window() -> None:
    """Triton core's cumulative microsecond counters become means per request over the window: the capture, then
    the same server 3 requests later with 3 s more of request time and 0.3 s more of queue (1 s and 0.1 s each)."""
    from inferwatch.agent.config import Settings
    from inferwatch.agent.node.collectors.engine import EngineCollector
    from inferwatch.agent.node.wiring import collect_context
    from tests import engine_server as es

    first = (ENGINES / "triton-core-durations-datadog.prom").read_text()
    later = (
        first.replace(
            'nv_inference_request_success{model="densenet_onnx",version="1"} 3',
            'nv_inference_request_success{model="densenet_onnx",version="1"} 6',
        )
        .replace(
            'duration_us{model="densenet_onnx",version="1"} 1327965',
            'duration_us{model="densenet_onnx",version="1"} 4327965',
        )
        .replace(
            'queue_duration_us{model="densenet_onnx",version="1"} 145',
            'queue_duration_us{model="densenet_onnx",version="1"} 300145',
        )
    )
    assert later.count("4327965") == 1 and "300145" in later and "} 6\n" in later
    clock = iter((1000.0, 1015.0))
    with es.EngineServer({"/metrics": es.body(first)}) as srv:
        settings = Settings.from_values(dict(engine={"metrics_url": srv.url("/metrics"), "timeout_s": 30}))
        c = EngineCollector(collect_context(settings), settings.engine, clock=lambda: next(clock))
        try:
            c.collect()
            srv.routes["/metrics"] = es.body(later)
            second = c.collect()
        finally:
            c.close()
    means = {
        (dict(s.attributes)["quantity"], dict(s.attributes)["window"]): s.value
        for s in second.samples
        if s.name == "inferwatch.engine.latency.mean" and dict(s.attributes)["gen_ai.request.model"] == "densenet_onnx"
    }
    assert means[("e2e", "1m")] == pytest.approx(1.0) and means[("e2e", "5m")] == pytest.approx(1.0)
    assert means[("queue", "1m")] == pytest.approx(0.1)
    assert means[("inference", "1m")] == 0.0  # its counter did not move while 3 requests succeeded


def test_the_status_page_shows_the_recognised_release() -> None:
    """The engine collector's collection of a real capture, put in the agent state, on the status page."""
    from inferwatch.agent.config import Settings
    from inferwatch.agent.node.api.pagehistory import PageHistory
    from inferwatch.agent.node.api.statushtml import render_page
    from inferwatch.agent.node.api.statuspage import build_overview
    from inferwatch.agent.node.collectors.engine import EngineCollector
    from inferwatch.agent.node.state import AgentState, CollectorHealth
    from inferwatch.agent.node.wiring import collect_context
    from tests import engine_server as es

    name = "vllm-0.10.0-prodstack-617.prom"
    want = expected(name)
    with es.EngineServer({"/metrics": es.body((ENGINES / name).read_text())}) as srv:
        settings = Settings.from_values(dict(engine={"metrics_url": srv.url("/metrics"), "timeout_s": 30}))
        c = EngineCollector(collect_context(settings), settings.engine)
        try:
            collection = c.collect()
        finally:
            c.close()
    state = AgentState()
    state.record("engine", CollectorHealth("engine", 1.0, 1.0, runs=1, state="ok"), collection)
    ov = build_overview(state, PageHistory())
    assert ov["engine_schema"] == {
        "engine": "vllm",
        "release_range": want["release_range"],
        "schema": want["schema"],
        "quantities_recognised": len(want["mapped"]) + len(want["derived"]),  # type: ignore[arg-type]
        "unmapped_families": 0,  # the two _created gauges are counters' timestamps, the rest is read
    }
    page = render_page(ov)
    assert "vllm: v1 0.9 - 0.10 (kv_cache_usage_perc) (schema vllm-v1-kv); 2 quantities mapped or derived" in page
