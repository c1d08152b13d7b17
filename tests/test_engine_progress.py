"""The engine collector's progress pass (agent/node/engine/progress.py): what hang detection reads, taken from the
progress families' lines alone between two full reads.

Its values are the full read's, for every recorded engine exposition it takes; where it cannot be sure of that (a
bad line, a series in a form it does not take) the collector reads the same body in full. Between full reads a
collection repeats the last full read's series (the very objects, so /metrics reuses their text) with new verdicts.
"""

from __future__ import annotations

import random
from pathlib import Path

import pytest

from inferwatch.agent.config import Settings
from inferwatch.agent.node.collectors.engine import FILTER_RETRY_S, EngineCollector
from inferwatch.agent.node.engine import progress as progress_module
from inferwatch.agent.node.engine.adapters import EngineReading
from inferwatch.agent.node.engine.fetch import EngineScrapeError
from inferwatch.agent.node.engine.progress import (
    PROGRESS_COUNTERS,
    PROGRESS_GAUGES,
    ProgressReader,
    filtered_url,
    find_lines,
    progress_lines,
)
from inferwatch.agent.node.engine.scrape import EngineParser
from inferwatch.agent.node.wiring import collect_context
from inferwatch.exporters.prometheus import prerender
from tests import engine_server as es
from tests.engine_expo import VllmLike
from tests.test_exposition_whole import python_calls

FIXTURES = sorted((Path(__file__).parent / "fixtures" / "engines").glob("*.prom"))
HANG = ("inferwatch.engine.stall", "inferwatch.engine.stall.allowance", "inferwatch.engine.hung")


def _progress_view(r: EngineReading) -> dict[str, object]:
    """What hang detection reads of a reading, per model that has any of it (a model with histograms alone, as an
    OpenVINO model server's, gives hang detection nothing)."""
    return {
        name: (
            m.ranks,
            {q: m.gauges.get(q) for q in PROGRESS_GAUGES},
            {c: m.counters.get(c) for c in PROGRESS_COUNTERS},
            {q: m.sources.get(q) for q in (*PROGRESS_GAUGES, *PROGRESS_COUNTERS)},
        )
        for name, m in r.models.items()
        if m.ranks or any(q in m.gauges or q in m.counters for q in (*PROGRESS_GAUGES, *PROGRESS_COUNTERS))
    }


def test_the_progress_pass_gives_the_full_reads_values_on_every_recorded_exposition() -> None:
    taken = 0
    for path in FIXTURES:
        body = path.read_bytes()
        try:
            full = EngineParser().parse(body)
        except EngineScrapeError:
            continue  # not a whole exposition of a known engine: no full read to stand for
        progress = ProgressReader(full.kind).read(body)
        if progress is None:
            continue  # it reads in full instead (OpenMetrics exemplars, a timestamp form it does not take...)
        taken += 1
        assert _progress_view(progress) == _progress_view(full), path.name
    assert taken >= 10, f"only {taken} of {len(FIXTURES)} recorded expositions read by the progress pass"


def test_the_progress_pass_reads_only_its_families_lines() -> None:
    gen = VllmLike([f"m{i}" for i in range(4)], engines=2, seed=3)
    gen.observe(5)
    body = gen.text().encode()
    r = ProgressReader("vllm")
    reading = r.read(body)
    assert reading is not None and set(reading.models) == {f"m{i}" for i in range(4)}
    kept = {ln.split(b"{")[0] for ln in body.splitlines() if ln and not ln.startswith(b"#")}
    assert 0 < r.lines < sum(1 for ln in body.splitlines() if ln and not ln.startswith(b"#")) / 5
    assert all(m.histograms == {} for m in reading.models.values()) and len(kept) > 20


