"""What the agent process leaves unimported: modules it never runs cost RSS in every node's agent.

Each check runs in a fresh interpreter (this one has imported the test suite's own dependencies).
"""

from __future__ import annotations

import os
import subprocess
from pathlib import Path

import pytest

from tests.conftest import PYTHON, ROOT, free_port


def _modules_after(code: str) -> set[str]:
    """Modules imported after `code` in a fresh interpreter (a None entry in sys.modules is a blocked import)."""
    script = f"import sys\n{code}\nprint('\\n'.join(sorted(k for k, m in sys.modules.items() if m is not None)))"
    out = subprocess.run([PYTHON, "-c", script], cwd=ROOT, capture_output=True, text=True, timeout=120, check=True)
    return set(out.stdout.split())


def test_the_agent_imports_jsonschema_only_for_the_probe() -> None:
    assert "jsonschema" not in _modules_after("import inferwatch.agent.node.app")
    first_probe = "from inferwatch.agent.node.probe.schema import validate_payload\nvalidate_payload('openai', {}, 0)"
    assert "jsonschema" in _modules_after(first_probe)


def test_a_probe_of_a_well_formed_runtime_does_not_import_jsonschema() -> None:
    # The fake runtime's clean streams in both protocols pass schema.plain(); its usage_only pitfall reaches jsonschema.
    code = (
        "from inferwatch.agent.node.probe import run_probe\nfrom tests.fake_runtime import fake_runtime\n"
        "with fake_runtime() as rt:\n    rt.stream_mode = '{mode}'\n"
        "    for protocol in ('openai', 'anthropic'):\n"
        "        r = run_probe(rt.url, protocol, timeout_s=10)\n"
        "        assert r.events > 3 and bool(r.violations) == ('{mode}' != 'ok'), r.as_dict()"
    )
    clean = _modules_after(code.format(mode="ok"))
    assert "inferwatch.agent.node.probe.client" in clean and "jsonschema" not in clean
    assert "jsonschema" in _modules_after(code.format(mode="usage_only"))


# What uvicorn's package __init__ imports for its command line (click) and its reloader and workers (multiprocessing),
# which the agent never runs: cli/serve.py's defer_uvicorn_package_init leaves them out.
UVICORN_CLI = ("uvicorn.main", "click", "uvicorn.supervisors", "multiprocessing")


def test_uvicorn_names_read_the_same_with_its_package_init_deferred() -> None:
    code = (
        "from inferwatch.agent.cli.serve import defer_uvicorn_package_init\nassert defer_uvicorn_package_init()\n"
        "import uvicorn, uvicorn.config, uvicorn.server\n"
        "assert uvicorn.Config is uvicorn.config.Config and uvicorn.Server is uvicorn.server.Server\n"
        "from inferwatch.agent.node import quietserver\nassert 'uvicorn.main' not in sys.modules\n"
        "assert uvicorn.run is sys.modules['uvicorn.main'].run and uvicorn.__version__ and callable(uvicorn.main)\n"
        "print('read', uvicorn.__version__)"
    )
    assert {"uvicorn.main", "click"} <= _modules_after(code)  # asked for run: the real __init__ ran
    # a process that imported uvicorn first keeps it as it is
    first = "import uvicorn\nfrom inferwatch.agent.cli.serve import defer_uvicorn_package_init\n"
    assert "click" in _modules_after(first + "assert not defer_uvicorn_package_init()")


def test_a_served_agent_does_not_import_trio_through_httpcore() -> None:
    # trio comes with selenium, which the test command installs: without it this check would say nothing.
    assert "trio" in _modules_after("import trio"), "trio is not installed: the test command's selenium brings it"
    # What serve() does before it builds the agent, then the agent's first HTTP client.
    code = (
        "from inferwatch.agent.cli.serve import block_unused_imports\n"
        "block_unused_imports()\nimport httpx\nhttpx.Client()"
    )
    mods = _modules_after(code)
    assert "httpcore._synchronization" in mods and "trio" not in mods
    # Without the block the same client imports it: the check above is not vacuous.
    assert "trio" in _modules_after("import httpx\nhttpx.Client()")


