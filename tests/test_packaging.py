"""The user's path: the built wheel, installed into a fresh venv outside the checkout, works as the checkout does.

Issues 12 and 31. The sdist and the wheel are built the standard way (``python -m build``: the sdist, then the
wheel from that sdist, each in an isolated build environment) from a copy of the checkout, so no build/ or
egg-info lands in the checkout and a stale build/lib cannot leak into the wheel. The wheel is installed with its
dependencies into one fresh venv per module (no --system-site-packages, no PYTHONPATH, cwd a temp directory),
with uv from its cache (``--offline``; from PyPI only when the cache lacks something), else with pip; that also
catches a runtime import of a package that only the test extra provides.

From that install, every test runs ``inferwatch`` as a user does and fails on any traceback:

- every file of the packages (code and data) is in the wheel under the one import name ``inferwatch`` (nothing
  else at the top of site-packages), and ``inferwatch`` imports from the venv's site-packages;
- every command's ``--help``, and each command's main path against the simulator started from the install (probe,
  engine inspect, loadgen, drift, simd, profile, doctor, top, explain, evidence, assets, prices, grafana push);
- ``inferwatch run`` with every collector on the simulator: every collector runs, none fails;
- ``inferwatch demo`` for about a minute: no collector fails, every runbook link of the status page resolves;
- the container image's command (Dockerfile ENTRYPOINT + CMD and ENV) and the DaemonSet's (args, env, mounts,
  ConfigMap and token Secret of deploy/kubernetes/base) as written, adapted only to 127.0.0.1, free ports and
  temp paths.

Where the outcome depends on this machine rather than on the package (doctor's checks, py-spy's ptrace, a matrix
query without Prometheus), the same command runs from the checkout too and the two must agree.
"""

from __future__ import annotations

import json
import os
import re
import runpy
import shutil
import signal
import subprocess
import sys
import sysconfig
import tarfile
import threading
import time
import zipfile
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import httpx
import pytest
import typer.main
import yaml

from inferwatch.agent.cli.main import app as checkout_app
from tests.alerting import alert_names, run_tool
from tests.conftest import PYTHON, ROOT, free_port
from tests.grafana_fake import FakeGrafana
from tests.procs import running, wait_http
from tests.test_assets import repository_assets
from tests.tools import require

pytestmark = [pytest.mark.integration, pytest.mark.slow]

VERSION = "0.1.0"
BUILD_TIMEOUT_S = 300
INSTALL_TIMEOUT_S = 480
START_TIMEOUT_S = 90  # an agent's /readyz (every collector ran once) on a loaded 2-core machine
DEMO_S = 75  # "about a minute": time for the first spans to reach explain on a loaded machine
UV = ROOT / ".venv" / "bin" / "uv"
# One client for the test's own requests to the agents it starts: ``httpx.get`` builds a client, and with it a TLS
# context (~25 ms of CPU), per call (the readiness and status polls, ~80 runbook pages). No keep-alive: each request
# opens its own connection, so an agent closing an idle one cannot pass for an agent that stopped.
HTTP = httpx.Client(limits=httpx.Limits(max_keepalive_connections=0))
# checkout folder -> import name (setup.py: everything under the one name ``inferwatch``)
FOLDERS: dict[str, str] = runpy.run_path(str(ROOT / "setup.py"), run_name="layout")["FOLDERS"]
# What a checkout holds, without what a build or the suite's setup makes in it: ``.venv*`` are scripts/test.sh's
# three virtual environments (~760 MB, which every copy of the checkout here paid for, three per run).
COPY_IGNORE = shutil.ignore_patterns(
    ".git", ".venv*", "build", "dist", "*.egg-info", "__pycache__", ".mypy_cache", ".ruff_cache", ".pytest_cache",
    ".hypothesis", "tmp", "*.so",
)  # fmt: skip


def package_paths() -> dict[str, Path]:
    """Path inside the package → the repository file it must equal (agent/common/assets.py's mapping)."""
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


def wheel_path(rel: str) -> str:
    """Where a checkout file (``agent/node/runner.py``) lands in the wheel (``inferwatch/agent/node/runner.py``)."""
    folder, _, rest = rel.partition("/")
    return f"{FOLDERS[folder].replace('.', '/')}/{rest}"


def package_files() -> dict[str, Path]:
    """Every file the packages hold in the checkout (code and data, the asset symlinks followed) by wheel path."""
    out: dict[str, Path] = {}
    for package in FOLDERS:
        for directory, dirs, files in os.walk(ROOT / package, followlinks=True):
            dirs[:] = [d for d in dirs if d != "__pycache__"]
            for name in files:
                # not the C extension's source or a binary built in place: the wheel has the one its build makes
                if not name.endswith((".pyc", ".pyo", ".c", ".so")):
                    path = Path(directory) / name
                    out[wheel_path(path.relative_to(ROOT).as_posix())] = path
    return out


def clean_env(**extra: str) -> dict[str, str]:
    """The environment with nothing that points Python at the checkout or its venv."""
    env = {k: v for k, v in os.environ.items() if not k.startswith(("PYTHON", "VIRTUAL_ENV", "INFERWATCH_"))}
    return {**env, **extra}


