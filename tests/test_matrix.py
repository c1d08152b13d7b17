"""``inferwatch matrix``: the PromQL on a real Prometheus engine (promtool), output formats, errors.

The end-to-end ordering check against simulators on several hardware profiles is in
tests/test_dashboards_data.py.
"""

from __future__ import annotations

import csv
import io
import json
import subprocess
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path
from threading import Thread

import pytest
import yaml

from inferwatch.agent.fleet.matrix import (
    Cell,
    Hardware,
    Matrix,
    nodes_query,
    nodes_recorded,
    short_window,
    to_csv,
    to_json,
    to_markdown,
    tokens_query,
    tokens_recorded,
    ttft_p95_query,
    ttft_p95_recorded,
    validate_window,
)
from tests.conftest import PYTHON, ROOT, free_port
from tests.tools import require

MODEL = "meta-llama/Llama-3.1-8B-Instruct"
_NODE = (
    'inferwatch_node_info{{instance="{i}", job="inferwatch-agent", arch="x86_64", cpu_vendor="GenuineIntel", '
    'cpu_model="{c}", kernel_release="6.8.0", machine_type="{m}"}}'
)
_BUCKET = (
    'gen_ai_server_time_to_first_token_seconds_bucket{{instance="{i}", job="inferwatch-agent", '
    'gen_ai_request_model="{model}", le="{le}"}}'
)


def _series(instance: str, cpu: str, machine: str, buckets: dict[str, int], tokens_per_min: int) -> list[dict]:
    out = [{"series": _NODE.format(i=instance, c=cpu, m=machine), "values": "1+0x15"}]
    for le, per_min in buckets.items():
        out.append({"series": _BUCKET.format(i=instance, model=MODEL, le=le), "values": f"0+{per_min}x15"})
    out.append(
        {
            "series": f'gen_ai_server_time_to_first_token_seconds_count{{instance="{instance}", '
            f'job="inferwatch-agent", gen_ai_request_model="{MODEL}"}}',
            "values": f"0+{buckets['+Inf']}x15",
        }
    )
    out.append(
        {
            "series": f'inferwatch_engine_tokens_total{{instance="{instance}", job="inferwatch-agent", '
            f'gen_ai_request_model="{MODEL}", type="generation"}}',
            "values": f"0+{tokens_per_min}x15",
        }
    )
    return out


