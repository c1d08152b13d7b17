"""Run docker-compose.yml's services as local processes, the way their containers would run them.

No Docker engine exists on the test machines, so tests/test_compose_processes.py runs this module as PID 1 of
private network, mount and PID namespaces (``unshare --net --mount --pid --fork``). Inside, it builds what
the containers would see and starts each service from ``docker-compose config``'s rendering:

- one filesystem view: an overlay over ``/`` (writes land in a tmpfs, never on the host) holding every
  service's bind mounts and named volumes at their container paths, the inferwatch image's files
  (``COPY``, ``useradd --home-dir``, ``install -d -o``, read from the Dockerfile's final stage) and the
  upstream images' entrypoint binaries (Debian's builds, :data:`UPSTREAM`); the services run chrooted in it;
- one network: ``lo`` only, every started service's name → 127.0.0.1 in ``/etc/hosts`` (so the started
  services must not share a port: one would fail to bind and never become healthy), services that cannot
  start here → 192.0.2.1 (TEST-NET-1, unroutable: connections fail at once, as to a stopped container);
- each process: the image's ENTRYPOINT/CMD unless compose overrides them, the image's ENV then compose's
  ``environment``, the image's USER (or compose's ``user``) and WORKDIR; ``$$`` unescaped as the container
  sees it. Python is the test virtualenv's (the checkout, installed editable), not the image's wheel.

A service starts once every service it depends on is healthy by its own compose healthcheck command, run as
the container would run it (same user, environment, timeout), polled every second rather than at the
``interval``. Services whose binary is absent here (:data:`UPSTREAM`) are reported, not faked. Afterwards
:func:`probe` checks the agent's API, token, runbooks, state volume and runtime discovery, and Prometheus'
targets; everything is stopped, and the report is written as JSON.

Usage (as root): ``python -m tests.compose_local PLAN.json REPORT.json``; PLAN holds ``rendered`` (the
config), ``root`` (the checkout), ``work`` (a scratch directory) and ``deadline_s``.
"""

from __future__ import annotations

import contextlib
import fcntl
import json
import os
import re
import shlex
import shutil
import socket
import stat
import struct
import subprocess
import sys
import time
import urllib.error
import urllib.request
from collections.abc import Iterator, Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import yaml

from inferwatch.agent.config import DEFAULT_SNAPSHOT_DIR
from tests.procs import stop as stop_process

UNREACHABLE = "192.0.2.1"  # TEST-NET-1: no route in the namespace, so connections fail immediately
POLL_S = 1.0
STOP_TIMEOUT_S = 10.0
# The runtime image's PATH (python:3.11-slim) with the test virtualenv's bin first: "python" is the venv's.
IMAGE_PATH = "/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin"


@dataclass(frozen=True)
class Image:
    """What a container of this image runs by default (from the image's Dockerfile)."""

    entrypoint: list[str]
    cmd: list[str]
    user: str
    workdir: str
    env: dict[str, str] = field(default_factory=dict)
    owned_dirs: dict[str, str] = field(default_factory=dict)  # path → "uid:gid"; a fresh volume copies it
    binaries: dict[str, str] = field(default_factory=dict)  # container path → the local command standing in
    copies: dict[str, str] = field(default_factory=dict)  # container path → path in the checkout (COPY)


