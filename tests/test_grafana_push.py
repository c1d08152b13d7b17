"""``inferwatch grafana push`` against a local server that answers like Grafana's HTTP API."""

from __future__ import annotations

import base64
import subprocess
from collections.abc import Iterator
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from threading import Thread

import pytest

from inferwatch.dashboards import load_all
from inferwatch.exporters.grafana import (
    GrafanaAuthError,
    GrafanaConnectionError,
    GrafanaError,
    GrafanaPusher,
    GrafanaVersionError,
    folder_uid,
    push,
)
from tests.conftest import PYTHON, ROOT, free_port
from tests.grafana_fake import FakeGrafana

DASHBOARDS = load_all()


@pytest.fixture
def grafana() -> Iterator[FakeGrafana]:
    fake = FakeGrafana().start()
    try:
        yield fake
    finally:
        fake.stop()


def _cli(*args: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [PYTHON, "-m", "inferwatch.agent", "grafana", "push", *args],
        cwd=ROOT,
        capture_output=True,
        text=True,
        timeout=60,
    )


def _writes(fake: FakeGrafana, path: str) -> list[dict]:
    return [r for r in fake.requests if r["method"] == "POST" and r["path"] == path]


def test_cli_push_creates_folder_and_every_dashboard_then_is_idempotent(grafana: FakeGrafana) -> None:
    r = _cli("--url", grafana.url, "--token", grafana.token, "--folder", "LLM serving")
    assert r.returncode == 0, r.stderr
    assert "Grafana 11.6.0" in r.stdout
    assert r.stdout.count("created") == 4
    assert list(grafana.folders) == ["llm-serving"] and grafana.folders["llm-serving"]["title"] == "LLM serving"
    saves = _writes(grafana, "/api/dashboards/db")
    assert sorted(s["body"]["dashboard"]["uid"] for s in saves) == sorted(DASHBOARDS)
    for s in saves:
        assert s["headers"]["Authorization"] == f"Bearer {grafana.token}"
        assert s["body"]["folderUid"] == "llm-serving" and s["body"]["overwrite"] is True
        assert s["body"]["dashboard"]["id"] is None
        assert s["body"]["dashboard"]["schemaVersion"] == 41
        assert s["body"]["dashboard"]["panels"] == DASHBOARDS[s["body"]["dashboard"]["uid"]]["panels"]

    before = len(grafana.requests)
    r = _cli("--url", grafana.url, "--token", grafana.token, "--folder", "LLM serving")
    assert r.returncode == 0, r.stderr
    assert r.stdout.count("unchanged") == 4
    new = grafana.requests[before:]
    assert not [x for x in new if x["method"] == "POST"], "a second push must not write anything"
    assert all(d["dashboard"]["version"] == 1 for d in grafana.dashboards.values())


def test_push_updates_a_dashboard_edited_in_grafana_and_keeps_the_others(grafana: FakeGrafana) -> None:
    pusher = GrafanaPusher(grafana.url, basic_auth=grafana.basic)
    push(pusher, DASHBOARDS)
    grafana.dashboards["inferwatch-slo"]["dashboard"]["title"] = "edited by hand"
    version, results = push(pusher, DASHBOARDS)
    assert version == "11.6.0"
    actions = {r.uid: r.action for r in results}
    assert actions == {
        "inferwatch-engine": "unchanged",
        "inferwatch-matrix": "unchanged",
        "inferwatch-node": "unchanged",
        "inferwatch-slo": "updated",
    }
    assert grafana.dashboards["inferwatch-slo"]["dashboard"]["title"] == DASHBOARDS["inferwatch-slo"]["title"]
    assert grafana.dashboards["inferwatch-slo"]["dashboard"]["version"] == 2
    basic = base64.b64encode(b"admin:secret").decode()
    assert all(r["headers"]["Authorization"] == f"Basic {basic}" for r in grafana.requests)


def test_existing_folder_with_the_same_title_is_reused(grafana: FakeGrafana) -> None:
    grafana.folders["abc123"] = {"id": 1, "uid": "abc123", "title": "inferwatch", "version": 1}
    push(GrafanaPusher(grafana.url, token=grafana.token), DASHBOARDS)
    assert list(grafana.folders) == ["abc123"]
    assert {d["meta"]["folderUid"] for d in grafana.dashboards.values()} == {"abc123"}


def test_datasource_is_created_and_dashboards_open_on_it(grafana: FakeGrafana) -> None:
    r = _cli(
        "--url",
        grafana.url,
        "--token",
        grafana.token,
        "--datasource-uid",
        "prom-main",
        "--prometheus-url",
        "http://prometheus:9090",
    )
    assert r.returncode == 0, r.stderr
    ds = grafana.datasources["prom-main"]
    assert ds["type"] == "prometheus" and ds["url"] == "http://prometheus:9090" and ds["access"] == "proxy"
    for d in grafana.dashboards.values():
        var = d["dashboard"]["templating"]["list"][0]
        assert var["type"] == "datasource" and var["current"]["value"] == "prom-main"
    # Second push: the datasource exists, nothing is created again.
    before = len(_writes(grafana, "/api/datasources"))
    assert _cli("--url", grafana.url, "--token", grafana.token, "--datasource-uid", "prom-main").returncode == 0
    assert len(_writes(grafana, "/api/datasources")) == before


