"""The remote-write storage path, natively: VictoriaMetrics, vmagent, vmalert and Prometheus in agent mode.

The configurations are the shipped ones (deploy/prometheus-agent.yml, deploy/vmagent/scrape.yml,
deploy/vmalert/vmalert.flags); only what cannot be the same outside a cluster is replaced: scrape targets,
intervals, the remote-write and notifier URLs, the scrape token (the native agents listen on loopback without
one) and data paths. Used by tests/test_vm_storage.py and benchmarks/fleet_series.py.
"""

from __future__ import annotations

import contextlib
from collections.abc import Iterator, Sequence
from pathlib import Path
from typing import Any

import httpx
import yaml

from tests.conftest import ROOT, free_port
from tests.procs import running, wait_http

PROMETHEUS_AGENT_CONFIG = ROOT / "deploy" / "prometheus-agent.yml"
VMAGENT_CONFIG = ROOT / "deploy" / "vmagent" / "scrape.yml"
VMALERT_FLAGS = ROOT / "deploy" / "vmalert" / "vmalert.flags"
READY_TIMEOUT_S = 60.0
# One client for every query: ``httpx.get`` builds a client per call, and with it a TLS context (~25 ms of CPU,
# measured), which the few thousand queries of tests/test_vm_storage.py's comparison paid each time (~60 s of the
# test process's CPU). No keep-alive: each query still opens a connection of its own, as with ``httpx.get``.
_QUERIES = httpx.Client(timeout=30, limits=httpx.Limits(max_keepalive_connections=0))


def _scrape_config(path: Path, targets: dict[str, Sequence[str]], interval: str) -> dict[str, Any]:
    """A shipped scrape configuration with ``targets`` per job (jobs not given are dropped) and no token."""
    cfg = yaml.safe_load(path.read_text())
    cfg["global"]["scrape_interval"] = interval
    jobs = []
    for job in cfg["scrape_configs"]:
        if job["job_name"] not in targets:
            continue
        job.pop("authorization", None)
        job["static_configs"] = [{"targets": list(targets[job["job_name"]])}]
        jobs.append(job)
    unknown = set(targets) - {j["job_name"] for j in jobs}
    if unknown:
        raise ValueError(f"{path.name} has no job {sorted(unknown)}")
    cfg["scrape_configs"] = jobs
    return cfg


@contextlib.contextmanager
def _serving(cmd: Sequence[str], log: Path, url: str, health: str) -> Iterator[str]:
    """Run ``cmd`` until the context exits; yield ``url`` once ``url + health`` answers 200."""
    with running(cmd, log) as proc:
        wait_http(f"{url}{health}", timeout_s=READY_TIMEOUT_S, proc=proc, ok=lambda r: r.status_code == 200)
        yield url


@contextlib.contextmanager
def victoria_metrics(tmp: Path, binary: str) -> Iterator[str]:
    """Single-node VictoriaMetrics on a free port; yields its base URL.

    ``-search.latencyOffset=1s``: by default the newest 30 s are hidden from queries (for late samples), which
    would hide a test's whole run. ``-search.maxLookback=5m``: an instant selector finds the newest sample
    within 5 m, as with Prometheus' ``--query.lookback-delta`` (by default VictoriaMetrics derives the
    look-back from the series' sample interval, so one late sample empties a gauge for vmalert's evidence
    queries; seen on the loaded test machine). ``-search.disableCache``: every query reads the storage.
    """
    port = free_port()
    url = f"http://127.0.0.1:{port}"
    cmd = [
        binary,
        f"-storageDataPath={tmp / 'vm-data'}",
        f"-httpListenAddr=127.0.0.1:{port}",
        "-retentionPeriod=1d",
        "-search.latencyOffset=1s",
        "-search.maxLookback=5m",
        "-search.disableCache",
        "-loggerLevel=WARN",
    ]
    with _serving(cmd, tmp / "victoria-metrics.log", url, "/health") as served:
        yield served


@contextlib.contextmanager
def prometheus_agent(
    tmp: Path, binary: str, targets: dict[str, Sequence[str]], write_urls: Sequence[str], interval: str = "1s"
) -> Iterator[str]:
    """Prometheus in agent mode with deploy/prometheus-agent.yml, writing to each of ``write_urls``."""
    cfg = _scrape_config(PROMETHEUS_AGENT_CONFIG, targets, interval)
    shipped = cfg["remote_write"][0]
    queue = {**shipped.get("queue_config", {}), "batch_send_deadline": "1s"}
    cfg["remote_write"] = [{**shipped, "url": u, "queue_config": queue} for u in write_urls]
    path = tmp / "prometheus-agent.yml"
    path.write_text(yaml.safe_dump(cfg, sort_keys=False))
    port = free_port()
    url = f"http://127.0.0.1:{port}"
    cmd = [
        binary,
        "--enable-feature=agent",
        f"--config.file={path}",
        f"--storage.agent.path={tmp / 'prom-agent-wal'}",
        f"--web.listen-address=127.0.0.1:{port}",
    ]
    with _serving(cmd, tmp / "prometheus-agent.log", url, "/-/ready") as served:
        yield served


