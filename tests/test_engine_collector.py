"""The engine collector against real HTTP servers on 127.0.0.1: good data, every kind of bad answer."""

from __future__ import annotations

import threading
import time

import httpx
import pytest
from prometheus_client.parser import text_string_to_metric_families

from inferwatch.agent.common.samples import HistogramSample, Sample
from inferwatch.agent.config import Settings
from inferwatch.agent.errors import NoDataError
from inferwatch.agent.node.collectors.engine import EngineCollector
from inferwatch.agent.node.engine.board import LatencyBoard
from inferwatch.agent.node.engine.emit import keep_sums, reading_samples
from inferwatch.agent.node.engine.fetch import EngineScrapeError
from inferwatch.agent.node.engine.scrape import EngineParser
from inferwatch.agent.node.runner import validate
from inferwatch.agent.node.wiring import collect_context
from tests import engine_server as es
from tests.conftest import FIXTURES, PYTHON, ROOT
from tests.engine_expo import VllmLike
from tests.procs import running, wait_http

VALID = (FIXTURES / "engines" / "vllm-v1-dp2-synthetic.prom").read_text()


def collector(url: str | None, **engine: object) -> EngineCollector:
    settings = Settings.from_values(dict(engine={"metrics_url": url, **engine}))
    return EngineCollector(collect_context(settings), settings.engine)


def samples_by_name(samples) -> dict[str, list]:
    out: dict[str, list] = {}
    for s in samples:
        out.setdefault(s.name, []).append(s)
    return out


def test_no_url_is_absence_with_a_hint() -> None:
    with pytest.raises(NoDataError) as err:
        collector(None).collect()
    assert "INFERWATCH_ENGINE__METRICS_URL" in str(err.value)


def test_good_exposition_windows_and_catalog() -> None:
    gen = VllmLike(["m1", "m2"], engines=2, seed=11)
    gen.observe(50)
    with es.EngineServer() as srv:
        srv.routes["/metrics"] = es.body(gen.text())
        c = collector(srv.url("/metrics"))
        try:
            first = validate(c.collect())
            by = samples_by_name(first.samples)
            assert {s.attributes for s in by["inferwatch.engine.info"]} == {
                (("engine", "vllm"), ("gen_ai.request.model", "m1")),
                (("engine", "vllm"), ("gen_ai.request.model", "m2")),
            }
            assert "inferwatch.engine.latency" not in by  # one scrape: no window yet
            ttft = [s for s in by["gen_ai.server.time_to_first_token"] if isinstance(s, HistogramSample)]
            assert len(ttft) == 2 and all(s.count == 100 for s in ttft)  # 50 per engine, summed
            gen.observe(10, slow=3.0)
            srv.routes["/metrics"] = es.body(gen.text())
            second = validate(c.collect())
        finally:
            c.close()
    by = samples_by_name(second.samples)
    counts = {
        (dict(s.attributes)["quantity"], dict(s.attributes)["window"]): s.value
        for s in by["inferwatch.engine.latency.samples"]
        if dict(s.attributes)["gen_ai.request.model"] == "m1"
    }
    assert counts[("ttft", "1m")] == 20 and counts[("e2e", "5m")] == 20  # 10 per engine in the window
    lat = [s for s in by["inferwatch.engine.latency"] if dict(s.attributes)["source"] == "histogram"]
    assert {dict(s.attributes)["quantile"] for s in lat} == {"0.5", "0.9", "0.95", "0.99"}
    gaps = by["inferwatch.engine.frontend_gap"]
    assert len(gaps) == 4 and all(isinstance(s, Sample) for s in gaps)
    board = c.board
    stats = board.get("m1", "ttft", "1m")
    assert stats is not None and stats.source == "histogram" and stats.count == 20