def test_missing_datasource_without_url_is_a_clear_error(grafana: FakeGrafana) -> None:
    with pytest.raises(GrafanaError, match=r"no datasource with uid 'nope'.*--prometheus-url"):
        push(GrafanaPusher(grafana.url, token=grafana.token), DASHBOARDS, datasource_uid="nope")
    assert not grafana.dashboards


def test_permission_denied_names_the_role(grafana: FakeGrafana) -> None:
    grafana.forbid_datasources = True
    with pytest.raises(GrafanaAuthError, match=r"HTTP 403.*Admin"):
        push(GrafanaPusher(grafana.url, token=grafana.token), DASHBOARDS, prometheus_url="http://p:9090")


def test_wrong_token_is_an_authentication_error(grafana: FakeGrafana) -> None:
    r = _cli("--url", grafana.url, "--token", "wrong")
    assert r.returncode == 1
    assert "refused the credentials" in r.stderr and "HTTP 401" in r.stderr
    assert not grafana.dashboards
    with pytest.raises(GrafanaAuthError):
        push(GrafanaPusher(grafana.url, basic_auth=("admin", "bad")), DASHBOARDS)


def test_connection_refused_is_a_connection_error() -> None:
    url = f"http://127.0.0.1:{free_port()}"
    with pytest.raises(GrafanaConnectionError, match="cannot connect to Grafana"):
        push(GrafanaPusher(url, token="t", timeout_s=2), DASHBOARDS)
    r = _cli("--url", url, "--token", "t", "--timeout", "2")
    assert r.returncode == 1 and "cannot connect to Grafana" in r.stderr


@pytest.mark.parametrize("version", ["10.4.3", "9.5.0"])
def test_old_grafana_is_refused_before_writing(grafana: FakeGrafana, version: str) -> None:
    grafana.version = version
    with pytest.raises(GrafanaVersionError, match=rf"Grafana {version} is too old.*11\.6"):
        push(GrafanaPusher(grafana.url, token=grafana.token), DASHBOARDS)
    assert not [r for r in grafana.requests if r["method"] == "POST"]


def test_grafana_12_is_accepted(grafana: FakeGrafana) -> None:
    grafana.version = "12.0.1-security-01"
    version, results = push(GrafanaPusher(grafana.url, token=grafana.token), DASHBOARDS)
    assert version.startswith("12.0.1") and len(results) == 4


def test_a_server_that_is_not_grafana_is_a_version_error() -> None:
    class Html(BaseHTTPRequestHandler):
        def log_message(self, *args: object) -> None:
            pass

        def do_GET(self) -> None:
            body = b"<html>hello</html>"
            self.send_response(200)
            self.send_header("Content-Type", "text/html")
            self.send_header("Content-Length", str(len(body)))
            self.end_headers()
            self.wfile.write(body)

    server = ThreadingHTTPServer(("127.0.0.1", 0), Html)
    Thread(target=server.serve_forever, daemon=True).start()
    try:
        url = f"http://127.0.0.1:{server.server_address[1]}"
        with pytest.raises(GrafanaVersionError, match=r"not Grafana's JSON API|is it a Grafana"):
            push(GrafanaPusher(url, token="t"), DASHBOARDS)
    finally:
        server.shutdown()
        server.server_close()


@pytest.mark.parametrize("grafana_root", [False, True], ids=["nothing-grafana", "only-the-version"])
def test_a_server_answering_404_is_one_line_no_traceback(grafana_root: bool) -> None:
    """Issue 15: ``grafana push`` against a server answering 404 printed a GrafanaClientError traceback. A real
    HTTP server answers 404 to every request (or to all but Grafana's version endpoint)."""
    import json

    class NotFound(BaseHTTPRequestHandler):
        def log_message(self, *args: object) -> None:
            pass

        def _answer(self) -> None:
            if grafana_root and self.path.startswith("/api/frontend/settings"):
                code, body = 200, json.dumps({"buildInfo": {"version": "11.6.0"}}).encode()
            else:
                code, body = 404, b'{"message":"Not found"}'
            self.send_response(code)
            self.send_header("Content-Type", "application/json")
            self.send_header("Content-Length", str(len(body)))
            self.end_headers()
            self.wfile.write(body)

        do_GET = do_POST = do_PUT = _answer

    server = ThreadingHTTPServer(("127.0.0.1", 0), NotFound)
    Thread(target=server.serve_forever, daemon=True).start()
    try:
        out = _cli("--url", f"http://127.0.0.1:{server.server_address[1]}", "--token", "t")
    finally:
        server.shutdown()
        server.server_close()
    assert out.returncode == 1, out.stdout + out.stderr
    lines = out.stderr.strip().splitlines()
    assert len(lines) == 1 and "Traceback" not in out.stderr, out.stderr
    assert lines[0].startswith("inferwatch: ") and "404" in lines[0], lines


def test_usage_errors_exit_2() -> None:
    assert _cli("--url", "http://x").returncode == 2  # no credentials
    assert _cli("--url", "http://x", "--token", "t", "--basic-auth", "a:b").returncode == 2
    r = _cli("--url", "http://x", "--basic-auth", "nocolon")
    assert r.returncode == 2 and "USER:PASSWORD" in r.stderr
    assert _cli("--url", "ftp://x", "--token", "t").returncode == 2


def test_folder_uid_is_stable_and_valid() -> None:
    assert folder_uid("inferwatch") == "inferwatch"
    assert folder_uid("LLM serving / prod") == "llm-serving-prod"
    assert len(folder_uid("x" * 100)) == 40