# Upstream images: entrypoint, user and workdir from their Dockerfiles at the pinned tags; Debian's binaries
# stand in for the ones they ship (Prometheus 2.42 / Alertmanager 0.25 here, 2.53.4 / 0.27.0 in the images).
UPSTREAM: dict[str, Image] = {
    "prom/prometheus": Image(
        ["/bin/prometheus"],
        ["--config.file=/etc/prometheus/prometheus.yml", "--storage.tsdb.path=/prometheus"],
        "65534:65534",
        "/prometheus",
        owned_dirs={"/prometheus": "65534:65534"},
        binaries={"/bin/prometheus": "prometheus"},
    ),
    "prom/alertmanager": Image(
        ["/bin/alertmanager"],
        ["--config.file=/etc/alertmanager/alertmanager.yml", "--storage.path=/alertmanager"],
        "65534:65534",
        "/alertmanager",
        owned_dirs={"/alertmanager": "65534:65534"},
        binaries={"/bin/alertmanager": "prometheus-alertmanager"},
    ),
    "otel/opentelemetry-collector-contrib": Image(
        ["/otelcol-contrib"],
        ["--config", "/etc/otelcol-contrib/config.yaml"],
        "10001:10001",
        "/",
        binaries={"/otelcol-contrib": "otelcol-contrib"},
    ),
    "grafana/grafana-oss": Image(["/run.sh"], [], "472:0", "/usr/share/grafana", binaries={"/run.sh": "grafana"}),
}


def _instructions(dockerfile: str, target: str | None = None) -> list[tuple[str, str]]:
    """(INSTRUCTION, arguments) of one stage of the Dockerfile (``target``, by its ``AS`` name; default the last),
    continuation lines joined, comments dropped."""
    lines = [line for line in dockerfile.splitlines() if not line.lstrip().startswith("#")]
    joined = re.sub(r"\\\n\s*", " ", "\n".join(lines))
    out: list[tuple[str, str]] = []
    stages: dict[str, list[tuple[str, str]]] = {}
    for line in joined.splitlines():
        word, _, rest = line.strip().partition(" ")
        if not word:
            continue
        if word.upper() == "FROM":
            out = []
            name = re.search(r"\s+AS\s+(\S+)$", rest, re.I)
            if name:
                stages[name.group(1)] = out
        out.append((word.upper(), rest.strip()))
    if target is not None:
        if target not in stages:
            raise ValueError(f"the Dockerfile has no stage {target!r}")
        return stages[target]
    return out


def _exec_form(text: str) -> list[str]:
    return list(json.loads(text)) if text.startswith("[") else ["/bin/sh", "-c", text]


def dockerfile_image(dockerfile: str, target: str | None = None) -> Image:
    """A stage of this repository's Dockerfile (``target``; default the final one) as an :class:`Image`.

    A stage whose entrypoint is a command installed by pip (not a path: ``phoenix``) stands in by the same command
    here (:attr:`Image.binaries`), so a machine without it reports the service as not startable.
    """
    entrypoint: list[str] = []
    cmd: list[str] = []
    user, workdir = "0:0", "/"
    env: dict[str, str] = {}
    owned: dict[str, str] = {}
    copies: dict[str, str] = {}
    for word, rest in _instructions(dockerfile, target):
        if word == "ENV":
            env.update(dict(kv.split("=", 1) for kv in shlex.split(rest)))
        elif word == "USER":
            user = rest if ":" in rest else f"{rest}:{rest}"
        elif word == "WORKDIR":
            workdir = rest
        elif word == "ENTRYPOINT":
            entrypoint = _exec_form(rest)
        elif word == "CMD":
            cmd = _exec_form(rest)
        elif word == "COPY" and not rest.startswith("--"):
            *sources, dest = shlex.split(rest)
            for src in sources:
                copies[dest + Path(src).name if dest.endswith("/") else dest] = src
        elif word == "RUN":
            for uid, home in re.findall(r"useradd\b.*?--uid (\d+).*?--home-dir (\S+) --create-home", rest):
                owned[home] = f"{uid}:{uid}"
            for o, g, paths in re.findall(r"install -d -o (\d+) -g (\d+)(?: -m \d+)? ((?:/\S+ ?)+)", rest):
                owned.update({p: f"{o}:{g}" for p in paths.split()})
    # Only what stays in the image: files copied under the final WORKDIR (others are build inputs, removed).
    copies = {dst: src for dst, src in copies.items() if dst.startswith(workdir.rstrip("/") + "/")}
    binaries = {entrypoint[0]: entrypoint[0]} if target is not None and entrypoint and "/" not in entrypoint[0] else {}
    return Image(entrypoint, cmd, user, workdir, env, owned, binaries=binaries, copies=copies)


