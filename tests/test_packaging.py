"""The sdist and the wheel carry every asset, and an installed wheel serves them (issue 12).

Built the standard way (``python -m build``: the sdist, then the wheel from that sdist, each in an isolated
build environment) from a copy of the checkout, so no build/ or egg-info lands in the checkout and a stale
build/lib cannot leak into the wheel. The wheel is installed with its dependencies into a fresh venv
outside the checkout (no --system-site-packages, no PYTHONPATH, cwd elsewhere), which also catches a runtime
import of a package that only the test extra provides; that install is most of this test's time (about 50 s
on the 2-core machine, dependencies from pip's cache or PyPI).
"""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
import tarfile
import time
import zipfile
from pathlib import Path

import httpx
import pytest
import yaml

from tests.alerting import alert_names, run_tool
from tests.conftest import PYTHON, ROOT, free_port
from tests.procs import running, wait_http
from tests.test_assets import repository_assets
from tests.tools import require

pytestmark = [pytest.mark.integration, pytest.mark.slow]

VERSION = "0.1.0"
BUILD_TIMEOUT_S = 300
INSTALL_TIMEOUT_S = 480
COPY_IGNORE = shutil.ignore_patterns(
    ".git", ".venv", "build", "dist", "*.egg-info", "__pycache__", ".mypy_cache", ".ruff_cache", ".pytest_cache",
    ".hypothesis", "tmp",
)  # fmt: skip


def package_paths() -> dict[str, Path]:
    """Path inside the package → the repository file it must equal (agent/assets.py's mapping)."""
    out: dict[str, Path] = {}
    for rel, source in repository_assets().items():
        kind, _, name = rel.rpartition("/")
        if kind == "dashboards":
            out[f"dashboards/json/{name}"] = source
        elif kind == "runbooks":
            out[f"agent/_assets/runbooks/{name}"] = source
        else:  # rules/x.rules.yml, alertmanager.yml, slo.yml: all from alerts/
            out[f"agent/_assets/alerts/{name}"] = source
    return out


def clean_env(**extra: str) -> dict[str, str]:
    """The environment with nothing that points Python at the checkout or its venv."""
    env = {k: v for k, v in os.environ.items() if not k.startswith(("PYTHON", "VIRTUAL_ENV"))}
    return {**env, **extra}


@pytest.fixture(scope="module")
def dist(tmp_path_factory: pytest.TempPathFactory) -> dict[str, Path]:
    """``python -m build`` of a copy of the checkout: {"sdist": ..., "wheel": ...}."""
    base = tmp_path_factory.mktemp("build")
    src = base / "src"
    shutil.copytree(ROOT, src, symlinks=True, ignore=COPY_IGNORE)
    out = base / "dist"
    r = subprocess.run(
        [PYTHON, "-m", "build", "--outdir", str(out), str(src)],
        cwd=base, capture_output=True, text=True, timeout=BUILD_TIMEOUT_S, check=False, env=clean_env(),
    )  # fmt: skip
    assert r.returncode == 0, r.stdout[-3000:] + r.stderr[-3000:]
    sdists, wheels = sorted(out.glob("*.tar.gz")), sorted(out.glob("*.whl"))
    assert len(sdists) == 1 and len(wheels) == 1, sorted(p.name for p in out.iterdir())
    return {"sdist": sdists[0], "wheel": wheels[0]}


def test_sdist_carries_every_asset_as_a_file(dist: dict[str, Path]) -> None:
    prefix = f"inferwatch-{VERSION}/"
    with tarfile.open(dist["sdist"]) as tar:
        members = {m.name.removeprefix(prefix): m for m in tar.getmembers()}
        links = sorted(n for n, m in members.items() if m.issym() or m.islnk())
        assert not links, f"the sdist must hold files, not links: {links}"
        missing = sorted(set(package_paths()) - set(members))
        assert not missing, f"the sdist lacks {missing}"
        for rel, source in package_paths().items():
            fh = tar.extractfile(members[rel])
            assert fh is not None and fh.read() == source.read_bytes(), rel


