"""Engine pods on this node, from the Kubernetes API: list, then watch, as client-go's Reflector does.

For each scope (every namespace, or each namespace the user names) the watcher lists
``GET /api/v1[/namespaces/NS]/pods?fieldSelector=spec.nodeName=NODE`` (paged with ``limit``/``continue``), then
watches from the list's ``resourceVersion`` with ``watch=1&allowWatchBookmarks=true&timeoutSeconds=N``. Every
event (ADDED, MODIFIED, DELETED, and BOOKMARK, which carries only a resourceVersion) moves the resume point; when a
watch ends (the server's ``timeoutSeconds``) the next one resumes from it. A resume point too old for the server
(HTTP 410, or an ``ERROR`` event whose Status has ``code: 410``) clears the scope and lists again
(docs: /work/shared/reference/fleet-apis.md §1, kubernetes.io "API concepts", "Efficient detection of changes").

Why httpx and not the ``kubernetes`` client: ``kubernetes`` 37 brings 13 packages the agent does not have
(aiohttp and its six, oauthlib, requests-oauthlib, python-dateutil, durationpy, tzdata), and its ``Watch`` helper
records no BOOKMARK resourceVersion and leaves the re-list on 410 to the caller: the Reflector below would be
needed anyway. The agent already uses httpx; the API is two GET requests.

A pod becomes targets by :func:`pod_targets`: opted in by annotations (``inferwatch.io/scrape: "true"``,
``inferwatch.io/engine``, ``inferwatch.io/port``, ``inferwatch.io/path``, ``inferwatch.io/probe-path``,
``inferwatch.io/profile-path``, ``inferwatch.io/container``), or recognised by its image
(:mod:`inferwatch.agent.node.discovery.engines`) unless ``inferwatch.io/scrape: "false"``. Only Running pods with an IP
are targets; a pod that restarts with a new IP, a container restarted (a new container id), a pod deleted or moved
(DELETED here, ADDED on its new node) change the :class:`TargetSet` at the next event.
"""

from __future__ import annotations

import contextlib
import json
import logging
import os
import socket
import threading
import time
from collections.abc import Callable, Iterator, Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Any
from urllib.parse import quote

from inferwatch.agent.catalog.engine import ENGINE_KINDS
from inferwatch.agent.errors import CollectorError, ConfigError, SourceFormatError
from inferwatch.agent.node.discovery.engines import KnownEngine, known_engine
from inferwatch.agent.node.discovery.target import ENGINE_KIND_AUTO, EngineTarget, TargetIdentity, TargetSet

if TYPE_CHECKING:  # httpx is imported with the watcher's client: no Kubernetes discovery, no httpx
    import httpx

log = logging.getLogger(__name__)

ANNOTATION = "inferwatch.io/"
SERVICE_ACCOUNT_DIR = Path("/var/run/secrets/kubernetes.io/serviceaccount")
LIST_PAGE_LIMIT = 500
MAX_LIST_PAGES = 1000  # 500,000 pods on one node: a bound, not an expectation
MAX_EVENT_BYTES = 8 << 20  # one pod object; the API server's own limit on an object is ~1.5 MB (etcd)
WATCH_READ_MARGIN_S = 30.0  # the read timeout is the watch's timeoutSeconds plus this
DEFAULT_CONNECT_TIMEOUT_S = 5.0
MIN_BACKOFF_S = 1.0
MAX_BACKOFF_S = 30.0
_TRUE = ("true", "1", "yes")
_FALSE = ("false", "0", "no")


class Gone(CollectorError):
    """The resume point is older than the server keeps (HTTP 410): list again."""