def no_traceback(r: subprocess.CompletedProcess[str], what: str) -> None:
    out = r.stdout + r.stderr
    assert "Traceback (most recent call last)" not in out, f"{what}: a traceback\n{out[-4000:]}"


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


@dataclass(frozen=True)
class Install:
    """The wheel installed in ``venv``; commands run from ``cwd`` (outside the checkout) with ``env``."""

    venv: Path
    cwd: Path
    env: dict[str, str]

    @property
    def python(self) -> str:
        return str(self.venv / "bin" / "python")

    @property
    def inferwatch(self) -> str:
        return str(self.venv / "bin" / "inferwatch")

    def run(
        self, *args: str, timeout: float = 120, env: dict[str, str] | None = None
    ) -> subprocess.CompletedProcess[str]:
        """``inferwatch ARGS`` from the install; fails the test on a traceback."""
        r = subprocess.run(
            [self.inferwatch, *args], cwd=self.cwd, env={**self.env, **(env or {})},
            capture_output=True, text=True, timeout=timeout, check=False,
        )  # fmt: skip
        no_traceback(r, f"inferwatch {' '.join(args)} (install)")
        return r


def from_checkout(*args: str, timeout: float = 120) -> subprocess.CompletedProcess[str]:
    r = subprocess.run(
        [PYTHON, "-m", "inferwatch.agent", *args], cwd=ROOT, capture_output=True, text=True, timeout=timeout,
         check=False,
        env=clean_env(),
    )  # fmt: skip
    no_traceback(r, f"inferwatch {' '.join(args)} (checkout)")
    return r


@pytest.fixture(scope="module")
def installed(dist: dict[str, Path], tmp_path_factory: pytest.TempPathFactory) -> Install:
    base = tmp_path_factory.mktemp("install")
    venv, elsewhere, home = base / "venv", base / "elsewhere", base / "home"
    elsewhere.mkdir()
    home.mkdir()
    installer_env = clean_env()  # the real HOME: uv's and pip's caches
    t0 = time.monotonic()
    if UV.is_file():
        subprocess.run([str(UV), "venv", "-q", "--python", sys.executable, str(venv)], cwd=elsewhere,
                       env=installer_env, check=True, timeout=120)  # fmt: skip
        cmd = [str(UV), "pip", "install", "-q", "--python", str(venv / "bin" / "python"), str(dist["wheel"])]
        install = subprocess.run([*cmd, "--offline"], cwd=elsewhere, env=installer_env, capture_output=True,
                                 text=True, timeout=INSTALL_TIMEOUT_S, check=False)  # fmt: skip
        if install.returncode != 0:  # something missing from the cache: from PyPI
            install = subprocess.run(cmd, cwd=elsewhere, env=installer_env, capture_output=True, text=True,
                                     timeout=INSTALL_TIMEOUT_S, check=False)  # fmt: skip
    else:
        subprocess.run([sys.executable, "-m", "venv", str(venv)], cwd=elsewhere, env=installer_env, check=True,
                       timeout=120)  # fmt: skip
        install = subprocess.run(
            [str(venv / "bin" / "python"), "-m", "pip", "install", "-q", str(dist["wheel"])],
            cwd=elsewhere, env=installer_env, capture_output=True, text=True, timeout=INSTALL_TIMEOUT_S, check=False,
        )  # fmt: skip
    assert install.returncode == 0, install.stdout[-3000:] + install.stderr[-3000:]
    print(f"venv + wheel install with dependencies: {time.monotonic() - t0:.1f} s")
    return Install(venv, elsewhere, clean_env(HOME=str(home)))


@dataclass(frozen=True)
class Sim:
    url: str
    pid: int


@pytest.fixture(scope="module")
def sim(installed: Install, tmp_path_factory: pytest.TempPathFactory) -> Iterator[Sim]:
    """The simulator, started from the install (debug profile on; spans to a receiver that is not up yet)."""
    port, log = free_port(), tmp_path_factory.mktemp("sim") / "sim.log"
    cmd = [installed.inferwatch, "simulate", "--port", str(port), "--debug-profile", "--control-token", "t"]
    with running(cmd, log, cwd=installed.cwd, env=installed.env) as proc:
        url = f"http://127.0.0.1:{port}"
        wait_http(f"{url}/health", timeout_s=60, proc=proc)
        yield Sim(url, proc.pid)
    assert "Traceback" not in log.read_text(errors="replace"), log.read_text(errors="replace")[-4000:]


def collectors(status: dict[str, Any]) -> dict[str, dict[str, Any]]:
    return {c["name"]: c for c in status["collectors"]}


def failing(status: dict[str, Any]) -> dict[str, str]:
    """Collectors failing, with their last error: failed and never succeeded, or failed in half their runs or more.

    A file missing from the wheel fails a collector on every run; one timeout on a loaded machine does not count.
    """
    return {
        name: f"{c['state']} runs={c['runs']} errors={c['errors']}: {c['last_error']}"
        for name, c in collectors(status).items()
        if (c["state"] == "failed" and c["last_success_at"] is None) or (c["errors"] and 2 * c["errors"] >= c["runs"])
    }


