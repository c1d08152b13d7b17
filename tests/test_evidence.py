"""Evidence bundles on real processes: a real deadlock, py-spy and /proc (``--native``, and the retry without it
where py-spy cannot), without ptrace permission, rate limits, the hang trigger and the Alertmanager webhook, the
spans section from a real OTLP receiver, redaction, the API scope and the CLI."""

from __future__ import annotations

import json
import os
import subprocess
import sys
import tempfile
import textwrap
import time
from collections.abc import Iterator
from pathlib import Path

import httpx
import pytest

from inferwatch.agent.common.samples import Collection, Finding
from inferwatch.agent.config import ReceiverSettings, Settings
from inferwatch.agent.node.actions import pyspy
from inferwatch.agent.node.actions.evidence import EvidenceStore
from inferwatch.agent.node.actions.evidencebundle import python_frames, render_text
from inferwatch.agent.node.actions.evidencecapture import NATIVE_OFF, NATIVE_OK
from inferwatch.agent.node.analytics.latency import LatencyAnalytics
from inferwatch.agent.node.receiver import Receiver
from inferwatch.agent.node.wiring import build_deps
from tests.conftest import PYTHON, ROOT, free_port
from tests.fake_nvml import FakeGPU, FakeNVML
from tests.procs import running, stop, wait_http

DEADLOCK = ROOT / "tests" / "fixtures" / "programs" / "deadlock.py"
NOBODY = 65534
EVID = "evid-token-0123456789abcdef"
READ = "read-token-0123456789abcdef"


@pytest.fixture
def deadlocked() -> Iterator[tuple[subprocess.Popen[str], int]]:
    """The deadlock program, both workers blocked, its health thread answering; (process, health port)."""
    proc = subprocess.Popen(
        [PYTHON, str(DEADLOCK), "--api-key", "sk-live-0123456789abcdefghij"],
        stdout=subprocess.PIPE,
        text=True,
        start_new_session=True,
    )
    try:
        assert proc.stdout is not None
        port = int(proc.stdout.readline().split()[1])
        assert proc.stdout.readline().strip() == "DEADLOCKED"
        yield proc, port
    finally:
        stop(proc)  # type: ignore[arg-type]


def _settings(tmp: Path, pid: int, py_spy_exe: Path | None = None, **evidence: object) -> Settings:
    return Settings.from_values(
        dict(
            runtime={"pid": pid},
            snapshots={"dir": str(tmp / "snap")},
            profiling={"py_spy": str(py_spy_exe) if py_spy_exe else None},
            evidence={"dir": str(tmp / "evidence"), **evidence},
        )
    )


def _store(
    tmp: Path, pid: int, nvml: FakeNVML | None = None, py_spy_exe: Path | None = None, **evidence: object
) -> EvidenceStore:
    return build_deps(_settings(tmp, pid, py_spy_exe, **evidence), nvml=nvml or FakeNVML([FakeGPU()])).evidence


def _stacks(bundle: dict) -> dict[str, dict]:
    (proc,) = bundle["processes"]
    return {t["thread_name"]: t for t in proc["py_spy"]["threads"]}


def _innermost_python(thread: dict) -> dict:
    return python_frames(thread["frames"])[0]


def _py_spy_that(tmp: Path, when_native: str) -> Path:
    """A py-spy standing in for a build or platform where ``--native`` does not work: with ``--native`` it runs
    ``when_native`` (shell), otherwise it is the real py-spy."""
    real = pyspy.resolve_executable(None)
    wrapper = tmp / "py-spy"
    wrapper.write_text(
        f'#!/bin/sh\nfor a in "$@"; do [ "$a" = --native ] && {{ {when_native}; }}; done\nexec {real} "$@"\n'
    )
    wrapper.chmod(0o755)
    return wrapper


# The message py-spy prints where it cannot unwind native stacks (aarch64 builds, macOS arm64).
UNSUPPORTED = "Collecting stack traces from native extensions (--native) is not supported on your platform."


def _line_of(text: str) -> int:
    return next(n for n, line in enumerate(DEADLOCK.read_text().splitlines(), 1) if text in line)


