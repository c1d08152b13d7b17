"""The HTTP clients the agent reads its sources with (engine /metrics, the probe, the runtime profile): one factory.

A server closes a keep-alive connection once it has been idle for its own timeout (uvicorn, and so vLLM, SGLang
and trtllm-serve: 5 s; llama.cpp's server and Node: 5 s; gunicorn: 2 s). A client that keeps idle connections
as long, or longer, and asks at about that interval sometimes sends its request on a connection the server is
closing at that moment: the request fails with no answer (httpx ``RemoteProtocolError`` "Server disconnected
without sending a response", ``ReadError`` "Connection reset by peer", ``WriteError`` "Broken pipe") on a
healthy server: at a 5 s interval against uvicorn with httpx's default 5 s expiry, one collection in 120 to 240
(docs/benchmarks.md, "Keep-alive race"). httpcore's pool already drops an idle connection
whose socket it finds closed when it hands it out; the race is a close that crosses the request in flight.
Two settings close it:

- :data:`KEEPALIVE_EXPIRY_S`: idle connections are dropped by the client first, below the common server
  keep-alives;
- :class:`StaleConnectionRetry`: an idempotent request (GET, HEAD, OPTIONS, no body to replay) that fails that
  way on a *reused* connection, before its response's head arrived, is sent once more (the pool has closed and
  dropped the failed connection) and counted in :class:`RetryCounts`
  (``inferwatch_http_retries_total{source}``; the counts live in :mod:`~inferwatch.agent.common.retrycounts`, which
  a collector's context holds without importing httpx). A failure on a connection opened for the request is the
  server's answer and is never retried, nor is a request whose response began, nor a POST.

httpx's own ``HTTPTransport(retries=N)`` retries only the opening of a connection (httpcore's connect
errors), not a request on a reused one, so the retry is a transport wrapper around it. Whether the connection
was reused is told by httpcore's ``trace`` request extension: no ``connection.connect_tcp`` (or
``connect_unix_socket``) event before the failure.
"""

from __future__ import annotations

import logging
import os
import ssl
import threading
from collections.abc import Callable
from typing import Any

import httpx

from inferwatch.agent.common.redact import redact_url
from inferwatch.agent.common.retrycounts import RetryCounts

log = logging.getLogger(__name__)

# Below the keep-alive of the servers engines run on (uvicorn: vLLM, SGLang, trtllm-serve, LiteLLM; llama.cpp's server;
# Node; Apache: 5 s) with a second to spare, so the client lets an idle connection go before the server can close it
# under a request; above the engine collector's 2 s interval, so its connection is reused from one collection to the
# next (a new connection costs about 0.45 ms of CPU here, 2026-12-06). A server that closes sooner (gunicorn: 2 s)
# can still close one under a request: the retry takes that.
KEEPALIVE_EXPIRY_S = 4.0
DEFAULT_HTTP_TIMEOUT_S = 5.0  # httpx's own default; every caller passes its own per request
IDEMPOTENT_METHODS = frozenset({"GET", "HEAD", "OPTIONS"})
# What a request on a connection the server closed under it fails with (before any byte of the answer).
STALE_CONNECTION_ERRORS: tuple[type[httpx.TransportError], ...] = (
    httpx.RemoteProtocolError,  # EOF: "Server disconnected without sending a response"
    httpx.ReadError,  # ECONNRESET: the request reached a closed socket, the peer answered with RST
    httpx.WriteError,  # EPIPE: the RST came back before the whole request was written
)
_CONNECT_EVENTS = frozenset({"connection.connect_tcp.started", "connection.connect_unix_socket.started"})

Trace = Callable[[str, dict[str, Any]], None]


class _ConnectionTrace:
    """httpcore's ``trace`` extension for one request: notes whether a connection was opened for it."""

    __slots__ = ("chained", "connected")

    def __init__(self, chained: Trace | None) -> None:
        self.chained = chained
        self.connected = False

    def __call__(self, name: str, info: dict[str, Any]) -> None:
        if name in _CONNECT_EVENTS:
            self.connected = True
        if self.chained is not None:
            self.chained(name, info)


class StaleConnectionRetry(httpx.BaseTransport):
    """Wraps a transport: an idempotent request that fails on a reused connection before its answer began is
    sent once more, and counted (see the module docstring). Everything else passes through unchanged."""

    def __init__(self, inner: httpx.BaseTransport, source: str, counts: RetryCounts | None = None) -> None:
        self._inner = inner
        self.source = source
        self._counts = counts
        if counts is not None:
            counts.register(source)

    def handle_request(self, request: httpx.Request) -> httpx.Response:
        if request.method not in IDEMPOTENT_METHODS or not isinstance(request.stream, httpx.ByteStream):
            return self._inner.handle_request(request)
        previous: Trace | None = request.extensions.get("trace")
        first = _ConnectionTrace(previous)
        request.extensions["trace"] = first
        try:
            return self._inner.handle_request(request)
        except STALE_CONNECTION_ERRORS as exc:
            if first.connected:  # a connection opened for this request: the server's answer, not the race
                raise
            failure = f"{type(exc).__name__}: {exc}"
        if self._counts is not None:
            self._counts.add(self.source)
        url = redact_url(str(request.url))  # no credentials in the log
        log.debug("%s: %s %s failed on a reused connection (%s); sent again", self.source, request.method, url, failure)
        request.extensions["trace"] = _ConnectionTrace(previous)
        return self._inner.handle_request(request)

    def close(self) -> None:
        self._inner.close()


