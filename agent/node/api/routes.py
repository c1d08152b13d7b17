"""API routes for diagnostics and the authentication middleware for the whole API.

Scopes by route (see :mod:`inferwatch.agent.node.api.auth`): ``read`` for the status page ``/`` and
``/api/v1/overview``, ``/api/v1/status``, ``/api/v1/findings``,
``GET /api/v1/binary`` and anything not listed; ``snapshots`` for ``/api/v1/snapshots*``; ``profile``
for ``/api/v1/profiles*`` and ``POST /api/v1/binary``; ``evidence`` for ``/api/v1/evidence*`` and the
Alertmanager webhook ``POST /api/v1/alertmanager``; ``read`` for ``GET /engines/{name}/ready`` too (add
``/engines/*`` to ``api.open_paths`` for a load balancer or probe that sends no token). Paths in
``api.open_paths`` (default ``/metrics``, ``/healthz``, ``/readyz``) need no token. 401 = no valid token,
403 = token lacks scope.

The actions on a runtime (binary check, evidence capture, py-spy profiles) take a discovered engine target's name
(``?target=`` or the body's ``target``) and act on that target's process; without one, on the configured runtime.
"""

from __future__ import annotations

import json
from typing import Any

from starlette.applications import Starlette
from starlette.concurrency import run_in_threadpool
from starlette.datastructures import Headers
from starlette.requests import Request
from starlette.responses import FileResponse, HTMLResponse, JSONResponse, PlainTextResponse, Response

from inferwatch.agent.common.samples import UNKNOWN_MODEL, Finding, Sample, attrs
from inferwatch.agent.config import EngineSettings, ReadinessSettings
from inferwatch.agent.errors import NoDataError, StorageError
from inferwatch.agent.node.actions import pyspy
from inferwatch.agent.node.actions.binary import BinaryCheck
from inferwatch.agent.node.actions.evidencebundle import render_text
from inferwatch.agent.node.actions.profiles import ProfileBusyError
from inferwatch.agent.node.actions.runtimes import UnknownTargetError
from inferwatch.agent.node.analytics import explain, explaintext
from inferwatch.agent.node.api.auth import Authenticator
from inferwatch.agent.node.api.endpoints import json_object, query_int, query_str, route
from inferwatch.agent.node.api.pagehistory import PageHistory
from inferwatch.agent.node.api.readiness import readiness
from inferwatch.agent.node.api.services import ApiServices
from inferwatch.agent.node.api.statushtml import render_page
from inferwatch.agent.node.api.statuspage import PAGE_MODELS, PageIndex, build_overview
from inferwatch.agent.node.state import AgentState

MEDIA_TYPES = {"speedscope": "application/json", "flamegraph": "image/svg+xml", "raw": "text/plain"}
# py-spy refusals before anything runs: a malformed pid, a process outside the runtime's, no runtime.
TARGET_NAME = "inferwatch.engine.name"  # the attribute naming a discovered engine target's series (catalog)
PYSPY_STATUS = {"invalid_pid": 400, "not_runtime": 403, "no_runtime": 404}
INSUFFICIENT_STORAGE = ("no_space", "too_large")  # StorageError reasons answered 507; the others 500
MIN_PAGE_REFRESH_S, MAX_PAGE_REFRESH_S = 5, 3600  # the status page's ?refresh=N, clamped


def storage_refusal(exc: StorageError) -> JSONResponse:
    """507 (full disk, quota, size limit, over the ring's budget) or 500 (unwritable), as JSON; no traceback."""
    code = 507 if exc.reason in INSUFFICIENT_STORAGE else 500
    return JSONResponse({"error": "snapshot_not_stored", "reason": exc.reason, "message": str(exc)}, status_code=code)


def scope_for(method: str, path: str) -> str:
    if path.startswith(("/api/v1/evidence", "/api/v1/alertmanager")):
        return "evidence"
    if path.startswith("/api/v1/snapshots"):
        return "snapshots"
    if path.startswith("/api/v1/profiles") or (path == "/api/v1/binary" and method == "POST"):
        return "profile"
    return "read"


