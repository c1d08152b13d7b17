"""Our bucket quantiles equal a real Prometheus's ``histogram_quantile`` (within 1e-9).

A tiny HTTP server serves a sequence of vLLM v1 expositions (two data-parallel engines; requests
finish between scrapes; the engine restarts half-way, so every counter resets). A real Prometheus
(Debian's ``prometheus``) scrapes it every second. We read the very same bodies with our reader and
adapter, feed our windows with Prometheus's own scrape timestamps, and compare, for every timing
quantity and q in 0.5/0.9/0.95/0.99:

- ``histogram_quantile(q, sum by (le) (X_bucket))`` with our quantile of the cumulative buckets, and
- ``histogram_quantile(q, sum by (le) (rate(X_bucket[W])))`` with our quantile of the window's
  increments, for windows that start and end exactly on scrapes (so rate does not extrapolate).
"""

from __future__ import annotations

import math
import threading
import time
from collections.abc import Callable
from http.server import BaseHTTPRequestHandler

import httpx
import pytest

from inferwatch.agent.node.engine.adapters import FEATURE_QUANTITIES, VLLM
from inferwatch.agent.node.engine.histogram import bucket_quantile
from inferwatch.agent.node.engine.scrape import EngineParser
from inferwatch.agent.node.engine.windows import HistogramWindow
from tests import engine_server as es
from tests.conftest import free_port
from tests.engine_expo import VllmLike
from tests.procs import running, wait_http

pytestmark = pytest.mark.integration
QS = (0.5, 0.9, 0.95, 0.99)
STEPS = 7


def snapshots() -> list[str]:
    gen = VllmLike(["m"], engines=2, seed=42)
    gen.observe(60)
    out = [gen.text()]
    for step in range(1, STEPS):
        if step == 4:
            gen.restart()  # engine restart: every counter and bucket starts from zero again
        gen.observe(5 + 7 * step, slow=1.0 + 0.6 * step)
        out.append(gen.text())
    return out


def sequence(bodies: list[str], served: list[int]) -> Callable[[BaseHTTPRequestHandler], None]:
    lock = threading.Lock()

    def send(h: BaseHTTPRequestHandler) -> None:
        with lock:
            i = min(len(served), len(bodies) - 1)
            served.append(i)
        es.body(bodies[i])(h)

    return send


def query(base: str, promql: str, at: float) -> list[dict]:
    r = httpx.get(f"{base}/api/v1/query", params={"query": promql, "time": f"{at:.3f}"}, timeout=10)
    r.raise_for_status()
    return r.json()["data"]["result"]


def test_bucket_quantiles_match_prometheus(tmp_path) -> None:
    bodies = snapshots()
    served: list[int] = []
    with es.EngineServer({"/metrics": sequence(bodies, served)}) as srv:
        port = free_port()
        cfg = tmp_path / "prometheus.yml"
        cfg.write_text(
            "global: {scrape_interval: 1s, evaluation_interval: 1s}\n"
            "scrape_configs:\n"
            f"  - job_name: engine\n    static_configs: [{{targets: ['127.0.0.1:{srv.port}']}}]\n"
        )
        cmd = [
            "prometheus",
            f"--config.file={cfg}",
            f"--storage.tsdb.path={tmp_path / 'tsdb'}",
            f"--web.listen-address=127.0.0.1:{port}",
        ]
        base = f"http://127.0.0.1:{port}"
        with running(cmd, tmp_path / "prometheus.log") as proc:
            wait_http(f"{base}/-/ready", ok=lambda r: r.status_code == 200, proc=proc)
            points = _wait_points(base, STEPS + 1)
            compare(base, bodies, served, points)


def _wait_points(base: str, n: int, timeout_s: float = 60.0) -> list[tuple[float, float]]:
    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline:
        res = query(base, 'vllm:e2e_request_latency_seconds_count{engine="0",model_name="m"}[10m]', time.time())
        if res and len(res[0]["values"]) >= n:
            return [(float(t), float(v)) for t, v in res[0]["values"]]
        time.sleep(0.5)
    raise AssertionError(f"Prometheus did not store {n} scrapes in {timeout_s}s")


def compare(base: str, bodies: list[str], served: list[int], points: list[tuple[float, float]]) -> None:
    parser = EngineParser("vllm")
    readings = [parser.parse(b.encode()) for b in bodies]
    # Prometheus's k-th sample is the body of our k-th answer; check it by the count it stored.
    index = served[: len(points)]
    for (_, value), i in zip(points, index, strict=True):
        series = readings[i].models["m"].histograms["e2e"][(("engine", "0"),)]
        assert series.count == value
    times = [t for t, _ in points]
    checked = 0
    # Every latency histogram the adapter maps; a feature's (the P/D KV transfer's) is absent from this engine.
    latency = [q for q in VLLM.histograms if q not in FEATURE_QUANTITIES]
    assert all(q not in readings[-1].models["m"].histograms for q in VLLM.histograms if q in FEATURE_QUANTITIES)
    for quantity in latency:
        family = VLLM.histograms[quantity][0].name
        window = HistogramWindow(horizon_s=math.inf)
        for t, i in zip(times, index, strict=True):
            window.update(t, readings[i].models["m"].histograms[quantity])
        last = times[-1]
        current = window.current()
        assert current is not None
        for q in QS:
            prom = query(base, f'histogram_quantile({q}, sum by (le) ({family}_bucket{{model_name="m"}}))', last)
            ours = bucket_quantile(q, current.buckets)
            assert abs(float(prom[0]["value"][1]) - ours) <= 1e-9, (quantity, q, "cumulative")
            checked += 1
        for first in (0, 2, 3, 5):  # windows over the restart, before it, and after it
            width_ms = round((last - times[first]) * 1000)
            inc = window.window(width_ms / 1000, at=last)
            assert inc is not None
            for q in QS:
                promql = f'histogram_quantile({q}, sum by (le) (rate({family}_bucket{{model_name="m"}}[{width_ms}ms])))'
                prom = query(base, promql, last)
                ours = bucket_quantile(q, inc.buckets)
                theirs = float(prom[0]["value"][1]) if prom else math.nan
                if math.isnan(ours) or math.isnan(theirs):
                    assert math.isnan(ours) and math.isnan(theirs), (quantity, q, first)
                else:
                    assert abs(theirs - ours) <= 1e-9, (quantity, q, first, theirs, ours)
                checked += 1
    assert checked == 7 * 4 * 5
