"""End-to-end alerting harness: a PagerDuty Events v2 sink, and Prometheus + Alertmanager with the repo's files.

What is overridden, and nothing else:
- Prometheus: the rule files are the repo's ``alerts/*.rules.yml`` rendered with the test profile
  (:mod:`inferwatch.agent.alerts.profile`: every duration divided by 60, to match 1 s scrape and evaluation intervals);
  ``--rules.alert.resend-delay=1s``; the agent targets come from a file_sd file the test writes; the external
  label ``runbook_base`` points runbook links at a test agent.
- Alertmanager: the repo's ``alerts/alertmanager.yml`` with the PagerDuty URL, the routing-key file and the
  webhook URLs pointed at the local sink (or, per receiver, at ``webhooks``: the agent's evidence webhook and its
  token file). Routes, group_wait, inhibition and templates are the shipped ones.

``pipeline(..., production=True)`` keeps the shipped durations and runs Prometheus at the production 15 s scrape
and evaluation interval with its default resend delay (tests/e2e/test_hang_production.py).
"""

from __future__ import annotations

import contextlib
import json
import os
import shutil
import subprocess
import threading
import time
from collections.abc import Callable, Iterator, Sequence
from dataclasses import dataclass, field
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path
from typing import Any

import httpx
import pytest
import yaml

from inferwatch.agent.alerts.profile import DEFAULT_FACTOR, render_file
from tests.conftest import ROOT, free_port
from tests.procs import running, wait_http
from tests.tools import require

MAX_BODY_BYTES = 1 << 20
ROUTING_KEY = "e2e0123456789abcdef0123456789abc"  # 32 characters, like an Events v2 integration key


@dataclass(frozen=True, slots=True)
class Delivery:
    """One alert as it reached a receiver. ``t`` is time.monotonic() at arrival."""

    t: float
    receiver: str  # pagerduty | ticket | deadmansswitch
    alertname: str
    instance: str
    action: str  # trigger/resolve (PagerDuty) or firing/resolved (webhook)
    body: dict[str, Any] = field(hash=False, compare=False)
    alert: dict[str, Any] = field(hash=False, compare=False)  # webhook: the alert; PagerDuty: {}


class Sink:
    """PagerDuty Events API v2 (``POST /v2/enqueue`` → 202) and webhook receivers on one ThreadingHTTPServer."""

    def __init__(self) -> None:
        self.deliveries: list[Delivery] = []
        self.raw: list[dict[str, Any]] = []
        self._cond = threading.Condition()
        sink = self

        class Handler(BaseHTTPRequestHandler):
            def do_POST(self) -> None:
                length = min(int(self.headers.get("Content-Length") or 0), MAX_BODY_BYTES)
                try:
                    body = json.loads(self.rfile.read(length) or b"{}")
                except ValueError:
                    self.send_error(400, "not JSON")
                    return
                sink._record(self.path, dict(self.headers), body)
                if self.path == "/v2/enqueue":
                    reply = {"status": "success", "message": "Event processed", "dedup_key": body.get("dedup_key")}
                    data = json.dumps(reply).encode()
                    self.send_response(202)
                else:
                    data = b"ok"
                    self.send_response(200)
                self.send_header("Content-Type", "application/json")
                self.send_header("Content-Length", str(len(data)))
                self.end_headers()
                self.wfile.write(data)

            def log_message(self, format: str, *args: Any) -> None:
                pass

        self.server = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
        self.url = f"http://127.0.0.1:{self.server.server_address[1]}"
        self._thread = threading.Thread(target=self.server.serve_forever, daemon=True)

    def _record(self, path: str, headers: dict[str, str], body: dict[str, Any]) -> None:
        now = time.monotonic()
        out: list[Delivery] = []
        if path == "/v2/enqueue":
            details = body.get("payload", {}).get("custom_details", {})
            out.append(
                Delivery(
                    now,
                    "pagerduty",
                    details.get("alertname", ""),
                    details.get("instance", ""),
                    body.get("event_action", ""),
                    body,
                    {},
                )
            )
        else:
            receiver = path.rstrip("/").rsplit("/", 1)[-1]
            for alert in body.get("alerts", []):
                labels = alert.get("labels", {})
                out.append(
                    Delivery(
                        now,
                        receiver,
                        labels.get("alertname", ""),
                        labels.get("instance", ""),
                        alert.get("status", ""),
                        body,
                        alert,
                    )
                )
        with self._cond:
            self.raw.append({"t": now, "path": path, "headers": headers, "body": body})
            self.deliveries.extend(out)
            self._cond.notify_all()

    def wait_for(self, pred: Callable[[Delivery], bool], timeout_s: float) -> Delivery | None:
        deadline = time.monotonic() + timeout_s
        with self._cond:
            while True:
                for d in self.deliveries:
                    if pred(d):
                        return d
                left = deadline - time.monotonic()
                if left <= 0:
                    return None
                self._cond.wait(min(left, 0.5))

    def snapshot(self) -> list[Delivery]:
        with self._cond:
            return list(self.deliveries)

    def __enter__(self) -> Sink:
        self._thread.start()
        return self

    def __exit__(self, *exc: object) -> None:
        self.server.shutdown()
        self.server.server_close()
        self._thread.join(5)