def seconds(duration: str | int | float) -> float:
    """A compose duration (``1m30s``, ``10s``, ``500ms``) in seconds."""
    if isinstance(duration, int | float):
        return float(duration)
    units = {"h": 3600.0, "m": 60.0, "s": 1.0, "ms": 0.001, "us": 1e-6}
    parts = re.findall(r"(\d+(?:\.\d+)?)(ms|us|h|m|s)", duration)
    if not parts or "".join(n + u for n, u in parts) != duration:
        raise ValueError(f"not a compose duration: {duration!r}")
    return sum(float(n) * units[u] for n, u in parts)


def _unescape(value: Any) -> Any:
    """``$$`` → ``$``: docker-compose config keeps the escape (its output is a compose file)."""
    if isinstance(value, str):
        return value.replace("$$", "$")
    if isinstance(value, list):
        return [_unescape(v) for v in value]
    return value


@dataclass
class Service:
    name: str
    spec: dict[str, Any]
    image: Image
    missing: str | None  # why it cannot start here, or None
    argv: list[str]
    env: dict[str, str]
    uid: int
    gid: int
    groups: list[int]
    health: list[str]
    health_timeout_s: float
    health_deadline_s: float
    proc: subprocess.Popen[bytes] | None = None
    log: Path | None = None
    healthy_after_s: float | None = None
    last_health: str = ""


def image_of(spec: Mapping[str, Any], local: Image, dockerfile: str | None = None) -> Image | None:
    build = spec.get("build")
    if build:
        target = build.get("target") if isinstance(build, Mapping) else None
        return local if target is None or dockerfile is None else dockerfile_image(dockerfile, target)
    repo = str(spec["image"]).rsplit(":", 1)[0]
    return UPSTREAM.get(repo)


def service(name: str, spec: dict[str, Any], local: Image, venv_bin: str, dockerfile: str | None = None) -> Service:
    image = image_of(spec, local, dockerfile)
    if image is None:
        raise ValueError(f"{name}: no image facts for {spec.get('image')} (add it to tests/compose_local.UPSTREAM)")
    entrypoint = _unescape(spec["entrypoint"]) if "entrypoint" in spec else image.entrypoint
    if isinstance(entrypoint, str):
        entrypoint = shlex.split(entrypoint)
    command = _unescape(spec["command"]) if "command" in spec else ([] if "entrypoint" in spec else image.cmd)
    if isinstance(command, str):
        command = shlex.split(command)
    env = {"PATH": f"{venv_bin}:{IMAGE_PATH}" if image is local else IMAGE_PATH, "HOSTNAME": name}
    env.update(image.env)
    env.update({k: "" if v is None else str(_unescape(v)) for k, v in (spec.get("environment") or {}).items()})
    user = str(spec.get("user") or image.user)
    uid, _, gid = user.partition(":")
    groups = [int(g) for g in spec.get("group_add", [])]
    missing = None
    for path, command_name in image.binaries.items():
        if shutil.which(command_name) is None:
            missing = f"{path}: no {command_name} binary on this machine"
    hc = spec.get("healthcheck") or {}
    test = _unescape(hc.get("test") or [])
    if isinstance(test, str):
        test = ["CMD-SHELL", test]
    if test[:1] == ["CMD"]:
        health = list(test[1:])
    elif test[:1] == ["CMD-SHELL"]:
        health = ["/bin/sh", "-c", test[1]]
    else:
        health = []  # no healthcheck (or NONE): reported as such
    deadline = seconds(hc.get("start_period", "0s")) + seconds(hc.get("interval", "30s")) * int(hc.get("retries", 3))
    return Service(
        name,
        spec,
        image,
        missing,
        list(entrypoint) + [str(c) for c in command],
        env,
        int(uid),
        int(gid or uid),
        groups,
        health,
        seconds(hc.get("timeout", "30s")),
        deadline,
    )