def test_inferwatch_run_imports_its_own_command_module_only() -> None:
    # The CLI imports a command's module when that command runs: `inferwatch run` loads cli/run.py (and
    # cli/common.py), not the other commands' modules and what they import (~2 MB of every agent).
    def after(*argv: str) -> set[str]:
        code = (
            "from inferwatch.agent.cli.main import main\n"
            f"sys.argv = ['inferwatch', *{list(argv)!r}]\n"
            "try:\n    main()\nexcept SystemExit:\n    pass"
        )
        return {m for m in _modules_after(code) if m.startswith("inferwatch.agent.cli.")}

    commands = {
        "inferwatch.agent.cli.run",
        "inferwatch.agent.cli.common",
        "inferwatch.agent.cli.main",
        "inferwatch.agent.cli.serve",
    }
    assert after("run", "--help") == commands
    # The listing loads every command (its help line is the command's docstring): the check above is not vacuous.
    listed = after("--help")
    assert {"inferwatch.agent.cli.engine", "inferwatch.agent.cli.matrix", "inferwatch.agent.cli.top"} <= listed


# What the agent's modules import only where the feature that needs it is on: psutil by the runtime locator when a
# runtime is configured (or an engine port to look at), PyYAML by a config file's, a discovery file's or the shipped
# rules' read (the Alertmanager push). docs/benchmarks.md, "Where the megabytes go".
PSUTIL = ("psutil",)
YAML = ("yaml",)
ON_DEMAND_MODULES = (
    "inferwatch.agent.config",
    "inferwatch.agent.node.host.runtime",
    "inferwatch.agent.node.collectors.process",
    "inferwatch.agent.node.actions.pyspy",
    "inferwatch.agent.node.discovery.filesd",
    "inferwatch.agent.node.actions.alertpush",
)


def test_psutil_and_yaml_are_imported_on_use_only() -> None:
    imports = "import " + ", ".join(ON_DEMAND_MODULES)
    mods = _modules_after(imports)
    assert set(ON_DEMAND_MODULES) <= mods
    assert not mods & {*PSUTIL, *YAML}, sorted(mods & {*PSUTIL, *YAML})
    # Their first use imports them: a runtime configured (the pattern matches nothing), a config file read.
    use = (
        f"{imports}\nfrom pathlib import Path\nimport tempfile\n"
        "from inferwatch.agent.config import RuntimeSettings, read_yaml\n"
        "from inferwatch.agent.errors import NoDataError\n"
        "from inferwatch.agent.node.host.runtime import RuntimeLocator\n"
        "loc = RuntimeLocator(RuntimeSettings(cmdline_pattern='no-such-runtime-x9'))\n"
        "try:\n    loc.find()\nexcept NoDataError:\n    pass\n"
        "f = Path(tempfile.mkdtemp()) / 'c.yaml'\nf.write_text('interval_s: 1')\nread_yaml(f)"
    )
    assert {*PSUTIL, *YAML} <= _modules_after(use)


# `python -m inferwatch.agent run ARGS` as benchmarks/import_cost.py starts it, with this sitecustomize.py on
# PYTHONPATH: in the interpreter that serves (the one the command execs after its command line, agent/cli/serve.py)
# a thread waits for the agent to be ready (/readyz: every collector has run once), asks for /metrics and the status
# page, then writes the modules it holds to $IW_SERVED_OUT and stops it. The command's own interpreter runs none of
# it.
_SERVED = """
import os, sys
if "--settings-fd" in sys.argv and os.environ.get("IW_SERVED_OUT"):
    import signal, threading, time, urllib.request

    def _watch():
        base = "http://127.0.0.1:" + os.environ["IW_SERVED_PORT"]
        deadline = time.monotonic() + 90
        while True:
            try:
                if urllib.request.urlopen(base + "/readyz", timeout=5).status == 200:
                    break
            except OSError:
                if time.monotonic() > deadline:
                    os._exit(3)
                time.sleep(0.2)
        for path in ("/metrics", "/", "/metrics"):
            urllib.request.urlopen(base + path, timeout=30).read()
        with open(os.environ["IW_SERVED_OUT"], "w") as f:
            f.write("\\n".join(sorted(k for k, m in sys.modules.items() if m is not None)))
        os.kill(os.getpid(), signal.SIGTERM)

    threading.Thread(target=_watch, daemon=True).start()
"""
# What only a switched-on HTTP source (engine, probe, runtime profile, Kubernetes discovery, Alertmanager push) uses.
HTTP_ONLY = ("httpx", "httpcore", "inferwatch.agent.common.httpclient")


def _served_modules(tmp_path: Path, *args: str, env: dict[str, str] | None = None) -> set[str]:
    out, port = tmp_path / "modules.txt", str(free_port())
    site = tmp_path / "site"
    site.mkdir(exist_ok=True)
    (site / "sitecustomize.py").write_text(_SERVED)
    # the benchmark's environment: no INFERWATCH_* of the caller's; HOME here, so nothing is written to the real one
    clean = {k: v for k, v in os.environ.items() if not k.startswith("INFERWATCH_")}
    clean |= {"HOME": str(tmp_path), "PYTHONPATH": str(site), "IW_SERVED_OUT": str(out), "IW_SERVED_PORT": port}
    clean |= env or {}
    cmd = [PYTHON, "-m", "inferwatch.agent", "run", "--port", port, *args]
    proc = subprocess.run(cmd, cwd=tmp_path, env=clean, capture_output=True, text=True, timeout=150)
    assert out.exists(), f"the agent did not serve (exit {proc.returncode}): {proc.stderr[-2000:]}"
    return set(out.read_text().split())


