"""The alert push against real Alertmanagers (two, as an HA pair is sent to) and a local capture server.

The pusher is stepped by hand on a fake clock, over an :class:`AgentState` filled as the runner fills it, so the
timing rules (resend, ``endsAt``, the pushed EngineDown's ``for:``) are checked exactly; what Alertmanager makes of
the alerts is read back from its own API.
"""

from __future__ import annotations

import contextlib
import json
import threading
from collections.abc import Iterator
from datetime import datetime
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path
from typing import Any

import httpx
import pytest
import yaml

from inferwatch.agent.catalog.engine import MODEL
from inferwatch.agent.common.samples import Collection, Sample, attrs
from inferwatch.agent.config import AlertmanagerSettings
from inferwatch.agent.errors import ConfigError
from inferwatch.agent.node.actions.alertpush import AlertPusher
from inferwatch.agent.node.state import AgentState, CollectorHealth
from tests.alerting import tool
from tests.conftest import free_port
from tests.procs import running, wait_http

T0 = 1_800_000_000.0


class Clock:
    def __init__(self) -> None:
        self.t = T0

    def __call__(self) -> float:
        return self.t


def _engine(state: AgentState, hung: float | None = None, up: float = 1, timeouts: float = 0, refused: float = 0):
    samples = [Sample("inferwatch.engine.up", up, attrs(engine="vllm"))]
    samples += [
        Sample("inferwatch.engine.scrape.errors", timeouts, attrs(reason="timeout")),
        Sample("inferwatch.engine.scrape.errors", refused, attrs(reason="connect")),
    ]
    if hung is not None:
        a = attrs({MODEL: "m"}, rank="1")
        samples += [Sample("inferwatch.engine.hung", hung, a), Sample("inferwatch.engine.stall", 7.0, a)]
    state.record("engine", CollectorHealth("engine", 2, 2, runs=1, state="ok"), Collection(samples, [], {}))


@contextlib.contextmanager
def alertmanager(tmp: Path, name: str) -> Iterator[str]:
    cfg = tmp / f"{name}.yml"
    cfg.write_text(yaml.safe_dump({"route": {"receiver": "null"}, "receivers": [{"name": "null"}]}))
    port = free_port()
    url = f"http://127.0.0.1:{port}"
    cmd = [tool("prometheus-alertmanager"), f"--config.file={cfg}", f"--storage.path={tmp / name}"]
    cmd += [f"--web.listen-address=127.0.0.1:{port}", "--cluster.listen-address="]
    with running(cmd, tmp / f"{name}.log") as proc:
        wait_http(f"{url}/-/ready", ok=lambda r: r.status_code == 200, proc=proc, timeout_s=60)
        yield url


def _held(url: str) -> list[dict[str, Any]]:
    r = httpx.get(f"{url}/api/v2/alerts", timeout=5)
    r.raise_for_status()
    return list(r.json())


def _ts(iso: str) -> float:
    return datetime.fromisoformat(iso.replace("Z", "+00:00")).timestamp()


@pytest.mark.integration
def test_a_hang_reaches_every_alertmanager_with_the_rules_labels_and_resolves(tmp_path: Path) -> None:
    with alertmanager(tmp_path, "am0") as am0, alertmanager(tmp_path, "am1") as am1:
        state, clock = AgentState(), Clock()
        cfg = AlertmanagerSettings(
            urls=[am0, am1 + "/"], instance="node-a:9435", labels={"runbook_base": "http://rb.example/runbooks"}
        )
        pusher = AlertPusher(cfg, state, client=httpx.Client(), clock=clock)
        _engine(state, hung=0)
        assert pusher.step() == []
        clock.t = datetime.now().timestamp()  # Alertmanager judges startsAt/endsAt by its own (real) clock
        _engine(state, hung=1)
        sent = pusher.step()
        assert len(sent) == 1
        for url in (am0, am1):
            (alert,) = _held(url)
            assert alert["labels"] == {
                "alertname": "EngineHungButHealthy",
                "severity": "critical",
                "instance": "node-a:9435",
                "job": "inferwatch-agent",
                "gen_ai_request_model": "m",
                "rank": "1",
                "runbook_base": "http://rb.example/runbooks",
            }
            assert _ts(alert["endsAt"]) == pytest.approx(clock.t + 4 * 60, abs=1)
            ann = alert["annotations"]
            assert ann["runbook_url"] == "http://rb.example/runbooks/EngineHungButHealthy"
            assert ann["evidence_url"] == "http://node-a:9435/api/v1/evidence/latest?alertname=EngineHungButHealthy"
            assert ann["summary"].startswith("An engine rank has requests but produces no tokens")
        clock.t += 30
        assert pusher.step() == []  # not yet due for a resend
        clock.t += 31
        assert len(pusher.step()) == 1  # re-sent every resend_s with a new endsAt
        _engine(state, hung=0)
        clock.t = datetime.now().timestamp()  # the resolution at Alertmanager's now
        (resolved,) = pusher.step()
        assert _ts(str(resolved["endsAt"])) == pytest.approx(clock.t, abs=1)
        for url in (am0, am1):
            assert _held(url) == []  # resolved: no longer listed
        pusher.stop()


class Capture:
    """A local HTTP server that answers 200 and keeps each request's headers and JSON body."""

    def __init__(self) -> None:
        self.got: list[tuple[dict[str, str], Any]] = []
        capture = self

        class Handler(BaseHTTPRequestHandler):
            def do_POST(self) -> None:
                body = json.loads(self.rfile.read(int(self.headers.get("Content-Length") or 0)))
                capture.got.append((dict(self.headers), body))
                self.send_response(200)
                self.send_header("Content-Length", "0")
                self.end_headers()

            def log_message(self, format: str, *args: Any) -> None:
                pass

        self.server = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
        self.url = f"http://127.0.0.1:{self.server.server_address[1]}"
        self.thread = threading.Thread(target=self.server.serve_forever, daemon=True)
        self.thread.start()

    def close(self) -> None:
        self.server.shutdown()
        self.server.server_close()