@contextlib.contextmanager
def vmagent(
    tmp: Path, binary: str, targets: dict[str, Sequence[str]], write_urls: Sequence[str], interval: str = "1s"
) -> Iterator[str]:
    """vmagent with deploy/vmagent/scrape.yml, writing to each of ``write_urls``."""
    path = write_vmagent_config(tmp, targets, interval)
    port = free_port()
    url = f"http://127.0.0.1:{port}"
    cmd = [
        binary,
        f"-promscrape.config={path}",
        f"-remoteWrite.tmpDataPath={tmp / 'vmagent-buffer'}",
        f"-httpListenAddr=127.0.0.1:{port}",
        "-remoteWrite.flushInterval=1s",
        "-loggerLevel=WARN",
        *(f"-remoteWrite.url={u}" for u in write_urls),
    ]
    with _serving(cmd, tmp / "vmagent.log", url, "/health") as served:
        yield served


def write_vmagent_config(tmp: Path, targets: dict[str, Sequence[str]], interval: str) -> Path:
    """Write deploy/vmagent/scrape.yml with ``targets`` to ``tmp``; the path :func:`vmagent` reads."""
    path = tmp / "vmagent-scrape.yml"
    tmp_path = path.with_suffix(".tmp")
    tmp_path.write_text(yaml.safe_dump(_scrape_config(VMAGENT_CONFIG, targets, interval), sort_keys=False))
    tmp_path.replace(path)
    return path


def reload_vmagent(tmp: Path, url: str, targets: dict[str, Sequence[str]], interval: str) -> None:
    """Replace the running vmagent's targets (a node joining or leaving the fleet): rewrite and ``/-/reload``."""
    write_vmagent_config(tmp, targets, interval)
    httpx.post(f"{url}/-/reload", timeout=10).raise_for_status()


def vmalert_flags(
    rules: Sequence[Path], datasource: str, notifier: str, url: str, external_labels: dict[str, str], interval: str
) -> list[str]:
    """deploy/vmalert/vmalert.flags with local addresses, ``rules`` and ``interval`` in place of the shipped ones."""
    local = {
        "-datasource.url": datasource,
        "-remoteWrite.url": datasource,
        "-remoteRead.url": datasource,
        "-notifier.url": notifier,
        "-evaluationInterval": interval,
        "-external.url": url,
    }
    flags: list[str] = []
    for line in VMALERT_FLAGS.read_text().splitlines():
        line = line.strip()
        if not line or line.startswith("#"):
            continue
        name = line.split("=", 1)[0]
        if name in ("-rule", "-external.label"):
            continue
        flags.append(f"{name}={local[name]}" if name in local else line)
    flags += [f"-rule={p}" for p in rules]
    flags += [f"-external.label={k}={v}" for k, v in external_labels.items()]
    return flags


@contextlib.contextmanager
def vmalert(
    tmp: Path,
    binary: str,
    rules: Sequence[Path],
    datasource: str,
    notifier: str,
    external_labels: dict[str, str],
    interval: str = "1s",
) -> Iterator[str]:
    port = free_port()
    url = f"http://127.0.0.1:{port}"
    flags = vmalert_flags(rules, datasource, notifier, url, external_labels, interval)
    cmd = [binary, *flags, f"-httpListenAddr=127.0.0.1:{port}", "-loggerLevel=WARN"]
    with _serving(cmd, tmp / "vmalert.log", url, "/health") as served:
        yield served


def instant(base_url: str, expr: str, at: float) -> list[dict[str, Any]]:
    """``expr`` evaluated at unix time ``at`` through the Prometheus query API (Prometheus or VictoriaMetrics)."""
    r = _QUERIES.get(f"{base_url}/api/v1/query", params={"query": expr, "time": f"{at:.3f}"})
    body = r.json()
    if r.status_code != 200 or body.get("status") != "success":
        raise RuntimeError(f"{base_url} rejected {expr!r}: HTTP {r.status_code} {body.get('error', body)}")
    if body["data"]["resultType"] == "scalar":
        return [{"metric": {}, "value": body["data"]["result"]}]
    return list(body["data"]["result"])


def self_metric(base_url: str, name: str) -> float:
    """Sum of a process's own /metrics samples named ``name`` (any labels)."""
    total = 0.0
    for line in _QUERIES.get(f"{base_url}/metrics", timeout=10).text.splitlines():
        if line.startswith(name) and line[len(name) : len(name) + 1] in ("{", " "):
            total += float(line.rsplit(" ", 1)[-1])
    return total