# What a default agent (no config file, no runtime, no HTTP source) never loads: the other commands' modules, the
# HTTP client, psutil and PyYAML, and no agent loads pydantic: the settings are msgspec structs, their environment
# source the agent's own (docs/benchmarks.md, "Where the megabytes go").
OTHER_COMMANDS = ("inferwatch.agent.cli.engine", "inferwatch.agent.cli.explain", "inferwatch.agent.cli.top")
# importlib.metadata: reads every installed distribution's metadata (pydantic's plugin loader did, at start).
PYDANTIC = ("pydantic", "pydantic_core", "pydantic_settings")
# The command line: `inferwatch run` serves in a fresh interpreter without it (agent/cli/serve.py)
COMMAND_LINE = ("typer", "click", *(f"inferwatch.agent.cli.{m}" for m in ("main", "run", "common")))
NOT_IN_A_DEFAULT_AGENT = (
    *COMMAND_LINE,
    *HTTP_ONLY,
    *PSUTIL,
    *YAML,
    *OTHER_COMMANDS,
    *UVICORN_CLI,
    *PYDANTIC,
    "importlib.metadata",
)


def _nvml_library_loads() -> bool:
    import ctypes

    try:
        ctypes.CDLL("libnvidia-ml.so.1")
    except OSError:
        return False
    return True


def test_the_settings_load_no_pydantic() -> None:
    # Settings converted from a config's values, an error in them included, in a plain interpreter: msgspec only.
    mods = _modules_after(
        "from inferwatch.agent.config import Settings\n"
        "Settings.from_values({'engine': {'metrics_url': 'http://e:8000/metrics'}, 'collectors': {'cpu': {}}})\n"
        "try:\n    Settings.from_values({'engine': {'max_series': 0}})\nexcept Exception:\n    pass"
    )
    assert "msgspec" in mods and not mods & set(PYDANTIC), sorted(mods & set(PYDANTIC))


@pytest.mark.integration
def test_a_default_agent_imports_only_what_it_runs(tmp_path: Path) -> None:
    # No engine URL, probe, runtime profile, discovery or Alertmanager: httpx is never loaded (1.7 MB of a default
    # agent's install, more with a client and its TLS context); no runtime configured: no psutil; no config file: no
    # PyYAML; of the CLI, the run command's module only; settings without pydantic.
    mods = _served_modules(tmp_path)
    assert "inferwatch.agent.node.collectors.engine" in mods  # the engine collector is built (and reports no URL)
    assert {"inferwatch.agent.node.host.runtime", "inferwatch.agent.node.discovery.filesd"} <= mods
    assert not mods & set(NOT_IN_A_DEFAULT_AGENT), sorted(mods & set(NOT_IN_A_DEFAULT_AGENT))
    assert ("pynvml" in mods) == _nvml_library_loads()  # the GPU collector imports it where a driver is


@pytest.mark.integration
def test_an_agent_with_an_engine_a_runtime_and_a_config_file_imports_them(tmp_path: Path) -> None:
    # The same wrapper sees httpx and psutil once what uses them is on: the check above is not vacuous.
    # Nothing listens on the engine's port (the first collection makes the client and fails to connect); no process
    # matches the runtime's pattern (the locator looks with psutil and finds none).
    url = f"http://127.0.0.1:{free_port()}/metrics"
    config = tmp_path / "inferwatch.yaml"
    config.write_text("runtime:\n  cmdline_pattern: no-such-runtime-x9\n")
    env = {"INFERWATCH_ENGINE__METRICS_URL": url}
    mods = _served_modules(tmp_path, "--interval", "1", "--config", str(config), env=env)
    wanted = {*HTTP_ONLY, *PSUTIL}
    assert wanted <= mods, sorted(wanted - mods)
    # the config file was read by the command, which hands the agent its settings: PyYAML stays out of the agent
    assert not mods & set(YAML)


