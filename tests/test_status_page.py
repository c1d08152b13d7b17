"""The node status page in a real browser: Debian's headless Chromium (Selenium + chromedriver) against the real
agent beside the simulator.

One stack per module: the simulator (one engine, spans over OTLP/gRPC to the agent's receiver) and the agent
(tests/node_agent.py: the shipped agent with a fake NVML device, since no GPU exists here) on a crafted node: a
Graviton3 (c7g) whose cpuinfo lost its SVE hwcaps (booted with arm64.nosve), every other /proc entry this host's.
API tokens are configured, so the page is behind them; the browser sends the read token (a CDP extra header).

What is checked: 401 without a token; no console errors; the DOM's numbers equal what /api/v1/status and /metrics
report (bracketed between two equal scrapes); the feature table marks SVE missing; after the simulator's
page_cache_pressure scenario the TTFT histogram has two modes (from the bars' own counts) and the LatencyBimodal
finding appears with a runbook link that opens the runbook; axe-core finds no serious or critical violation; at
phone width nothing scrolls sideways. Screenshots at 1280x800 and 390x844 go to the test's tmp dir;
INFERWATCH_UPDATE_SCREENSHOT=1 also writes docs/img/status-page.png (the one the README shows).
"""

from __future__ import annotations

import json
import math
import os
import shutil
import subprocess
import time
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import httpx
import pytest
from axe_core_python.selenium import Axe
from prometheus_client.parser import text_string_to_metric_families
from selenium import webdriver
from selenium.webdriver.chrome.service import Service
from selenium.webdriver.common.by import By
from selenium.webdriver.remote.webdriver import WebDriver

from inferwatch.agent.catalog.engine import TTFT_BUCKETS_S
from inferwatch.agent.common.samples import Collection, HistogramSample, Sample, attrs
from inferwatch.agent.node.api.pagehistory import PageHistory
from inferwatch.agent.node.api.statushtml import render_page
from inferwatch.agent.node.api.statuspage import build_overview, histogram_modes
from inferwatch.agent.node.state import AgentState, CollectorHealth
from tests.conftest import PYTHON, ROOT, free_port
from tests.e2e.test_alert_pipeline import SVE_TOKENS
from tests.procs import running, wait_http
from tests.test_dashboards_data import _fake_procfs, _fake_sysfs
from tests.tools import require

pytestmark = [pytest.mark.integration, pytest.mark.cpu_heavy]  # TTFT modes: not beside the real-stack files

TOKEN = "page-read-token-0123456789"
MODEL = "meta-llama/Llama-3.1-8B-Instruct"
GPU = "NVIDIA H100 80GB HBM3"
MACHINE = "c7g.2xlarge"
SIZES = {"desktop": (1280, 800), "phone": (390, 844)}
SCREENSHOT = ROOT / "docs" / "img" / "status-page.png"
BAD_IMPACTS = ("serious", "critical")
# 30 % of requests stall 1.5 s before prefill (the default 0.55 s lands where a busy 2-core host's queueing can
# smear the fast mode; 1.5 s keeps the two modes apart however loaded the machine is)
STALL = "page_cache_pressure:fraction=0.3,extra_s=1.5"


@dataclass
class Stack:
    sim: str
    agent: str
    tmp: Path

    def loadgen(self, count: int, rate: float, seed: int) -> None:
        out = subprocess.run(
            [PYTHON, "-m", "inferwatch.agent", "loadgen", "--url", self.sim, "--model", MODEL, "--json", "--count",
             str(count),
             "--rate", str(rate), "--seed", str(seed), "--prompt-tokens", "lognormal:256:0.3", "--output-tokens", "4"],
            cwd=ROOT, capture_output=True, text=True, timeout=120,
        )  # fmt: skip
        assert out.returncode == 0, out.stderr[-2000:]

    def get(self, path: str) -> httpx.Response:
        return httpx.get(self.agent + path, headers={"Authorization": f"Bearer {TOKEN}"}, timeout=10)


