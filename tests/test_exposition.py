"""``/metrics`` is written by inferwatch.exporters.prometheus.render: byte for byte what prometheus_client's
``generate_latest`` makes of the agent's registry, for every metric the catalog declares.

prometheus_client is the oracle here: the state holds samples of every catalog metric (every kind, label
values that need escaping, missing attributes, duplicate series, NaN/±Inf and values Go writes with an
exponent), and both paths must agree exactly; the text must also parse back to the same values.
"""

from __future__ import annotations

import math
import random

from prometheus_client import generate_latest
from prometheus_client.parser import text_string_to_metric_families

from inferwatch.agent import catalog
from inferwatch.agent.catalog.spec import Kind
from inferwatch.agent.common.samples import HistogramSample, Sample
from inferwatch.agent.node.collectors.base import Collection
from inferwatch.agent.node.state import AgentState, CollectorHealth
from inferwatch.exporters.openmetrics import make_registry
from inferwatch.exporters.prometheus import float_text, render

AWKWARD = ["plain", "back\\slash", 'quote"d', "new\nline", "ünïcode ✓", "", "a,b=c{d}", "50%s %d %%"]
VALUES = [0.0, 1.0, -2.5, 1e22, 123456789.0, 0.1 + 0.2, 5e-324, math.inf, -math.inf, math.nan, 7]


def _state() -> AgentState:
    state = AgentState(environment="test")
    samples: list[Sample | HistogramSample] = []
    for i, spec in enumerate(catalog.CATALOG.values()):
        for j in range(3):
            values = {a: AWKWARD[(i + j + k) % len(AWKWARD)] for k, a in enumerate(spec.attributes)}
            if j == 2 and spec.attributes:  # one attribute missing: exported as an empty label
                values.pop(spec.attributes[-1])
            attributes = tuple(sorted(values.items()))
            if spec.kind is Kind.HISTOGRAM:
                bounds = [*spec.buckets[:3], math.inf] if spec.buckets else [0.1, 1.0, math.inf]
                buckets = tuple((b, float(n * (j + 1))) for n, b in enumerate(bounds, 1))
                samples.append(
                    HistogramSample(spec.name, buckets, VALUES[(i + j) % len(VALUES)], buckets[-1][1], attributes)
                )
            else:
                samples.append(Sample(spec.name, VALUES[(i + j) % len(VALUES)], attributes))
        if spec.attributes:  # the same series again (a second source): the first one is kept
            first = samples[-3]
            if isinstance(first, Sample):
                samples.append(Sample(first.name, 99.0, first.attributes))
    negative = next(s for s in catalog.CATALOG.values() if s.kind is Kind.HISTOGRAM)
    samples.append(HistogramSample(negative.name, ((-1.0, 1.0), (math.inf, 2.0)), 0.5, 2.0, (("zz", "x"),)))
    state.register(CollectorHealth("synthetic", 5.0, 5.0))
    state.record(
        "synthetic",
        CollectorHealth(
            "synthetic",
            5.0,
            5.0,
            runs=3,
            errors=1,
            duration_s=0.012,
            state="ok",
            last_success_at=1_700_000_000.25,
            error_counts={"timeout": 1},
        ),
        Collection(samples),
    )
    state.add_source("not-in-catalog", lambda: [Sample("no.such.metric", 1.0)])
    return state


def test_render_is_byte_identical_to_generate_latest() -> None:
    state = _state()
    expected = generate_latest(make_registry(state))
    got = render(state)
    assert got.splitlines() == expected.splitlines()  # a readable diff on failure
    assert got == expected
    assert b"no_such_metric" not in got


def test_every_declared_metric_is_rendered_and_parses_back() -> None:
    state = _state()
    families = {f.name: f for f in text_string_to_metric_families(render(state).decode())}
    for spec in catalog.CATALOG.values():
        base = spec.prometheus.removesuffix("_total") if spec.kind is Kind.COUNTER else spec.prometheus
        assert base in families, spec.name
    quoted = [s for f in families.values() for s in f.samples if 'quote"d' in s.labels.values()]
    assert quoted and all(s.labels for s in quoted)
    assert any(math.isnan(s.value) for f in families.values() for s in f.samples)


def test_empty_state_renders_the_agent_info_only() -> None:
    state = AgentState(environment="prod")
    assert render(state) == generate_latest(make_registry(state))
    assert b'inferwatch_agent_info{environment="prod"' in render(state)


def test_float_text_is_prometheus_client_s_float_to_go_string() -> None:
    from prometheus_client.utils import floatToGoString

    values = [0.0, -0.0, 1.0, -1.0, 0.1, 1e-7, 2.5e-300, 5e-324, 1234567.0, 12345678.0, -12345678.0, 9999999.999]
    values += [1e7, 1.5e7, 123456789.125, 1e15, 9.999999999999998e15, 1e16, 1.2345e16, -1e16, 1e300]
    values += [1.7976931348623157e308]
    values += [math.inf, -math.inf, math.nan, 3, 10**7, 2**53, -(10**9), True]
    rng = random.Random(38)
    values += [rng.uniform(-1, 1) * 10 ** rng.randint(-20, 20) for _ in range(2000)]
    for v in values:
        assert float_text(v) == floatToGoString(v), v


def _big_state(series: int) -> AgentState:
    """A state whose exposition is several pieces long (``series`` gauge series of one family)."""
    state = AgentState(environment="test")
    spec = next(s for s in catalog.CATALOG.values() if s.kind is Kind.GAUGE and s.attributes)
    samples = [
        Sample(spec.name, float(i), tuple((a, f"{a}-{i:07d}" * 4) for a in spec.attributes)) for i in range(series)
    ]
    state.register(CollectorHealth("synthetic", 5.0, 5.0))
    state.record("synthetic", CollectorHealth("synthetic", 5.0, 5.0, runs=1, state="ok"), Collection(samples))
    return state


def test_metrics_is_written_in_pieces_that_add_up_to_the_whole_text() -> None:
    """issue 38: the scrape's answer is written in ~256 KiB pieces (never one more copy of the whole text), with the
    whole text's Content-Length; a HEAD gets the headers alone."""
    import asyncio

    from inferwatch.agent.config import ApiSettings
    from inferwatch.agent.node.api.auth import Authenticator
    from inferwatch.agent.node.api.server import WRITE_PIECE_BYTES, MetricsEndpoint

    state = _big_state(20_000)
    whole = render(state)
    assert len(whole) > 4 * WRITE_PIECE_BYTES
    endpoint = MetricsEndpoint(None, state, Authenticator(ApiSettings()), None, 2.0, exemplars=False)

    def scrape(method: str) -> list[dict]:
        sent: list[dict] = []

        async def send(message: dict) -> None:
            sent.append(message)

        scope = {"type": "http", "path": "/metrics", "method": method, "headers": []}
        asyncio.run(endpoint(scope, None, send))
        return sent

    start, *bodies = scrape("GET")
    assert dict(start["headers"])[b"content-length"] == str(len(whole)).encode()
    assert b"".join(m["body"] for m in bodies) == whole
    assert [m["more_body"] for m in bodies] == [True] * (len(bodies) - 1) + [False]
    assert len(bodies) >= len(whole) // WRITE_PIECE_BYTES  # pieces, never the whole text again
    assert all(len(m["body"]) <= 2 * WRITE_PIECE_BYTES for m in bodies)
    start, *bodies = scrape("HEAD")
    assert dict(start["headers"])[b"content-length"] == str(len(whole)).encode() and bodies == [
        {"type": "http.response.body", "body": b""}
    ]