def finding_dict(f: Finding) -> dict[str, Any]:
    return {"id": f.id, "status": f.status, "summary": f.summary, "evidence": dict(f.evidence), "runbook": f.runbook}


class Authenticate:
    """Bearer-token check for every path not in ``api.open_paths``, as plain ASGI middleware.

    Not ``@app.middleware("http")``: Starlette's BaseHTTPMiddleware runs each request through a task group and
    memory streams, several times the cost of a /metrics scrape itself.
    """

    def __init__(self, app: Any, auth: Authenticator) -> None:
        self.app = app
        self.auth = auth

    async def __call__(self, scope: dict[str, Any], receive: Any, send: Any) -> None:
        if scope["type"] != "http" or self.auth.is_open(scope["path"]):
            await self.app(scope, receive, send)
            return
        needed = scope_for(scope["method"], scope["path"])
        code = self.auth.decide(Headers(scope=scope).get("authorization"), needed)
        if code == 401:
            refusal: Response = JSONResponse(
                {"error": "unauthorized", "message": "a bearer token is required (Authorization: Bearer <token>)"},
                status_code=401,
                headers={"WWW-Authenticate": 'Bearer realm="inferwatch"'},
            )
        elif code == 403:
            refusal = JSONResponse(
                {"error": "forbidden", "message": f"this token lacks the {needed!r} scope"}, status_code=403
            )
        else:
            await self.app(scope, receive, send)
            return
        await refusal(scope, receive, send)