_SSL_CONTEXTS: dict[tuple[str, str], ssl.SSLContext] = {}
_SSL_LOCK = threading.Lock()


def _ca_source(trust_env: bool) -> tuple[str, str]:
    """Where a context's CA certificates come from, as httpx.create_ssl_context chooses: ``SSL_CERT_FILE`` or
    ``SSL_CERT_DIR`` when the environment counts and sets one, else certifi's bundle ("", "")."""
    if trust_env and os.environ.get("SSL_CERT_FILE"):
        return "file", os.environ["SSL_CERT_FILE"]
    if trust_env and os.environ.get("SSL_CERT_DIR"):
        return "dir", os.environ["SSL_CERT_DIR"]
    return "", ""


def shared_ssl_context(trust_env: bool) -> ssl.SSLContext:
    """The verifying TLS context every client of this process uses, made on first use: one per source of CA
    certificates (``trust_env``: whether ``SSL_CERT_FILE``/``SSL_CERT_DIR`` count; where neither is set a client that
    trusts the environment and one that does not read the same certifi bundle, and share its context).

    httpx builds a context per transport, parsing certifi's CA bundle each time: 0.8–2.7 MB per client, measured
    (docs/benchmarks.md, "Where the megabytes go"), with a client per source and per engine target; each parse holds
    ~1.1 MB. An :class:`ssl.SSLContext` is safe to share between threads and connections.
    """
    key = _ca_source(trust_env)
    with _SSL_LOCK:
        ctx = _SSL_CONTEXTS.get(key)
        if ctx is None:
            ctx = _SSL_CONTEXTS[key] = httpx.create_ssl_context(trust_env=bool(key[0]))
        return ctx


class TLSOnDemand(httpx.BaseTransport):
    """``http://`` requests on a transport that holds no CA certificates, ``https://`` ones on a transport with the
    verifying :func:`shared_ssl_context` (``verify()``), made at the first of them: an agent whose sources are all
    plain HTTP (an engine, a probe and an OTLP receiver on the node) never parses a CA bundle (~1.1 MB). A request
    is never sent over TLS without verification: the unverified context of the plain transport is never used by
    it (no TLS without ``https://``, redirects not followed)."""

    def __init__(self, limits: httpx.Limits, trust_env: bool, verify: Callable[[], ssl.SSLContext]) -> None:
        self._limits, self._trust_env, self._verify = limits, trust_env, verify
        self._plain = httpx.HTTPTransport(limits=limits, trust_env=trust_env, verify=False)
        self._tls: httpx.HTTPTransport | None = None
        self._lock = threading.Lock()

    def handle_request(self, request: httpx.Request) -> httpx.Response:
        if request.url.scheme == "http":
            return self._plain.handle_request(request)
        return self.secure().handle_request(request)

    def secure(self) -> httpx.HTTPTransport:
        """The transport of ``https://`` requests (made on first use)."""
        with self._lock:
            if self._tls is None:
                self._tls = httpx.HTTPTransport(limits=self._limits, trust_env=self._trust_env, verify=self._verify())
            return self._tls

    def close(self) -> None:
        self._plain.close()
        with self._lock:
            tls, self._tls = self._tls, None
        if tls is not None:
            tls.close()


def client_verify(trust_env: bool) -> ssl.SSLContext | bool:
    """What an :class:`httpx.Client` with a transport of its own is given as ``verify``: it is used only for the
    proxies the environment names (``trust_env``), so the shared context is made only where there are some."""
    from urllib.request import getproxies  # httpx's own source of them, imported by httpx already

    return shared_ssl_context(trust_env) if trust_env and getproxies() else True


def http_client(
    source: str,
    counts: RetryCounts | None = None,
    *,
    timeout: float | httpx.Timeout = DEFAULT_HTTP_TIMEOUT_S,
    trust_env: bool = False,
    keepalive_expiry_s: float = KEEPALIVE_EXPIRY_S,
    retry: bool = True,
    transport: httpx.BaseTransport | None = None,
) -> httpx.Client:
    """A client for reading ``source`` (``engine``, ``probe``, ``runtime_profile``...): no redirects followed,
    idle connections kept :data:`KEEPALIVE_EXPIRY_S`, a request that met a closing connection sent once more and
    counted under ``source`` in ``counts``.

    ``trust_env``: take proxies and CA files from the environment (httpx's default; the engine's client does not).
    A request sent through an environment proxy gets the expiry, not the retry. ``retry`` False and
    ``keepalive_expiry_s`` are for comparing with httpx's defaults (benchmarks/keepalive_race.py);
    ``transport`` replaces the network transport (the retry still wraps it). TLS: :func:`shared_ssl_context`, made
    at the first ``https://`` request (:class:`TLSOnDemand`).
    """
    limits = httpx.Limits(keepalive_expiry=keepalive_expiry_s)
    inner = transport or TLSOnDemand(limits, trust_env, lambda: shared_ssl_context(trust_env))
    outer = StaleConnectionRetry(inner, source, counts) if retry else inner
    verify = client_verify(trust_env)
    return httpx.Client(
        transport=outer, limits=limits, timeout=timeout, follow_redirects=False, trust_env=trust_env, verify=verify
    )