def _crafted_node(tmp: Path) -> tuple[Path, Path]:
    procfs = _fake_procfs(tmp / "proc", "graviton3_neoverse_v1")
    cpuinfo = procfs / "cpuinfo"
    cpuinfo.write_text(SVE_TOKENS.sub("", cpuinfo.read_text()))
    return procfs, _fake_sysfs(tmp / "sys", MACHINE)


@pytest.fixture(scope="module")
def stack(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Stack]:
    tmp = tmp_path_factory.mktemp("status-page")
    procfs, sysfs = _crafted_node(tmp)
    (tmp / "tokens").write_text(f"{TOKEN} read page\n")
    sim_port, agent_port, grpc_port, http_port = (free_port() for _ in range(4))
    sim_cmd = [PYTHON, "-m", "inferwatch.agent", "simulate", "--port", str(sim_port), "--engines", "1", "--seed", "7",
               "--model", MODEL, "--control-token", "t",
               "--otlp-traces-endpoint", f"http://127.0.0.1:{grpc_port}"]  # fmt: skip
    env = {
        "INFERWATCH_LISTEN_PORT": str(agent_port),
        "INFERWATCH_INTERVAL_S": "1",
        "INFERWATCH_PATH__PROCFS": str(procfs),
        "INFERWATCH_PATH__SYSFS": str(sysfs),
        "INFERWATCH_API__TOKENS_FILE": str(tmp / "tokens"),
        "INFERWATCH_ENGINE__METRICS_URL": f"http://127.0.0.1:{sim_port}/metrics",
        "INFERWATCH_RECEIVER__ENABLED": "true",
        "INFERWATCH_RECEIVER__GRPC_ENDPOINT": f"127.0.0.1:{grpc_port}",
        "INFERWATCH_RECEIVER__HTTP_ENDPOINT": f"127.0.0.1:{http_port}",
        "DASH_FAKE_GPU": GPU,
    }
    with (
        running([PYTHON, "-m", "tests.node_agent"], tmp / "agent.log", cwd=ROOT, env=env) as agent,
        running(sim_cmd, tmp / "sim.log", cwd=ROOT, env={"OTEL_BSP_SCHEDULE_DELAY": "100"}) as sim,
    ):
        s = Stack(f"http://127.0.0.1:{sim_port}", f"http://127.0.0.1:{agent_port}", tmp)
        wait_http(s.agent + "/healthz", proc=agent)
        wait_http(s.sim + "/health", proc=sim)
        # every collector has run once and the engine's model is on the page (its first, empty TTFT buckets kept)
        wait_http(s.agent + "/readyz", ok=lambda r: r.status_code == 200, proc=agent)
        deadline = time.monotonic() + 120  # bounds a hang (CI's load 10-17 on 2 cores)
        while time.monotonic() < deadline and not any(
            m["ttft_histogram"] for m in s.get("/api/v1/overview").json()["models"]
        ):
            time.sleep(0.3)
        yield s


@pytest.fixture(scope="module")
def browser(stack: Stack) -> Iterator[WebDriver]:
    opts = webdriver.ChromeOptions()
    opts.binary_location = require("chromium")
    for arg in ("--headless=new", "--no-sandbox", "--disable-gpu", "--disable-dev-shm-usage", "--no-first-run",
                "--disable-extensions", "--disable-background-networking", "--window-size=1280,800"):  # fmt: skip
        opts.add_argument(arg)
    opts.set_capability("goog:loggingPrefs", {"browser": "ALL"})
    driver = webdriver.Chrome(
        options=opts, service=Service(require("chromedriver"), log_output=str(stack.tmp / "cd.log"))
    )
    try:
        driver.set_page_load_timeout(20)
        driver.set_script_timeout(30)
        driver.execute_cdp_cmd("Network.enable", {})
        driver.execute_cdp_cmd("Network.setExtraHTTPHeaders", {"headers": {"Authorization": f"Bearer {TOKEN}"}})
        yield driver
    finally:
        driver.quit()


def _size(driver: WebDriver, name: str) -> None:
    w, h = SIZES[name]
    driver.execute_cdp_cmd(
        "Emulation.setDeviceMetricsOverride",
        {"width": w, "height": h, "deviceScaleFactor": 1, "mobile": name == "phone"},
    )