@pytest.mark.integration
def test_deadlock_bundle_shows_both_workers_blocked_on_the_locks(tmp_path, deadlocked) -> None:
    proc, port = deadlocked
    assert httpx.get(f"http://127.0.0.1:{port}/health").status_code == 200  # hung, but healthy
    store = _store(tmp_path, proc.pid)
    meta = store.capture("api", "test")
    bundle = store.get(meta.id)
    assert bundle is not None and bundle["meta"]["id"] == meta.id
    stacks = _stacks(bundle)
    a, b = _innermost_python(stacks["worker-a"]), _innermost_python(stacks["worker-b"])
    assert (a["name"], a["line"]) == ("post_ledger_then_journal", _line_of("with JOURNAL:  # never"))
    assert (b["name"], b["line"]) == ("post_journal_then_ledger", _line_of("with LEDGER:  # never"))
    spy = bundle["processes"][0]["py_spy"]  # --native by default: the lock wait's native frames above the Python one
    assert (
        spy["mode"] == "native"
        and spy["mode_reason"] == NATIVE_OK
        and [x["mode"] for x in spy["attempts"]] == ["native"]
    )
    assert stacks["worker-a"]["frames"][0].get("native") is True
    threads = {t.get("python_name"): t for t in bundle["processes"][0]["threads"]}
    for name in ("worker-a", "worker-b"):  # blocked in the kernel on the lock's futex
        assert threads[name]["state"] == "S" and "futex" in threads[name]["wchan"]
        assert any("futex" in line for line in threads[name]["kernel_stack"])
    assert "stuck in post_ledger_then_journal" in meta.summary or "post_journal_then_ledger" in meta.summary
    assert "py-spy 1/1 [native]" in meta.summary and "none in D state" in meta.summary
    m = bundle["meta"]
    assert m["wall_s"] <= 10 and m["cpu_s"]["total"] > 0 and m["cpu_s"]["py_spy_children"] > 0
    assert bundle["gpus"]["gpus"][0]["name"] == "NVIDIA H100 80GB HBM3"
    assert "runtime_profile.url" in bundle["runtime_profile"]["absent"]
    spans = bundle["spans"]  # no receiver, no probe, no engine scrape in this store: each says why
    assert "in flight" in spans["note"] and "receiver is off" in spans["recent_finished"]["absent"]
    assert "no engine scrape" in spans["in_flight"]["absent"] and "probe.url" in spans["probe"]["absent"]
    text = json.dumps(bundle)
    assert "sk-live-0123456789abcdefghij" not in text and "[REDACTED hmac:" in text  # redacted before written
    shown = render_text(bundle)
    assert "worker-a" in shown and "post_ledger_then_journal" in shown and "futex" in shown
    assert "py-spy native:" in shown and "[native]" in shown


@pytest.mark.integration
@pytest.mark.parametrize(
    ("case", "native", "when_native", "first_error"),
    [
        ("unsupported", True, f"echo '{UNSUPPORTED}' >&2; exit 1", "native_unsupported"),
        ("unwind fails", True, "echo 'Error: Failed to unwind native stack: libunwind error -8' >&2; exit 1", "failed"),
        ("hangs", True, "exec sleep 60", "timeout"),
        ("off", False, "exit 99", None),
    ],
    ids=["unsupported", "unwind-fails", "hangs", "native-off"],
)
def test_native_falls_back_to_python_frames_once_and_says_why(
    tmp_path, deadlocked, case, native, when_native, first_error
) -> None:
    """Where ``py-spy dump --native`` fails (the stand-in py-spy fails or hangs on it, and is the real one without
    it), the bundle still has the stacks, from one retry without --native within the time limit, and records the
    mode and why; with evidence.native false there is no --native run at all."""
    proc, _port = deadlocked
    store = _store(tmp_path, proc.pid, py_spy_exe=_py_spy_that(tmp_path, when_native), native=native, time_limit_s=4.0)
    t0 = time.monotonic()
    meta = store.capture("api", case)
    assert time.monotonic() - t0 < 4.0 + 1.0  # the retry fits in the bundle's time limit
    bundle = store.get(meta.id)
    assert bundle is not None
    spy = bundle["processes"][0]["py_spy"]
    assert spy["mode"] == "python" and "[python]" in meta.summary
    a = _innermost_python(_stacks(bundle)["worker-a"])
    assert (a["name"], a["line"]) == ("post_ledger_then_journal", _line_of("with JOURNAL:  # never"))
    assert not any(f.get("native") for t in spy["threads"] for f in t["frames"])
    if first_error is None:
        assert spy["mode_reason"] == NATIVE_OFF and [x["mode"] for x in spy["attempts"]] == ["python"]
        return
    tried, retried = spy["attempts"]
    assert (tried["mode"], tried["error"], retried["mode"]) == ("native", first_error, "python")
    assert "error" not in retried and spy["mode_reason"].startswith(f"--native failed ({first_error}: ")
    assert "retried without it" in spy["mode_reason"]
    if case == "unsupported":
        assert UNSUPPORTED in spy["mode_reason"]
    if case == "hangs":  # the native run got its share of the limit, not all of it
        assert tried["wall_s"] < 4.0 * 0.7


