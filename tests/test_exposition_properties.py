"""Property-based tests of the exposition reader: any input returns or raises the project's error.

Never another exception (IndexError, a bare ValueError, RecursionError, ...), and in bounded time and
memory: generated text, mutations of real expositions, OpenMetrics bodies, and huge lines.
"""

from __future__ import annotations

import time
import tracemalloc

from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from inferwatch.agent.errors import SourceFormatError
from inferwatch.agent.node.engine.exposition import Everything, ExpositionReader
from inferwatch.agent.node.engine.fetch import EngineScrapeError
from inferwatch.agent.node.engine.scrape import EngineParser
from inferwatch.agent.node.engine.textformat import ExpositionError, decode
from tests.conftest import FIXTURES

SEEDS = [
    (FIXTURES / "engines" / name).read_text()
    for name in ("vllm-v1-dp2-synthetic.prom", "sglang-0.5.10.post1.prom", "tgi-synthetic.prom")
]
SEEDS.append('# TYPE a counter\n# HELP a help\na_total{a="1"} 1 # {t="x"} 0.5 1.5\n# EOF\n')
# The characters the format is made of, so that mutations hit its corners more often than random text.
ALPHABET = st.sampled_from([*'{}",=#\\ \t\n_:.+-eE0123456789abcINFNaxé\x00', "# EOF\n", "# TYPE ", "le="])
SETTINGS = settings(max_examples=300, deadline=None, suppress_health_check=[HealthCheck.too_slow])
# Per input, in CPU seconds of the reading thread (time.thread_time): the work done, whatever the machine's load
# (wall time at CI's load 10-17 on 2 cores is several times this). The inputs here are a few KiB.
MAX_SECONDS = 5.0


def read_all(text: str) -> None:
    """Both readers the agent uses: everything kept (inspect) and the vLLM adapter's selection."""
    for reader in (ExpositionReader(("",), Everything()), ExpositionReader(("",), Everything(), scrape_rules=False)):
        try:
            reader.read(text)
        except ExpositionError as exc:
            assert exc.lineno >= 1 and exc.reason
        except SourceFormatError:
            pass


def bounded(fn, *args) -> None:  # type: ignore[no-untyped-def]
    started = time.thread_time()
    fn(*args)
    assert time.thread_time() - started < MAX_SECONDS


@SETTINGS
@given(st.text(max_size=400))
def test_any_text(text: str) -> None:
    bounded(read_all, text)


@SETTINGS
@given(st.lists(ALPHABET, max_size=200).map("".join))
def test_text_made_of_the_format_s_characters(text: str) -> None:
    bounded(read_all, text)
    bounded(read_all, text + "\n")


@SETTINGS
@given(
    st.sampled_from(SEEDS),
    st.lists(st.tuples(st.floats(0, 1), st.sampled_from(["insert", "delete", "replace"]), ALPHABET), max_size=8),
)
def test_mutations_of_real_expositions(seed: str, edits: list[tuple[float, str, str]]) -> None:
    text = seed
    for where, op, piece in edits:
        i = int(where * len(text))
        if op == "insert":
            text = text[:i] + piece + text[i:]
        elif op == "delete":
            text = text[:i] + text[i + 1 :]
        else:
            text = text[:i] + piece + text[i + 1 :]
    bounded(read_all, text)


@SETTINGS
@given(st.binary(max_size=300))
def test_engine_parser_on_any_bytes(body: bytes) -> None:
    try:
        EngineParser().parse(body)
    except EngineScrapeError as exc:
        assert exc.reason
    try:
        decode(body)
    except ExpositionError as exc:
        assert exc.lineno >= 1


def test_huge_lines_in_bounded_time_and_memory() -> None:
    mib = 2**20
    cases = [
        'vllm:x{model_name="' + "m" * (4 * mib) + '"} 1\n',  # a 4 MiB label value
        "vllm:x{" + ",".join(f'l{i}="v"' for i in range(100_000)) + "} 1\n",  # 100k labels on one line
        "vllm:" + "x" * (4 * mib) + " 1\n",  # a 4 MiB name
        "vllm:x " + "9" * (4 * mib) + "\n",  # a 4 MiB number
        'vllm:x{a="' + "\\\\" * mib + '"} 1\n',  # a million escapes
        "{" * mib + "\n",
        '"' * mib + "\n",
        "# HELP vllm:x " + "\\n" * mib + "\n",
    ]
    for text in cases:
        started = time.thread_time()  # CPU seconds of this thread: the work, not the machine's load
        read_all(text)  # two readers
        elapsed = time.thread_time() - started
        assert elapsed < 20, (text[:40], elapsed)  # ~1 s each on an idle core; linear, never quadratic
        tracemalloc.start()
        read_all(text)
        peak = tracemalloc.get_traced_memory()[1]
        tracemalloc.stop()
        assert peak < 40 * len(text) + 16 * mib, (text[:40], peak)  # linear in the input, no blow-up