def _console_errors(driver: WebDriver) -> list[dict[str, Any]]:
    return [e for e in driver.get_log("browser") if e["level"] == "SEVERE"]


def _scrape(stack: Stack) -> dict[str, float | None]:
    """The compared values (see :func:`_latency_keys`) from one scrape of the agent's /metrics."""
    text = stack.get("/metrics").text
    samples = [s for f in text_string_to_metric_families(text) for s in f.samples]
    out: dict[str, float | None] = {}
    for key, (name, labels) in _latency_keys().items():
        hits = [s.value for s in samples if s.name == name and labels <= set(s.labels.items())]
        assert len(hits) <= 1, (key, hits)
        out[key] = hits[0] if hits else None
    return out


def _latency_keys() -> dict[str, tuple[str, frozenset[tuple[str, str]]]]:
    keys = {}
    for quantity in ("ttft", "itl"):
        for q, cls in (("0.5", "p50"), ("0.95", "p95"), ("0.99", "p99")):
            labels = {"gen_ai_request_model": MODEL, "quantity": quantity, "source": "histogram", "window": "1m",
                      "quantile": q}  # fmt: skip
            keys[f"q-{quantity}-{cls}"] = ("inferwatch_engine_latency_seconds", frozenset(labels.items()))
    keys["ttft-count"] = (
        "gen_ai_server_time_to_first_token_seconds_count",
        frozenset({("gen_ai_request_model", MODEL)}),
    )
    return keys


def _dom_numbers(driver: WebDriver) -> dict[str, float]:
    card = driver.find_element(By.CSS_SELECTOR, f'section.model[data-model="{MODEL}"]')
    out = {}
    for key in _latency_keys():
        if key.startswith("q-"):
            out[key] = float(card.find_element(By.CSS_SELECTOR, f"td.{key} data").get_attribute("value") or "nan")
    out["ttft-count"] = sum(float(b.get_attribute("data-count") or 0) for b in _bars(driver))
    return out


def _bars(driver: WebDriver) -> list[Any]:
    return driver.find_elements(By.CSS_SELECTOR, f'section.model[data-model="{MODEL}"] svg.ttft-hist rect.bar')


def _load_stable_page(stack: Stack, driver: WebDriver) -> tuple[dict[str, float], dict[str, float]]:
    """The page loaded between two /metrics scrapes that agree on every compared value (bounded retries)."""
    for _ in range(10):
        before = _scrape(stack)
        driver.get(stack.agent + "/")
        if before == _scrape(stack) and None not in before.values():
            return _dom_numbers(driver), before  # type: ignore[return-value]
        time.sleep(0.5)
    pytest.fail("the agent's /metrics never held still across one page load")


def _bar_data(driver: WebDriver) -> list[tuple[float, float, float]]:
    """(lower edge, upper edge, requests) of each drawn bar."""
    return [
        (float(b.get_attribute("data-ge") or 0), float((b.get_attribute("data-le") or "").replace("+Inf", "inf")),
         float(b.get_attribute("data-count") or 0))
        for b in _bars(driver)
    ]  # fmt: skip


def _modes(bars: list[tuple[float, float, float]]) -> list[int]:
    """Independent of the page's own: requests per log-second (a bucket from 0 or to +Inf as wide as its
    neighbour), peaks holding >= 5 % of requests, separate when the density between falls under a quarter of the
    smaller."""
    widths = [math.log(le / ge) if ge > 0 and math.isfinite(le) else None for ge, le, _ in bars]
    for i, w in enumerate(widths):
        if w is None:
            widths[i] = next(x for x in (*widths[i + 1 :], *reversed(widths[:i])) if x is not None)
    dens = [c / w for (_, _, c), w in zip(bars, widths, strict=True)]  # type: ignore[operator]
    total = sum(c for _, _, c in bars)
    big = [i for i, (_, _, c) in enumerate(bars) if c >= 0.05 * total]
    groups: list[int] = []
    for i in big:
        if groups and min(dens[groups[-1] : i + 1]) > 0.25 * min(dens[groups[-1]], dens[i]):
            if dens[i] > dens[groups[-1]]:
                groups[-1] = i
            continue
        groups.append(i)
    return groups