def order(services: Mapping[str, Service]) -> list[Service]:
    """Services in dependency order (every dependency before its dependents)."""
    done: list[str] = []

    def visit(name: str, path: tuple[str, ...]) -> None:
        if name in done:
            return
        if name in path:
            raise ValueError(f"dependency cycle: {' -> '.join((*path, name))}")
        for dep in services[name].spec.get("depends_on") or {}:
            visit(dep, (*path, name))
        done.append(name)

    for name in sorted(services):
        visit(name, ())
    return [services[n] for n in done]


def volumes(spec: Mapping[str, Any]) -> list[tuple[str, str, bool, bool]]:
    """(source, target, read_only, named) of a rendered service's volumes."""
    out = []
    for v in spec.get("volumes", []):
        if isinstance(v, dict):
            out.append((v["source"], v["target"], bool(v.get("read_only")), v.get("type") == "volume"))
            continue
        src, target, *mode = str(v).split(":")
        out.append((src, target, "ro" in (mode[0].split(",") if mode else []), not src.startswith(("/", "."))))
    return out


def _run(*argv: str) -> None:
    subprocess.run(list(argv), check=True, capture_output=True, timeout=30)


def _loopback_up() -> None:
    """``ip link set lo up`` without iproute2 (SIOCGIFFLAGS/SIOCSIFFLAGS on a socket)."""
    with socket.socket() as s:
        ifreq = struct.pack("16sh", b"lo", 0)
        flags = struct.unpack("16sh", fcntl.ioctl(s, 0x8913, ifreq))[1]
        fcntl.ioctl(s, 0x8914, struct.pack("16sh", b"lo", flags | 0x1))


def _chown(path: Path, owner: str) -> None:
    uid, _, gid = owner.partition(":")
    os.chown(path, int(uid), int(gid or uid))


def build_root(work: Path, services: list[Service], root: Path) -> Path:
    """The overlay root with every service's files at their container paths (see the module docstring)."""
    rw, new = work / "rw", work / "root"
    for d in (rw, new):
        d.mkdir(parents=True, exist_ok=True)
    _run("mount", "--make-rprivate", "/")
    _run("mount", "-t", "tmpfs", "tmpfs", str(rw))
    (rw / "upper").mkdir()
    (rw / "work").mkdir()
    _run("mount", "-t", "overlay", "overlay", "-o", f"lowerdir=/,upperdir={rw}/upper,workdir={rw}/work", str(new))
    _run("mount", "-t", "proc", "proc", str(new / "proc"))
    for shared in ("/dev", "/sys"):
        _run("mount", "--rbind", shared, str(new / shared[1:]))
    # The checkout, the virtualenv and the scratch directory (not recursive: not this overlay again).
    for top in sorted({f"/{p.resolve().parts[1]}" for p in (root, Path(sys.executable).parent, work)}):
        _run("mount", "--bind", top, str(new / top[1:]))
    # The interpreter standing in for the image's Python may sit under a private home (pyenv in /root, 0700):
    # let the images' users traverse to it, in the overlay only.
    for parent in Path(os.path.realpath(sys.executable)).parents:
        mode = (new / str(parent).lstrip("/")).stat().st_mode
        if not mode & stat.S_IXOTH:
            os.chmod(new / str(parent).lstrip("/"), stat.S_IMODE(mode) | stat.S_IXOTH)
    targets: dict[str, str] = {}
    volume_dirs = work / "volumes"
    for svc in services:
        if svc.missing:
            continue
        for path, owner in svc.image.owned_dirs.items():
            d = new / path.lstrip("/")
            d.mkdir(parents=True, exist_ok=True)
            _chown(d, owner)
        for path, command_name in svc.image.binaries.items():
            dst = new / path.lstrip("/")
            if not dst.exists():
                dst.parent.mkdir(parents=True, exist_ok=True)
                dst.touch()
                _run("mount", "--bind", str(shutil.which(command_name)), str(dst))
        for path, src in svc.image.copies.items():
            dst = new / path.lstrip("/")
            dst.parent.mkdir(parents=True, exist_ok=True)
            dst.touch()
            _run("mount", "--bind", str(root / src), str(dst))
        for src, target, read_only, named in volumes(svc.spec):
            key = f"volume:{src}" if named else src
            if targets.setdefault(target, key) != key:
                raise ValueError(f"{target} is mounted from both {targets[target]} and {key}: cannot share one root")
            source = volume_dirs / src if named else Path(src)
            if named and not source.exists():
                # A fresh named volume takes the ownership of the image's directory at its first mount point.
                source.mkdir(parents=True)
                if target in svc.image.owned_dirs:
                    _chown(source, svc.image.owned_dirs[target])
            dst = new / target.lstrip("/")
            if dst.exists() and dst.is_dir() != source.is_dir():
                raise ValueError(f"{svc.name}: {target} is a {'directory' if dst.is_dir() else 'file'} in the image")
            if source.is_dir():
                dst.mkdir(parents=True, exist_ok=True)
            else:
                dst.parent.mkdir(parents=True, exist_ok=True)
                dst.touch()
            _run("mount", "--bind", str(source), str(dst))
            if read_only:
                _run("mount", "-o", "remount,bind,ro", str(dst))
    hosts = ["127.0.0.1 localhost", "::1 localhost"]
    hosts += [f"{UNREACHABLE if s.missing else '127.0.0.1'} {s.name}" for s in services]
    (new / "etc" / "hosts").write_text("\n".join(hosts) + "\n")
    return new