@dataclass(frozen=True, slots=True)
class ApiServer:
    """Where the API server is and how to authenticate: in a pod, the service account's projected token
    (re-read on every request: kubelet rotates it) and CA (:meth:`in_cluster`)."""

    base_url: str
    token_file: Path | None = None
    ca_file: Path | None = None

    @classmethod
    def in_cluster(cls, env: Mapping[str, str] = os.environ, sa_dir: Path = SERVICE_ACCOUNT_DIR) -> ApiServer:
        host, port = env.get("KUBERNETES_SERVICE_HOST"), env.get("KUBERNETES_SERVICE_PORT", "443")
        if not host:
            raise ConfigError(
                "discovery.kubernetes is on, and KUBERNETES_SERVICE_HOST is not set: the agent is not in a pod"
            )
        if not (sa_dir / "token").is_file():
            raise ConfigError(
                f"discovery.kubernetes is on, and there is no service account token in {sa_dir}: mount one "
                "(deploy/kubernetes/overlays/discovery/token.yaml)"
            )
        if ":" in host:
            host = f"[{host}]"
        return cls(f"https://{host}:{port}", sa_dir / "token", sa_dir / "ca.crt")

    def headers(self) -> dict[str, str]:
        if self.token_file is None:
            return {}
        try:
            token = self.token_file.read_text(encoding="ascii", errors="replace").strip()
        except OSError as exc:
            raise CollectorError(f"service account token {self.token_file} cannot be read ({exc.strerror})") from None
        return {"Authorization": f"Bearer {token}"}

    def client(self, watch_timeout_s: float) -> httpx.Client:
        import httpx

        verify: Any = str(self.ca_file) if self.ca_file is not None else True
        timeout = httpx.Timeout(DEFAULT_CONNECT_TIMEOUT_S, read=watch_timeout_s + WATCH_READ_MARGIN_S)
        return httpx.Client(base_url=self.base_url, verify=verify, timeout=timeout, trust_env=False)


# -- pods → targets -------------------------------------------------------------------------------------------


def _container_port(container: Mapping[str, Any], value: str) -> int | None:
    """A port annotation's value: a number, or the name of one of the container's ports."""
    if value.isdigit():
        port = int(value)
        return port if 0 < port < 65536 else None
    for p in container.get("ports") or []:
        if p.get("name") == value and isinstance(p.get("containerPort"), int):
            return int(p["containerPort"])
    return None


def _declared_ports(container: Mapping[str, Any]) -> list[int]:
    return [int(p["containerPort"]) for p in container.get("ports") or [] if isinstance(p.get("containerPort"), int)]


def _path(value: str | None, default: str | None) -> str | None:
    if value is None:
        return default
    return value if value.startswith("/") else "/" + value


def _host(ip: str) -> str:
    return f"[{ip}]" if ":" in ip else ip


def pod_targets(pod: Mapping[str, Any], image_fallback: bool = True) -> tuple[list[EngineTarget], str | None]:
    """The engine targets of one pod object (``v1.Pod`` as JSON), and why an opted-in pod gave none (or None)."""
    meta = pod.get("metadata") or {}
    spec = pod.get("spec") or {}
    status = pod.get("status") or {}
    ns, name = str(meta.get("namespace", "")), str(meta.get("name", ""))
    if status.get("phase") != "Running" or not status.get("podIP"):
        return [], None
    ann: Mapping[str, str] = meta.get("annotations") or {}
    scrape = str(ann.get(ANNOTATION + "scrape", "")).strip().lower()
    if scrape in _FALSE:
        return [], None
    containers = [c for c in spec.get("containers") or [] if isinstance(c, dict) and c.get("name")]
    statuses = {s.get("name"): s for s in status.get("containerStatuses") or [] if isinstance(s, dict)}
    chosen: list[tuple[Mapping[str, Any], KnownEngine | None]] = []
    if scrape in _TRUE:
        wanted = ann.get(ANNOTATION + "container")
        by_name = {c["name"]: c for c in containers}
        container: Mapping[str, Any]
        if wanted is not None:
            if wanted not in by_name:
                return [], f"{ns}/{name}: {ANNOTATION}container {wanted!r} is not a container of the pod"
            container = by_name[wanted]
        else:
            engines = [c for c in containers if known_engine(str(c.get("image", "")))]
            if not containers:
                return [], f"{ns}/{name}: the pod has no containers"
            container = engines[0] if engines else containers[0]
        chosen.append((container, known_engine(str(container.get("image", "")))))
    elif scrape:
        return [], f"{ns}/{name}: {ANNOTATION}scrape is {scrape!r}, not true or false"
    elif image_fallback:
        for c in containers:
            engine = known_engine(str(c.get("image", "")))
            if engine is not None:
                chosen.append((c, engine))
    ip = _host(str(status["podIP"]))
    gates = {g.get("conditionType") for g in spec.get("readinessGates") or [] if isinstance(g, dict)}
    readiness_gates = tuple(sorted(str(g) for g in gates if g))
    out = []
    for picked, engine in chosen:
        container = picked
        kind = str(ann.get(ANNOTATION + "engine", engine.kind if engine else ENGINE_KIND_AUTO))
        if kind not in (ENGINE_KIND_AUTO, *ENGINE_KINDS):
            return [], f"{ns}/{name}: {ANNOTATION}engine {kind!r} is not one of {', '.join(ENGINE_KINDS)} or auto"
        declared = _declared_ports(container)
        port_value = ann.get(ANNOTATION + "port")
        port: int | None
        if port_value is not None:
            port = _container_port(container, str(port_value).strip())
            if port is None:
                return [], f"{ns}/{name}: {ANNOTATION}port {port_value!r} is not a port number or a port name"
        elif engine is not None:
            port = next((p for p in engine.ports if p in declared), engine.ports[0])
        elif (named := _container_port(container, "metrics")) is not None:
            port = named
        else:
            return [], f"{ns}/{name}: set {ANNOTATION}port (the image is not a known engine's)"
        origin = f"http://{ip}:{port}"
        metrics_path = _path(ann.get(ANNOTATION + "path"), engine.metrics_path if engine else "/metrics")
        health_default = None
        if engine is not None:
            health_origin = f"http://{ip}:{engine.health_port}" if engine.health_port else origin
            health_default = health_origin + engine.health_path
        probe = ann.get(ANNOTATION + "probe-path")
        profile = ann.get(ANNOTATION + "profile-path")
        cname = str(container["name"])
        cid = str((statuses.get(cname) or {}).get("containerID") or "")
        identity = TargetIdentity(
            namespace=ns,
            pod=name,
            container=cname,
            pod_uid=str(meta.get("uid", "")),
            node=str(spec.get("nodeName", "")),
            container_id=cid.split("://", 1)[-1],
        )
        out.append(
            EngineTarget(
                name=f"{ns}/{name}/{cname}",
                kind=kind,
                metrics_url=origin + str(metrics_path),
                health_url=origin + str(_path(probe, "/")) if probe is not None else health_default,
                profile_url=origin + str(_path(profile, "/")) if profile else None,
                identity=identity,
                source="kubernetes",
                readiness_gates=readiness_gates,
            )
        )
    return out, None