def test_llamacpp_token_time_from_counters() -> None:
    a = (FIXTURES / "engines" / "llamacpp-synthetic-a.prom").read_text()
    b = (FIXTURES / "engines" / "llamacpp-synthetic-b.prom").read_text()
    with es.EngineServer({"/metrics": es.body(a)}) as srv:
        c = collector(srv.url("/metrics"), model_name="tiny-llama")
        try:
            validate(c.collect())
            srv.routes["/metrics"] = es.body(b)
            out = validate(c.collect())
        finally:
            c.close()
    times = {
        (dict(s.attributes)["phase"], dict(s.attributes)["window"]): s.value
        for s in out.samples
        if s.name == "inferwatch.engine.token_time"
    }
    assert times[("prefill", "1m")] == pytest.approx(0.3 / 600)
    assert times[("decode", "5m")] == pytest.approx(4.0 / 200)
    names = {s.name for s in out.samples}
    assert "inferwatch.engine.kv_cache.usage" not in names  # llama.cpp has none: absent, never 0
    assert "inferwatch.engine.latency" not in names


BAD = {
    "garbage": (es.body(b"\x00\x01 hello world {{{ not metrics"), "not_prometheus"),
    "html": (es.body("<html>vllm:num_requests_running 1</html>", ctype="text/html"), "not_prometheus"),
    "json": (es.body('{"vllm:num_requests_running": 1}', ctype="application/json"), "not_prometheus"),
    "latin1": (es.body('vllm:num_requests_running{model_name="caf\xe9"} 1\n'.encode("latin-1")), "not_utf8"),
    "cut-midline": (es.body('vllm:num_requests_running{model_name="m"} 1\nvllm:num_requests_running{mod'), "truncated"),
    "short-body": (es.truncated(VALID[:500], claimed=len(VALID)), "truncated"),
    "huge-announced": (es.body("x" * (11 * 1024 * 1024)), "too_large"),
    "slow-answer": (es.slow(1.5, es.body(VALID)), "timeout"),
    "slow-body": (es.trickle(b"vllm:num_requests_running 1\n", 0.05, 3.0), "timeout"),
    "http-500": (es.status(500), "http_status"),
    "bad-line": (es.body('vllm:num_requests_running{model_name="m"} one\n'), "parse"),
    "bad-le": (
        es.body(
            '# TYPE vllm:e2e_request_latency_seconds histogram\nvllm:e2e_request_latency_seconds_bucket{le="abc"} 1\n'
        ),
        "parse",
    ),
    # a duplicate series: its second line is dropped and counted, the rest read (tests/test_engine_bad_lines.py)
    "type-conflict": (
        es.body("# TYPE vllm:num_requests_running gauge\n# TYPE vllm:num_requests_running counter\n"),
        "type_conflict",
    ),
    "negative-counter": (
        es.body("# TYPE vllm:prompt_tokens_total counter\nvllm:prompt_tokens_total -1\n"),
        "negative_value",
    ),
    # issue 14: a ratio far below its domain was exported as-is; an untyped counter below zero too
    "negative-kv-usage": (es.body('vllm:kv_cache_usage_perc{model_name="m"} -1e308\n'), "negative_value"),
    "kv-usage-above-one": (es.body('vllm:kv_cache_usage_perc{model_name="m"} 7\n'), "out_of_range"),
    "negative-untyped-counter": (es.body('vllm:generation_tokens_total{model_name="m"} -3\n'), "negative_value"),
    "unknown-engine": (es.body("# TYPE my_server_requests counter\nmy_server_requests 3\n"), "unknown_engine"),
}


@pytest.mark.parametrize("case", sorted(BAD))
def test_bad_answers_fail_with_their_reason(case: str) -> None:
    route, reason = BAD[case]
    with es.EngineServer({"/metrics": route}) as srv:
        c = collector(srv.url("/metrics"), timeout_s=0.5)
        try:
            started = time.monotonic()
            with pytest.raises(EngineScrapeError) as err:
                c.collect()
            elapsed = time.monotonic() - started
            status = samples_by_name(c.status_samples())
        finally:
            c.close()
    assert err.value.reason == reason, str(err.value)
    assert f"reason: {reason}" in str(err.value)
    assert elapsed < 10  # bounded (the deadline is 0.5 s; the bound is loose for a busy machine)
    assert status["inferwatch.engine.up"][0].value == 0
    errors = {dict(s.attributes)["reason"]: s.value for s in status["inferwatch.engine.scrape.errors"]}
    assert errors[reason] == 1 and sum(errors.values()) == 1


