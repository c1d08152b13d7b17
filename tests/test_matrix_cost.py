"""Effective cost in the hardware × model matrix (issue 21): the price file, the arithmetic, and ``inferwatch
matrix --prices`` and the matrix dashboard's cost panels against a real Prometheus scraping two nodes of
different machine types at known token rates, with the price rules ``inferwatch prices FILE --rules`` writes.
"""

from __future__ import annotations

import contextlib
import csv
import io
import json
import subprocess
import time
from collections.abc import Iterator
from http.server import BaseHTTPRequestHandler
from pathlib import Path

import httpx
import pytest
import yaml

from inferwatch.agent.errors import ConfigError
from inferwatch.agent.fleet.matrix import Cell, Hardware, Matrix, cost_per_mtok, cost_rows, unpriced
from inferwatch.agent.fleet.prices import PRICE_RECORD, load_prices, parse_prices, price_rules
from tests.conftest import PYTHON, ROOT
from tests.tools import require

MODEL = "meta-llama/Llama-3.1-8B-Instruct"
FAST = Hardware("p5.48xlarge", "AMD EPYC 9654", "none")
SLOW = Hardware("c7g.16xlarge", "Neoverse-V1", "none")
PRICES = "currency: EUR\nmachine_types:\n  p5.48xlarge: 10\n  c7g.16xlarge: 2\n"


def test_price_file_format() -> None:
    t = parse_prices(PRICES)
    assert t.currency == "EUR" and t.per_hour == {"p5.48xlarge": 10.0, "c7g.16xlarge": 2.0} and not t.example
    shipped = load_prices(ROOT / "deploy" / "prices.example.yml")
    assert shipped.example, "the shipped example must say its values are placeholders"
    bad = {
        "currency: dollars\nmachine_types: {a: 1}": "currency",
        "currency: USD\nmachine_types: {a: -1}": "machine_types.a: price per hour must be > 0",
        "currency: USD\nmachine_types: {a: '1'}": "must be a number",
        "currency: USD\nmachine_types: {a: .nan}": "must be > 0",
        "currency: USD\nmachine_types: {}": "machine_types must map",
        'currency: USD\nmachine_types: {"a\\"b": 1}': "not a machine type name",
        "currency: USD\nmachine_types: {a: 1}\nregion: x": "unknown field(s) region",
        "currency: USD\nexample: maybe\nmachine_types: {a: 1}": "example must be true or false",
        "[1, 2": "not YAML",
    }
    for text, message in bad.items():
        with pytest.raises(ConfigError, match=message.replace("(", r"\(").replace(")", r"\)")):
            parse_prices(text)


def test_cost_arithmetic_match_and_rank() -> None:
    # The example: a machine reaching 65 % of the best throughput costs 1/0.65 of its "list" per token.
    assert cost_per_mtok(10.0, 1_000_000 / 3600) == pytest.approx(10.0)
    assert cost_per_mtok(1.0, 0.0) is None
    other = Hardware("m7i.48xlarge", "Xeon", "none")  # not priced
    m = Matrix(
        "1h",
        (MODEL,),
        (SLOW, other, FAST),
        {(MODEL, FAST): Cell(0.05, 300.0, 2), (MODEL, SLOW): Cell(0.4, 100.0, 1), (MODEL, other): Cell(0.3, 50.0, 1)},
    )
    table = parse_prices(PRICES)
    rows = cost_rows(m, table)
    assert [(r.hardware, r.rank) for r in rows] == [(SLOW, 1), (FAST, 2), (other, None)]
    assert rows[0].cost_per_mtok == pytest.approx(2 / (100 * 3600) * 1e6)  # 5.556
    assert rows[1].cost_per_mtok == pytest.approx(10 / (300 * 3600) * 1e6)  # 9.259
    assert [r.hardware_match for r in rows] == pytest.approx([1 / 3, 1.0, 1 / 6])
    assert unpriced(m, table) == ["m7i.48xlarge"]


def test_price_rules_pass_promtool(tmp_path: Path) -> None:
    require("promtool")
    rules = tmp_path / "prices.rules.yml"
    rules.write_text(price_rules(parse_prices(PRICES)))
    r = subprocess.run(["promtool", "check", "rules", str(rules)], capture_output=True, text=True, timeout=60)
    assert r.returncode == 0, r.stdout + r.stderr