def test_wheel_carries_every_asset(dist: dict[str, Path]) -> None:
    with zipfile.ZipFile(dist["wheel"]) as whl:
        names = set(whl.namelist())
        missing = sorted(set(package_paths()) - names)
        assert not missing, f"the wheel lacks {missing}"
        for rel, source in package_paths().items():
            assert whl.read(rel) == source.read_bytes(), rel
        shipped = {n for n in names if n.startswith("agent/_assets/")}
        assert shipped == {n for n in package_paths() if n.startswith("agent/_assets/")}, "unexpected extra files"


def test_installed_wheel_serves_runbooks_metrics_and_exports(dist: dict[str, Path], tmp_path: Path) -> None:
    venv, elsewhere = tmp_path / "venv", tmp_path / "elsewhere"
    elsewhere.mkdir()
    env = clean_env(HOME=str(tmp_path / "home"))
    t0 = time.monotonic()
    subprocess.run([sys.executable, "-m", "venv", str(venv)], cwd=elsewhere, env=env, check=True, timeout=120)
    py, inferwatch = venv / "bin" / "python", venv / "bin" / "inferwatch"
    install = subprocess.run(
        [str(py), "-m", "pip", "install", "-q", str(dist["wheel"])],
        cwd=elsewhere, env={**env, "HOME": os.environ.get("HOME", "/root")},  # pip's cache, not the agent's home
        capture_output=True, text=True, timeout=INSTALL_TIMEOUT_S, check=False,
    )  # fmt: skip
    assert install.returncode == 0, install.stderr[-3000:]
    print(f"venv + wheel install with dependencies: {time.monotonic() - t0:.1f} s")

    probe = subprocess.run(
        [str(py), "-c", "import agent, json, sys; print(json.dumps([agent.__file__, sys.path]))"],
        cwd=elsewhere, env=env, capture_output=True, text=True, timeout=60, check=True,
    )  # fmt: skip
    agent_file, sys_path = json.loads(probe.stdout)
    assert Path(agent_file).is_relative_to(venv), f"agent imported from {agent_file}, not the installed wheel"
    assert not [p for p in sys_path if p and Path(p).resolve().is_relative_to(ROOT)], sys_path

    exported = tmp_path / "exported"
    r = subprocess.run(
        [str(inferwatch), "assets", "export", str(exported)],
        cwd=elsewhere, env=env, capture_output=True, text=True, timeout=60, check=False,
    )  # fmt: skip
    assert r.returncode == 0, r.stdout + r.stderr
    for rel, source in repository_assets().items():
        assert (exported / rel).read_bytes() == source.read_bytes(), rel
    rules = sorted((exported / "rules").glob("*.yml"))
    checked = run_tool(require("promtool"), "check", "rules", *rules)
    assert checked.returncode == 0, checked.stdout + checked.stderr
    shipped_alerts = sorted(
        {
            rule["alert"]
            for path in rules
            for group in yaml.safe_load(path.read_text(encoding="utf-8"))["groups"]
            for rule in group["rules"]
            if "alert" in rule
        }
    )
    assert len(shipped_alerts) >= 15 and set(shipped_alerts) == alert_names()

    port = free_port()
    cmd = [str(inferwatch), "run", "--port", str(port), "--interval", "5"]
    with running(cmd, tmp_path / "agent.log", cwd=elsewhere, env={**env, "PYTHONPATH": ""}) as proc:
        base = f"http://127.0.0.1:{port}"
        wait_http(f"{base}/healthz", timeout_s=60, proc=proc)
        for name in shipped_alerts:
            r = httpx.get(f"{base}/runbooks/{name}", timeout=10)
            assert r.status_code == 200, f"{name}: {r.status_code} {r.text[:200]}"
            assert r.text == (ROOT / "runbooks" / f"{name}.md").read_text(encoding="utf-8"), name
        metrics = httpx.get(f"{base}/metrics", timeout=10)
        assert metrics.status_code == 200 and "# TYPE " in metrics.text

    demo = subprocess.run(
        [str(inferwatch), "demo", "--help"], cwd=elsewhere, env=env, capture_output=True, text=True, timeout=60
    )
    assert demo.returncode == 0 and "--sim-port" in demo.stdout, demo.stdout + demo.stderr