def test_a_streamed_body_past_the_byte_cap_is_cut() -> None:
    """No Content-Length: the cap is found while the body streams in (held, not yet parsed: under 8 MiB)."""
    body = "vllm:num_requests_running 1\n" + "".join(f'vllm:x{{i="{i:07d}"}} {"1" * 100}\n' for i in range(25_000))
    with es.EngineServer({"/metrics": es.body(body, length=False)}) as srv:
        c = collector(srv.url("/metrics"), timeout_s=10, max_bytes=2 * 1024 * 1024)
        try:
            with pytest.raises(EngineScrapeError) as err:
                c.collect()
        finally:
            c.close()
    assert len(body) > 2 * 1024 * 1024 and err.value.reason == "too_large", str(err.value)


def test_connection_refused() -> None:
    from tests.conftest import free_port

    c = collector(f"http://127.0.0.1:{free_port()}/metrics", timeout_s=0.5)
    with pytest.raises(EngineScrapeError) as err:
        c.collect()
    c.close()
    assert err.value.reason == "connect"


def test_agent_keeps_serving_while_the_engine_misbehaves(tmp_path) -> None:
    """A real agent process scrapes a real server that turns bad and good again."""
    gen = VllmLike(["m"], engines=2, seed=5)
    gen.observe(5)
    with es.EngineServer({"/metrics": BAD["garbage"][0]}) as srv:
        from tests.conftest import free_port

        port = free_port()
        env = {
            "INFERWATCH_ENGINE__METRICS_URL": srv.url("/metrics"),
            "INFERWATCH_ENGINE__TIMEOUT_S": "0.5",
            "INFERWATCH_COLLECTORS__ENGINE__TIMEOUT_S": "3",
        }
        cmd = [PYTHON, "-m", "inferwatch.agent", "run", "--port", str(port), "--interval", "0.3"]
        with running(cmd, tmp_path / "agent.log", cwd=ROOT, env=env) as proc:
            base = f"http://127.0.0.1:{port}"
            wait_http(f"{base}/readyz", ok=lambda r: r.status_code == 200, proc=proc)
            for case in ("garbage", "latin1", "huge-announced", "slow-answer", "short-body"):
                srv.routes["/metrics"] = BAD[case][0]
                reason = BAD[case][1]
                metrics = _wait_metric(base, "inferwatch_engine_scrape_errors_total", {"reason": reason}, 1.0)
                assert metrics["inferwatch_engine_up"] == 0
                status = httpx.get(f"{base}/api/v1/status", timeout=5).json()
                eng = next(c for c in status["collectors"] if c["name"] == "engine")
                assert eng["state"] == "failed" and f"reason: {reason}" in eng["last_error"]
            srv.routes["/metrics"] = es.body(gen.text())
            _wait_metric(base, "inferwatch_engine_up", {"engine": "vllm"}, 1.0)
            gen.observe(5)
            srv.routes["/metrics"] = es.body(gen.text())
            _wait_metric(
                base,
                "inferwatch_engine_latency_samples",
                {"gen_ai_request_model": "m", "quantity": "ttft", "window": "1m", "source": "histogram"},
                10.0,
            )


