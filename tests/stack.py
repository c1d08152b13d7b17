"""Run the docker-compose stack's configuration natively: the same files, local addresses.

docker-compose.yml mounts ``deploy/prometheus.yml``, ``alerts/*.rules.yml``, ``alerts/alertmanager.yml`` and
``deploy/otelcol.yaml``. The end-to-end tests use exactly these files: :func:`native_prometheus_config`
loads ``deploy/prometheus.yml`` and replaces only what cannot be the same outside Docker (scrape targets,
intervals, the rule-file directory, the Alertmanager address, and the agent's token file: the native agents
listen on loopback without tokens, so the job's ``authorization`` is dropped unless a token file is given).
tests/test_compose.py checks that the compose file mounts these same paths.
"""

from __future__ import annotations

import contextlib
import shutil
import subprocess
from collections.abc import Iterator, Mapping, Sequence
from pathlib import Path
from typing import Any

import yaml

from tests.conftest import ROOT, free_port
from tests.procs import running, wait_http

PROMETHEUS_CONFIG = ROOT / "deploy" / "prometheus.yml"
RULES_DIR = ROOT / "alerts"
ALERTMANAGER_CONFIG = ROOT / "alerts" / "alertmanager.yml"
OTELCOL_CONFIG = ROOT / "deploy" / "otelcol.yaml"
COMPOSE_FILE = ROOT / "docker-compose.yml"
CONTAINER_RULES_DIR = "/etc/prometheus/rules"


def prometheus_binary() -> str | None:
    return shutil.which("prometheus")


def native_prometheus_config(
    targets: Mapping[str, Sequence[str]],
    *,
    interval: str = "1s",
    alertmanager: str | None = None,
    token_file: Path | None = None,
    extra_rule_files: Sequence[Path] = (),
) -> dict[str, Any]:
    """deploy/prometheus.yml with ``targets`` per job (jobs not given get none) and local paths.

    ``token_file`` replaces the container path of every job's ``authorization.credentials_file``; without it
    those jobs scrape without a token.
    """
    cfg = yaml.safe_load(PROMETHEUS_CONFIG.read_text())
    jobs = {j["job_name"] for j in cfg["scrape_configs"]}
    unknown = set(targets) - jobs
    if unknown:
        raise ValueError(f"deploy/prometheus.yml has no job {sorted(unknown)} (jobs: {sorted(jobs)})")
    cfg["global"]["scrape_interval"] = interval
    cfg["global"]["evaluation_interval"] = interval
    cfg["rule_files"] = [
        str(RULES_DIR / Path(p).relative_to(CONTAINER_RULES_DIR)) if p.startswith(CONTAINER_RULES_DIR) else p
        for p in cfg.get("rule_files", [])
    ] + [str(p) for p in extra_rule_files]  # e.g. the price rules `inferwatch prices FILE --rules` writes
    for am in cfg.get("alerting", {}).get("alertmanagers", []):
        am["static_configs"] = [{"targets": [alertmanager]}] if alertmanager else []
    for job in cfg["scrape_configs"]:
        job["static_configs"] = [{"targets": list(targets.get(job["job_name"], []))}]
        job["scrape_interval"] = interval
        job["scrape_timeout"] = interval
        if "credentials_file" in job.get("authorization", {}):
            if token_file is None:
                del job["authorization"]
            else:
                job["authorization"]["credentials_file"] = str(token_file)
    return cfg


@contextlib.contextmanager
def prometheus(
    tmp: Path,
    targets: Mapping[str, Sequence[str]],
    *,
    interval: str = "1s",
    extra_rule_files: Sequence[Path] = (),
    rule_files: Sequence[Path] | None = None,
) -> Iterator[str]:
    """Start Debian's Prometheus on a free port with the native config; yield its base URL.

    ``rule_files`` replaces the shipped rule files (a test's own rendering of one of them, say)."""
    binary = prometheus_binary()
    if binary is None:
        raise RuntimeError("prometheus is not installed (scripts/test.sh installs Debian's prometheus)")
    cfg = native_prometheus_config(targets, interval=interval, extra_rule_files=extra_rule_files)
    if rule_files is not None:
        cfg["rule_files"] = [str(p) for p in rule_files]
    cfg_path = tmp / "prometheus.yml"
    cfg_path.write_text(yaml.safe_dump(cfg))
    check = subprocess.run(["promtool", "check", "config", str(cfg_path)], capture_output=True, text=True, timeout=60)
    if check.returncode != 0:
        raise RuntimeError(f"promtool rejected the native config: {check.stdout}{check.stderr}")
    port = free_port()
    url = f"http://127.0.0.1:{port}"
    cmd = [
        binary,
        f"--config.file={cfg_path}",
        f"--storage.tsdb.path={tmp / 'prom-data'}",
        f"--web.listen-address=127.0.0.1:{port}",
        f"--web.external-url={url}",
    ]
    with running(cmd, tmp / "prometheus.log") as proc:
        wait_http(f"{url}/-/ready", timeout_s=60, proc=proc, ok=lambda r: r.status_code == 200)
        yield url