@pytest.fixture
def capture() -> Iterator[Capture]:
    c = Capture()
    yield c
    c.close()


@pytest.mark.parametrize("kind", ["bearer", "basic"])
def test_auth_headers(tmp_path: Path, capture: Capture, kind: str) -> None:
    secret = tmp_path / "secret"
    secret.write_text("s3cret-value\n")
    auth: dict[str, Any] = (
        {"bearer_token_file": secret} if kind == "bearer" else {"username": "am", "password_file": secret}
    )
    cfg = AlertmanagerSettings(urls=[capture.url], instance="n:9435", **auth)
    state = AgentState()
    pusher = AlertPusher(cfg, state, clock=Clock())
    _engine(state, hung=1)
    pusher.step()
    headers, body = capture.got[0]
    expected = "Bearer s3cret-value" if kind == "bearer" else "Basic YW06czNjcmV0LXZhbHVl"
    assert headers["Authorization"] == expected and body[0]["labels"]["alertname"] == "EngineHungButHealthy"
    pusher.stop()


def test_a_missing_secret_is_a_config_error(tmp_path: Path) -> None:
    cfg = AlertmanagerSettings(urls=["http://127.0.0.1:9"], instance="n:9435", bearer_token_file=tmp_path / "nope")
    with pytest.raises(ConfigError, match=r"alertmanager\.bearer_token_file"):
        AlertPusher(cfg, AgentState())


@pytest.mark.parametrize(("reason", "after_s"), [("timeout", 6.0), ("connect", 45.0)])
def test_engine_down_is_pushed_after_6_s_when_wedged_and_45_s_when_refused(
    capture: Capture, reason: str, after_s: float
) -> None:
    state, clock = AgentState(), Clock()
    pusher = AlertPusher(AlertmanagerSettings(urls=[capture.url], instance="n:9435"), state, clock=clock)
    _engine(state)
    pusher.step()
    n = 0
    while not capture.got:
        n += 1
        clock.t += 1
        _engine(state, up=0, **{"timeouts" if reason == "timeout" else "refused": n})
        pusher.step()
        assert n < 100
    labels = capture.got[0][1][0]["labels"]
    assert labels == {
        "alertname": "EngineDown",
        "severity": "critical",
        "instance": "n:9435",
        "job": "inferwatch-agent",
        "engine": "vllm",
    }
    assert n - 1 == after_s  # the first down reading starts the for:
    pusher.stop()


@pytest.mark.parametrize(("reason", "fires_at"), [("timeout", 6.0 - 1.5), ("connect", 45.0)])
def test_a_wedged_engines_for_counts_from_its_first_timed_out_read_and_the_sender_wakes_when_it_ends(
    capture: Capture, reason: str, fires_at: float
) -> None:
    """The first read that timed out began ``engine_timeout_s`` (1.5 s) before it was recorded: EngineDown's 6 s
    count from then, and the sender's next wake-up is when they end (``_due_at``), not its next 1 s tick. A refused
    read is recorded at once: the rule's 45 s from the first down reading."""
    state, clock = AgentState(), Clock()
    cfg = AlertmanagerSettings(urls=[capture.url], instance="n:9435")
    pusher = AlertPusher(cfg, state, clock=clock, engine_timeout_s=1.5)
    _engine(state)
    pusher.step()
    assert pusher._due_at is None
    first = clock.t = T0 + 0.3
    _engine(state, up=0, **{"timeouts" if reason == "timeout" else "refused": 1})
    pusher.step()
    assert pusher._due_at == pytest.approx(first + fires_at)
    clock.t = first + fires_at - 0.01
    pusher.step()
    assert not capture.got
    clock.t = first + fires_at
    pusher.step()
    assert [a["labels"]["alertname"] for _t, batch in capture.got for a in batch] == ["EngineDown"]
    assert pusher._due_at is None
    pusher.stop()


def test_a_gauge_condition_holds_as_long_as_the_gauge_while_a_counter_needs_an_increase() -> None:
    """RuntimeHardwareMismatch: ``missing_libraries > 0`` (a gauge) fires as long as it holds, past the rule's 5-minute
    increase window that applies to the probe's error counter only; a counter that stops rising stops firing."""
    state, clock = AgentState(), Clock()
    pusher = AlertPusher(AlertmanagerSettings(urls=["http://127.0.0.1:9"], instance="n:9435"), state, clock=clock)

    def record(missing: float, errors: float) -> None:
        samples = [
            Sample("inferwatch.runtime.binary.missing_libraries", missing, attrs()),
            Sample("inferwatch.probe.http_errors", errors, attrs(error_type="hardware_mismatch")),
        ]
        state.record("binary", CollectorHealth("binary", 5, 5, runs=1, state="ok"), Collection(samples, [], {}))

    def mismatch_firing() -> bool:
        return any(rule.alert == "RuntimeHardwareMismatch" for rule, _l, _d in pusher.firing(clock.t).values())

    for _ in range(12 * 15):  # 15 minutes at 5 s: the gauge stays at 2, the counter at 0
        clock.t += 5
        record(2, 0)
        assert mismatch_firing()
    for _ in range(12 * 15):  # the libraries found, the probe's counter rose once and then no more
        clock.t += 5
        record(0, 3)
    assert not mismatch_firing()
    pusher.stop()