def _wait_metric(base: str, name: str, labels: dict[str, str], at_least: float, timeout_s: float = 120.0) -> dict:
    """Poll the agent's /metrics until ``name{labels} >= at_least``; return {name: value} of unlabeled engine series.
    The default bounds a hang (CI's load 10-17 on 2 cores), never how soon a healthy agent gets there."""
    deadline = time.monotonic() + timeout_s
    last = None
    while time.monotonic() < deadline:
        text = httpx.get(f"{base}/metrics", timeout=5).text
        seen: dict[str, float] = {}
        found = False
        for family in text_string_to_metric_families(text):
            for s in family.samples:
                if s.name == "inferwatch_engine_up":
                    seen[s.name] = s.value
                if s.name == name and all(s.labels.get(k) == v for k, v in labels.items()):
                    last = s.value
                    found = found or s.value >= at_least
        if found:
            return seen
        time.sleep(0.2)
    raise AssertionError(f"{name}{labels} did not reach {at_least} (last {last})")


def test_engine_restart_and_new_rank_between_scrapes() -> None:
    before = VllmLike(["m"], engines=1, seed=21)
    before.observe(30)
    with es.EngineServer({"/metrics": es.body(before.text())}) as srv:
        c = collector(srv.url("/metrics"))
        try:
            validate(c.collect())
            before.observe(4)
            srv.routes["/metrics"] = es.body(before.text())
            validate(c.collect())  # +4 on engine 0
            after = VllmLike(["m"], engines=2, seed=22)  # restarted with a second data-parallel rank
            after.observe(3)
            srv.routes["/metrics"] = es.body(after.text())
            out = validate(c.collect())
        finally:
            c.close()
    counts = {
        dict(s.attributes)["window"]: s.value
        for s in out.samples
        if s.name == "inferwatch.engine.latency.samples" and dict(s.attributes)["quantity"] == "e2e"
    }
    # 4 before the restart + 3 on the restarted engine 0; the new engine 1's first 3 are history, not increase
    assert counts == {"1m": 7, "5m": 7}
    cumulative = [s for s in out.samples if s.name == "gen_ai.server.request.duration"]
    assert len(cumulative) == 1 and cumulative[0].count == 6  # what the engine says now, summed over ranks


def test_board_prefers_spans_and_samples_fit_the_catalog() -> None:
    from inferwatch.agent.common.samples import Collection
    from inferwatch.agent.node.engine.board import LatencyStats, latency_samples

    board = LatencyBoard()
    hist = LatencyStats({0.5: 0.3, 0.9: 0.5, 0.95: 0.6, 0.99: 0.9}, 100, "histogram", 0.35)
    spans = LatencyStats({0.5: 0.29, 0.9: 0.45, 0.95: 0.55, 0.99: 0.87}, 98, "spans", 0.33)
    board.replace("histogram", {("m", "ttft", "1m"): hist})
    board.replace("spans", {("m", "ttft", "1m"): spans})
    assert board.get("m", "ttft", "1m") is spans and board.get("m", "ttft", "1m", "histogram") is hist
    board.replace("spans", {})
    assert board.get("m", "ttft", "1m") is hist  # spans gone: the histogram value remains
    samples = latency_samples("m", "ttft", "1m", spans)
    validate(Collection(samples=samples))
    ratio = next(s for s in samples if s.name == "inferwatch.engine.latency.tail_ratio")
    assert ratio.value == pytest.approx(0.87 / 0.29) and dict(ratio.attributes)["source"] == "spans"


class _SlowParse:
    """Wraps the collector's parser: while ``slow`` is set, each chunk waits for ``release`` before it is read."""

    def __init__(self, parser: object) -> None:
        self.parser = parser
        self.slow = threading.Event()
        self.release = threading.Event()
        self.waiting = threading.Event()

    def dropped_lines(self) -> dict[str, int]:
        return self.parser.dropped_lines()  # type: ignore[attr-defined,no-any-return]

    def stream(self) -> object:
        inner = self.parser.stream()  # type: ignore[attr-defined]
        outer = self

        class Stream:
            def begin(self, content_type: str) -> None:
                inner.begin(content_type)

            def feed(self, chunk: bytes) -> None:
                if outer.slow.is_set():
                    outer.waiting.set()
                    outer.release.wait(10)
                inner.feed(chunk)

            def finish(self) -> object:
                return inner.finish()

        return Stream()