@pytest.mark.parametrize("recorded", [False, True], ids=["raw", "recorded"])
def test_matrix_queries_on_prometheus_engine(tmp_path: Path, recorded: bool) -> None:
    """Two H100 nodes and one CPU node: hardware join, fleet quantile, per-node token average, node count; the
    raw queries (``inferwatch matrix``) and the recording rules' form (the dashboard, ``--recorded``) alike."""
    require("promtool")
    series = [
        # H100 nodes: every request within 50 ms; 600 and 1200 generated tokens per minute.
        *_series(
            "a:9435", "Intel Xeon Platinum 8480+", "p5.48xlarge", {"0.05": 60, "0.1": 60, "0.5": 60, "+Inf": 60}, 600
        ),
        *_series(
            "b:9435", "Intel Xeon Platinum 8480+", "p5.48xlarge", {"0.05": 60, "0.1": 60, "0.5": 60, "+Inf": 60}, 1200
        ),
        # CPU node: every request between 100 and 500 ms.
        *_series(
            "c:9435", "Intel Xeon Platinum 8480+", "m7i.48xlarge", {"0.05": 0, "0.1": 0, "0.5": 30, "+Inf": 30}, 60
        ),
    ]
    for inst in ("a:9435", "b:9435"):
        for gpu in ("0", "1"):
            series.append(
                {
                    "series": f'hw_gpu_memory_limit_bytes{{instance="{inst}", job="inferwatch-agent", hw_id="{gpu}", '
                    'hw_model="NVIDIA H100 80GB HBM3"}',
                    "values": "85899345920+0x15",
                }
            )
    hw_h100 = {
        "machine_type": "p5.48xlarge",
        "cpu_model": "Intel Xeon Platinum 8480+",
        "hw_model": "NVIDIA H100 80GB HBM3",
    }
    hw_cpu = {"machine_type": "m7i.48xlarge", "cpu_model": "Intel Xeon Platinum 8480+", "hw_model": "none"}

    def labels(d: dict[str, str]) -> str:
        return "{" + ", ".join(f'{k}="{v}"' for k, v in sorted({"gen_ai_request_model": MODEL, **d}.items())) + "}"

    sel = 'job="inferwatch-agent"'
    if recorded:
        ttft, tokens, nodes = ttft_p95_recorded("5m"), tokens_recorded("5m"), nodes_recorded("5m")
    else:
        ttft, tokens, nodes = ttft_p95_query("5m", sel), tokens_query("5m", sel), nodes_query("5m", sel)
    tests = {
        "rule_files": [str(ROOT / "alerts" / "recording.rules.yml")] if recorded else [],
        "evaluation_interval": "1m",
        "tests": [
            {
                "interval": "1m",
                "input_series": series,
                "promql_expr_test": [
                    {
                        "expr": f"round({ttft}, 0.0001)",
                        "eval_time": "10m",
                        # P95 interpolated inside the first bucket (0..50 ms) and inside (100..500 ms].
                        "exp_samples": [
                            {"labels": labels(hw_h100), "value": 0.0475},
                            {"labels": labels(hw_cpu), "value": 0.48},
                        ],
                    },
                    {
                        "expr": f"round({tokens}, 0.0001)",
                        "eval_time": "10m",
                        # (10 + 20 tokens/s) / 2 nodes; 1 token/s.
                        "exp_samples": [
                            {"labels": labels(hw_h100), "value": 15},
                            {"labels": labels(hw_cpu), "value": 1},
                        ],
                    },
                    {
                        "expr": nodes,
                        "eval_time": "10m",
                        "exp_samples": [
                            {"labels": labels(hw_h100), "value": 2},
                            {"labels": labels(hw_cpu), "value": 1},
                        ],
                    },
                ],
            }
        ],
    }
    path = tmp_path / "matrix_test.yml"
    path.write_text(yaml.safe_dump(tests, sort_keys=False))
    r = subprocess.run(["promtool", "test", "rules", str(path)], capture_output=True, text=True, timeout=60)
    assert r.returncode == 0, r.stdout + r.stderr
    # Near miss: a wrong expectation fails, so the check above can fail.
    tests["tests"][0]["promql_expr_test"][0]["exp_samples"][0]["value"] = 0.05
    path.write_text(yaml.safe_dump(tests, sort_keys=False))
    r = subprocess.run(["promtool", "test", "rules", str(path)], capture_output=True, text=True, timeout=60)
    assert r.returncode == 1


def _sample() -> Matrix:
    h100 = Hardware("p5.48xlarge", "Intel Xeon Platinum 8480+", "NVIDIA H100 80GB HBM3")
    cpu = Hardware("m7i.48xlarge", "Intel Xeon Platinum 8480+", "none")
    cells = {
        ("llama|8b", h100): Cell(0.0425, 812.5, 2),
        ("llama|8b", cpu): Cell(1.5, 21.0, 1),
        ("qwen", h100): Cell(None, 100.0, 1),
    }
    return Matrix("1h", ("llama|8b", "qwen"), (cpu, h100), cells)


def test_formats() -> None:
    m = _sample()
    md = to_markdown(m).splitlines()
    assert md[0].startswith("| model | m7i.48xlarge / Intel Xeon Platinum 8480+ TTFT P95 |")
    assert "p5.48xlarge / Intel Xeon Platinum 8480+ / NVIDIA H100 80GB HBM3 tok/s" in md[0]
    assert md[2] == "| llama\\|8b | 1.50 s | 21.0 | 42 ms | 812.5 |"
    assert md[3] == "| qwen | – | – | – | 100.0 |"
    rows = list(csv.DictReader(io.StringIO(to_csv(m))))
    assert len(rows) == 3
    assert rows[0] == {
        "model": "llama|8b",
        "machine_type": "m7i.48xlarge",
        "cpu_model": "Intel Xeon Platinum 8480+",
        "gpu_model": "none",
        "nodes": "1",
        "ttft_p95_seconds": "1.5",
        "tokens_per_second": "21",
    }
    assert rows[2]["ttft_p95_seconds"] == ""
    data = json.loads(to_json(m))
    assert data["window"] == "1h" and len(data["cells"]) == 3
    assert data["hardware"][1]["label"] == "p5.48xlarge / Intel Xeon Platinum 8480+ / NVIDIA H100 80GB HBM3"


def test_window_validation() -> None:
    assert validate_window("90m") == "90m"
    for bad in ("1 hour", "", "5m]) or vector(1", "-1h"):
        with pytest.raises(ValueError):
            validate_window(bad)