def test_py_spy_native_failures_are_classified() -> None:
    assert pyspy.classify(UNSUPPORTED + "\n", 7).kind == "native_unsupported"
    assert pyspy.classify("Can't get native stack traces with the --nonblocking option.\n", 7).kind == (
        "native_unsupported"
    )
    assert pyspy.classify("Permission denied (os error 13)\n", 7).kind == "permission"  # not retried


def _engine_scrape(running: float, waiting: float, stalled: bool) -> Collection:
    rank = {"model": "m", "rank": "0", "running": running, "waiting": waiting, "stall_s": 0.0, "stalled": stalled}
    return Collection(details={"engine": "vllm", "hang": [rank]})


@pytest.mark.integration
def test_spans_section_has_the_in_flight_gauges_the_probe_and_the_last_finished_spans(tmp_path) -> None:
    """A real OTLP receiver gets vLLM-shaped spans from the OpenTelemetry SDK, two before the onset and one after;
    the bundle's spans section names them (trace ids as the SDK made them, request ids, newest first, marked before
    or after the onset), counts the requests in flight from the last engine scrape and carries the probe's last
    result."""
    from opentelemetry.exporter.otlp.proto.http.trace_exporter import OTLPSpanExporter
    from opentelemetry.sdk.trace import TracerProvider
    from opentelemetry.sdk.trace.export import SimpleSpanProcessor

    receiver = Receiver(
        ReceiverSettings(enabled=True, grpc_endpoint=None, http_endpoint="127.0.0.1:0"), LatencyAnalytics()
    )
    receiver.start()
    try:
        provider = TracerProvider()
        provider.add_span_processor(
            SimpleSpanProcessor(OTLPSpanExporter(endpoint=f"http://127.0.0.1:{receiver.http_port}/v1/traces"))
        )
        tracer = provider.get_tracer("vllm.tracing")
        trace_ids = []

        def request(i: int) -> None:
            with tracer.start_as_current_span("llm_request") as span:
                span.set_attributes(
                    {
                        "gen_ai.response.model": "Qwen/Qwen3-8B",
                        "gen_ai.request.id": f"cmpl-{i}",
                        "gen_ai.usage.prompt_tokens": 512,
                        "gen_ai.usage.completion_tokens": 101,
                        "gen_ai.latency.time_to_first_token": 0.38,
                        "gen_ai.latency.e2e": 2.5,
                    }
                )
                trace_ids.append(f"{span.get_span_context().trace_id:032x}")

        store = _store(tmp_path, os.getpid(), py_spy=False)
        store.on_record("engine", _engine_scrape(2, 0, stalled=False))
        request(0)
        request(1)
        time.sleep(0.02)
        store.on_record("engine", _engine_scrape(3, 5, stalled=True))  # stall_s 0: the onset is now
        time.sleep(0.02)
        request(2)
        probe = {"ok": False, "error_type": "timeout", "error_message": "no first token in 30s", "ttft_s": None}
        store.on_record("probe", Collection(details={"openai": probe}))
        provider.shutdown()

        store.attach_spans(receiver.recent_spans)
        bundle = store.get(store.capture("api", "spans").id)
    finally:
        receiver.stop()
    assert bundle is not None
    spans = bundle["spans"]
    flight = spans["in_flight"]
    assert (flight["running"], flight["waiting"]) == (3, 5) and "engine gauges" in flight["source"]
    assert spans["probe"]["protocols"]["openai"]["error_type"] == "timeout"
    recent = spans["recent_finished"]
    assert recent["onset_at"] is not None and "OTLP receiver" in recent["source"]
    got = [(r["request_id"], r["trace_id"], r["ended_before_onset"]) for r in recent["requests"]]
    assert got == [("cmpl-2", trace_ids[2], False), ("cmpl-1", trace_ids[1], True), ("cmpl-0", trace_ids[0], True)]
    first = recent["requests"][0]
    assert first["seconds"]["e2e"] == 2.5 and first["completion_tokens"] == 101 and first["model"] == "Qwen/Qwen3-8B"
    shown = render_text(bundle)
    assert "3 running, 5 waiting" in shown and "cmpl-2" in shown and "before onset" in shown