def wait_ready(base: str, proc: subprocess.Popen[bytes], log: Path, headers: dict[str, str] | None = None) -> None:
    """Until /readyz says every collector has run once (bounded); the log's tail on failure."""
    deadline = time.monotonic() + START_TIMEOUT_S
    while time.monotonic() < deadline:
        assert proc.poll() is None, log.read_text(errors="replace")[-4000:]
        try:
            if HTTP.get(f"{base}/readyz", headers=headers, timeout=5).status_code == 200:
                return
        except httpx.HTTPError:
            pass
        time.sleep(0.5)
    raise AssertionError(f"{base}/readyz not ready in {START_TIMEOUT_S} s\n{log.read_text(errors='replace')[-4000:]}")


def log_problems(log: Path) -> list[str]:
    text = log.read_text(errors="replace")
    assert "Traceback" not in text, f"{log.name}: a traceback\n{text[-4000:]}"
    return [line for line in text.splitlines() if " ERROR " in line or "no runtime process configured" in line]


# --- what the wheel holds ---------------------------------------------------------------------------------------


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
        expected = {wheel_path(rel): source for rel, source in package_paths().items()}
        missing = sorted(set(expected) - names)
        assert not missing, f"the wheel lacks {missing}"
        for rel, source in expected.items():
            assert whl.read(rel) == source.read_bytes(), rel
        shipped = {n for n in names if n.startswith("inferwatch/agent/_assets/")}
        assert shipped == {n for n in expected if n.startswith("inferwatch/agent/_assets/")}, "unexpected extra files"


def test_wheel_installs_one_import_name(dist: dict[str, Path]) -> None:
    """Everything under ``inferwatch``: no ``agent`` or ``exporters`` at the top of site-packages to collide with."""
    with zipfile.ZipFile(dist["wheel"]) as whl:
        names = whl.namelist()
    top = {n.split("/", 1)[0] for n in names if not n.split("/", 1)[0].endswith(".dist-info")}
    assert top == {"inferwatch"}, f"the wheel installs top-level names other than inferwatch: {sorted(top)}"
    assert "inferwatch/__init__.py" in names and "inferwatch/py.typed" in names


def test_wheel_carries_every_file_of_the_packages(dist: dict[str, Path]) -> None:
    """Code and data: a file the code reads beside itself (the probe's JSON Schemas) must be package data."""
    expected = package_files()
    assert "inferwatch/agent/node/probe/schemas/openai_chat_chunk.json" in expected
    with zipfile.ZipFile(dist["wheel"]) as whl:
        names = set(whl.namelist())
        missing = sorted(set(expected) - names)
        assert not missing, f"the wheel lacks files the packages hold (pyproject.toml package-data): {missing}"
        for rel, source in expected.items():
            if not rel.endswith(".py"):
                assert whl.read(rel) == source.read_bytes(), rel


READ_SCRIPT = """
import json, sys
from inferwatch.agent.node.engine import bulkparse
from inferwatch.agent.node.engine.exposition import Everything, ExpositionReader
from inferwatch.agent.node.engine.textformat import ExpositionError
out = {}
for path in sys.argv[1:]:
    try:
        e = ExpositionReader(("",), Everything()).read(open(path, encoding="utf-8").read())
    except ExpositionError as exc:
        out[path] = str(exc)
        continue
    out[path] = {n: [[list(map(list, labels)), repr(v)] for labels, v in series] for n, series in e.samples.items()}
print(json.dumps([bulkparse.COMPILED, out]))
"""


def test_wheel_carries_the_compiled_reader(dist: dict[str, Path], installed: Install) -> None:
    """Where a C compiler and Python.h are (scripts/run.sh and test.sh install them), the wheel carries the exposition
    reader's extension and the install reads through it; ``INFERWATCH_PURE_PARSER=1`` reads in pure Python, alike."""
    compiler = (Path(sysconfig.get_paths()["include"]) / "Python.h").is_file() and bool(shutil.which("gcc"))
    with zipfile.ZipFile(dist["wheel"]) as whl:
        built = [n for n in whl.namelist() if re.fullmatch(r"inferwatch/agent/node/engine/_fastparse\..+\.so", n)]
    tag = f"cp{sys.version_info.major}{sys.version_info.minor}"
    assert dist["wheel"].name.startswith(f"inferwatch-{VERSION}-{tag}-{tag}-"), dist["wheel"].name  # not py3-none-any
    if compiler:
        assert built, "a C compiler and Python.h are here, but the wheel lacks _fastparse"
    corpus = [str(p) for p in sorted((ROOT / "tests" / "fixtures" / "engines").glob("*.prom"))]
    runs = {}
    for pure in ("", "1"):
        r = subprocess.run(
            [installed.python, "-c", READ_SCRIPT, *corpus], cwd=installed.cwd,
            env={**installed.env, "INFERWATCH_PURE_PARSER": pure}, capture_output=True, text=True, timeout=120,
            check=False,
        )  # fmt: skip
        no_traceback(r, "reading the engine corpus (install)")
        runs[pure] = json.loads(r.stdout)
    assert runs[""][0] is bool(built) and runs["1"][0] is False, (runs[""][0], runs["1"][0])
    assert runs[""][1] == runs["1"][1] and len(runs[""][1]) == len(corpus)