def test_short_window_allows_the_span_query_its_step() -> None:
    # A 5 s window is read at 1 s steps: data that covers it can read as 4 s (CI-like load, stop 26), not short.
    assert short_window("5s", 4.0) is None
    assert short_window("5s", 3.0) == "3s"
    assert short_window("1h", 180.0) == "3m"  # issue 15's case: 3 minutes of data under the 1 h default
    assert short_window("1h", 3234.0) is None  # 1 h is read at 7 s steps: 3,234 s + 7 s covers 90 %
    assert short_window("1h", None) is None


def _cli(*args: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [PYTHON, "-m", "inferwatch.agent", "matrix", *args], cwd=ROOT, capture_output=True, text=True, timeout=60
    )


def test_cli_errors() -> None:
    url = f"http://127.0.0.1:{free_port()}"
    r = _cli("--prometheus", url, "--timeout", "2")
    assert r.returncode == 1 and "cannot reach Prometheus" in r.stderr
    assert _cli("--prometheus", url, "--window", "1 hour").returncode == 2
    assert _cli("--prometheus", url, "--format", "xml").returncode == 2
    assert _cli("--prometheus", url, "--job", 'x"}').returncode == 2

    class Html(BaseHTTPRequestHandler):
        def log_message(self, *args: object) -> None:
            pass

        def do_GET(self) -> None:
            body = b"<html>not prometheus</html>"
            self.send_response(200)
            self.send_header("Content-Length", str(len(body)))
            self.end_headers()
            self.wfile.write(body)

    server = ThreadingHTTPServer(("127.0.0.1", 0), Html)
    Thread(target=server.serve_forever, daemon=True).start()
    try:
        r = _cli("--prometheus", f"http://127.0.0.1:{server.server_address[1]}")
        assert r.returncode == 1 and "not JSON" in r.stderr
    finally:
        server.shutdown()
        server.server_close()


def test_window_longer_than_the_data_is_warned_on_real_prometheus(tmp_path: Path) -> None:
    """Issue 15: over 3 minutes of data the 1 h default showed 25 tok/s against 302 with --window 5m, silently.
    A real Prometheus scrapes a node whose counters grow from its first scrape; the CLI warns while the window
    is longer than the data, and not once the data covers it."""
    import time

    import httpx

    from tests import engine_server as es
    from tests import stack

    require("prometheus")
    started = time.monotonic()

    def exposition(h: BaseHTTPRequestHandler) -> None:
        n = int((time.monotonic() - started) * 10)  # 10 requests/s, 300 generated tokens/s
        m = f'gen_ai_request_model="{MODEL}"'
        text = (
            'inferwatch_node_info{machine_type="m7i.48xlarge",cpu_model="Intel Xeon Platinum 8480+"} 1\n'
            + "".join(
                f'gen_ai_server_time_to_first_token_seconds_bucket{{{m},le="{le}"}} {n}\n' for le in ("0.1", "+Inf")
            )
            + f"gen_ai_server_time_to_first_token_seconds_count{{{m}}} {n}\n"
            + f'inferwatch_engine_tokens_total{{{m},type="generation"}} {n * 30}\n'
        )
        es.body(text)(h)

    import contextlib

    with contextlib.ExitStack() as stack_:
        node = stack_.enter_context(es.EngineServer({"/metrics": exposition}))
        prom = stack_.enter_context(stack.prometheus(tmp_path, {"inferwatch-agent": [f"127.0.0.1:{node.port}"]}))
        deadline = time.monotonic() + 60
        while time.monotonic() < deadline:  # two scrapes: rate() has data
            q = httpx.get(f"{prom}/api/v1/query", params={"query": "count_over_time(inferwatch_node_info[1m])"})
            if q.json()["data"]["result"] and float(q.json()["data"]["result"][0]["value"][1]) >= 3:
                break
            time.sleep(0.5)
        long = _cli("--prometheus", prom, "--format", "json")  # the 1 h default over ~3 s of data
        assert long.returncode == 0, long.stderr
        if "warning" not in long.stderr:  # say what the span query saw
            from inferwatch.agent.fleet.matrix import data_span_query

            span = httpx.get(f"{prom}/api/v1/query", params={"query": data_span_query("1h")}).json()
            pytest.fail(f"no warning; stderr {long.stderr!r}; span query now: {span}")
        assert "less than --window 1h" in long.stderr, long.stderr
        assert "try --window " in long.stderr
        time.sleep(7)
        short = _cli("--prometheus", prom, "--format", "json", "--window", "5s")
        assert short.returncode == 0, short.stderr
        assert "warning" not in short.stderr, short.stderr
        tps = json.loads(short.stdout)["cells"][0]["tokens_per_second"]
        assert tps == pytest.approx(300, rel=0.2)
