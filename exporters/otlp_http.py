"""OTLP/HTTP exports on httpx: the transport the agent gives the SDK's HTTP metric and log exporters.

The SDK's own transport is a ``requests`` session, whose import and first session load requests, urllib3 (here
urllib3-future with its HTTP/2 stack), charset_normalizer and idna: 7.5 MB of RSS in an agent that already carries
httpx for its engine and probe clients (docs/benchmarks.md, "Where everything-on's megabytes go"). This transport
sends the same requests with httpx: POST, no redirects followed, the SDK's timeout per attempt; the SDK keeps its
retries, backoff, compression and headers (``_OTLPHTTPClient``). TLS as the SDK reads it: the signal's
``OTEL_EXPORTER_OTLP_<SIGNAL>_CERTIFICATE`` (else ``OTEL_EXPORTER_OTLP_CERTIFICATE``) is the CA file to verify with
(else httpx's default, certifi's bundle, as requests'), a client certificate and key from the ``..._CLIENT_CERTIFICATE``
and ``..._CLIENT_KEY`` variables; proxies from the environment (``HTTPS_PROXY``, ``NO_PROXY``), as requests reads
them. Where a credential provider is configured (``OTEL_PYTHON_EXPORTER_OTLP_HTTP_<SIGNAL>_CREDENTIAL_PROVIDER``,
a ``requests.Session`` by definition), :func:`transport` returns None and the SDK builds its own. A CA, certificate
or key file that cannot be read is a :class:`~inferwatch.agent.errors.ConfigError` at start (with requests, every
export failed).
"""

from __future__ import annotations

import os
from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any

from opentelemetry.exporter.http.transport._base import BaseHTTPResult, BaseHTTPTransport

from inferwatch.agent.errors import ConfigError

if TYPE_CHECKING:
    import httpx


@dataclass(frozen=True, slots=True)
class HttpxResult(BaseHTTPResult):
    response: httpx.Response | None = field(default=None, hash=False, compare=False)

    def content(self) -> bytes:
        return self.response.content if self.response is not None else b""

    def headers(self) -> Mapping[str, str]:
        return self.response.headers if self.response is not None else {}


class HttpxTransport(BaseHTTPTransport):
    """One ``httpx.Client`` (kept-alive connections) for one exporter."""

    def __init__(self, *, cafile: str | None = None, cert: str | tuple[str, str] | None = None) -> None:
        import ssl

        import httpx

        from inferwatch.agent.common.httpclient import TLSOnDemand, client_verify, shared_ssl_context

        if cafile is not None or cert is not None:
            if cafile is None:
                import certifi

                cafile = certifi.where()
            context = ssl.create_default_context(cafile=cafile)
            if cert is not None:
                context.load_cert_chain(*((cert,) if isinstance(cert, str) else cert))
            self._client = httpx.Client(verify=context, follow_redirects=False, trust_env=True)
        else:
            # httpx's default context (certifi's bundle, as requests'; SSL_CERT_FILE from the environment), the one
            # the probe's client holds: each context made parses the bundle again (~1.1 MB); made at the first
            # https:// export, none for an http:// endpoint
            limits = httpx.Limits()
            plain_or_tls = TLSOnDemand(limits, True, lambda: shared_ssl_context(trust_env=True))
            self._client = httpx.Client(
                transport=plain_or_tls, verify=client_verify(True), follow_redirects=False, trust_env=True
            )
        self._errors = (httpx.TransportError,)

    def request(
        self,
        method: str,
        url: str,
        *,
        headers: dict[str, str] | None = None,
        timeout: float | None = None,
        data: bytes | None = None,
    ) -> BaseHTTPResult:
        try:
            response = self._client.request(method, url, headers=headers, content=data, timeout=timeout)
        except Exception as error:  # the SDK's client decides what is retried (is_connection_error)
            return HttpxResult(error=error)
        return HttpxResult(status_code=response.status_code, reason=response.reason_phrase, response=response)

    def is_connection_error(self, exception: Exception | None) -> bool:
        return isinstance(exception, self._errors)

    def close(self) -> None:
        self._client.close()


def transport(signal: str, environ: Mapping[str, str] | None = None) -> HttpxTransport | None:
    """The transport for ``signal`` (``METRICS``, ``LOGS``) with the SDK's TLS variables; None where a credential
    provider (a requests session) is configured, so the SDK builds its own."""
    env: Mapping[str, Any] = os.environ if environ is None else environ
    if env.get(f"OTEL_PYTHON_EXPORTER_OTLP_HTTP_{signal}_CREDENTIAL_PROVIDER"):
        return None

    def read(name: str) -> str | None:
        return env.get(f"OTEL_EXPORTER_OTLP_{signal}_{name}") or env.get(f"OTEL_EXPORTER_OTLP_{name}") or None

    key, certificate = read("CLIENT_KEY"), read("CLIENT_CERTIFICATE")
    cert = (certificate, key) if certificate and key else certificate
    try:
        return HttpxTransport(cafile=read("CERTIFICATE"), cert=cert)
    except (OSError, ValueError) as exc:  # ssl.SSLError is an OSError: a file missing or not PEM
        raise ConfigError(f"OTLP/HTTP {signal.lower()} export: certificate or key files: {exc}") from None