def test_a_machine_without_a_compiler_builds_the_pure_package(tmp_path: Path) -> None:
    """The extension is optional: with no working C compiler the build says so, succeeds, and builds no module (the
    package then reads in pure Python: tests/test_bulkparse.py)."""
    src = tmp_path / "src"
    shutil.copytree(ROOT, src, symlinks=True, ignore=COPY_IGNORE)
    r = subprocess.run(
        [PYTHON, "setup.py", "build_ext", "--inplace"], cwd=src, env=clean_env(CC="/bin/false"),
        capture_output=True, text=True, timeout=BUILD_TIMEOUT_S, check=False,
    )  # fmt: skip
    assert r.returncode == 0, r.stdout[-3000:] + r.stderr[-3000:]
    assert 'building extension "inferwatch.agent.node.engine._fastparse" failed' in r.stdout + r.stderr
    assert not list((src / "agent" / "node" / "engine").glob("_fastparse*.so"))


def test_agent_imports_from_the_install_only(installed: Install) -> None:
    probe = subprocess.run(
        [installed.python, "-c", "import inferwatch.agent as a, json, sys; print(json.dumps([a.__file__, sys.path]))"],
        cwd=installed.cwd, env=installed.env, capture_output=True, text=True, timeout=60, check=True,
    )  # fmt: skip
    agent_file, sys_path = json.loads(probe.stdout)
    site = next(installed.venv.glob("lib/python3*/site-packages"))
    assert Path(agent_file).is_relative_to(site), f"agent imported from {agent_file}, not the installed wheel"
    assert not [p for p in sys_path if p and Path(p).resolve().is_relative_to(ROOT)], sys_path


# --- every command ------------------------------------------------------------------------------------------------

HELP_SCRIPT = """
import json, typer.main
from typer.testing import CliRunner
from inferwatch.agent.cli.main import app
def walk(group, prefix=()):
    for name, cmd in sorted(group.commands.items()):
        yield (*prefix, name)
        if hasattr(cmd, "commands"):  # a group (typer vendors its own click: no isinstance)
            yield from walk(cmd, (*prefix, name))
root, out = typer.main.get_command(app), {}
for path in walk(root):
    r = CliRunner().invoke(app, [*path, "--help"])
    error = None if r.exception is None or isinstance(r.exception, SystemExit) else repr(r.exception)
    out[" ".join(path)] = [r.exit_code, error, r.output]
print(json.dumps(out))
"""


def command_paths(group: Any, prefix: tuple[str, ...] = ()) -> list[str]:
    out: list[str] = []
    for name, cmd in sorted(group.commands.items()):
        out.append(" ".join((*prefix, name)))
        if hasattr(cmd, "commands"):
            out += command_paths(cmd, (*prefix, name))
    return out


def test_every_command_helps_from_the_install(installed: Install) -> None:
    r = subprocess.run([installed.python, "-c", HELP_SCRIPT], cwd=installed.cwd, env=installed.env,
                       capture_output=True, text=True, timeout=300, check=False)  # fmt: skip
    assert r.returncode == 0, r.stderr[-4000:]
    helped = json.loads(r.stdout)
    expected = command_paths(typer.main.get_command(checkout_app))
    assert sorted(helped) == sorted(expected) and len(expected) >= 20, sorted(set(expected) ^ set(helped))
    for path, (code, error, output) in helped.items():
        assert code == 0 and error is None and "Usage: " in output, (path, code, error, output[-500:])
    top = installed.run("--help")
    assert top.returncode == 0 and "Commands" in top.stdout
    assert installed.run("version").stdout.strip() == VERSION