def _as_service(svc: Service) -> Any:
    def preexec() -> None:
        os.setgroups(svc.groups)
        os.setgid(svc.gid)
        os.setuid(svc.uid)

    return preexec


def health(svc: Service) -> tuple[bool, str]:
    """Run the service's compose healthcheck command once: (healthy, its output)."""
    if not svc.health:
        return False, "no healthcheck"
    try:
        r = subprocess.run(
            svc.health,
            env=svc.env,
            cwd=svc.image.workdir,
            preexec_fn=_as_service(svc),
            capture_output=True,
            timeout=svc.health_timeout_s,
        )
    except subprocess.TimeoutExpired:
        return False, f"timed out after {svc.health_timeout_s}s"
    except OSError as exc:
        return False, f"cannot run {svc.health[0]}: {exc}"
    return r.returncode == 0, (r.stdout + r.stderr).decode("utf-8", "replace")[-500:]


def wait_healthy(svc: Service, start: float, deadline: float) -> bool:
    limit = min(deadline, time.monotonic() + svc.health_deadline_s)
    while time.monotonic() < limit:
        if svc.proc is not None and svc.proc.poll() is not None:
            svc.last_health = f"exited with {svc.proc.returncode}"
            return False
        ok, out = health(svc)
        svc.last_health = out
        if ok:
            svc.healthy_after_s = round(time.monotonic() - start, 2)
            return True
        time.sleep(POLL_S)
    return False


def start(svc: Service, logs: Path) -> None:
    svc.log = logs / f"{svc.name}.log"
    with open(svc.log, "wb") as out:
        svc.proc = subprocess.Popen(
            svc.argv,
            env=svc.env,
            cwd=svc.image.workdir,
            stdout=out,
            stderr=subprocess.STDOUT,
            preexec_fn=_as_service(svc),
            start_new_session=True,
        )


def stop(svc: Service) -> int | None:
    if svc.proc is None:
        return None
    stop_process(svc.proc, STOP_TIMEOUT_S)
    return svc.proc.returncode


def http(url: str, token: str | None = None, method: str = "GET") -> tuple[int, str]:
    req = urllib.request.Request(url, method=method, headers={"Authorization": f"Bearer {token}"} if token else {})
    opener = urllib.request.build_opener(urllib.request.ProxyHandler({}))
    try:
        with opener.open(req, timeout=10) as resp:
            return resp.status, resp.read().decode("utf-8", "replace")
    except urllib.error.HTTPError as exc:
        return exc.code, exc.read().decode("utf-8", "replace")