def _cli(*args: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [PYTHON, "-m", "inferwatch.agent", *args], cwd=ROOT, capture_output=True, text=True, timeout=60, check=False
    )


def test_cli_price_errors(tmp_path: Path) -> None:
    bad = tmp_path / "bad.yml"
    bad.write_text("currency: USD\nmachine_types: {a: 0}\n")
    r = _cli("matrix", "--prometheus", "http://127.0.0.1:1", "--prices", str(bad))
    assert r.returncode == 2 and "machine_types.a: price per hour must be > 0" in r.stderr
    r = _cli("prices", str(tmp_path / "missing.yml"))
    assert r.returncode == 2 and "No such file" in r.stderr
    r = _cli("prices", str(ROOT / "deploy" / "prices.example.yml"))
    assert r.returncode == 0 and "p5.48xlarge\t50 USD/h" in r.stdout and "example: true" in r.stderr


# --- against a real Prometheus -------------------------------------------------------------------------------

TOKENS_PER_S = {FAST: 300, SLOW: 100}


@pytest.fixture(scope="module")
def prom(tmp_path_factory: pytest.TempPathFactory) -> Iterator[str]:
    """Two nodes (one per machine type) whose counters grow at known rates, scraped every second by the
    shipped Prometheus config with alerts/*.rules.yml and the price rules."""
    from tests import engine_server as es
    from tests import stack

    require("prometheus")
    tmp = tmp_path_factory.mktemp("cost")
    started = time.monotonic()

    def node(hw: Hardware) -> es.Route:
        def exposition(h: BaseHTTPRequestHandler) -> None:
            s = time.monotonic() - started
            n = int(s * 10)  # 10 requests/s, all within 100 ms
            m = f'gen_ai_request_model="{MODEL}"'
            text = (
                'inferwatch_agent_info{version="test"} 1\n'
                f'inferwatch_engine_info{{engine="vllm",{m}}} 1\n'
                f'inferwatch_node_info{{machine_type="{hw.machine_type}",cpu_model="{hw.cpu_model}"}} 1\n'
                + "".join(
                    f'gen_ai_server_time_to_first_token_seconds_bucket{{{m},le="{le}"}} {n}\n' for le in ("0.1", "+Inf")
                )
                + f"gen_ai_server_time_to_first_token_seconds_count{{{m}}} {n}\n"
                + f'inferwatch_engine_tokens_total{{{m},type="generation"}} {int(s * TOKENS_PER_S[hw])}\n'
            )
            es.body(text)(h)

        return exposition

    rules = tmp / "prices.rules.yml"
    rules.write_text(price_rules(parse_prices(PRICES)))
    with contextlib.ExitStack() as ctx:
        ports = [ctx.enter_context(es.EngineServer({"/metrics": node(hw)})).port for hw in (FAST, SLOW)]
        url = ctx.enter_context(
            stack.prometheus(tmp, {"inferwatch-agent": [f"127.0.0.1:{p}" for p in ports]}, extra_rule_files=[rules])
        )
        deadline = time.monotonic() + 60
        query = "count(count_over_time(model_hardware:inferwatch_engine_generation_tokens_per_node:rate5m[1m]) >= 6)"
        while time.monotonic() < deadline:  # enough recorded rates for both cells
            res = httpx.get(f"{url}/api/v1/query", params={"query": query}).json()["data"]["result"]
            if res and float(res[0]["value"][1]) >= 2:
                break
            time.sleep(0.5)
        else:
            pytest.fail(f"no recorded token rates for both nodes within 60 s: {res}")
        yield url