def test_assets_export_from_the_install(installed: Install, tmp_path: Path) -> None:
    exported = tmp_path / "exported"
    r = installed.run("assets", "export", str(exported))
    assert r.returncode == 0, r.stdout + r.stderr
    for rel, source in repository_assets().items():
        assert (exported / rel).read_bytes() == source.read_bytes(), rel
    rules = sorted((exported / "rules").glob("*.yml"))
    checked = run_tool(require("promtool"), "check", "rules", *rules)
    assert checked.returncode == 0, checked.stdout + checked.stderr
    shipped_alerts = {
        rule["alert"]
        for path in rules
        for group in yaml.safe_load(path.read_text(encoding="utf-8"))["groups"]
        for rule in group["rules"]
        if "alert" in rule
    }
    assert len(shipped_alerts) >= 15 and shipped_alerts == alert_names()
    # docs/deploy.md: regenerate the SLO rules from the exported spec with the installed generator
    regenerated = tmp_path / "slo.rules.yml"
    r = subprocess.run(
        [installed.python, "-m", "inferwatch.agent.alerts.slo", "--spec", str(exported / "slo.yml"), "--out",
         str(regenerated)],
        cwd=installed.cwd, env=installed.env, capture_output=True, text=True, timeout=120, check=False,
    )  # fmt: skip
    no_traceback(r, "python -m inferwatch.agent.alerts.slo (install)")
    assert r.returncode == 0, r.stderr
    body = regenerated.read_text(encoding="utf-8").split("\n", 1)[1]  # line 1 names the spec it was made from
    assert body == (exported / "rules" / "slo.rules.yml").read_text(encoding="utf-8").split("\n", 1)[1]
    listed = installed.run("assets", "list")
    assert listed.returncode == 0 and len(listed.stdout.splitlines()) == len(repository_assets()), listed.stdout
    shown = installed.run("assets", "show", "EngineDown")
    assert shown.returncode == 0 and shown.stdout == (ROOT / "runbooks" / "EngineDown.md").read_text(), shown.stderr


def test_engine_side_commands_from_the_install(installed: Install, sim: Sim, tmp_path: Path) -> None:
    """probe, engine inspect, loadgen, drift, simd and profile against the simulator the install started."""
    r = installed.run("probe", "--url", sim.url)
    assert r.returncode == 0 and re.search(r"result\s+OK", r.stdout), r.stdout + r.stderr
    r = installed.run("engine", "inspect", "--metrics-url", f"{sim.url}/metrics")
    assert r.returncode == 0 and "vllm" in r.stdout, r.stdout + r.stderr
    r = installed.run("loadgen", "--url", sim.url, "--count", "6", "--rate", "20", "--output-tokens", "4", "--json")
    assert r.returncode == 0, r.stderr
    assert json.loads(r.stdout)["ok"] == 6, r.stdout
    r = installed.run("drift", "--endpoint", f"a={sim.url}", "--endpoint", f"b={sim.url}", "--max-tokens", "4")
    assert r.returncode == 0 and "no drift" in r.stdout, r.stdout + r.stderr
    r = installed.run("simd", "--pid", str(sim.pid), "--window", "1")
    assert r.returncode == 0 and f"pid {sim.pid}" in r.stdout, r.stdout + r.stderr
    # py-spy needs ptrace on the simulator: whatever this machine allows, the install must do what the checkout does
    args = ("profile", "--pid", str(sim.pid), "--duration", "1")
    ours = installed.run(*args, "-o", str(tmp_path / "install.json"), timeout=180)
    theirs = from_checkout(*args, "-o", str(tmp_path / "checkout.json"), timeout=180)
    assert ours.returncode == theirs.returncode, (ours.stderr, theirs.stderr)
    if ours.returncode == 0:
        assert json.loads((tmp_path / "install.json").read_text())["$schema"].startswith("https://www.speedscope.app")


def test_doctor_from_the_install_agrees_with_the_checkout(installed: Install, sim: Sim) -> None:
    """Every collector once, as the agent runs them, plus the engine, probe and profile checks."""
    args = ("doctor", "--engine-url", sim.url, "--profile-url", f"{sim.url}/debug/runtime_profile", "--json")
    ours, theirs = installed.run(*args, timeout=180), from_checkout(*args, timeout=180)
    verdicts = [{c["id"]: c["status"] for c in json.loads(r.stdout)["checks"]} for r in (ours, theirs)]
    assert verdicts[0] == verdicts[1] and ours.returncode == theirs.returncode, (verdicts, ours.stderr)
    for check in ("engine.reachable", "runtime_profile.available", "probe.openai", "probe.anthropic"):
        assert verdicts[0].get(check) == "ok", (check, verdicts[0])