@pytest.mark.integration
def test_without_ptrace_permission_the_bundle_is_written_with_the_reason(deadlocked) -> None:
    """The capture runs as nobody against a root process: no py-spy, no wchan, no kernel stacks, a bundle still."""
    if os.geteuid() != 0:
        pytest.skip("needs root to drop to another uid (the no-permission case needs a process of another user)")
    proc, _port = deadlocked
    tmp = Path(tempfile.mkdtemp(prefix="evidence-nobody-"))
    tmp.chmod(0o755)
    (tmp / "evidence").mkdir()
    os.chown(tmp / "evidence", NOBODY, NOBODY)
    script = textwrap.dedent(
        f"""
        import json, os, sys
        sys.path.insert(0, {str(ROOT)!r})
        from tests.fake_nvml import FakeNVML
        from inferwatch.agent.config import Settings
        from inferwatch.agent.node.wiring import build_deps
        s = Settings.from_values(dict(runtime={{"pid": {proc.pid}}}, snapshots={{"dir": {str(tmp / "snap")!r}}},
                     evidence={{"dir": {str(tmp / "evidence")!r}}}))
        deps = build_deps(s, nvml=FakeNVML([]))
        store = deps.evidence
        store.reader.enrich_policy()  # the redaction key, as root (the agent made it at start)
        deps.sources.locator.find()  # the runtime found, as root: the agent's collectors found it at start (and
        # loaded psutil, which the locator imports on first use: no module could be read once this is nobody)
        os.setgid({NOBODY}); os.setuid({NOBODY})
        meta = store.capture("api", "no ptrace")
        print(json.dumps(store.get(meta.id)))
        """
    )
    try:
        r = subprocess.run([PYTHON, "-c", script], capture_output=True, text=True, timeout=60, check=False)
        assert r.returncode == 0, r.stderr
        bundle = json.loads(r.stdout)
    finally:
        subprocess.run(["rm", "-rf", str(tmp)], check=False)
    (p,) = bundle["processes"]
    assert p["py_spy"]["error"] == "permission" and "CAP_SYS_PTRACE" in p["py_spy"]["message"]
    assert [a["mode"] for a in p["py_spy"]["attempts"]] == ["native"]  # no retry: it would be refused the same way
    assert all("permission denied" in t["kernel_stack_error"] for t in p["threads"])
    assert all(t["state"] == "S" for t in p["threads"])  # /proc/PID/task/*/stat is readable by anyone
    assert "py-spy 0/1 (permission)" in bundle["meta"]["summary"]
    assert bundle["gpus"] == {"absent": "NVML reports no GPU"}