def alertmanager_config(
    sink_url: str, routing_key_file: Path, webhooks: dict[str, tuple[str, Path]] | None = None
) -> dict[str, Any]:
    """The shipped alertmanager.yml with only the receiver addresses (and the key and token file paths) replaced.

    ``webhooks``: receiver name → (URL, token file) for receivers that go somewhere other than the sink.
    """
    cfg = yaml.safe_load((ROOT / "alerts" / "alertmanager.yml").read_text())
    for receiver in cfg["receivers"]:
        for pd in receiver.get("pagerduty_configs", []):
            pd["url"] = f"{sink_url}/v2/enqueue"
            pd["routing_key_file"] = str(routing_key_file)
        for hook in receiver.get("webhook_configs", []):
            url, token = (webhooks or {}).get(receiver["name"], (f"{sink_url}/inferwatch/{receiver['name']}", None))
            hook["url"] = url
            if "http_config" in hook:
                if token is None:
                    token = routing_key_file.with_name(f"{receiver['name']}.token")
                    token.write_text("e2e-unused-token-0123456789\n")
                hook["http_config"]["authorization"]["credentials_file"] = str(token)
    return cfg


@contextlib.contextmanager
def alertmanager(workdir: Path, sink: Sink, webhooks: dict[str, tuple[str, Path]] | None = None) -> Iterator[str]:
    """Alertmanager with :func:`alertmanager_config` (the shipped routes, receivers at ``sink``, ``webhooks`` as
    there) on a free port; yields its base URL."""
    workdir.mkdir(parents=True, exist_ok=True)
    key_file = workdir / "pagerduty_routing_key"
    key_file.write_text(ROUTING_KEY + "\n")
    am_yml = workdir / "alertmanager.yml"
    am_yml.write_text(yaml.safe_dump(alertmanager_config(sink.url, key_file, webhooks), sort_keys=False))
    am_port = free_port()
    am_url = f"http://127.0.0.1:{am_port}"
    am_cmd = [
        _binary("prometheus-alertmanager"),
        f"--config.file={am_yml}",
        f"--storage.path={workdir / 'am'}",
        f"--web.listen-address=127.0.0.1:{am_port}",
        f"--web.external-url={am_url}",
        "--cluster.listen-address=",
    ]
    with running(am_cmd, workdir / "alertmanager.log") as am:
        wait_http(f"{am_url}/-/ready", ok=lambda r: r.status_code == 200, proc=am, timeout_s=60)
        yield am_url


@dataclass
class Pipeline:
    prometheus_url: str
    alertmanager_url: str
    targets_file: Path
    started_at: float

    def set_targets(self, ports: list[int]) -> None:
        """Atomically rewrite the agent job's file_sd targets (Prometheus picks it up through inotify)."""
        tmp = self.targets_file.with_suffix(".tmp")
        tmp.write_text(json.dumps([{"targets": [f"127.0.0.1:{p}" for p in ports]}]))
        os.replace(tmp, self.targets_file)

    def query(self, promql: str) -> list[dict[str, Any]]:
        r = httpx.get(f"{self.prometheus_url}/api/v1/query", params={"query": promql}, timeout=5)
        r.raise_for_status()
        return list(r.json()["data"]["result"])


def _binary(name: str) -> str:
    path = shutil.which(name)
    if path is None:
        pytest.fail(f"{name} not found: apt-get install -y --no-install-recommends prometheus prometheus-alertmanager")
    return path


# The compressed profile's shortest range: three of its 1 s scrapes. A shipped [1m] (the fast window of the
# multi-window engine-signal alerts) is [1s] at factor 60, where Prometheus's rate sees at most one sample and the
# record stays empty, so those alerts could never fire here.
PROFILE_MIN_RANGE_S = 3