def test_run_serves_every_collector_from_the_install(installed: Install, sim: Sim, tmp_path: Path) -> None:
    """``inferwatch run`` with every collector pointed at the simulator; then the commands that read an agent."""
    port, grpc, http_port = free_port(), free_port(), free_port()
    env = {
        "INFERWATCH_ENGINE__METRICS_URL": f"{sim.url}/metrics",
        "INFERWATCH_RUNTIME_PROFILE__URL": f"{sim.url}/debug/runtime_profile",
        "INFERWATCH_PROBE__URL": sim.url,
        "INFERWATCH_RUNTIME__PID": str(sim.pid),
        "INFERWATCH_RECEIVER__ENABLED": "true",
        "INFERWATCH_RECEIVER__GRPC_ENDPOINT": f"127.0.0.1:{grpc}",
        "INFERWATCH_RECEIVER__HTTP_ENDPOINT": f"127.0.0.1:{http_port}",
    }
    log = tmp_path / "agent.log"
    cmd = [installed.inferwatch, "run", "--port", str(port), "--interval", "5"]
    with running(cmd, log, cwd=installed.cwd, env={**installed.env, **env}) as proc:
        base = f"http://127.0.0.1:{port}"
        wait_ready(base, proc, log)
        status = HTTP.get(f"{base}/api/v1/status", timeout=10).json()
        states = {name: c["state"] for name, c in collectors(status).items()}
        assert not failing(status), failing(status)
        for name in ("engine", "probe", "runtime_profile", "process", "spans", "cpu"):
            assert states.get(name) == "ok", (name, states)
        metrics = HTTP.get(f"{base}/metrics", timeout=10)
        assert metrics.status_code == 200 and re.search(r"^inferwatch_engine_up\{[^}]*\} 1\.0$", metrics.text, re.M)
        for name in sorted(alert_names()):
            page = HTTP.get(f"{base}/runbooks/{name}", timeout=10)
            assert page.status_code == 200 and f"<h1>{name}</h1>" in page.text, (name, page.status_code)
            md = HTTP.get(f"{base}/runbooks/{name}?format=md", timeout=10)
            assert md.text == (ROOT / "runbooks" / f"{name}.md").read_text(encoding="utf-8"), name
        index = HTTP.get(f"{base}/runbooks", timeout=10).json()["runbooks"]
        assert {e["alert"] for e in index} == alert_names()
        assert all(e["url"] == f"{base}/runbooks/{e['alert']}" for e in index), index[:2]

        r = installed.run("top", "--once", "--agent", base)
        assert r.returncode == 0, r.stdout + r.stderr
        # spans: the simulator sends none to this agent, so explain says there is nothing (exit 1, one line)
        r = installed.run("explain", "--agent", base)
        assert r.returncode in (0, 1) and (r.returncode == 0 or len(r.stderr.strip().splitlines()) == 1), r.stderr
        r = installed.run("evidence", "list")  # this node's ring, under the install's HOME
        assert r.returncode == 0, r.stderr
        assert not failing(HTTP.get(f"{base}/api/v1/status", timeout=10).json())
    assert not log_problems(log)


def test_operator_commands_from_the_install(installed: Install, tmp_path: Path) -> None:
    """prices, grafana push (the shipped dashboards, to the suite's Grafana API stand-in) and matrix."""
    r = installed.run("prices", str(ROOT / "deploy" / "prices.example.yml"))
    assert r.returncode == 0, r.stdout + r.stderr
    grafana = FakeGrafana().start()
    try:
        r = installed.run("grafana", "push", "--url", grafana.url, "--token", grafana.token, "--folder", "LLM serving")
        assert r.returncode == 0 and r.stdout.count("created") == 4, r.stdout + r.stderr
    finally:
        grafana.stop()
    # No Prometheus with a day of the agent's series here: the install must fail as the checkout does, in one line.
    args = ("matrix", "--prometheus", f"http://127.0.0.1:{free_port()}", "--timeout", "5")
    ours, theirs = installed.run(*args), from_checkout(*args)
    assert ours.returncode == theirs.returncode != 0 and ours.stderr.strip().count("\n") == 0, ours.stderr


def test_demo_runs_a_minute_from_the_install(installed: Install, tmp_path: Path) -> None:
    ports = {flag: free_port() for flag in ("--sim-port", "--agent-port", "--otlp-port", "--otlp-http-port")}
    logs = tmp_path / "logs"
    # The demo's own load (5 requests/s), as a user starts it: at 10/s its load generator and simulator took ~20 s of
    # the file's CPU, and 5/s fills explain's 1m window as well.
    cmd = [installed.inferwatch, "demo", "--duration", str(DEMO_S), "--log-dir", str(logs)]
    cmd += [str(x) for pair in ports.items() for x in pair]
    out = tmp_path / "demo.out"
    base = f"http://127.0.0.1:{ports['--agent-port']}"
    with running(cmd, out, cwd=installed.cwd, env=installed.env) as demo:
        wait_ready(base, demo, out)
        page = HTTP.get(f"{base}/", timeout=10).text  # the status page: every runbook link it shows is served
        for name in set(re.findall(r'href="runbooks/([^"]+)"', page)):
            assert HTTP.get(f"{base}/runbooks/{name}", timeout=10).status_code == 200, name
        top = installed.run("top", "--once", "--agent", base)
        assert top.returncode == 0, top.stderr
        explained = False
        last: dict[str, Any] = {}
        deadline = time.monotonic() + DEMO_S + 30
        while demo.poll() is None and time.monotonic() < deadline:
            try:
                last = HTTP.get(f"{base}/api/v1/status", timeout=10).json()
            except httpx.HTTPError:
                break  # the demo is stopping its children
            assert not failing(last), failing(last)
            if not explained:  # the simulator's spans reach the agent's receiver within ~30 s
                explained = installed.run("explain", "--agent", base, "--window", "1m").returncode == 0
            time.sleep(2)
        assert demo.wait(DEMO_S + 60) == 0, out.read_text(errors="replace")[-4000:]
    assert explained, "explain never had spans from the demo"
    assert collectors(last)["process"]["state"] == "ok", collectors(last)["process"]
    # No traceback in any log. ERROR lines count in the agent's only: the simulator's span exporter logs one when
    # the demo stops the agent (its receiver) before the simulator, which is the demo's stop order.
    others = [log_problems(log) for log in (out, *sorted(logs.glob("*.log"))) if log.name != "agent.log"]
    assert not [p for lines in others for p in lines if "no runtime process configured" in p], others
    assert not log_problems(logs / "agent.log")