@pytest.mark.integration
def test_hang_onset_captures_once_and_a_burst_of_alerts_gives_one_bundle(tmp_path, deadlocked) -> None:
    proc, _port = deadlocked
    store = _store(tmp_path, proc.pid)
    finding = Finding("engine_hung", "fail", "rank 0 hung", {"model": "m", "rank": "0", "stall_s": 45.0}, "x")
    quiet = Collection(details={"engine": "vllm", "hang": [{"model": "m", "rank": "0", "stall_s": 0.0}]})
    hung = Collection(findings=[finding], details={"engine": "vllm", "hang": [{"model": "m", "rank": "0"}]})
    store.on_record("engine", quiet)
    store.on_record("gpu", hung)  # another collector's collection is ignored
    assert store.list() == []
    store.on_record("engine", hung)
    store.on_record("engine", hung)  # still hung: no second capture
    store.wait()
    (first,) = store.list()
    assert first.trigger == "hang" and first.alertnames == ("EngineHungButHealthy",)
    bundle = store.get(first.id)
    assert bundle is not None and len(bundle["engine"]["scrapes"]) >= 2 and bundle["meta"]["finding"]["rank"] == "0"
    alert = {"status": "firing", "labels": {"alertname": "EngineHungButHealthy", "severity": "critical"}}
    for _ in range(5):  # Alertmanager resends; other critical alerts of the node arrive
        answer = store.on_alerts({"version": "4", "status": "firing", "alerts": [alert]})
        assert answer["rate_limited"] is True and answer["latest"] == first.id
    store.wait()
    assert len(store.list()) == 1 and store.rate_limited == 5
    assert store.on_alerts({"alerts": [{**alert, "status": "resolved"}]})["captured"] is None
    assert store.on_alerts({"alerts": [{"status": "firing", "labels": {"severity": "warning"}}]})["captured"] is None


def test_webhook_ignores_critical_alerts_of_other_nodes(tmp_path) -> None:
    store = _store(tmp_path, os.getpid(), instances=["node-a:9435"])
    other = {
        "status": "firing",
        "labels": {"alertname": "EngineDown", "severity": "critical", "instance": "node-b:9435"},
    }
    answer = store.on_alerts({"alerts": [other]})
    assert answer == {"captured": None, "reason": "no firing critical alert for this node"}
    store.wait()
    assert store.list() == []


@pytest.mark.integration
def test_webhook_alert_captures_when_nothing_recent_and_ring_is_bounded(tmp_path, deadlocked) -> None:
    proc, _port = deadlocked
    store = _store(tmp_path, proc.pid, max_count=2, min_interval_s=0)
    alert = {"status": "firing", "labels": {"alertname": "EngineDown", "severity": "critical"}, "startsAt": "x"}
    assert store.on_alerts({"alerts": [alert, alert]})["captured"] == "started"
    store.wait()
    (b,) = store.list()
    assert b.trigger == "alert" and b.alertnames == ("EngineDown",)
    for _ in range(2):
        store.capture("api")
    assert len(store.list()) == 2 and b.id not in {m.id for m in store.list()}  # the oldest went first
    latest = store.latest("NoSuchAlert")
    assert latest is not None and latest["meta"]["id"] == store.list()[0].id