@pytest.mark.integration
def test_cli_prices_on_real_prometheus(prom: str, tmp_path: Path) -> None:
    prices = tmp_path / "prices.yml"
    prices.write_text(PRICES)
    r = _cli("matrix", "--prometheus", prom, "--window", "5s", "--prices", str(prices), "--format", "json")
    assert r.returncode == 0, r.stderr
    data = json.loads(r.stdout)
    assert data["currency"] == "EUR" and data["unpriced_machine_types"] == []
    cells = {c["hardware"]["machine_type"]: c for c in data["cells"]}
    # c7g: 2 EUR/h at 100 tok/s = 5.56 EUR/MTok, cheapest although 1/3 of p5's throughput (10 EUR/h, 9.26).
    assert cells["c7g.16xlarge"]["rank"] == 1 and cells["p5.48xlarge"]["rank"] == 2
    assert cells["c7g.16xlarge"]["cost_per_mtok"] == pytest.approx(5.556, rel=0.15)
    assert cells["p5.48xlarge"]["cost_per_mtok"] == pytest.approx(9.259, rel=0.15)
    assert cells["c7g.16xlarge"]["hardware_match"] == pytest.approx(1 / 3, rel=0.15)
    assert cells["p5.48xlarge"]["hardware_match"] == 1.0
    r = _cli("matrix", "--prometheus", prom, "--window", "5s", "--prices", str(prices), "--format", "csv")
    assert r.returncode == 0, r.stderr
    rows = list(csv.DictReader(io.StringIO(r.stdout)))
    assert [(x["rank"], x["machine_type"]) for x in rows] == [("1", "c7g.16xlarge"), ("2", "p5.48xlarge")]
    r = _cli("matrix", "--prometheus", prom, "--window", "5s", "--prices", str(prices))
    assert r.returncode == 0, r.stderr
    lines = r.stdout.splitlines()
    first = next(i for i, x in enumerate(lines) if "c7g.16xlarge" in x)
    assert "2 EUR/h" in lines[first] and "100%" in next(x for x in lines if "p5.48xlarge" in x), r.stdout
    assert first < next(i for i, x in enumerate(lines) if "p5.48xlarge" in x), "cheapest first"


@pytest.mark.integration
def test_dashboard_cost_panels_on_real_prometheus(prom: str) -> None:
    """Every panel of the matrix dashboard (the cost ones included) returns data; the cost and match panels'
    numbers equal the recorded rates' arithmetic and order the cells as the CLI does."""
    from inferwatch.dashboards import load_all
    from inferwatch.dashboards.prove import Prover, interpolate, panel_queries

    board = load_all()["inferwatch-matrix"]
    prover = Prover(prom, rate_interval="10s", range_="20s")
    try:
        bad = [o for o in prover.prove(board) if not o.ok]
        assert not bad, [(o.query.panel, o.query.ref_id, o.error, o.resolved) for o in bad]
        values = prover.resolve_variables(board)
    finally:
        prover.close()
    queries = {(q.panel, q.ref_id): q.expr for q in panel_queries(board)}
    macros = {**values, "__range": "20s"}
    at = f"{time.time():.3f}"  # every query at one instant: the recorded rates move every second

    def run(key: tuple[str, str]) -> dict[str, float]:
        params = {"query": interpolate(queries[key], macros), "time": at}
        res = httpx.get(f"{prom}/api/v1/query", params=params).json()
        return {x["metric"]["machine_type"]: float(x["value"][1]) for x in res["data"]["result"]}

    tokens = {
        x["metric"]["machine_type"]: float(x["value"][1])
        for x in httpx.get(
            f"{prom}/api/v1/query",
            params={
                "query": "avg_over_time(model_hardware:inferwatch_engine_generation_tokens_per_node:rate5m[20s])",
                "time": at,
            },
        ).json()["data"]["result"]
    }
    cost = run(("Cost ranking, one line per model and hardware type", "B"))
    match = run(("Cost ranking, one line per model and hardware type", "C"))
    price = run(("Cost ranking, one line per model and hardware type", "A"))
    assert price == {"p5.48xlarge": 10.0, "c7g.16xlarge": 2.0}
    for mt, p in price.items():  # tokens and cost at the same instant
        assert cost[mt] == pytest.approx(p / (tokens[mt] * 3600) * 1e6, rel=0.05)
    assert cost["c7g.16xlarge"] < cost["p5.48xlarge"]
    assert match["p5.48xlarge"] == 1.0 and match["c7g.16xlarge"] == pytest.approx(1 / 3, rel=0.15)
    grid = run(("Effective cost per million generated tokens by model × hardware", "A"))
    assert set(grid) == set(price)


@pytest.mark.integration
def test_price_rules_file_is_yaml_prometheus_reads(prom: str) -> None:
    res = httpx.get(f"{prom}/api/v1/query", params={"query": PRICE_RECORD}).json()["data"]["result"]
    assert {(x["metric"]["machine_type"], x["metric"]["currency"]) for x in res} == {
        ("p5.48xlarge", "EUR"),
        ("c7g.16xlarge", "EUR"),
    }
    assert yaml.safe_load(price_rules(parse_prices(PRICES)))["groups"][0]["name"] == "inferwatch-prices"