# --- the container image's and the DaemonSet's commands -------------------------------------------------------


def dockerfile_final_stage() -> tuple[list[str], dict[str, str]]:
    """The final stage's ENTRYPOINT + CMD (exec form) and ENV."""
    text = (ROOT / "Dockerfile").read_text(encoding="utf-8").replace("\\\n", " ")
    final = text.rsplit("\nFROM ", 1)[1]
    entry = json.loads(re.search(r"^ENTRYPOINT (\[.*\])$", final, re.M).group(1))  # type: ignore[union-attr]
    cmd = json.loads(re.search(r"^CMD (\[.*\])$", final, re.M).group(1))  # type: ignore[union-attr]
    env: dict[str, str] = {}
    for line in re.findall(r"^ENV (.+)$", final, re.M):
        env |= dict(re.findall(r"(\w+)=(\S+)", line))
    return entry + cmd, env


def adapt(argv: list[str], python: str, port: int) -> list[str]:
    """The command as written, on 127.0.0.1 and a free port, with the venv's python."""
    out = [python if a == "python" else a for a in argv]
    out = ["127.0.0.1" if a == "0.0.0.0" else a for a in out]
    if "--port" in out:
        out[out.index("--port") + 1] = str(port)
    else:
        out += ["--port", str(port)]
    return out


def test_container_image_command_from_the_install(installed: Install, sim: Sim, tmp_path: Path) -> None:
    argv, image_env = dockerfile_final_stage()
    assert argv[:4] == ["python", "-m", "inferwatch.agent", "run"], argv
    env = {k: (str(tmp_path / k.lower()) if v.startswith("/") else v) for k, v in image_env.items()}  # its paths
    # Exactly as written (0.0.0.0, no token): refused before it binds, in one line that says what to set.
    bare = subprocess.run(
        [installed.python, *argv[1:], "--port", "0"], cwd=installed.cwd, env={**installed.env, **env},
        capture_output=True, text=True, timeout=120, check=False,
    )  # fmt: skip
    no_traceback(bare, "the image's command as written")
    assert bare.returncode == 2 and "api.tokens" in bare.stderr and bare.stderr.count("\n") == 1, bare.stderr
    port = free_port()
    env["INFERWATCH_ENGINE__METRICS_URL"] = f"{sim.url}/metrics"  # what docker-compose.yml sets: the runtime
    log = tmp_path / "image.log"
    with running(adapt(argv, installed.python, port), log, cwd=installed.cwd, env={**installed.env, **env}) as proc:
        base = f"http://127.0.0.1:{port}"
        wait_ready(base, proc, log)
        status = HTTP.get(f"{base}/api/v1/status", timeout=10).json()
        assert not failing(status), failing(status)
        assert collectors(status)["engine"]["state"] == "ok"
        assert HTTP.get(f"{base}/runbooks/AgentDown", timeout=10).status_code == 200
    assert not [p for p in log_problems(log) if "no runtime process configured" not in p]