def _shot(driver: WebDriver, stack: Stack, name: str) -> Path:
    path = stack.tmp / f"status-page-{name}.png"
    assert driver.save_screenshot(str(path)), path
    assert path.stat().st_size > 10_000
    return path


def test_page_is_behind_the_api_tokens(stack: Stack) -> None:
    assert httpx.get(stack.agent + "/", timeout=10).status_code == 401
    bad = httpx.get(stack.agent + "/", headers={"Authorization": "Bearer wrong-token-0123456789"}, timeout=10)
    assert bad.status_code == 401
    ok = stack.get("/")
    assert ok.status_code == 200 and ok.headers["content-type"].startswith("text/html")
    assert "<script" not in ok.text and "http://" not in ok.text.split("</head>")[0]  # nothing fetched from outside
    assert stack.get("/?refresh=1").text.count('http-equiv="refresh" content="5"') == 1  # clamped


def test_healthy_page_shows_what_the_api_reports(stack: Stack, browser: WebDriver) -> None:
    stack.loadgen(120, rate=40, seed=1)
    deadline = time.monotonic() + 120  # the engine scraped after the last request (bounds a hang at CI's load)
    while time.monotonic() < deadline:
        if _scrape(stack)["ttft-count"] == 120:
            break
        time.sleep(0.3)
    _size(browser, "desktop")
    dom, api = _load_stable_page(stack, browser)
    assert dom == api
    assert not _console_errors(browser)
    status = stack.get("/api/v1/status").json()
    node = status["node"]
    text = {k: browser.find_element(By.CSS_SELECTOR, f"dd.node-{k}").text for k in ("machine", "cpu", "kernel", "gpus")}
    assert text["machine"] == node["host.type"] == MACHINE
    assert text["cpu"] == node["host.cpu.model.name"] and "Neoverse-V1" in text["cpu"]
    assert text["kernel"] == node["os.version"]
    assert text["gpus"] == GPU
    rows = {
        r.get_attribute("data-id"): r.get_attribute("data-status")
        for r in browser.find_elements(By.CSS_SELECTOR, "tr.finding")
    }
    for f in status["findings"]:
        assert rows.get(f["id"]) == f["status"], (f, rows)
    collectors = {
        r.get_attribute("data-name"): r.get_attribute("data-state")
        for r in browser.find_elements(By.CSS_SELECTOR, "tr.collector")
    }
    assert collectors == {c["name"]: c["state"] for c in status["collectors"]}
    # the node booted without SVE: the feature table marks it, in words as well as colour
    sve = browser.find_element(By.CSS_SELECTOR, 'tr.feature[data-feature="sve"]')
    assert sve.get_attribute("data-missing") == "1" and "MISSING" in sve.text
    assert rows.get("cpu.features") == "fail"
    # healthy: the page names the modes its bars show, and no mass sits where the stall will put it (> 0.5 s)
    bars = _bar_data(browser)
    svg = browser.find_element(By.CSS_SELECTOR, f'section.model[data-model="{MODEL}"] svg.ttft-hist')
    assert svg.get_attribute("data-modes") == str(len(_modes(bars)))
    assert sum(c for _, le, c in bars if le > 0.5) < 0.05 * sum(c for _, _, c in bars), bars
    _shot(browser, stack, "healthy-desktop")


