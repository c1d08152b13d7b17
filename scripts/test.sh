#!/usr/bin/env bash
# Install everything the test suite needs on a fresh Debian/Ubuntu machine (Python >= 3.10), then run
# lint, types and the whole suite. Safe to re-run: installs are skipped when already present.
set -euo pipefail
cd "$(dirname "$0")/.."
SUDO=""
if [ "$(id -u)" -ne 0 ]; then SUDO="sudo"; fi

need_apt=()
command -v prometheus >/dev/null 2>&1 || need_apt+=(prometheus)
command -v prometheus-alertmanager >/dev/null 2>&1 || need_apt+=(prometheus-alertmanager)
command -v docker-compose >/dev/null 2>&1 || need_apt+=(docker-compose)
python3 -m venv --help >/dev/null 2>&1 || need_apt+=(python3-venv)
command -v g++ >/dev/null 2>&1 || need_apt+=(g++)    # scripts/build-llama-server.sh compiles llama.cpp
command -v make >/dev/null 2>&1 || need_apt+=(make)
command -v objdump >/dev/null 2>&1 || need_apt+=(binutils)  # SIMD code-scan cross-check
command -v gcc >/dev/null 2>&1 || need_apt+=(gcc libc6-dev)  # diag: binary-compatibility test builds a program
command -v ldd >/dev/null 2>&1 || need_apt+=(libc-bin)
if [ ${#need_apt[@]} -gt 0 ]; then
  echo "== installing Debian packages: ${need_apt[*]}"
  $SUDO apt-get update -qq
  DEBIAN_FRONTEND=noninteractive $SUDO apt-get install -y -qq --no-install-recommends "${need_apt[@]}" >/dev/null
fi

if [ ! -x .venv/bin/python ]; then
  echo "== creating .venv"
  python3 -m venv .venv
fi
echo "== installing Python packages"
.venv/bin/python -m pip install -q --disable-pip-version-check -e '.[test]' 2> >(grep -v 'is ignored: it is neither' >&2)

if [ -x scripts/build-llama-server.sh ]; then
  scripts/build-llama-server.sh
fi

echo "== ruff"
.venv/bin/ruff check .
echo "== mypy"
.venv/bin/mypy
echo "== pytest"
.venv/bin/python -m pytest "$@"
