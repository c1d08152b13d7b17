#!/usr/bin/env bash
# Install everything the test suite needs on a fresh Debian/Ubuntu machine (Python >= 3.10), then run
# lint, types and the whole suite. Safe to re-run: installs are skipped when already present.
#
#   scripts/test.sh [PYTEST_ARGS...]           in this checkout
#   scripts/test.sh --fresh [PYTEST_ARGS...]   the same in a fresh clone of HEAD with an empty HOME and no pip
#                                              cache (what a new machine sees; run it before you stop)
#
# Each phase's wall time is printed at the end (and written to build/test-phases.txt).
set -euo pipefail
cd "$(dirname "$0")/.."

if [ "${1:-}" = "--fresh" ]; then
  shift
  # A fresh clone on a used machine is not a fresh machine: every cache the scripts use lives under HOME
  # (pip's wheel cache, ~/.cache/inferwatch/llama-avx2) or is named by a variable, so hide them all.
  work="$(mktemp -d "${TMPDIR:-/tmp}/inferwatch-fresh.XXXXXX")"
  chmod 755 "$work"  # mktemp makes it 0700; a checkout's folder is readable, and the compose test runs services as uid 10001
  git clone -q --no-hardlinks . "$work/repo"
  mkdir -p "$work/home"
  # shared/ sits beside the checkout in CI; keep that layout for tests that read it.
  [ -d ../shared ] && ln -s "$(cd ../shared && pwd)" "$work/shared"
  echo "== fresh: clone of $(git rev-parse --short HEAD) in $work/repo, HOME=$work/home, no pip cache"
  set +e
  (
    cd "$work/repo"
    unset XDG_CACHE_HOME PIP_CACHE_DIR UV_CACHE_DIR LLAMA_SERVER LLAMA_SERVER_AVX2 INFERWATCH_LLAMA_CACHE \
      INFERWATCH_LLAMA_AVX2 INFERWATCH_LLAMA_AVX2_DIR VIRTUAL_ENV
    HOME="$work/home" PIP_NO_CACHE_DIR=1 exec bash scripts/test.sh "$@"
  )
  rc=$?
  set -e
  if [ "$rc" -eq 0 ] && [ "${INFERWATCH_FRESH_KEEP:-0}" != "1" ]; then
    rm -rf "$work"
  else
    echo "== fresh: kept $work (exit $rc)"
  fi
  exit "$rc"
fi

SUDO=""
if [ "$(id -u)" -ne 0 ]; then SUDO="sudo"; fi
mkdir -p build
# Bytecode. An image that sets PYTHONDONTWRITEBYTECODE=1 (this one does) makes every Python process the suite starts
# (hundreds of agents, simulators, load generators and CLI runs) compile its whole import graph from source again:
# measured min of 7 starts, `import inferwatch.agent.cli.main, inferwatch.agent.node.app, inferwatch.agent.node.wiring` 1,398 ms of CPU without a cache, 858 ms
# with one; `import inferwatch.simulator.serve` 554 -> 229 ms. Cache it under build/, never beside the sources.
unset PYTHONDONTWRITEBYTECODE
export PYTHONPYCACHEPREFIX="$PWD/build/pycache"
PHASES=build/test-phases.txt
: > "$PHASES"
phase_start=0
phase_name=""
begin() { phase_name="$1"; phase_start=$(date +%s); echo "== $1"; }
end() { printf '%-28s %5d s\n' "$phase_name" "$(( $(date +%s) - phase_start ))" >> "$PHASES"; }
summary() { echo "== phase wall times"; cat "$PHASES"; }
trap summary EXIT

begin "apt"
need_apt=()
command -v prometheus >/dev/null 2>&1 || need_apt+=(prometheus)
command -v prometheus-alertmanager >/dev/null 2>&1 || need_apt+=(prometheus-alertmanager)
command -v docker-compose >/dev/null 2>&1 || need_apt+=(docker-compose)
command -v victoria-metrics >/dev/null 2>&1 || need_apt+=(victoria-metrics)
python3 -c 'import ensurepip, venv' >/dev/null 2>&1 || need_apt+=(python3-venv)  # Debian's python3 has venv but not ensurepip
command -v g++ >/dev/null 2>&1 || need_apt+=(g++)    # scripts/build-llama-server.sh compiles llama.cpp
command -v make >/dev/null 2>&1 || need_apt+=(make)
command -v cmake >/dev/null 2>&1 || need_apt+=(cmake)
command -v objdump >/dev/null 2>&1 || need_apt+=(binutils)  # SIMD code-scan cross-check
command -v gcc >/dev/null 2>&1 || need_apt+=(gcc libc6-dev)  # diag: binary-compatibility test builds a program
# the exposition reader's C extension (agent/node/engine/_fastparse.c; pip builds it with the venv below): Python.h
python3 -c 'import os, sysconfig, sys; sys.exit(not os.path.isfile(os.path.join(sysconfig.get_paths()["include"], "Python.h")))' ||
  need_apt+=(python3-dev)
