"""The collector's path: an exposition parsed chunk by chunk as it streams in (agent/node/engine/scrape.py).

The same body read whole (``EngineParser.parse``) and in chunks of any size gives the same reading and
the same errors, with line numbers counted across chunks; the body itself is never held.
"""

from __future__ import annotations

import pytest

from inferwatch.agent.node.engine import scrape
from inferwatch.agent.node.engine.adapters import EngineReading
from inferwatch.agent.node.engine.fetch import EngineScrapeError
from inferwatch.agent.node.engine.limits import EngineLimits
from inferwatch.agent.node.engine.scrape import EngineParser
from tests.conftest import FIXTURES
from tests.engine_expo import VllmLike

ENGINES = FIXTURES / "engines"


def streamed(body: bytes, size: int, parser: EngineParser | None = None, ctype: str = "text/plain") -> EngineReading:
    stream = (parser or EngineParser()).stream()
    stream.begin(ctype)
    for i in range(0, len(body), size):
        stream.feed(body[i : i + size])
    return stream.finish()


@pytest.fixture(params=["default", "small", "compressed", "compressed, small"])
def hold(request: pytest.FixtureRequest, monkeypatch: pytest.MonkeyPatch) -> None:
    """The body held before it is read: the default (most bodies held whole, as they came), 100 bytes (streamed);
    held compressed past 40 bytes (whole), or past 20 bytes and read from 300 on."""
    if request.param == "small":
        monkeypatch.setattr(scrape, "STREAM_HOLD_BYTES", 100)
    if request.param.startswith("compressed"):
        monkeypatch.setattr(scrape, "HOLD_RAW_BYTES", 40 if request.param == "compressed" else 20)
    if request.param == "compressed, small":
        monkeypatch.setattr(scrape, "STREAM_HOLD_BYTES", 300)


def fixtures() -> list[str]:
    return sorted(p.name for p in ENGINES.glob("*.prom"))


@pytest.mark.parametrize("name", fixtures())
@pytest.mark.parametrize("size", [1, 7, 4096, 1 << 20])
@pytest.mark.usefixtures("hold")
def test_streamed_reading_equals_the_whole_body_one(name: str, size: int) -> None:
    body = (ENGINES / name).read_bytes()
    body = body if body.endswith(b"\n") else body + b"\n"
    whole = EngineParser().parse(body)
    got = streamed(body, size)
    assert got == whole


@pytest.mark.usefixtures("hold")
def test_multibyte_characters_cut_by_a_chunk_and_a_late_engine_family() -> None:
    # a preamble of another program's families: the engine is told once its first family arrives
    pre = "".join(f'python_info{{x="é{i}"}} 1\n' for i in range(5000))
    gen = VllmLike(["modèle-ü"], engines=2, seed=2)
    gen.observe(5)
    body = (pre + gen.text()).encode()
    got = streamed(body, 3)
    assert got == EngineParser().parse(body) and list(got.models) == ["modèle-ü"]


@pytest.mark.parametrize("size", [1, 3, 64, 1 << 16])
@pytest.mark.parametrize("hold_bytes", [100, 300, scrape.STREAM_HOLD_BYTES])
def test_the_engine_is_told_from_compressed_held_bytes_as_from_raw_ones(
    monkeypatch: pytest.MonkeyPatch, hold_bytes: int, size: int
) -> None:
    """With families of several engines in a body, the engine told from held bytes kept compressed (past
    HOLD_RAW_BYTES) is the one told from the same bytes held as they came: detect() over the first STREAM_HOLD_BYTES
    (ENGINE_KINDS order), whichever chunk brings each prefix."""
    monkeypatch.setattr(scrape, "STREAM_HOLD_BYTES", hold_bytes)
    sglang = 'sglang:num_running_reqs{model_name="s"} 1\n'
    vllm = 'vllm:num_requests_running{model_name="v"} 2\n'
    pad = "".join(f'python_info{{x="{i}"}} 1\n' for i in range(8))
    told = set()
    for text in (sglang + pad + vllm, pad + sglang + vllm + pad, vllm + pad + sglang, sglang + pad, pad + vllm):
        body = text.encode()
        monkeypatch.setattr(scrape, "HOLD_RAW_BYTES", 1 << 30)
        raw = streamed(body, size)
        monkeypatch.setattr(scrape, "HOLD_RAW_BYTES", 20)
        assert streamed(body, size) == raw, text
        told.add(raw.kind)
    assert told == {"vllm", "sglang"}


@pytest.mark.parametrize(
    ("body", "reason", "where"),
    [
        (
            b'vllm:num_requests_running{model_name="m"} 1\nvllm:num_requests_running{model_name="n"} x\n',
            "parse",
            "line 2",
        ),
        (b'vllm:num_requests_running{model_name="m"} 1\nvllm:num_requests_running{mod', "truncated", "line 2"),
        (b'vllm:num_requests_running{model_name="caf\xe9"} 1\n', "not_utf8", "offset 41"),
        (
            b'vllm:num_requests_running{model_name="m"} 5\n' * 2,
            "duplicate_series",
            "line 2",
        ),
        (b"# TYPE my_server_requests counter\nmy_server_requests 3\n", "unknown_engine", "my_"),
    ],
)
@pytest.mark.parametrize("size", [1, 5, 1 << 16])
@pytest.mark.usefixtures("hold")
def test_errors_are_the_same_in_chunks(body: bytes, reason: str, where: str, size: int) -> None:
    strict = EngineLimits(max_bad_lines=0)
    with pytest.raises(EngineScrapeError) as whole:
        EngineParser(limits=strict).parse(body)
    with pytest.raises(EngineScrapeError) as err:
        streamed(body, size, EngineParser(limits=strict))
    assert err.value.reason == whole.value.reason == reason
    assert where in str(err.value), str(err.value)
    # tolerant (the default): a bad line is dropped with the same words, whole or in chunks
    if reason in ("parse", "duplicate_series"):
        whole_parser, chunked = EngineParser(), EngineParser()
        assert streamed(body, size, chunked) == whole_parser.parse(body)
        assert chunked.problems == whole_parser.problems and chunked.problems[0][0] == reason
        assert where in chunked.problems[0][1]


def test_a_limit_stops_the_read_at_the_line_that_breaks_it(monkeypatch: pytest.MonkeyPatch) -> None:
    """Once streaming, nothing after the offending line is read: the fetch stops there."""
    monkeypatch.setattr(scrape, "STREAM_HOLD_BYTES", 10)
    stream = EngineParser("vllm", limits=EngineLimits(max_label_value_bytes=10)).stream()
    stream.begin("text/plain")
    stream.feed(b'vllm:num_requests_running{model_name="m"} 1\n')
    with pytest.raises(EngineScrapeError) as err:
        stream.feed(b'vllm:num_requests_running{model_name="' + b"x" * 11 + b'"} 1\nmore')
    assert err.value.reason == "label_value_length_limit" and "line 2" in str(err.value)


def test_an_openmetrics_body_is_read_whole_with_its_rules() -> None:
    om = b'# TYPE vllm:num_requests_running gauge\nvllm:num_requests_running{model_name="m"} 1\n# EOF\n'
    assert streamed(om, 4, ctype="application/openmetrics-text") == EngineParser().parse(om)
    bad = b'# TYPE vllm:prompt_tokens counter\nvllm:prompt_tokens{model_name="m"} 1\n# EOF\n'  # no _total
    with pytest.raises(EngineScrapeError) as err:
        streamed(bad, 4, ctype="application/openmetrics-text")
    assert err.value.reason == "openmetrics"
