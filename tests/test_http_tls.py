"""The agent's HTTP clients: plain HTTP without a CA bundle, HTTPS verified (agent/common/httpclient.py TLSOnDemand).

A real TLS server on 127.0.0.1 with a self-signed certificate (made by Debian's ``openssl``): an https:// request is
refused unless the certificate is trusted, and trusted through SSL_CERT_FILE where the client trusts the environment.
"""

from __future__ import annotations

import http.server
import ssl
import subprocess
import threading
from collections.abc import Iterator
from pathlib import Path

import httpx
import pytest

from inferwatch.agent.common import httpclient
from tests import engine_server as es


class _Ok(http.server.BaseHTTPRequestHandler):
    def do_GET(self) -> None:
        self.send_response(200)
        self.send_header("Content-Length", "2")
        self.end_headers()
        self.wfile.write(b"ok")

    def log_message(self, *args: object) -> None:
        pass


@pytest.fixture
def tls_server(tmp_path: Path) -> Iterator[tuple[str, Path]]:
    key, cert = tmp_path / "key.pem", tmp_path / "cert.pem"
    names = ["-subj", "/CN=localhost", "-addext", "subjectAltName=DNS:localhost,IP:127.0.0.1"]
    subprocess.run(
        ["openssl", "req", "-x509", "-newkey", "rsa:2048", "-nodes", "-keyout", str(key), "-out", str(cert), *names],
        check=True,
        capture_output=True,
        timeout=60,
    )
    server = http.server.ThreadingHTTPServer(("127.0.0.1", 0), _Ok)
    context = ssl.SSLContext(ssl.PROTOCOL_TLS_SERVER)
    context.load_cert_chain(cert, key)
    server.socket = context.wrap_socket(server.socket, server_side=True)
    thread = threading.Thread(target=server.serve_forever, kwargs={"poll_interval": 0.05}, daemon=True)
    thread.start()
    try:
        yield f"https://127.0.0.1:{server.server_address[1]}/", cert
    finally:
        server.shutdown()
        server.server_close()
        thread.join(5)


def _fresh(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(httpclient, "_SSL_CONTEXTS", {})
    for name in ("SSL_CERT_FILE", "SSL_CERT_DIR", "HTTPS_PROXY", "https_proxy", "ALL_PROXY", "all_proxy"):
        monkeypatch.delenv(name, raising=False)


def test_plain_http_needs_no_ca_bundle(monkeypatch: pytest.MonkeyPatch) -> None:
    _fresh(monkeypatch)
    with es.EngineServer({"/x": es.body("ok")}) as srv, httpclient.http_client("engine") as client:
        assert client.get(srv.url("/x")).text == "ok"
    assert httpclient._SSL_CONTEXTS == {}  # no context made, no bundle parsed


def test_https_is_verified_against_certifi_and_refused_for_an_untrusted_certificate(
    tls_server: tuple[str, Path], monkeypatch: pytest.MonkeyPatch
) -> None:
    _fresh(monkeypatch)
    url, _ = tls_server
    with httpclient.http_client("engine", retry=False) as client, pytest.raises(httpx.ConnectError) as exc:
        client.get(url)
    assert "CERTIFICATE_VERIFY_FAILED" in str(exc.value)
    assert len(httpclient._SSL_CONTEXTS) == 1  # made for that request: certifi's bundle


def test_https_trusts_a_ca_file_from_the_environment_where_the_client_does(
    tls_server: tuple[str, Path], monkeypatch: pytest.MonkeyPatch
) -> None:
    _fresh(monkeypatch)
    url, cert = tls_server
    monkeypatch.setenv("SSL_CERT_FILE", str(cert))
    with httpclient.http_client("probe", trust_env=True) as client:
        assert client.get(url).text == "ok"
    with httpclient.http_client("engine") as client, pytest.raises(httpx.ConnectError):
        client.get(url)  # the engine's client does not trust the environment: certifi's bundle, which lacks it