def test_page_cache_pressure_shows_two_modes_and_the_finding(stack: Stack, browser: WebDriver) -> None:
    r = httpx.post(stack.sim + "/control/scenario", json={"enable": STALL},
                   headers={"Authorization": "Bearer t"}, timeout=10)  # fmt: skip
    assert r.status_code == 200, r.text
    stack.loadgen(200, rate=30, seed=2)
    _size(browser, "desktop")
    deadline = time.monotonic() + 120  # bounds a hang (CI's load 10-17 on 2 cores)
    rows: list[Any] = []
    while time.monotonic() < deadline:
        browser.get(stack.agent + "/")
        rows = browser.find_elements(By.CSS_SELECTOR, f'tr.finding[data-id="latency.bimodal/{MODEL}"]')
        if rows and len(_modes(_bar_data(browser))) == 2:
            break
        time.sleep(1)
    if not rows:
        m = stack.get("/api/v1/overview").json()["models"]
        pytest.fail(f"no LatencyBimodal finding on the page; bimodal 5m: {[x['bimodal_ttft_5m'] for x in m]}")
    bars = _bar_data(browser)
    modes = _modes(bars)
    # The fast mode and the stall's. On a machine busy with the rest of the suite (four workers on two cores) the
    # simulator's queue can add a third, middle mode for the whole window (seen once: peaks at 20-40 ms, ~0.1 s
    # and the stall); the page must then name three, as its bars show.
    assert len(modes) >= 2, bars
    fast, slow = bars[modes[0]][1], bars[modes[-1]][1]
    assert fast <= 0.25 and 1.0 <= slow <= 2.5  # ~30-100 ms, and the 1.5 s stall on top of it
    svg = browser.find_element(By.CSS_SELECTOR, f'section.model[data-model="{MODEL}"] svg.ttft-hist')
    n = len(modes)
    assert svg.get_attribute("data-modes") == str(n) and f"{n} modes" in (svg.get_attribute("aria-label") or "")
    assert not _console_errors(browser)
    shot = _shot(browser, stack, "desktop")
    if os.environ.get("INFERWATCH_UPDATE_SCREENSHOT") == "1":
        SCREENSHOT.parent.mkdir(parents=True, exist_ok=True)
        shutil.copyfile(shot, SCREENSHOT)
    # accessibility: axe-core (bundled by axe-core-python) in this page
    result = Axe().run(browser)
    (stack.tmp / "axe.json").write_text(json.dumps(result["violations"], indent=1))  # the artifact, all impacts
    bad = [(v["id"], v["impact"], len(v["nodes"])) for v in result["violations"] if v["impact"] in BAD_IMPACTS]
    assert not bad, bad
    assert not result["violations"], [(v["id"], v["impact"]) for v in result["violations"]]  # none of lower impact
    # phone width: readable without sideways scrolling of the page itself (tables scroll in their own box)
    _size(browser, "phone")
    browser.get(stack.agent + "/")
    width = browser.execute_script("return [document.documentElement.scrollWidth, window.innerWidth]")
    assert width[0] <= width[1], width
    _shot(browser, stack, "phone")
    _size(browser, "desktop")
    # the runbook link works
    browser.get(stack.agent + "/")
    link = browser.find_element(By.CSS_SELECTOR, f'tr.finding[data-id="latency.bimodal/{MODEL}"] a.runbook')
    link.click()
    deadline = time.monotonic() + 60  # bounds a hang (CI's load 10-17 on 2 cores)
    while not browser.title.startswith("LatencyBimodal") and time.monotonic() < deadline:
        time.sleep(0.1)
    assert browser.title.startswith("LatencyBimodal"), browser.title
    # the runbook is served rendered from its Markdown: its title and sections are headings, not raw "## " text
    assert browser.find_element(By.TAG_NAME, "h1").text == "LatencyBimodal"
    sections = [h.text for h in browser.find_elements(By.TAG_NAME, "h2")]
    assert sections[:3] == ["When it fires", "Meaning", "Impact"], sections
    assert "## Meaning" not in browser.find_element(By.TAG_NAME, "main").text
    assert not _console_errors(browser)


# --- the page's own logic, without a browser ---------------------------------------------------------------------


def _counts(**by_le: float) -> list[float]:
    """Per-bucket counts on vLLM's TTFT buckets (+Inf last), keyed like le_0_04=..."""
    bounds = [*TTFT_BUCKETS_S, math.inf]
    want = {float(k[3:].replace("_", ".")): v for k, v in by_le.items()}
    return [want.get(b, 0.0) for b in bounds]