command -v ldd >/dev/null 2>&1 || need_apt+=(libc-bin)
command -v unshare >/dev/null 2>&1 || need_apt+=(util-linux)  # compose test: services in a private netns
command -v ip >/dev/null 2>&1 || need_apt+=(iproute2)
command -v kubectl >/dev/null 2>&1 || need_apt+=(kubernetes-client)
command -v chromium >/dev/null 2>&1 || need_apt+=(chromium)  # status page test: headless Chromium through Selenium
command -v chromedriver >/dev/null 2>&1 || need_apt+=(chromium-driver)
command -v tmux >/dev/null 2>&1 || need_apt+=(tmux)  # `inferwatch top` test: a terminal a person would use
command -v haproxy >/dev/null 2>&1 || need_apt+=(haproxy)  # readiness test: a real load balancer ejects a hung replica
command -v openssl >/dev/null 2>&1 || need_apt+=(openssl)  # TLS test: a self-signed server certificate
if [ ${#need_apt[@]} -gt 0 ]; then
  echo "   installing Debian packages: ${need_apt[*]}"
  $SUDO apt-get update -qq
  DEBIAN_FRONTEND=noninteractive $SUDO apt-get install -y -qq --no-install-recommends "${need_apt[@]}" >/dev/null
fi
end

begin "venv + Python packages"
# The packages go in with uv (pinned, from PyPI): the same resolution as pip's, in 8 s from its cache and ~20 s
# without one, where pip took 55-85 s for the same set (a CI run makes a new .venv in its fresh clone every time).
# uv keeps its cache in ~/.cache/uv, which `--fresh` hides with the rest of HOME.
UV_VERSION=0.13.9
[ -x .venv/bin/python ] || python3 -m venv .venv
.venv/bin/uv --version 2>/dev/null | grep -qx "uv $UV_VERSION" ||
  .venv/bin/python -m pip install -q --disable-pip-version-check "uv==$UV_VERSION" 2> >(grep -v 'is ignored: it is neither' >&2)
.venv/bin/uv pip install -q --python .venv/bin/python -e '.[test]'
end

# checkov pins packaging 23.x, which pytest and build refuse, so it has a venv of its own (tests/test_kubernetes.py
# finds it at .venv-tools/bin/checkov).
begin "checkov (.venv-tools)"
[ -x .venv-tools/bin/python ] || python3 -m venv .venv-tools
.venv/bin/uv pip install -q --python .venv-tools/bin/python 'checkov==3.3.30'
end

# arize-phoenix (the compose stack's trace store, Elastic-2.0) is ~650 MB of dependencies with pins of its own, kept
# out of the agent's: a venv of its own (tests/test_trace_store.py finds it at .venv-phoenix/bin/phoenix).
begin "arize-phoenix (.venv-phoenix)"
[ -x .venv-phoenix/bin/python ] || python3 -m venv .venv-phoenix
.venv/bin/uv pip install -q --python .venv-phoenix/bin/python -r deploy/phoenix/requirements.txt
end

if [ -x scripts/build-llama-server.sh ]; then
  # The script records each build's wall time in build/llama-build-times.txt.
  begin "llama.cpp server"
  : > build/llama-build-times.txt
  scripts/build-llama-server.sh
  end
  [ -f build/llama-build-times.txt ] && sed 's/^/  /' build/llama-build-times.txt >> "$PHASES"
fi

begin "ruff"
.venv/bin/ruff check .
.venv/bin/ruff format --check .
end
begin "mypy"
.venv/bin/mypy
end
begin "import contract"
.venv/bin/lint-imports
end
begin "pytest"
# Six workers (two cores: the long files mostly wait), each running whole files (module fixtures start their
# servers once), slow files first and longest
# first by their measured wall time (tests/file-costs.json), at most two cpu_heavy files at a time
# (tests/scheduling.py): the long files mostly wait out real timings (a for:, a window, Alertmanager's group_wait)
# at a fraction of a core, so they overlap. INFERWATCH_TEST_WORKERS=0 runs one process; arguments after the
# script's name go to pytest as they are.
INFERWATCH_TEST_HEAVY_SLOTS="${INFERWATCH_TEST_HEAVY_SLOTS:-2}" \
  .venv/bin/python -m pytest -n "${INFERWATCH_TEST_WORKERS:-6}" --dist loadfile --no-loadscope-reorder "$@"
end