def _cmdline(pid: int) -> str:
    return Path(f"/proc/{pid}/cmdline").read_bytes().replace(b"\0", b" ").decode("utf-8", "replace").strip()


def probe(services: Mapping[str, Service], work: Path) -> dict[str, Any]:
    """What a user of the stack would check once it is up (the test asserts on this)."""
    out: dict[str, Any] = {}
    agent = services["agent"]
    token_dir = Path(agent.env["INFERWATCH_API__TOKENS_FILE"]).parent
    out["token_files"] = {
        p.name: {"mode": oct(p.stat().st_mode & 0o777), "uid": p.stat().st_uid} for p in sorted(token_dir.iterdir())
    }
    operator = (token_dir / "token").read_text().strip()
    scrape = (token_dir / "scrape-token").read_text().strip()
    base = "http://agent:9435"
    out["metrics_with_scrape_token"] = http(f"{base}/metrics", scrape)
    out["status_without_token"] = http(f"{base}/api/v1/status")[0]
    out["status_with_scrape_token"] = http(f"{base}/api/v1/status", scrape)[0]
    code, body = http(f"{base}/api/v1/status", operator)
    out["status_with_operator_token"] = code
    out["status"] = json.loads(body) if code == 200 else body
    out["snapshot_with_scrape_token"] = http(f"{base}/api/v1/snapshots", scrape, "POST")[0]
    out["snapshot_with_operator_token"] = http(f"{base}/api/v1/snapshots", operator, "POST")
    default = str(DEFAULT_SNAPSHOT_DIR).replace("~", agent.env.get("HOME", "/"), 1)
    state = Path(agent.env.get("INFERWATCH_SNAPSHOTS__DIR") or default)
    out["state_dir"] = str(state)
    out["state_files"] = []
    for p in sorted(state.parent.rglob("*")) if state.parent.is_dir() else []:
        try:  # one stat per path: the agent's own captures (runtime profile, evidence) write a temp file and rename
            st = p.stat()  # it, so a name listed a moment ago can be gone now (FileNotFoundError would end the probe)
        except FileNotFoundError:
            continue
        if stat.S_ISREG(st.st_mode):
            out["state_files"].append({"path": str(p), "uid": st.st_uid})
    code, body = http(f"{base}/runbooks")
    out["runbook_index"] = json.loads(body) if code == 200 else body
    names = [r["alert"] for r in out["runbook_index"]["runbooks"]] if code == 200 else []
    out["runbooks"] = {n: http(f"{base}/runbooks/{n}") for n in names[:3]}
    code, body = http(f"{base}/api/v1/binary", operator)
    out["binary"] = json.loads(body) if code == 200 else body
    out["pids"] = {s.name: s.proc.pid for s in services.values() if s.proc is not None}
    out["cmdlines"] = {
        s.name: _cmdline(s.proc.pid) for s in services.values() if s.proc is not None and s.proc.poll() is None
    }
    if "prometheus" in services and services["prometheus"].proc is not None:
        code, body = http("http://prometheus:9090/api/v1/targets")
        targets = json.loads(body)["data"]["activeTargets"] if code == 200 else []
        out["prometheus_targets"] = [
            {"job": t["labels"]["job"], "health": t["health"], "error": t["lastError"]} for t in targets
        ]
    code, body = http("http://simulator:8000/metrics")
    out["simulator_requests"] = sum(
        float(line.rsplit(" ", 1)[1]) for line in body.splitlines() if line.startswith("vllm:request_success_total")
    )
    return out