def test_modes_read_the_density_not_the_raw_counts() -> None:
    bounds = [*TTFT_BUCKETS_S, math.inf]
    # a fast mode with a queueing tail: 0.08-0.1 (20 ms wide) holds fewer requests than 0.1-0.25 (150 ms wide),
    # a dip in raw counts that is no dip in density: one mode
    tail = _counts(le_0_04=150, le_0_06=60, le_0_08=25, le_0_1=8, le_0_25=20, le_0_5=3)
    assert len(histogram_modes(bounds, tail)) == 1
    # the same plus a page-cache stall at 1.5 s: two modes, the second where the stall is
    stalled = _counts(le_0_04=150, le_0_06=60, le_0_08=25, le_0_1=8, le_0_25=20, le_0_5=3, le_2_5=80)
    modes = histogram_modes(bounds, stalled)
    assert [bounds[i] for i in modes] == [0.04, 2.5]
    assert histogram_modes(bounds, [0.0] * len(bounds)) == []


def _engine(models: list[str], ttft_count: float = 0.0) -> Collection:
    samples: list[Sample | HistogramSample] = []
    for m in models:
        a = attrs({"gen_ai.request.model": m})
        buckets = tuple((b, ttft_count if b >= 0.1 else 0.0) for b in (*TTFT_BUCKETS_S, math.inf))
        samples.append(HistogramSample("gen_ai.server.time_to_first_token", buckets, 0.1 * ttft_count, ttft_count, a))
        for q, v in (("0.5", 0.05), ("0.95", 0.09), ("0.99", 0.1)):
            la = attrs({"gen_ai.request.model": m, "quantity": "ttft", "window": "1m", "source": "histogram",
                        "quantile": q})  # fmt: skip
            samples.append(Sample("inferwatch.engine.latency", v, la))
        samples.append(Sample("inferwatch.engine.info", 1, attrs({"gen_ai.request.model": m, "engine": "vllm"})))
    return Collection(samples=samples, details={"models": models})


def test_history_is_bounded_in_series_and_points() -> None:
    now = [1000.0]
    history = PageHistory(clock=lambda: now[0], step_s=10, points=3, max_series=2, chart_step_s=10)
    for i in range(6):
        history.on_collection("engine", _engine([f"m{k}" for k in range(5)], ttft_count=i))
        now[0] += 10
    assert len(history._lines) == 2 and len(history._buckets) == 2
    assert all(len(v) == 3 for v in history._lines.values())
    history.on_collection("cpu", _engine(["other"]))  # not a latency source: ignored
    assert "other" not in history._seen


def test_history_keeps_points_and_baselines_as_they_came() -> None:
    """The compact store (flat arrays) gives back what was kept: points in order with None for a missing quantile,
    the oldest buckets within the 5-minute window, and no baseline across a change of bounds."""
    now = [1000.0]
    history = PageHistory(clock=lambda: now[0], step_s=10, points=4, max_series=8, chart_step_s=10)
    for i in range(6):
        history.on_collection("engine", _engine(["m"], ttft_count=10 * i))
        now[0] += 10
    points = history.line("m", "ttft", "histogram")
    assert [p[0] for p in points] == [1020.0, 1030.0, 1040.0, 1050.0]  # the last 4, oldest first
    assert all(p[1:] == (0.05, 0.09, 0.1) for p in points)
    t, buckets = history.baseline("m", 1050.0 + 0.0) or (None, ())
    assert t == 1000.0 and buckets == _engine(["m"], ttft_count=0).samples[0].buckets  # type: ignore[union-attr]
    t, buckets = history.baseline("m", 1340.0) or (None, ())
    assert t == 1040.0 and buckets == _engine(["m"], ttft_count=40).samples[0].buckets  # type: ignore[union-attr]
    assert history.baseline("m", 2000.0) is None and history.baseline("other", 1050.0) is None
    # a quantile the collection lacks is None, not 0 or NaN
    la = attrs(
        {"gen_ai.request.model": "m", "quantity": "ttft", "window": "1m", "source": "histogram", "quantile": "0.5"}
    )
    history.on_collection("engine", Collection(samples=[Sample("inferwatch.engine.latency", 0.2, la)]))
    assert history.line("m", "ttft", "histogram")[-1] == (1060.0, 0.2, None, None)
    # other bounds (the engine restarted with other buckets): the ring starts again
    now[0] += 10
    other = HistogramSample("gen_ai.server.time_to_first_token", ((1.0, 5.0), (math.inf, 6.0)), 1.0, 6.0,
                            attrs({"gen_ai.request.model": "m"}))  # fmt: skip
    history.on_collection("engine", Collection(samples=[other], details={"models": ["m"]}))
    assert history.baseline("m", 1070.0) == (1070.0, ((1.0, 5.0), (math.inf, 6.0)))