@pytest.mark.integration
def test_api_scope_webhook_and_cli(tmp_path, deadlocked) -> None:
    proc, _port = deadlocked
    tokens = tmp_path / "tokens"
    tokens.write_text(f"{READ} read\n{EVID} evidence,read alertmanager\n")
    port = free_port()
    env = {
        "INFERWATCH_API__TOKENS_FILE": str(tokens),
        "INFERWATCH_RUNTIME__PID": str(proc.pid),
        "INFERWATCH_SNAPSHOTS__DIR": str(tmp_path / "snap"),
        "INFERWATCH_EVIDENCE__DIR": str(tmp_path / "evidence"),
    }
    with running(
        [PYTHON, "-m", "inferwatch.agent", "run", "--port", str(port)], tmp_path / "agent.log", cwd=ROOT, env=env
    ) as a:
        base = f"http://127.0.0.1:{port}"
        wait_http(f"{base}/healthz", proc=a)
        auth = {"Authorization": f"Bearer {EVID}"}
        assert httpx.get(base + "/api/v1/evidence", headers={"Authorization": f"Bearer {READ}"}).status_code == 403
        assert httpx.post(base + "/api/v1/alertmanager", json={}).status_code == 401
        assert httpx.get(base + "/api/v1/evidence/latest", headers=auth).status_code == 404
        alert = {"status": "firing", "labels": {"alertname": "EngineHungButHealthy", "severity": "critical"}}
        r = httpx.post(base + "/api/v1/alertmanager", json={"version": "4", "alerts": [alert]}, headers=auth)
        assert r.status_code == 202 and r.json()["captured"] == "started"
        deadline = time.monotonic() + 120  # bounds a hang (CI's load 10-17 on 2 cores)
        while not (listed := httpx.get(base + "/api/v1/evidence", headers=auth).json()["evidence"]):
            assert time.monotonic() < deadline
            time.sleep(0.2)
        (entry,) = listed
        latest = httpx.get(base + "/api/v1/evidence/latest?alertname=EngineHungButHealthy", headers=auth).json()
        assert latest["meta"]["id"] == entry["id"] and latest["meta"]["trigger"] == "alert"
        text = httpx.get(f"{base}/api/v1/evidence/{entry['id']}?format=text", headers=auth).text
        assert "post_ledger_then_journal" in text
        # the capture runs in the request (py-spy included, a 10 s budget): httpx's default 5 s read timeout is shorter
        r = httpx.post(base + "/api/v1/evidence", headers=auth, timeout=60)
        assert r.status_code == 201 and r.json()["url"] == f"/api/v1/evidence/{r.json()['id']}"
        assert "inferwatch_evidence_captures_total" in httpx.get(base + "/metrics").text
    cli = [sys.executable, "-m", "inferwatch.agent", "evidence"]
    envc = {**os.environ, "INFERWATCH_EVIDENCE__DIR": str(tmp_path / "evidence")}
    out = subprocess.run([*cli, "list"], capture_output=True, text=True, env=envc, cwd=ROOT, timeout=60, check=False)
    assert out.returncode == 0 and entry["id"] in out.stdout and "alert" in out.stdout
    out = subprocess.run([*cli, "show", entry["id"]], capture_output=True, text=True, env=envc, cwd=ROOT, timeout=60)
    assert out.returncode == 0 and "worker-b" in out.stdout and "post_journal_then_ledger" in out.stdout
    out = subprocess.run([*cli, "show", "0123456789abcdef"], capture_output=True, text=True, env=envc, cwd=ROOT)
    assert out.returncode == 1 and "no evidence bundle" in out.stderr