# -- list and watch -------------------------------------------------------------------------------------------


def _lines(chunks: Iterator[bytes]) -> Iterator[bytes]:
    """Newline-delimited JSON of a watch stream, one object a line; a line over MAX_EVENT_BYTES is an error."""
    buf = b""
    for chunk in chunks:
        buf += chunk
        while (nl := buf.find(b"\n")) >= 0:
            line, buf = buf[:nl], buf[nl + 1 :]
            if line.strip():
                yield line
        if len(buf) > MAX_EVENT_BYTES:
            raise SourceFormatError(f"a watch event is longer than {MAX_EVENT_BYTES} bytes: not a pod")
    if buf.strip():
        yield buf


def _json(raw: bytes, what: str) -> Any:
    try:
        return json.loads(raw)
    except ValueError:
        raise SourceFormatError(f"the API server's {what} is not JSON: {raw[:80]!r}") from None


class _Scope:
    """One list+watch: every namespace, or one. Holds the pods of this node in it, keyed namespace/name."""

    def __init__(self, watcher: PodWatcher, namespace: str | None) -> None:
        self.watcher = watcher
        self.namespace = namespace
        self.path = f"/api/v1/namespaces/{quote(namespace, safe='')}/pods" if namespace else "/api/v1/pods"
        self.pods: dict[str, Mapping[str, Any]] = {}
        self.resource_version: str | None = None

    def _check(self, response: httpx.Response, what: str) -> None:
        if response.status_code == 410:
            raise Gone(f"{what}: resourceVersion {self.resource_version} is gone (410)")
        if response.status_code in (401, 403):
            where = f"namespace {self.namespace}" if self.namespace else "all namespaces"
            raise CollectorError(
                f"{what}: the API server refused ({response.status_code}) to list and watch pods in {where}: bind "
                "the agent's ServiceAccount to the ClusterRole of deploy/kubernetes/overlays/discovery/rbac.yaml"
            )
        if response.status_code != 200:
            raise CollectorError(f"{what}: HTTP {response.status_code} from the API server")

    def relist(self) -> None:
        import httpx  # the watcher's client's own import: already loaded

        w = self.watcher
        params: dict[str, str | int] = {"fieldSelector": w.field_selector, "limit": LIST_PAGE_LIMIT}
        pods: dict[str, Mapping[str, Any]] = {}
        rv = None
        for _ in range(MAX_LIST_PAGES):
            try:
                response = w.client.get(self.path, params=params, headers=w.api.headers())
            except httpx.HTTPError as exc:
                raise CollectorError(f"listing pods at {self.path}: {exc}") from None
            self._check(response, f"listing pods at {self.path}")
            body = _json(response.content, "pod list")
            if not isinstance(body, dict) or not isinstance(body.get("items") or [], list):
                raise SourceFormatError(f"the API server's answer at {self.path} is not a PodList")
            meta = body.get("metadata") or {}
            for pod in body.get("items") or []:
                if isinstance(pod, dict):
                    pods[_key(pod)] = pod
            rv = meta.get("resourceVersion")
            cont = meta.get("continue")
            if not cont:
                break
            params["continue"] = cont
        else:
            raise CollectorError(f"listing pods at {self.path}: more than {MAX_LIST_PAGES} pages")
        if not rv:
            raise SourceFormatError(f"the pod list at {self.path} has no metadata.resourceVersion")
        with w.lock:
            self.pods = pods
            self.resource_version = str(rv)
            w.lists += 1
            w.changed()

    def watch(self) -> None:
        """One watch connection, from the resume point until the server ends it; Gone when the point is too old."""
        w = self.watcher
        if self.resource_version is None:
            raise Gone("no resume point")
        params = {
            "fieldSelector": w.field_selector,
            "watch": "1",
            "allowWatchBookmarks": "true",
            "resourceVersion": self.resource_version,
            "timeoutSeconds": str(w.watch_timeout_s),
        }
        import httpx  # the watcher's client's own import: already loaded

        try:
            with w.client.stream("GET", self.path, params=params, headers=w.api.headers()) as response:
                self._check(response, f"watching pods at {self.path}")
                with w.lock:
                    w.watches += 1
                    w._responses.add(response)
                    if w.stopping.is_set():  # stop() came before this watch was registered: it cannot end it
                        w._responses.discard(response)
                        return
                try:
                    for line in _lines(response.iter_bytes()):
                        self._event(_json(line, "watch event"))
                finally:
                    with w.lock:
                        w._responses.discard(response)
        except httpx.HTTPError as exc:
            if w.stopping.is_set():
                return
            raise CollectorError(f"watching pods at {self.path}: {exc}") from None

    def _event(self, event: Any) -> None:
        w = self.watcher
        if not isinstance(event, dict) or not isinstance(event.get("object"), dict):
            raise SourceFormatError(f"a watch event is not {{type, object}}: {str(event)[:80]}")
        kind, obj = event.get("type"), event["object"]
        if kind == "ERROR":
            code = obj.get("code")
            message = obj.get("message", "")
            if code == 410:
                raise Gone(f"watching pods at {self.path}: {message or '410 Gone'}")
            raise CollectorError(f"watching pods at {self.path}: ERROR event {code}: {message}")
        rv = (obj.get("metadata") or {}).get("resourceVersion")
        with w.lock:
            if kind in ("ADDED", "MODIFIED"):
                self.pods[_key(obj)] = obj
                w.changed()
            elif kind == "DELETED":
                self.pods.pop(_key(obj), None)
                w.changed()
            elif kind == "BOOKMARK":
                w.bookmarks += 1
            else:
                raise SourceFormatError(f"unknown watch event type {kind!r}")
            if rv:
                self.resource_version = str(rv)

    def step(self) -> None:
        """List when there is no resume point; else watch once. A Gone clears the resume point (the next step
        lists); the pods are kept until that list replaces them, so targets do not flap."""
        try:
            if self.resource_version is None:
                self.relist()
            else:
                self.watch()
        except Gone as exc:
            log.info("%s; listing again", exc)
            with self.watcher.lock:
                self.resource_version = None
                self.watcher.relists_after_gone += 1