def links_with_agent_stopped(services: Mapping[str, Service]) -> dict[str, Any]:
    """Stop the agent, then follow every alerting rule's runbook link as Prometheus renders it (issue 15)."""
    stop(services["agent"])
    out: dict[str, Any] = {}
    try:
        http("http://agent:9435/healthz")
        out["agent_answers"] = True
    except OSError:
        out["agent_answers"] = False
    code, body = http("http://prometheus:9090/api/v1/status/config")
    config = yaml.safe_load(json.loads(body)["data"]["yaml"]) if code == 200 else {}
    base = config.get("global", {}).get("external_labels", {}).get("runbook_base")
    out["runbook_base"] = base
    code, body = http("http://prometheus:9090/api/v1/rules?type=alert")
    groups = json.loads(body)["data"]["groups"] if code == 200 else []
    names = sorted({r["name"] for g in groups for r in g["rules"]})
    links: dict[str, Any] = {}
    for name in names:
        try:
            status, text = http(f"{base}/{name}")
            links[name] = [status, text[:2000]]  # the page past its <head>: the H1
        except OSError as exc:
            links[name] = [None, str(exc)]
    out["links"] = links
    return out


def wait_scraped(deadline: float) -> None:
    """Until Prometheus has scraped every job once (its first scrape comes after up to one interval)."""
    while time.monotonic() < deadline:
        code, body = http("http://prometheus:9090/api/v1/targets")
        targets = json.loads(body)["data"]["activeTargets"] if code == 200 else []
        if targets and all(t["health"] != "unknown" for t in targets):
            return
        time.sleep(POLL_S)


@contextlib.contextmanager
def stack(plan: Mapping[str, Any], report: dict[str, Any]) -> Iterator[dict[str, Service]]:
    root, work = Path(plan["root"]), Path(plan["work"])
    dockerfile = (root / "Dockerfile").read_text()
    local = dockerfile_image(dockerfile)
    venv_bin = str(Path(sys.executable).parent)
    services = {n: service(n, s, local, venv_bin, dockerfile) for n, s in plan["rendered"]["services"].items()}
    ordered = order(services)
    logs = work / "logs"
    logs.mkdir(parents=True, exist_ok=True)
    report["not_started"] = {s.name: s.missing for s in ordered if s.missing}
    new_root = build_root(work, ordered, root)
    _loopback_up()
    os.chroot(new_root)
    os.chdir("/")
    start_t = time.monotonic()
    deadline = start_t + float(plan["deadline_s"])
    report["services"] = {}
    try:
        for svc in ordered:
            if svc.missing:
                continue
            deps = svc.spec.get("depends_on") or {}
            unhealthy = [d for d in deps if not services[d].missing and services[d].healthy_after_s is None]
            if unhealthy:
                report["services"][svc.name] = {"started": False, "waiting_for": unhealthy}
                continue
            start(svc, logs)
            ok = wait_healthy(svc, start_t, deadline)
            report["services"][svc.name] = {
                "started": True,
                "healthy": ok,
                "healthy_after_s": svc.healthy_after_s,
                "argv": svc.argv,
                "uid": svc.uid,
                "health": svc.health,
                "last_health": svc.last_health,
            }
        yield services
    finally:
        for svc in reversed(ordered):
            code = stop(svc)
            if svc.name in report["services"] and svc.proc is not None:
                entry = report["services"][svc.name]
                entry["exit"] = code
                entry["log_tail"] = svc.log.read_text(errors="replace")[-3000:] if svc.log else ""
        report["elapsed_s"] = round(time.monotonic() - start_t, 2)


def main(argv: list[str]) -> int:
    plan = json.loads(Path(argv[0]).read_text())
    report: dict[str, Any] = {}
    try:
        with stack(plan, report) as services:
            up = [s for s in services.values() if s.proc is not None and s.healthy_after_s is not None]
            if all(s.missing or s in up for s in services.values()):
                wait_scraped(time.monotonic() + 30)
                report["probe"] = probe(services, Path(plan["work"]))
                report["links_agent_stopped"] = links_with_agent_stopped(services)
    except Exception as exc:  # reported to the test, which fails with it
        report["error"] = f"{type(exc).__name__}: {exc}"
    Path(argv[1]).write_text(json.dumps(report, indent=1, default=str))
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