def test_daemonset_command_from_the_install(installed: Install, sim: Sim, tmp_path: Path) -> None:
    """deploy/kubernetes/base as the kubelet would run it: the image's ENTRYPOINT with the DaemonSet's args, its
    env (Downward API values stood in), its mounts (hostPath /proc and /sys, the ConfigMap, the token Secret,
    the emptyDirs) as directories here."""
    base_dir = ROOT / "deploy" / "kubernetes" / "base"
    ds = yaml.safe_load((base_dir / "daemonset.yaml").read_text(encoding="utf-8"))
    pod = ds["spec"]["template"]["spec"]
    (container,) = pod["containers"]
    volumes = {v["name"]: v for v in pod["volumes"]}
    configmap = yaml.safe_load((base_dir / "configmap.yaml").read_text(encoding="utf-8"))
    token = "ds-test-token-0123456789"  # the agent refuses tokens under 16 characters
    mounts: dict[str, Path] = {}
    for m in container["volumeMounts"]:
        volume = volumes[m["name"]]
        if "hostPath" in volume:
            mounts[m["mountPath"]] = Path(volume["hostPath"]["path"])
            continue
        here = tmp_path / m["name"]
        here.mkdir()
        if "configMap" in volume:
            for key, value in configmap["data"].items():
                (here / key).write_text(value, encoding="utf-8")
        elif "secret" in volume:
            (here / "tokens").write_text(f"{token} read,evidence test\n", encoding="utf-8")
        mounts[m["mountPath"]] = here
    fields = {"spec.nodeName": "node-a", "metadata.name": "inferwatch-agent-x1", "metadata.namespace": "inferwatch",
              "status.hostIP": "127.0.0.1"}  # fmt: skip
    env: dict[str, str] = {}
    for e in container["env"]:
        value = fields[e["valueFrom"]["fieldRef"]["fieldPath"]] if "valueFrom" in e else e["value"]
        value = re.sub(r"\$\((\w+)\)", lambda m: env[m.group(1)], value)
        for mount_path, here in sorted(mounts.items(), key=lambda kv: -len(kv[0])):
            if value == mount_path or value.startswith(mount_path + "/"):
                value = str(here) + value[len(mount_path) :]
                break
        env[e["name"]] = value
    assert env["INFERWATCH_ENGINE__METRICS_URL"] == "http://127.0.0.1:8000/metrics"
    env["INFERWATCH_ENGINE__METRICS_URL"] = f"{sim.url}/metrics"  # the node's engine port: the simulator's here
    entrypoint, _ = dockerfile_final_stage()
    argv = adapt(entrypoint[:3] + container["args"], installed.python, free_port())
    port = int(argv[argv.index("--port") + 1])
    log = tmp_path / "daemonset.log"
    with running(argv, log, cwd=installed.cwd, env={**installed.env, **env}) as proc:
        base, auth = f"http://127.0.0.1:{port}", {"Authorization": f"Bearer {token}"}
        wait_ready(base, proc, log)  # the DaemonSet's readinessProbe: an open path
        assert HTTP.get(f"{base}/api/v1/status", timeout=10).status_code in (401, 403)  # the Secret's token is needed
        status = HTTP.get(f"{base}/api/v1/status", headers=auth, timeout=10).json()
        assert not failing(status), failing(status)
        assert collectors(status)["engine"]["state"] == "ok"
        assert HTTP.get(f"{base}/metrics", timeout=10).status_code == 200
        token_file = tmp_path / "token"
        token_file.write_text(token + "\n", encoding="utf-8")
        r = installed.run("evidence", "list", "--agent", base, "--token-file", str(token_file))
        assert r.returncode == 0, r.stderr
    assert not log_problems(log)


# --- scripts/run.sh ---------------------------------------------------------------------------------------------


def test_run_sh_says_what_it_does_while_it_installs(tmp_path: Path) -> None:
    """scripts/run.sh in a copy of the checkout: a line before the ~30 s pip step, one after it, then the demo.

    The copy's .venv is made beforehand with the dependencies from uv's cache, so the pip step is what a second
    run of the script costs (pip resolving, and building the editable install)."""
    src = tmp_path / "checkout"
    shutil.copytree(ROOT, src, symlinks=True, ignore=COPY_IGNORE)
    env = clean_env()
    if UV.is_file():
        subprocess.run([str(UV), "venv", "-q", "--seed", "--python", sys.executable, str(src / ".venv")], cwd=src,
                       env=env, check=True, timeout=120)  # fmt: skip
        deps = _project_dependencies()
        pre = subprocess.run([str(UV), "pip", "install", "-q", "--offline", "--python", str(src / ".venv/bin/python"),
                              *deps], cwd=src, env=env, capture_output=True, text=True, timeout=INSTALL_TIMEOUT_S,
                             check=False)  # fmt: skip
        print(f"dependencies from uv's cache: rc {pre.returncode}")  # else pip fetches them: slower, still correct
    ports = [str(x) for flag in ("--sim-port", "--agent-port", "--otlp-port", "--otlp-http-port")
             for x in (flag, free_port())]  # fmt: skip
    cmd = ["bash", str(src / "scripts" / "run.sh"), "--duration", "3", "--log-dir", str(tmp_path / "logs"), *ports]
    t0 = time.monotonic()
    lines: list[tuple[float, str]] = []
    with subprocess.Popen(cmd, cwd=tmp_path, env=env, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True,
                          start_new_session=True) as proc:  # fmt: skip
        stdout = proc.stdout
        assert stdout is not None

        def read() -> None:  # each line with the time it came; ends at EOF (the script and the demo exited)
            for line in stdout:
                lines.append((time.monotonic() - t0, line.rstrip()))

        reader = threading.Thread(target=read, daemon=True)
        reader.start()
        try:
            code = proc.wait(INSTALL_TIMEOUT_S)  # pip's step and a 3 s demo
        finally:
            if proc.poll() is None:
                os.killpg(proc.pid, signal.SIGKILL)
        reader.join(30)
    text = "\n".join(f"{t:6.1f} {line}" for t, line in lines)
    assert code == 0 and "Traceback" not in text, text[-4000:]
    said = [line for _, line in lines if line.startswith("== ") and not line.startswith("== creating")]  # no uv
    assert said[0].startswith("== installing inferwatch and its dependencies into .venv"), text
    assert lines[0][0] < 15, f"the first line came {lines[0][0]:.0f} s after the start\n{text}"
    assert re.match(rf"== installed inferwatch {VERSION} in \d+ s$", said[1]), text
    assert said[2].startswith("== starting inferwatch demo"), text
    assert any("inferwatch demo is running" in line for _, line in lines), text


def _project_dependencies() -> list[str]:
    import tomllib

    return list(tomllib.loads((ROOT / "pyproject.toml").read_text(encoding="utf-8"))["project"]["dependencies"])