def _interrupt(response: httpx.Response) -> None:
    """End a watch another thread is blocked reading: shut its socket down (which wakes a blocked ``recv``; closing
    the response alone does not), then close it."""
    stream = response.extensions.get("network_stream")
    sock = stream.get_extra_info("socket") if stream is not None else None
    if sock is not None:
        with contextlib.suppress(OSError):  # already closed
            sock.shutdown(socket.SHUT_RDWR)
    response.close()


def _key(pod: Mapping[str, Any]) -> str:
    meta = pod.get("metadata") or {}
    return f"{meta.get('namespace', '')}/{meta.get('name', '')}"


class PodWatcher:
    """The engine pods on ``node`` in ``namespaces`` (empty: every namespace) as a :class:`TargetSet`.

    :meth:`targets` is safe from any thread. :meth:`start` runs one thread per scope (list, then watch, again and
    again; errors back off from 1 s to 30 s); :meth:`stop` ends them, bounded. :meth:`step` runs one list or watch
    of every scope in the caller's thread (tests, one-shot commands).
    """

    def __init__(
        self,
        api: ApiServer,
        node: str,
        namespaces: Sequence[str] = (),
        *,
        image_fallback: bool = True,
        watch_timeout_s: int = 300,
        client: httpx.Client | None = None,
        on_change: Callable[[], None] | None = None,
    ) -> None:
        if not node:
            raise ConfigError("discovery.node_name is empty: set it from the Downward API (spec.nodeName)")
        self.api = api
        self.node = node
        self.field_selector = f"spec.nodeName={node}"
        self.image_fallback = image_fallback
        self.watch_timeout_s = watch_timeout_s
        self.client = client or api.client(watch_timeout_s)
        self._own_client = client is None
        self.lock = threading.Lock()
        self.stopping = threading.Event()
        self.scopes = [_Scope(self, ns) for ns in dict.fromkeys(namespaces)] or [_Scope(self, None)]
        self._responses: set[httpx.Response] = set()
        self._threads: list[threading.Thread] = []
        self._on_change = on_change
        self.generation = 0
        self.lists = 0
        self.watches = 0
        self.bookmarks = 0
        self.relists_after_gone = 0
        self.errors: dict[str, str] = {}  # scope → the last error, while it lasts

    def changed(self) -> None:
        """Called with the lock held after the pods changed."""
        self.generation += 1
        if self._on_change is not None:
            self._on_change()

    def targets(self) -> TargetSet:
        return self.snapshot()[0]

    def snapshot(self) -> tuple[TargetSet, dict[str, str]]:
        """The targets, and for each opted-in pod that gave none the reason (a misspelt annotation)."""
        with self.lock:
            pods = [p for scope in self.scopes for p in scope.pods.values()]
        targets: list[EngineTarget] = []
        problems: dict[str, str] = {}
        for pod in pods:
            found, problem = pod_targets(pod, self.image_fallback)
            targets.extend(found)
            if problem:
                problems[_key(pod)] = problem
        return TargetSet(targets), problems

    def step(self) -> None:
        for scope in self.scopes:
            scope.step()

    def start(self) -> None:
        for scope in self.scopes:
            thread = threading.Thread(
                target=self._loop, args=(scope,), name=f"discovery-{scope.namespace or 'all'}", daemon=True
            )
            thread.start()
            self._threads.append(thread)

    def _loop(self, scope: _Scope) -> None:
        backoff = MIN_BACKOFF_S
        name = scope.namespace or "*"
        while not self.stopping.is_set():
            try:
                scope.step()
            except Exception as exc:  # one malformed answer must not end this scope's watch for good
                expected = isinstance(exc, (CollectorError, ConfigError))
                reason = str(exc) if expected else f"malformed API answer ({type(exc).__name__}: {exc})"
                with self.lock:
                    first = name not in self.errors
                    self.errors[name] = reason
                if first:
                    log.warning("kubernetes discovery: %s", reason)
                self.stopping.wait(backoff)
                backoff = min(backoff * 2, MAX_BACKOFF_S)
                continue
            with self.lock:
                ended = self.errors.pop(name, None)
            if ended is not None:
                log.info("kubernetes discovery in %s works again", name)
            backoff = MIN_BACKOFF_S

    def stop(self, timeout_s: float = 5.0) -> None:
        """End the threads (closing any watch in progress) and the client; safe to call twice."""
        self.stopping.set()
        with self.lock:
            responses = list(self._responses)
        for response in responses:
            _interrupt(response)
        deadline = time.monotonic() + timeout_s
        for thread in self._threads:
            thread.join(max(0.0, deadline - time.monotonic()))
        self._threads = []
        if self._own_client:
            self.client.close()