def _status(c: EngineCollector) -> tuple[float | None, dict[str, float]]:
    status = samples_by_name(c.status_samples())
    up = status["inferwatch.engine.up"][0].value if "inferwatch.engine.up" in status else None
    return up, {dict(s.attributes)["reason"]: s.value for s in status["inferwatch.engine.scrape.errors"]}


def _poll(pred, timeout_s: float = 10.0) -> bool:
    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline:
        if pred():
            return True
        time.sleep(0.02)
    return False


def test_a_parse_past_the_collector_timeout_sets_up_0_and_counts_a_timeout() -> None:
    """issue 14: every run timed out as hung while engine_up stayed 1 and scrape_errors_total did not move.

    The fetch deadline (``engine.timeout_s``) is the server's: the agent's own parsing is not counted against
    it, so a slow parse is cut by the runner's collector timeout, which must report like a fetch error.
    """
    from inferwatch.agent.node.collectors import Schedule
    from inferwatch.agent.node.runner import Runner
    from inferwatch.agent.node.state import AgentState

    with es.EngineServer({"/metrics": es.body(VALID)}) as srv:
        c = collector(srv.url("/metrics"), timeout_s=5)
        slow = _SlowParse(c.parser)
        c.parser = slow  # type: ignore[assignment]
        state = AgentState()
        runner = Runner(state, [c], {"engine": Schedule(0.1, 0.3, "engine")})
        runner.start()
        try:
            assert _poll(lambda: state.health()["engine"].state == "ok")
            up, errors = _status(c)
            # a cold first run can outlast the 0.3 s run timeout on a loaded machine (fresh run of 2026-12-07):
            # only timeouts before the slow parse, and the slow parse must add its own
            assert up == 1 and sum(errors.values()) == errors["timeout"]
            before = errors["timeout"]
            slow.release.clear()
            slow.slow.set()
            assert slow.waiting.wait(10)  # a run is parsing, well inside the 5 s fetch deadline
            assert _poll(lambda: state.health()["engine"].error_reason == "hung")  # timed out, then hung
            up, errors = _status(c)
            assert up == 0
            assert errors["timeout"] >= before + 2 and sum(errors.values()) == errors["timeout"]
            slow.slow.clear()
            slow.release.set()  # the abandoned run ends: it is not the runner's any more and changes nothing
            assert _poll(lambda: state.health()["engine"].state == "ok")  # the next run is a good one
            assert _status(c)[0] == 1
        finally:
            slow.release.set()
            runner.stop()


def test_a_run_the_runner_gave_up_on_does_not_set_up_when_it_ends() -> None:
    with es.EngineServer({"/metrics": es.body(VALID)}) as srv:
        c = collector(srv.url("/metrics"), timeout_s=5)
        slow = _SlowParse(c.parser)
        c.parser = slow  # type: ignore[assignment]
        try:
            c.collect()
            slow.slow.set()
            late = threading.Thread(target=c.collect)
            late.start()
            assert slow.waiting.wait(10)
            c.run_failed("timeout")  # the runner: this run is past its timeout
            assert _status(c)[0] == 0
            slow.release.set()
            late.join(10)
            up, errors = _status(c)
            assert up == 0 and errors["timeout"] == 1 and sum(errors.values()) == 1
        finally:
            slow.release.set()
            c.close()


def test_keep_sums_changes_no_sample_made_from_the_reading() -> None:
    """The collector replaces each histogram's per-rank series by their sum once the windows and the hang detector
    have read them (memory): every sample made from the reading after that is the one made before."""
    gen = VllmLike(["m1", "m2"], engines=3, seed=17)
    gen.observe(40)
    reading = EngineParser("vllm").parse(gen.text().encode())
    assert all(len(series) == 3 for m in reading.models.values() for series in m.histograms.values())
    before = reading_samples(reading)
    keep_sums(reading)
    assert all(len(series) == 1 for m in reading.models.values() for series in m.histograms.values())
    after = reading_samples(reading)
    assert after == before and any(isinstance(s, HistogramSample) for s in after)