@contextlib.contextmanager
def pipeline(
    workdir: Path,
    sink: Sink,
    agent_ports: list[int],
    runbook_base: str,
    *,
    engine_ports: Sequence[int] = (),
    webhooks: dict[str, tuple[str, Path]] | None = None,
    production: bool = False,
) -> Iterator[Pipeline]:
    """Start Alertmanager and Prometheus on free ports with the repo's files; stop both on exit.

    ``engine_ports``: engines Prometheus scrapes itself (job ``engine``, as deploy/prometheus.yml does), for the
    rules that read an engine's own series (the availability SLO's ``http_requests_total``)."""
    workdir.mkdir(parents=True, exist_ok=True)
    rules_dir = workdir / "rules"
    rules_dir.mkdir(exist_ok=True)
    for path in sorted((ROOT / "alerts").glob("*.rules.yml")):
        text = path.read_text() if production else render_file(path, DEFAULT_FACTOR, PROFILE_MIN_RANGE_S)
        (rules_dir / path.name).write_text(text)
    with alertmanager(workdir, sink, webhooks) as am_url:
        prom_port = free_port()
        targets = workdir / "agents.json"
        prom_cfg = {
            "global": {
                "scrape_interval": "15s" if production else "1s",
                "scrape_timeout": "10s" if production else "1s",
                "evaluation_interval": "15s" if production else "1s",
                "external_labels": {"runbook_base": runbook_base},
            },
            "rule_files": [str(rules_dir / "*.rules.yml")],
            "alerting": {"alertmanagers": [{"static_configs": [{"targets": [am_url.removeprefix("http://")]}]}]},
            "scrape_configs": [{"job_name": "inferwatch-agent", "file_sd_configs": [{"files": [str(targets)]}]}],
        }
        if engine_ports:
            engines = [f"127.0.0.1:{p}" for p in engine_ports]
            prom_cfg["scrape_configs"].append({"job_name": "engine", "static_configs": [{"targets": engines}]})
        prom_yml = workdir / "prometheus.yml"
        prom_yml.write_text(yaml.safe_dump(prom_cfg, sort_keys=False))
        prom_url = f"http://127.0.0.1:{prom_port}"
        prom_cmd = [
            _binary("prometheus"),
            f"--config.file={prom_yml}",
            f"--storage.tsdb.path={workdir / 'prom'}",
            f"--web.listen-address=127.0.0.1:{prom_port}",
            f"--web.external-url={prom_url}",
            *([] if production else ["--rules.alert.resend-delay=1s"]),
        ]
        pl = Pipeline(prom_url, am_url, targets, time.monotonic())
        pl.set_targets(agent_ports)
        with running(prom_cmd, workdir / "prometheus.log") as prom:
            wait_http(f"{prom_url}/-/ready", ok=lambda r: r.status_code == 200, proc=prom, timeout_s=60)
            yield pl


class EngineReplay:
    """A recorded engine exposition served at ``GET /metrics``, with values a test may rewrite over time.

    ``text()`` returns the exposition to serve; :meth:`stop` closes the port (the engine going down).
    """

    def __init__(self, text: Callable[[], str]) -> None:
        class Handler(BaseHTTPRequestHandler):
            def do_GET(self) -> None:
                data = text().encode()
                self.send_response(200)
                self.send_header("Content-Type", "text/plain; version=0.0.4; charset=utf-8")
                self.send_header("Content-Length", str(len(data)))
                self.end_headers()
                self.wfile.write(data)

            def log_message(self, format: str, *args: Any) -> None:
                pass

        self.server = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
        self.url = f"http://127.0.0.1:{self.server.server_address[1]}/metrics"
        self._thread = threading.Thread(target=self.server.serve_forever, daemon=True)
        self._stopped = False

    def stop(self) -> None:
        if not self._stopped:
            self._stopped = True
            self.server.shutdown()
            self.server.server_close()
            self._thread.join(5)

    def __enter__(self) -> EngineReplay:
        self._thread.start()
        return self

    def __exit__(self, *exc: object) -> None:
        self.stop()


def backfill_day_ago(out: Path, families: dict[str, list[tuple[str, float]]]) -> None:
    """Write TSDB blocks into ``out`` (Prometheus's data directory, before it starts) holding each gauge series
    (``{name: [(label text, value), ...]}``) a day ago, and 24 minutes ago for the rules compressed by 60 (their
    ``offset 1d``), each from 10 minutes before on. The later one ends 5.5 minutes before now (an instant query
    looks 5 minutes back, so "now" never shows the old value; Prometheus appends nothing older than its newest
    block) and covers the rules' look-back for the next 23 minutes."""
    now = time.time()
    lines = []
    for name, series in families.items():
        lines.append(f"# TYPE {name} gauge")
        for text, value in series:
            for ago, until in ((86400, 1800), (1440, 1440 - 330)):
                lines += [f"{name}{{{text}}} {value} {now - ago + t:.3f}" for t in range(-600, until + 1, 15)]
    out.mkdir(parents=True, exist_ok=True)
    source = out.parent / "yesterday.om"
    source.write_text("\n".join(lines) + "\n# EOF\n")
    r = subprocess.run(
        [require("promtool"), "tsdb", "create-blocks-from", "openmetrics", str(source), str(out)],
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert r.returncode == 0, r.stdout[-2000:] + r.stderr[-2000:]