def test_the_lines_are_found_in_chunks_as_in_one_search() -> None:
    """The search over the body in calls of ``chunk`` bytes (the interpreter let go between them) finds what one call
    over the whole body finds, at every chunk size, with lines cut anywhere by the chunk ends."""
    gen = VllmLike([f"m{i}" for i in range(3)], engines=2, seed=5)
    gen.observe(4)
    body = gen.text().encode()
    pattern, _ = progress_lines(ProgressReader("vllm").adapter.wanted())
    whole = pattern.findall(body)
    assert len(whole) > 20
    for chunk in (1, 7, 64, 100, 333, 4096, len(body) // 2, len(body), 10 * len(body)):
        assert find_lines(pattern, body, chunk) == whole, chunk
    for cut in (body[:-1], body[: len(body) // 3], b"\n\n" + body + b"no newline at the end", b"", b"\n"):
        for chunk in (1, 50, 1 << 20):
            assert find_lines(pattern, cut, chunk) == pattern.findall(cut), chunk


@pytest.mark.parametrize("find_chunk", [1, 50, 4096, 1 << 20])
def test_a_pass_over_the_body_as_it_arrives_reads_what_a_pass_over_the_whole_body_reads(
    monkeypatch: pytest.MonkeyPatch, find_chunk: int
) -> None:
    """The collector's pass (ProgressScan: fed the body chunk by chunk, searched every ~FIND_CHUNK bytes) gives the
    reading, the line count and None where the pass over the whole body does, for chunks cut anywhere; and it gives
    the body back byte for byte for the full read, kept as it came or compressed past HOLD_RAW_BYTES."""
    monkeypatch.setattr(progress_module, "FIND_CHUNK", find_chunk)
    gen = VllmLike([f"m{i}" for i in range(3)], engines=2, seed=6)
    gen.observe(4)
    body = gen.text().encode()
    pattern, _ = progress_lines(ProgressReader("vllm").adapter.wanted())
    lines_only = b"\n".join(pattern.findall(body)).lstrip(b"\n") + b"\n"  # its first line is a progress line
    running = next(ln for ln in body.splitlines() if ln.startswith(b"vllm:num_requests_running{"))
    bad = body.replace(running, running.rsplit(b" ", 1)[0] + b" x", 1)  # a bad value: the pass gives None
    rng = random.Random(find_chunk)
    for variant in (body, lines_only, bad, body[:-1], body[: len(body) // 3], b"", b"\n", b"\n\n" + body):
        whole = ProgressReader("vllm")
        expected = whole.read(variant)
        for hold_raw in (0, 1000, 1 << 30):
            monkeypatch.setattr(progress_module, "HOLD_RAW_BYTES", hold_raw)
            for most in (1, 13, 700, len(variant) + 1):
                r = ProgressReader("vllm")
                scan = r.scan()
                scan.begin("text/plain")
                at = 0
                while at < len(variant):
                    step = rng.randint(1, most)
                    scan.feed(variant[at : at + step])
                    at += step
                got = scan.finish()
                where = (variant[:40], hold_raw, most)
                assert (got is None) == (expected is None), where
                if got is not None and expected is not None:
                    assert _progress_view(got) == _progress_view(expected), where
                    assert r.lines == whole.lines, where
                assert scan.body() == variant, where
    assert ProgressReader("vllm").read(body) is not None and ProgressReader("vllm").read(lines_only) is not None
    assert ProgressReader("vllm").read(bad) is None


def _collector(url: str, clock: list[float]) -> EngineCollector:
    settings = Settings.from_values(dict(engine={"metrics_url": url, "kind": "vllm", "health_url": ""}))
    return EngineCollector(collect_context(settings), settings.engine, 5.0, lambda: clock[0])


def test_between_full_reads_a_collection_repeats_the_full_reads_series_with_new_verdicts() -> None:
    gen = VllmLike([f"m{i}" for i in range(3)], engines=2, seed=5)
    gen.observe(4)
    clock = [1000.0]
    with es.EngineServer() as srv:
        srv.routes["/metrics"] = es.body(gen.text())
        c = _collector(srv.url("/metrics"), clock)
        try:
            kinds, made = [], []
            for _ in range(7):  # a 2 s cadence and a 5 s interval: full, progress, progress, full, ...
                col = c.collect()
                prerender(col)
                kinds.append(col.details["read"]["kind"])
                made.append(col)
                gen.observe(1)
                srv.routes["/metrics"] = es.body(gen.text())
                clock[0] += 2.0
                if kinds[-1] == "full":
                    assert not c.paces_cadence()  # a full read between passes does not set the cadence
        finally:
            c.close()
    assert kinds == ["full", "progress", "progress", "full", "progress", "progress", "full"]
    full, progress = made[0], made[1]
    same = [s for s in full.samples if s.name not in HANG]
    assert [s for s in progress.samples if s.name not in HANG] == same
    assert all(a is b for a, b in zip(same, [s for s in progress.samples if s.name not in HANG], strict=True))
    stall = [s for s in progress.samples if s.name == HANG[0]]
    assert len(stall) == len(progress.details["hang"]) == 6  # three models x two ranks judged on the pass's reading
    assert not {id(s) for s in stall} & {id(s) for s in full.samples}  # new objects: the verdicts of this pass
    # the exposition reuses what it rendered for the series that did not change: the pass costs it the verdicts
    blocks, before = progress.rendered["prometheus"], full.rendered["prometheus"]
    assert all(blocks[n] is before[n] for n in blocks if n not in HANG)
    assert all(blocks[n] is not before[n] for n in HANG)


def _pass_and_full_calls(body: str) -> tuple[int, int]:
    clock = [1000.0]
    with es.EngineServer() as srv:
        srv.routes["/metrics"] = es.body(body)
        c = _collector(srv.url("/metrics"), clock)
        try:
            first = c.collect()
            prerender(first)
            clock[0] += 2.0
            prerender(c.collect())  # the first pass makes its reader and its URL: once per engine kind
            clock[0] += 2.0
            progress = python_calls(lambda: prerender(c.collect()))
            clock[0] += 2.0
            full = python_calls(lambda: prerender(c.collect()))
        finally:
            c.close()
    return progress, full


def test_a_progress_pass_costs_a_fraction_of_a_full_read() -> None:
    """Counted, not timed: the calls of one pass and its /metrics text against a full read's, at 8 models x 2 ranks."""
    gen = VllmLike([f"m{i}" for i in range(8)], engines=2, seed=9)
    gen.observe(5)
    progress, full = _pass_and_full_calls(gen.text())
    print(f"calls: progress pass {progress}, full read {full}")
    assert progress * 4 < full, (progress, full)


RUNNING = 'vllm:num_requests_running{engine="1",model_name="m0"}'
GENERATED = 'vllm:generation_tokens_total{engine="1",model_name="m0"}'


@pytest.mark.parametrize(
    ("head", "into"),
    [
        (RUNNING + " ", RUNNING + " x"),  # a bad value on a progress line: the full read drops and counts that line
        # a rank's tokens written with a quoted name (Prometheus 3): the pass does not take it, the full read does
        (GENERATED, '{"vllm:generation_tokens_total",engine="1",model_name="m0"}'),
    ],
)
def test_a_pass_that_cannot_stand_for_a_full_read_reads_the_body_in_full(head: str, into: str) -> None:
    gen = VllmLike(["m0", "m1"], engines=2, seed=2)
    gen.observe(3)
    clean = gen.text()
    line = next(ln for ln in clean.splitlines() if ln.startswith(head))
    changed = clean.replace(line, into if head.endswith(" ") else into + line[len(head) :])  # the value kept, or not
    assert changed != clean
    clock = [1000.0]
    with es.EngineServer() as srv:
        srv.routes["/metrics"] = es.body(clean)
        c = _collector(srv.url("/metrics"), clock)
        try:
            c.collect()
            clock[0] += 2.0
            srv.routes["/metrics"] = es.body(changed)
            col = c.collect()
        finally:
            c.close()
    assert col.details["read"]["kind"] == "full" and c.read_counts["fallback"] == 1
    assert {(v["model"], v["rank"]) for v in col.details["hang"]} == {(m, r) for m in ("m0", "m1") for r in "01"}


# --- asking for the progress families alone (name[]=, prometheus_client's restricted registry) ---------------------


def _filtered_collector(url: str, clock: list[float], **engine: object) -> EngineCollector:
    values = {"metrics_url": url, "kind": "vllm", "health_url": "", **engine}
    settings = Settings.from_values(dict(engine=values))
    return EngineCollector(collect_context(settings), settings.engine, 5.0, lambda: clock[0])


def _verdicts(col: object) -> list[tuple[str, str, bool]]:
    hang = col.details["hang"]  # type: ignore[attr-defined]
    return sorted((v["model"], v["rank"], v["stalled"]) for v in hang)


def test_a_pass_asks_prometheus_clients_own_server_for_its_families_and_reads_a_fraction_of_the_body() -> None:
    """The engine here is prometheus_client's own HTTP server over a vLLM-shaped registry (as vLLM serves its
    /metrics with prometheus_client's app): the pass's answer is its families alone, and it judges what a pass over
    the whole exposition judges."""
    from prometheus_client import start_http_server

    from tests.conftest import free_port

    gen = VllmLike([f"m{i}" for i in range(4)], engines=2, seed=11)
    gen.observe(4)
    port = free_port()
    httpd, thread = start_http_server(port, addr="127.0.0.1", registry=gen.registry)
    url = f"http://127.0.0.1:{port}/metrics"
    clock = [1000.0]
    asked, plain = _filtered_collector(url, clock), _filtered_collector(url, clock, progress_filter=False)
    try:
        for c in (asked, plain):
            first = c.collect()
            assert first.details["read"]["kind"] == "full" and len(first.details["models"]) == 4
            assert not any(c.parser.dropped_lines().values())  # the text format asked for: OpenMetrics escapes names
        full_bytes = asked._read_bytes
        clock[0] += 2.0
        gen.observe(2)
        got, want = asked.collect(), plain.collect()
        assert got.details["read"]["kind"] == want.details["read"]["kind"] == "progress"
        assert got.details["read"]["filter"] == {"state": "asked", "until": None, "refused": 0}
        assert want.details["read"]["filter"]["state"] == "off"
        assert asked._read_bytes * 10 < full_bytes, (asked._read_bytes, full_bytes)  # its families alone
        assert plain._read_bytes > 0.9 * full_bytes  # the whole exposition (its values moved on)
        assert asked._progress is not None and plain._progress is not None
        assert asked._progress.lines == plain._progress.lines > 0  # the same lines, taken from far fewer bytes
        assert _verdicts(got) == _verdicts(want) and len(_verdicts(got)) == 8
        assert [s for s in got.samples if s.name in HANG] == [s for s in want.samples if s.name in HANG]
    finally:
        asked.close()
        plain.close()
        httpd.shutdown()
        httpd.server_close()
        thread.join(5)


@pytest.mark.parametrize(
    "answer",
    [
        es.body(""),  # prometheus_client before 0.25 over a multiprocess registry: nothing
        es.status(400),  # a server that refuses the query
        es.body("# HELP x y\n# TYPE x gauge\nx 1\n"),  # something else, without the families
    ],
)
def test_an_answer_to_the_query_that_cannot_stand_for_a_full_read_is_never_read_as_the_whole_exposition(
    answer: es.Route,
) -> None:
    gen = VllmLike(["m0", "m1"], engines=2, seed=3)
    gen.observe(3)
    clock = [1000.0]
    with es.EngineServer() as srv:
        c = _filtered_collector(srv.url("/metrics"), clock)
        try:
            srv.routes["/metrics"] = es.body(gen.text())
            c.collect()
            query = c._progress_url()
            assert query is not None and str(query).startswith(srv.url("/metrics?name%5B%5D="))
            srv.routes[str(query)[len(srv.url("")) :]] = answer
            clock[0] += 2.0
            col = c.collect()
            # read in full from the plain URL: every series of the full read, the engine up, no error counted
            assert col.details["read"]["kind"] == "full" and c.read_counts["fallback"] == 1
            assert len(col.details["hang"]) == 4 and col.details["series_read"] > 100
            assert col.details["read"]["filter"] == {"state": "paused", "until": 1002.0 + FILTER_RETRY_S, "refused": 1}
            status = {(s.name, s.attributes): s.value for s in c.status_samples()}
            assert status[("inferwatch.engine.up", (("engine", "vllm"),))] == 1
            assert not any(v for (n, _), v in status.items() if n == "inferwatch.engine.scrape.errors")
            asked = str(query)[len(srv.url("")) :]

            def reads() -> list[str]:  # the engine's /metrics requests (not /v1/models, asked in a thread)
                return [p for _, p in srv.requests if p.startswith("/metrics")]

            assert reads()[-2:] == [asked, "/metrics"]
            clock[0] += 2.0
            assert c.collect().details["read"]["kind"] == "progress"  # the passes read the whole exposition now
            assert reads()[-1] == "/metrics"
            clock[0] += FILTER_RETRY_S
            c.collect()  # a full read (due)
            clock[0] += 2.0
            c.collect()  # the retry time has come: the pass asks again, and falls back again
            assert reads()[-2:] == [asked, "/metrics"] and c.read_counts["fallback"] == 2
        finally:
            c.close()


def test_an_engine_that_ignores_the_query_is_read_from_its_whole_answer() -> None:
    """TGI and llama.cpp answer ``/metrics?name[]=...`` with everything: the pass takes its lines from that."""
    gen = VllmLike(["m0", "m1"], engines=2, seed=4)
    gen.observe(3)
    clock = [1000.0]
    with es.EngineServer() as srv:
        srv.routes["/metrics"] = es.body(gen.text())  # any query: the same whole body
        c = _filtered_collector(srv.url("/metrics"), clock)
        try:
            c.collect()
            clock[0] += 2.0
            col = c.collect()
        finally:
            c.close()
    assert col.details["read"]["kind"] == "progress" and c.read_counts["fallback"] == 0
    assert "?name%5B%5D=" in srv.requests[-1][1] and len(col.details["hang"]) == 4


def test_the_query_keeps_the_urls_own() -> None:
    assert (
        filtered_url("http://e:8000/metrics?x=1", ["b", "a"]) == "http://e:8000/metrics?x=1&name%5B%5D=a&name%5B%5D=b"
    )
    assert filtered_url("http://e/metrics", ["vllm:a"]) == "http://e/metrics?name%5B%5D=vllm%3Aa"


def test_the_benchmarks_engine_answers_a_query_as_prometheus_client_does() -> None:
    """benchmarks/engine_scale.py's engine filters pre-rendered text as prometheus_client's restricted registry does."""
    from prometheus_client import generate_latest

    from benchmarks.engine_scale import restricted_text

    gen = VllmLike([f"m{i}" for i in range(3)], engines=2, seed=6)
    gen.observe(3)

    def families(text: bytes) -> list[bytes]:  # prometheus_client orders a restricted answer's families as a set
        return sorted(b"# HELP" + block for block in text.split(b"# HELP") if block)

    for names in (
        {"vllm:num_requests_running", "vllm:prompt_tokens_total"},
        set(ProgressReader("vllm").names),
        {"vllm:time_to_first_token_seconds_bucket", "vllm:time_to_first_token_seconds_count"},
        {"nothing"},
    ):
        want = generate_latest(gen.registry.restricted_registry(names))
        assert families(restricted_text(generate_latest(gen.registry), names)) == families(want), names