def install(
    app: Starlette,
    state: AgentState,
    services: ApiServices,
    *,
    engine_cfg: EngineSettings,
    readiness_cfg: ReadinessSettings,
) -> None:
    """The API's routes besides /metrics, the health checks and the runbooks: the engine and readiness sections are
    the only settings they read (whether py-spy profiles are on is the profile manager's)."""
    auth = services.auth
    snapshots = services.snapshots
    state.add_source(
        "api_auth",
        lambda: [Sample("inferwatch.api.refused", n, attrs(status=code)) for code, n in sorted(auth.refused.items())],
    )

    app.add_middleware(Authenticate, auth=auth)

    # --- the node status page (agent/node/api/statuspage.py, statushtml.py): on request; pagehistory.py and the
    # page's index: listeners
    history = PageHistory()
    state.add_listener(history.on_collection)
    pages = PageIndex()  # each collection indexed once, ahead while the page is watched
    state.add_listener(pages.on_collection)

    @route(app, "GET", "/")
    def status_page(request: Request) -> HTMLResponse:
        refresh = query_int(request, "refresh")
        refresh_s = None if refresh is None else min(max(refresh, MIN_PAGE_REFRESH_S), MAX_PAGE_REFRESH_S)
        cards = None if request.query_params.get("models") == "all" else PAGE_MODELS  # ?models=all: every card
        return HTMLResponse(render_page(build_overview(state, history, max_models=cards, pages=pages), refresh_s))

    @route(app, "GET", "/api/v1/overview")
    def overview(request: Request) -> dict[str, Any]:
        return build_overview(state, history, pages=pages)

    @route(app, "GET", "/api/v1/findings")
    async def findings(request: Request) -> list[dict[str, Any]]:
        return [finding_dict(f) for f in state.findings()]

    # --- whether an engine serves (agent/node/api/readiness.py): from the state, on the event loop, never the engine
    # ---
    @route(app, "GET", "/engines/{name}/ready")
    async def engine_ready(request: Request) -> JSONResponse:
        code, body = readiness(readiness_cfg, engine_cfg, state, request.path_params["name"])
        return JSONResponse(body, status_code=code)

    # --- runtime_profile snapshots ---
    @route(app, "GET", "/api/v1/snapshots")
    def list_snapshots(request: Request) -> dict[str, Any] | JSONResponse:
        if not snapshots.directory.is_dir():
            return {"snapshots": []}
        try:
            entries = snapshots.entries()
        except StorageError as exc:
            return storage_refusal(exc)
        out = []
        for e in reversed(entries):
            try:
                meta = json.loads(e.path.read_bytes()).get("meta", {})
            except (OSError, ValueError):
                meta = {}
            out.append({"id": e.id, "size_bytes": e.size_bytes, **{k: meta.get(k) for k in ("captured_at", "outcome")}})
        return {"snapshots": out}

    @route(app, "GET", "/api/v1/snapshots/{snap_id}")
    def get_snapshot(request: Request) -> Response:
        snap_id = request.path_params["snap_id"]
        try:
            entry = snapshots.get(snap_id) if snapshots.directory.is_dir() else None
        except StorageError as exc:
            return storage_refusal(exc)
        if entry is None:
            return JSONResponse({"error": "not_found", "message": f"no snapshot {snap_id!r}"}, status_code=404)
        try:
            return Response(entry.path.read_bytes(), media_type="application/json")
        except OSError:  # evicted between the listing and the read
            return JSONResponse({"error": "not_found", "message": f"no snapshot {snap_id!r}"}, status_code=404)

    @route(app, "POST", "/api/v1/snapshots")
    def capture_snapshot(request: Request) -> JSONResponse:
        try:
            result = snapshots.capture("api")
        except NoDataError as exc:
            return JSONResponse({"error": "not_configured", "message": str(exc)}, status_code=409)
        except StorageError as exc:
            return storage_refusal(exc)
        return JSONResponse(
            {"id": result.id, "outcome": result.outcome, "reason": result.reason, "message": result.message},
            status_code=201,
        )

    # --- evidence bundles (agent/node/actions/evidence.py) ---
    evidence = services.evidence

    def bundle_answer(bundle: dict[str, Any] | None, what: str, fmt: str | None) -> Response:
        if bundle is None:
            return JSONResponse({"error": "not_found", "message": f"no evidence bundle {what}"}, status_code=404)
        if fmt == "text":
            return PlainTextResponse(render_text(bundle))
        return JSONResponse(bundle)

    @route(app, "GET", "/api/v1/evidence")
    def list_evidence(request: Request) -> dict[str, Any]:
        return {"evidence": [m.as_dict() for m in evidence.list()]}

    @route(app, "GET", "/api/v1/evidence/latest")
    def latest_evidence(request: Request) -> Response:
        latest = evidence.latest(query_str(request, "alertname"))
        return bundle_answer(latest, "yet", query_str(request, "format"))

    @route(app, "GET", "/api/v1/evidence/{bundle_id}")
    def get_evidence(request: Request) -> Response:
        bundle_id = request.path_params["bundle_id"]
        return bundle_answer(evidence.get(bundle_id), repr(bundle_id[:40]), query_str(request, "format"))

    runtimes = evidence.runtimes  # the configured runtime and each engine target's (actions/runtimes.py)

    def unknown_target(exc: UnknownTargetError) -> JSONResponse:
        return JSONResponse({"error": "unknown_target", "message": str(exc), "known": exc.known}, status_code=404)

    @route(app, "POST", "/api/v1/evidence")
    def capture_evidence(request: Request) -> JSONResponse:
        """A bundle now, of engine target ``?target=`` (default: the configured runtime)."""
        try:
            meta = evidence.capture("api", "requested through the API", target=query_str(request, "target") or "")
        except UnknownTargetError as exc:
            return unknown_target(exc)
        except NoDataError as exc:
            return JSONResponse({"error": "store_failed", "message": str(exc)}, status_code=503)
        return JSONResponse(meta.as_dict() | {"url": f"/api/v1/evidence/{meta.id}"}, status_code=201)

    @route(app, "POST", "/api/v1/alertmanager")
    async def alertmanager_webhook(request: Request) -> JSONResponse:
        """Alertmanager's webhook (version 4): firing critical alerts for this node start one capture."""
        body = await json_object(request)
        return JSONResponse(await run_in_threadpool(evidence.on_alerts, body), status_code=202)

    # --- tail explainer (agent/node/analytics/explain.py) ---
    @route(app, "GET", "/api/v1/explain")
    def explain_tail(request: Request) -> Response:
        """Why the tail of a model is slow: from the receiver's spans, else from the engine's histograms; of engine
        target ``?target=`` (its own spans and histograms), else of the configured engine and the unattributed spans."""
        model = query_str(request, "model")
        target = query_str(request, "target") or ""
        window = query_str(request, "window", "5m") or "5m"
        by = query_str(request, "by", "ttft") or "ttft"
        fmt = query_str(request, "format", "")
        try:
            top = query_int(request, "top", explain.DEFAULT_TOP) or 0
            window_s = explain.parse_window(window)
            if not 0 <= top <= explain.MAX_TOP:
                raise ValueError(f"top must be 0..{explain.MAX_TOP}, got {top}")
            if by not in explain.QUANTITIES:
                raise ValueError(f"by must be one of {', '.join(explain.QUANTITIES)}, got {by!r}")
        except ValueError as exc:
            return JSONResponse({"error": "bad_request", "message": str(exc)}, status_code=400)
        engine = state.collections().get(f"engine:{target}" if target else "engine")
        if target and engine is None:
            known_targets = sorted(name.partition(":")[2] for name in state.collections() if name.startswith("engine:"))
            return unknown_target(UnknownTargetError(target, known_targets))
        engine_models = [str(m) for m in engine.details.get("models", ())] if engine is not None else []
        explainer = services.explainer
        if target:
            explainer = services.spans.explainer(target) if services.spans is not None else None
        span_models = explainer.records.models() if explainer is not None else []
        known = sorted({*engine_models, *(m for m in span_models if m != UNKNOWN_MODEL or not engine_models)})
        if model is None:
            if len(known) != 1:
                return JSONResponse(
                    {"error": "bad_request", "message": f"give model= (known: {', '.join(known) or 'none'})"},
                    status_code=400,
                )
            model = known[0]
        report = explainer.explain(model, window_s, top, by, engine_models) if explainer is not None else None
        if report is None:
            label = window if window in explain.WINDOW_SECONDS else "5m"
            own = (s for s in state.samples() if dict(s.attributes).get(TARGET_NAME, "") == target)  # one engine's
            quantiles, requests = explain.histogram_quantiles(own, model, label)
            if not quantiles:
                why = "no spans and no engine histograms" if explainer is not None else "the span receiver is off and "
                return JSONResponse(
                    {
                        "error": "not_found",
                        "message": f"nothing to explain for model {model!r} over {window}: {why}"
                        + ("" if explainer is not None else "the engine has no latency histograms")
                        + f" (known: {', '.join(known) or 'none'})"
                        + (
                            ""
                            if target or not any(n.startswith("engine:") for n in state.collections())
                            else "; an engine target's: give target="
                        ),
                    },
                    status_code=404,
                )
            report = explain.explain_histograms(quantiles, model, label, requests)
        if fmt == "text":
            return PlainTextResponse(explaintext.render_text(report))
        if fmt == "html":
            return HTMLResponse(explaintext.render_html(report))
        return JSONResponse(report)

    # --- binary compatibility ---
    def binary_answer(svc: BinaryCheck) -> JSONResponse:
        if svc.report is not None:
            return JSONResponse({"report": svc.report.as_dict(), "findings": [finding_dict(f) for f in svc.findings()]})
        if svc.absent is not None:
            return JSONResponse({"error": "no_runtime", "message": str(svc.absent)}, status_code=404)
        return JSONResponse({"error": "check_failed", "message": svc.error or "not run yet"}, status_code=503)

    def binary_of(request: Request) -> BinaryCheck | JSONResponse:
        """The binary check of engine target ``?target=`` (default: the configured runtime's)."""
        target = query_str(request, "target") or ""
        if not target:
            return services.binary
        try:
            check = runtimes.get(target).binary
        except UnknownTargetError as exc:
            return unknown_target(exc)
        if check is None:
            message = f"engine target {target!r} has no binary check (collectors.binary.enabled is false)"
            return JSONResponse({"error": "no_check", "message": message}, status_code=404)
        return check

    @route(app, "GET", "/api/v1/binary")
    def get_binary(request: Request) -> JSONResponse:
        check = binary_of(request)
        return check if isinstance(check, JSONResponse) else binary_answer(check)

    @route(app, "POST", "/api/v1/binary")
    def run_binary(request: Request) -> JSONResponse:
        check = binary_of(request)
        if isinstance(check, JSONResponse):
            return check
        check.check()
        return binary_answer(check)

    # --- py-spy profiles ---
    manager = services.profiles

    @route(app, "POST", "/api/v1/profiles")
    async def start_profile(request: Request) -> JSONResponse:
        body = await json_object(request)
        return await run_in_threadpool(start_profile_job, body)

    def start_profile_job(body: dict[str, Any]) -> JSONResponse:
        if not manager.cfg.enabled:
            return JSONResponse(
                {"error": "profiling_disabled", "message": "py-spy profiles are off: set profiling.enabled=true"},
                status_code=409,
            )
        try:
            target = body.get("target") or ""  # an engine target's runtime instead of the configured one
            if not isinstance(target, str):
                raise ValueError(f"target is an engine target's name, not {target!r:.40}")
            pid: object
            if body.get("pid") is not None:
                pid = body["pid"]  # validated by the profile manager's scope: a positive int, the runtime's
            elif body.get("runtime", True):
                pid = runtimes.get(target).locator.find().pid if target else services.locator.find().pid
            else:
                raise ValueError("give pid or runtime: true")
            opts = pyspy.RecordOptions(
                duration_s=float(body.get("duration_s", 5.0)),
                rate_hz=int(body.get("rate_hz", 100)),
                fmt=str(body.get("format", "speedscope")),
                native=bool(body.get("native", False)),
                nonblocking=bool(body.get("nonblocking", False)),
            )
            job = manager.start(pid, opts, target=target)
        except (ValueError, TypeError) as exc:
            return JSONResponse({"error": "bad_request", "message": str(exc)}, status_code=400)
        except UnknownTargetError as exc:
            return unknown_target(exc)
        except NoDataError as exc:
            return JSONResponse({"error": "no_runtime", "message": str(exc)}, status_code=404)
        except ProfileBusyError as exc:
            return JSONResponse({"error": "busy", "message": str(exc)}, status_code=409)
        except pyspy.PySpyError as exc:
            code = PYSPY_STATUS.get(exc.kind, 503)
            return JSONResponse({"error": exc.kind, "message": str(exc)}, status_code=code)
        return JSONResponse(
            job.as_dict()
            | {"status_url": f"/api/v1/profiles/{job.id}/status", "result_url": f"/api/v1/profiles/{job.id}"},
            status_code=202,
        )

    @route(app, "GET", "/api/v1/profiles")
    def list_profiles(request: Request) -> dict[str, Any]:
        return {"profiles": [j.as_dict() for j in manager.jobs()]}

    @route(app, "GET", "/api/v1/profiles/{job_id}/status")
    def profile_status(request: Request) -> JSONResponse:
        job_id = request.path_params["job_id"]
        job = manager.get(job_id)
        if job is None:
            return JSONResponse({"error": "not_found", "message": f"no profile {job_id!r}"}, status_code=404)
        return JSONResponse(job.as_dict())

    @route(app, "GET", "/api/v1/profiles/{job_id}")
    def download_profile(request: Request) -> Response:
        job_id = request.path_params["job_id"]
        mgr = manager
        job = mgr.get(job_id)
        if job is None:
            return JSONResponse({"error": "not_found", "message": f"no profile {job_id!r}"}, status_code=404)
        if job.state == "running":
            return JSONResponse(job.as_dict(), status_code=202)
        if job.state == "failed":
            return JSONResponse(job.as_dict(), status_code=422)
        path = mgr.result_path(job_id)
        if path is None:
            return JSONResponse({"error": "evicted", "message": "the result left the bounded ring"}, status_code=410)
        return FileResponse(
            path, media_type=MEDIA_TYPES[job.options.fmt], filename=f"profile-{job.pid}{pyspy.FORMATS[job.options.fmt]}"
        )