def test_history_keeps_a_point_per_chart_step_with_each_quantiles_maximum() -> None:
    """Copies every 10 s, a point per 30 s of the clock: the slot's last time and each quantile's maximum (a P99
    spike in one copy stays), a quantile missing from every copy None; an hour is 120 points."""
    now = [990.0]  # a 30 s slot starts here
    history = PageHistory(clock=lambda: now[0])
    assert history.points == 120 and history.chart_step_s == 30 and history.step_s == 10

    def copy(p50: float, p99: float | None) -> Collection:
        out = []
        for q, v in (("0.5", p50), ("0.99", p99)):
            if v is not None:
                la = {"gen_ai.request.model": "m", "quantity": "ttft", "window": "1m", "source": "histogram"}
                out.append(Sample("inferwatch.engine.latency", v, attrs(la, quantile=q)))
        return Collection(samples=out)

    for p50, p99 in ((0.1, 0.5), (0.2, 3.0), (0.15, None), (0.1, 0.4)):  # 990, 1000, 1010 | 1020
        history.on_collection("engine", copy(p50, p99))
        now[0] += 10
    assert history.line("m", "ttft", "histogram") == [(1010.0, 0.2, None, 3.0), (1020.0, 0.1, None, 0.4)]
    for _ in range(400):  # past the hour: 120 points, the oldest gone
        history.on_collection("engine", copy(0.1, 0.2))
        now[0] += 10
    points = history.line("m", "ttft", "histogram")
    assert len(points) == 120 and points[-1][0] == now[0] - 10 and points[0][0] >= now[0] - 3600


def test_page_escapes_what_the_engine_names_and_renders_an_empty_state() -> None:
    empty = AgentState()
    page = render_page(build_overview(empty, PageHistory()))
    assert "No engine model seen yet" in page and "<script" not in page
    state = AgentState()
    evil = '<script>alert(1)</script>"x'
    state.record("engine", CollectorHealth("engine", 1.0, 1.0, runs=1, state="ok"), _engine([evil], 12))
    history = PageHistory()
    history.on_collection("engine", _engine([evil], 0))
    ov = build_overview(state, history)
    page = render_page(ov)
    assert "<script" not in page and "&lt;script&gt;alert(1)&lt;/script&gt;&quot;x" in page
    (m,) = ov["models"]
    assert m["latency"]["ttft"] == {"source": "histogram", "window": "1m", "p50": 0.05, "p95": 0.09, "p99": 0.1}
    assert m["ttft_histogram"]["total"] == 12 and m["ttft_histogram"]["goodput"]["ratio"] == 1.0
    assert "explain?model=%3Cscript%3Ealert%281%29%3C%2Fscript%3E%22x&amp;format=html" in page