# What the SDK's OTLP/HTTP exporters load with their own transport (a requests session): requests, urllib3 (here
# urllib3-future, with its HTTP/2 stack jh2) and charset_normalizer, 7.5 MB; the agent gives them an httpx transport
# (exporters/otlp_http.py; docs/benchmarks.md, "Where everything-on's megabytes go").
REQUESTS_STACK = ("requests", "urllib3", "charset_normalizer", "jh2")
_HTTP_EXPORTERS = (
    "import os\nos.environ['OTEL_EXPORTER_OTLP_PROTOCOL'] = 'http/protobuf'\n"
    "os.environ['OTEL_EXPORTER_OTLP_ENDPOINT'] = 'http://127.0.0.1:9'\n"
    "from inferwatch.exporters.otlp import make_exporter\n"
    "from inferwatch.exporters.otlp_logs import make_log_exporter\n"
)


def test_otlp_http_export_loads_no_requests_stack() -> None:
    code = (
        f"{_HTTP_EXPORTERS}from inferwatch.exporters.otlp_http import HttpxTransport\n"
        "metrics, logs = make_exporter(), make_log_exporter()\n"
        "assert isinstance(metrics._client._transport, HttpxTransport), metrics._client._transport\n"
        "assert isinstance(logs._client._transport, HttpxTransport), logs._client._transport\n"
    )
    mods = _modules_after(code)
    assert "httpx" in mods and not mods & set(REQUESTS_STACK), sorted(mods & set(REQUESTS_STACK))
    # The SDK's exporter built without it loads them: the check above is not vacuous.
    sdk = (
        f"{_HTTP_EXPORTERS}from opentelemetry.exporter.otlp.proto.http.metric_exporter import OTLPMetricExporter\n"
        "OTLPMetricExporter()"
    )
    assert set(REQUESTS_STACK) <= _modules_after(sdk)


def test_otlp_http_transport_reads_the_sdk_tls_variables(tmp_path: Path) -> None:
    from inferwatch.agent.errors import ConfigError
    from inferwatch.exporters import otlp_http

    # A credential provider is a requests session by definition: the SDK builds its own transport then.
    assert otlp_http.transport("METRICS", {"OTEL_PYTHON_EXPORTER_OTLP_HTTP_METRICS_CREDENTIAL_PROVIDER": "x"}) is None
    # The CA file is read (a file that is not a certificate bundle fails as it does with requests' verify).
    bad = tmp_path / "ca.pem"
    bad.write_text("not a certificate\n")
    with pytest.raises(ConfigError, match="certificate or key files"):
        otlp_http.transport("LOGS", {"OTEL_EXPORTER_OTLP_LOGS_CERTIFICATE": str(bad)})
    import certifi

    ok = otlp_http.transport("LOGS", {"OTEL_EXPORTER_OTLP_CERTIFICATE": certifi.where()})
    assert ok is not None
    ok.close()


# A receiver with both endpoints (the default) whose engine sends OTLP/HTTP: grpcio is never loaded (~12 MB with its
# server's threads); the first gRPC connection loads it and is served (agent/node/receiver/grpc_server.py).
_RECEIVER = """
import sys, threading, time, urllib.request
from inferwatch.agent.config import ReceiverSettings
from inferwatch.agent.node.analytics.latency import LatencyAnalytics
from inferwatch.agent.node.receiver import Receiver
from benchmarks.span_intake import payload as raw_request
settings = ReceiverSettings(enabled=True, grpc_endpoint="127.0.0.1:0", http_endpoint="127.0.0.1:0")
r = Receiver(settings, LatencyAnalytics())
r.start()
def count(transport):
    want = (("transport", transport),)
    return sum(s.value for s in r.samples() if s.name == "inferwatch.receiver.requests" and s.attributes == want)
req = urllib.request.Request(f"http://127.0.0.1:{r.http_port}/v1/traces", data=raw_request(3),
                             headers={"Content-Type": "application/x-protobuf"})
assert urllib.request.urlopen(req, timeout=10).status == 200
assert count("http") == 3, [s for s in r.samples() if s.name == "inferwatch.receiver.requests"]
print("before_grpc", "grpc" in sys.modules, flush=True)
import grpc
with grpc.insecure_channel(f"127.0.0.1:{r.grpc_port}") as channel:  # the first connection: relayed to the server
    export = channel.unary_unary("/opentelemetry.proto.collector.trace.v1.TraceService/Export")
    for _ in range(3):
        export(raw_request(2), timeout=10)
with grpc.insecure_channel(f"127.0.0.1:{r.grpc_port}") as channel:  # a later one: the server itself
    channel.unary_unary("/opentelemetry.proto.collector.trace.v1.TraceService/Export")(raw_request(2), timeout=10)
assert count("grpc") == 8, count("grpc")  # 3 exports of 2 requests relayed, 1 of 2 served directly
t0 = time.monotonic()
r.stop()
assert time.monotonic() - t0 < 10
left = lambda: sorted(t.name for t in threading.enumerate() if t.name.startswith("otlp-grpc"))
while left() and time.monotonic() - t0 < 10:  # the worker pool is shut down without waiting
    time.sleep(0.05)
print("threads_left", left())
"""