def test_summary_names_the_stuck_application_frame_not_the_event_loop() -> None:
    from inferwatch.agent.node.actions.evidencebundle import summarise, top_frame

    lib = "/usr/lib/python3.11"
    main = {"thread_name": "MainThread", "active": False, "frames": [
        {"name": "EpollSelector.select", "filename": f"{lib}/selectors.py", "line": 468},
        {"name": "serve", "filename": "/app/simulator/serve.py", "line": 40}]}  # fmt: skip
    worker = {"thread_name": "asyncio_0", "active": False, "frames": [
        {"name": "Condition.wait", "filename": f"{lib}/threading.py", "line": 327},
        {"name": "Event.wait", "filename": f"{lib}/threading.py", "line": 629},
        {"name": "wait_for_collective", "filename": "/app/simulator/runtime.py", "line": 37}]}  # fmt: skip
    assert top_frame([main, worker]) == "wait_for_collective (runtime.py:37)"
    assert top_frame([main]) == "serve (serve.py:40)"
    # The dump landed while the event loop was running a callback (accepting a scrape): active and holding the
    # GIL, it is still serving, and the waiting worker is where the hang is (seen in the runbook run under load).
    accepting = {"thread_name": "MainThread", "active": True, "owns_gil": True, "frames": [
        {"name": "Server.startup.<locals>.create_protocol", "filename": "/venv/uvicorn/server.py", "line": 125},
        {"name": "BaseSelectorEventLoop._accept_connection2", "filename": f"{lib}/asyncio/selector_events.py",
         "line": 208},
        {"name": "_run_once", "filename": "(native)", "line": 0, "native": True},
        {"name": "BaseEventLoop._run_once", "filename": f"{lib}/asyncio/base_events.py", "line": 1922},
        {"name": "serve", "filename": "/app/simulator/serve.py", "line": 55}]}  # fmt: skip
    assert top_frame([accepting, worker]) == "wait_for_collective (runtime.py:37)"
    assert top_frame([accepting]) == "Server.startup.<locals>.create_protocol (server.py:125)"
    # A thread stuck outside any event loop (an engine core's busy loop in a collective) still wins when active.
    spinning = {"thread_name": "MainThread", "active": True, "frames": [
        {"name": "all_reduce", "filename": "/venv/torch/distributed/distributed_c10d.py", "line": 2050},
        {"name": "EngineCore.run_busy_loop", "filename": "/venv/vllm/v1/engine/core.py", "line": 300}]}  # fmt: skip
    assert top_frame([spinning, worker]) == "all_reduce (distributed_c10d.py:2050)"
    bundle = {
        "meta": {"trigger": "hang", "reason": "r", "wall_s": 0.4, "cpu_s": {"total": 0.12}},
        "processes": [
            {"threads": [{"tid": 7, "name": "python", "python_name": "worker-a", "state": "D"}],
             "py_spy": {"threads": [main, worker]}},
            {"threads": [], "py_spy": {"error": "permission", "message": "m"}},
        ],
    }  # fmt: skip
    line = summarise(bundle)
    assert "1 in D state: worker-a(7)" in line and "py-spy 1/2 (permission)" in line
    assert "stuck in wait_for_collective (runtime.py:37)" in line and line.endswith("0.40 s wall, 0.12 s CPU")


def test_the_agent_hands_its_receivers_finished_spans_to_the_evidence_store(tmp_path) -> None:
    """With the OTLP receiver on, the running agent's bundles read the receiver's last finished requests (without
    the wiring every bundle said the receiver was off); with it off, they say so. What the receiver returns is
    tested with real spans above."""
    from inferwatch.agent.node.app import Agent

    def spans_of(receiver_on: bool) -> dict:
        settings = Settings.from_values(
            dict(
                receiver=ReceiverSettings(enabled=receiver_on, grpc_endpoint=None, http_endpoint="127.0.0.1:0"),
                evidence={"dir": str(tmp_path / f"ev-{receiver_on}")},
            )
        )
        agent = Agent(settings, build_deps(settings, nvml=FakeNVML([])))
        return agent.deps.evidence._spans()["recent_finished"]

    assert "receiver is off" in spans_of(False)["absent"]
    assert "received no request span since the agent started" in spans_of(True)["absent"]  # read from the receiver


def test_kept_scrapes_give_back_each_rank_as_it_came(tmp_path: Path) -> None:
    """The last SCRAPES_KEPT engine scrapes are kept as tuples (memory) and given back as the dicts that came, in
    order; a rank with other keys than the first is kept as it is."""
    store = _store(tmp_path, os.getpid())
    first = {"model": "m", "rank": "0", "running": 1.0, "waiting": 0.0, "stall_s": 0.0, "stalled": False}
    odd = {"model": "m", "rank": "1", "note": "other keys"}
    for i in range(14):
        ranks = [{**first, "stall_s": float(i)}, odd]
        store.on_record("engine", Collection(details={"engine": {"kind": "vllm"}, "hang": ranks}))
    scrapes = store.scrapes()
    assert len(scrapes) == 12  # SCRAPES_KEPT
    assert [s["ranks"][0]["stall_s"] for s in scrapes] == [float(i) for i in range(2, 14)]
    assert all(s["ranks"] == [{**first, "stall_s": s["ranks"][0]["stall_s"]}, odd] for s in scrapes)
    assert all(s["engine"] == {"kind": "vllm"} and s["at"] > 0 for s in scrapes)
    store.on_record("engine", Collection(details={}))  # a scrape without hang verdicts
    assert store.scrapes()[-1]["ranks"] == []