def test_feature_table_marks_a_runtime_fallback() -> None:
    """simd_fallback as the runtime's profile reports it (compiled for sve, its kernels run asimd only)."""
    state = AgentState()
    ok = CollectorHealth("x", 1.0, 1.0, runs=1, state="ok")
    cpu = Collection(
        samples=[
            Sample("inferwatch.cpu.feature.present", 1, attrs(feature="sve")),
            Sample("inferwatch.cpu.feature.present", 1, attrs(feature="asimd")),
            Sample(
                "inferwatch.cpu.feature.missing",
                0,
                attrs(feature="sve", cpu_model="Arm Neoverse-V1", detected_by="kernel"),
            ),
        ]
    )
    profile = Collection(
        samples=[
            Sample("inferwatch.runtime.profile.simd_inactive", 1, attrs(feature="sve")),
            Sample("inferwatch.runtime.profile.simd_inactive", 0, attrs(feature="asimd")),
        ]
    )
    state.record("cpu", ok, cpu)
    state.record("runtime_profile", ok, profile)
    ov = build_overview(state, PageHistory())
    rows = {r["feature"]: r for r in ov["cpu_features"]}
    assert rows["sve"]["runtime"] == "inactive" and not rows["sve"]["missing"] and rows["asimd"]["runtime"] == "active"
    assert ov["cpu_features"][0]["feature"] == "sve"  # the fallback first
    page = render_page(ov)
    assert '<td data-runtime="inactive">✖ NOT IN USE (fallback)</td>' in page
    assert "compiled for sve but its kernels do not use them" in page


def test_prefix_cache_hit_ratio_per_model_counts_the_local_cache_only() -> None:
    """hits / queries of each model's local prefix cache (``cache`` "local" or none), summed over its series; the
    external (KV-connector) cache and the other models' series are not in it; no queries, no ratio."""
    state = AgentState()
    ok = CollectorHealth("engine", 1.0, 1.0, runs=1, state="ok")
    samples = [Sample("inferwatch.engine.info", 1, attrs({"gen_ai.request.model": m}, engine="vllm")) for m in "abc"]
    for model, cache, hits, queries in (
        ("a", "local", 30, 100),
        ("a", "external", 90, 100),
        ("a", "", 10, 100),
        ("b", "external", 5, 10),
        ("c", "local", 0, 0),
    ):
        labels = attrs({"gen_ai.request.model": model, "cache": cache})
        samples.append(Sample("inferwatch.engine.prefix_cache.hits", hits, labels))
        samples.append(Sample("inferwatch.engine.prefix_cache.queries", queries, labels))
    state.record("engine", ok, Collection(samples=samples))
    ratios = {m["model"]: m["prefix_cache_hit_ratio"] for m in build_overview(state, PageHistory())["models"]}
    assert ratios == {"a": 0.2, "b": None, "c": None}


def test_a_node_with_many_models_shows_twenty_cards_signals_first_and_links_to_all() -> None:
    """At 200 models the page shows PAGE_MODELS cards (those with a signal first, then by name) and a link to all;
    every model's signal stays in the findings, and ``max_models=None`` (``?models=all``, the JSON) builds them all."""
    from inferwatch.agent.node.api.statuspage import PAGE_MODELS

    state = AgentState()
    ok = CollectorHealth("engine", 1.0, 1.0, runs=1, state="ok")
    names = [f"model-{k:03d}" for k in range(200)]
    samples = [Sample("inferwatch.engine.info", 1, attrs({"gen_ai.request.model": m}, engine="vllm")) for m in names]
    for model in ("model-150", "model-199"):  # prefill P99 5x its P50 over 5m: a tail-ratio signal
        labels = {"gen_ai.request.model": model}
        window = {"quantity": "prefill", "window": "5m", "source": "histogram"}
        samples.append(Sample("inferwatch.engine.latency.tail_ratio", 5.0, attrs(labels, **window)))
        samples.append(Sample("inferwatch.engine.latency.samples", 500, attrs(labels, **window)))
    state.record("engine", ok, Collection(samples=samples))
    page = build_overview(state, PageHistory(), max_models=PAGE_MODELS)
    shown = [m["model"] for m in page["models"]]
    assert page["models_total"] == 200 and len(shown) == PAGE_MODELS == 20
    assert {"model-150", "model-199"} <= set(shown) and shown == sorted(shown)
    assert shown[:18] == names[:18]  # then by name
    assert {f["id"] for f in page["findings"]} >= {"latency.tail_ratio/model-150", "latency.tail_ratio/model-199"}
    html = render_page(page, refresh_s=15)
    assert "20 of 200 models" in html and "href='?models=all&amp;refresh=15'" in html
    every = build_overview(state, PageHistory())
    assert len(every["models"]) == every["models_total"] == 200
    assert "of 200 models" not in render_page(every)