def test_the_grpc_receiver_loads_grpcio_at_its_first_connection_only() -> None:
    out = subprocess.run([PYTHON, "-c", _RECEIVER], cwd=ROOT, capture_output=True, text=True, timeout=120)
    assert out.returncode == 0, out.stderr[-3000:]
    assert "before_grpc False" in out.stdout  # spans over HTTP, gRPC endpoint open: grpcio not loaded
    assert "threads_left []" in out.stdout


def test_an_agent_receiving_otlp_http_does_not_load_grpcio(tmp_path: Path) -> None:
    env = {
        "INFERWATCH_RECEIVER__ENABLED": "true",
        "INFERWATCH_RECEIVER__GRPC_ENDPOINT": f"127.0.0.1:{free_port()}",
        "INFERWATCH_RECEIVER__HTTP_ENDPOINT": f"127.0.0.1:{free_port()}",
    }
    mods = _served_modules(tmp_path, env=env)
    assert "inferwatch.agent.node.receiver.grpc_server" in mods and "grpc" not in mods
    # the OTLP/HTTP receiver's server (uvicorn.Config, uvicorn.Server) leaves uvicorn's command line out too
    assert "inferwatch.agent.node.receiver.http_server" in mods and not mods & set(UVICORN_CLI)


def test_otlp_http_transport_shares_the_agents_tls_context(monkeypatch: pytest.MonkeyPatch) -> None:
    # Each TLS context made parses certifi's bundle (~1.2 MB): the exporter's transport takes the one the probe's
    # client (trust_env) holds, unless a CA or client certificate of its own is configured.
    import ssl

    from inferwatch.agent.common import httpclient
    from inferwatch.exporters import otlp_http

    made: list[object] = []
    real = ssl.create_default_context

    def counting(*args: object, **kwargs: object) -> ssl.SSLContext:
        made.append(args or kwargs)
        return real(*args, **kwargs)  # type: ignore[arg-type]

    monkeypatch.setattr(ssl, "create_default_context", counting)
    monkeypatch.setattr(httpclient, "_SSL_CONTEXTS", {})
    monkeypatch.delenv("HTTPS_PROXY", raising=False)
    monkeypatch.delenv("https_proxy", raising=False)
    probe = httpclient.http_client("probe", trust_env=True)
    first = otlp_http.transport("METRICS", {})
    second = otlp_http.transport("LOGS", {})
    assert first is not None and second is not None
    assert made == []  # none until a request goes to an https:// URL
    probe._transport._inner.secure()  # type: ignore[attr-defined]  # as the first https:// request makes it
    for t in (first, second):
        t._client._transport.secure()  # type: ignore[attr-defined]
    assert len(made) == 1, made  # the probe's; none for either exporter
    for t in (first, second):
        t.close()
    probe.close()


def test_clients_that_read_the_same_ca_certificates_share_one_context(
    monkeypatch: pytest.MonkeyPatch, tmp_path: Path
) -> None:
    # The engine's client does not trust the environment, the probe's does: with no SSL_CERT_FILE/SSL_CERT_DIR both
    # read certifi's bundle, and one parse of it (~1.1 MB) serves both; a CA file in the environment is its own.
    import ssl

    import certifi

    from inferwatch.agent.common import httpclient

    monkeypatch.delenv("SSL_CERT_FILE", raising=False)
    monkeypatch.delenv("SSL_CERT_DIR", raising=False)
    monkeypatch.setattr(httpclient, "_SSL_CONTEXTS", {})
    assert httpclient.shared_ssl_context(False) is httpclient.shared_ssl_context(True)
    assert len(httpclient._SSL_CONTEXTS) == 1
    ca = tmp_path / "ca.pem"
    ca.write_text(
        Path(certifi.where()).read_text()[:200_000].rsplit("-----END CERTIFICATE-----", 1)[0]
        + "-----END CERTIFICATE-----\n"
    )
    monkeypatch.setenv("SSL_CERT_FILE", str(ca))
    own = httpclient.shared_ssl_context(True)
    assert own is not httpclient.shared_ssl_context(False) and isinstance(own, ssl.SSLContext)
    assert own.cert_store_stats()["x509_ca"] < httpclient.shared_ssl_context(False).cert_store_stats()["x509_ca"]
