#!/usr/bin/env bash
# Install inferwatch into .venv and run `inferwatch demo`: the vLLM-compatible simulator, a load generator and
# the agent on 127.0.0.1 (agent http://127.0.0.1:9435/metrics) until Ctrl-C. Arguments go to `inferwatch demo`.
set -euo pipefail
cd "$(dirname "$0")/.."
if [ ! -x .venv/bin/python ]; then
  # Stock Debian/Ubuntu ship python3 without ensurepip (it is in python3-venv), so `python3 -m venv` fails there
  # even though `python3 -m venv --help` works: check ensurepip too, and install python3-venv as scripts/test.sh does.
  if ! python3 -c 'import ensurepip, venv' >/dev/null 2>&1; then
    SUDO=""
    if [ "$(id -u)" -ne 0 ]; then SUDO="sudo"; fi
    echo "== installing python3-venv (python3 -m venv is not available)"
    $SUDO apt-get update -qq
    DEBIAN_FRONTEND=noninteractive $SUDO apt-get install -y -qq --no-install-recommends python3-venv >/dev/null
  fi
  echo "== creating the virtual environment .venv ($(python3 --version 2>&1))"
  python3 -m venv .venv
fi
# The exposition reader's C extension (agent/node/engine/_fastparse.c) is built by pip below where a C compiler and
# the Python headers are there; without them pip says so and inferwatch reads in pure Python (same results, about
# half the speed). On Debian/Ubuntu they are gcc and python3-dev: installed here when missing and apt-get can.
need_build=()
command -v gcc >/dev/null 2>&1 || need_build+=(gcc libc6-dev)
.venv/bin/python -c 'import os, sysconfig, sys; sys.exit(not os.path.isfile(os.path.join(sysconfig.get_paths()["include"], "Python.h")))' ||
  need_build+=(python3-dev)
if [ ${#need_build[@]} -gt 0 ] && command -v apt-get >/dev/null 2>&1; then
  SUDO=""
  if [ "$(id -u)" -ne 0 ]; then SUDO="sudo"; fi
  echo "== installing ${need_build[*]} (to build the exposition reader's C extension)"
  { $SUDO apt-get update -qq &&
    DEBIAN_FRONTEND=noninteractive $SUDO apt-get install -y -qq --no-install-recommends "${need_build[@]}" >/dev/null; } ||
    echo "== could not install ${need_build[*]}: inferwatch reads expositions in pure Python"
fi
# pip -q prints nothing while it works (~30 s when the dependencies are there already, a few minutes the first time):
# say what runs, and how long it took.
echo "== installing inferwatch and its dependencies into .venv (pip install -e .; the first time takes a few minutes)"
start=$(date +%s)
.venv/bin/python -m pip install -q --disable-pip-version-check -e .
echo "== installed inferwatch $(.venv/bin/inferwatch version) in $(($(date +%s) - start)) s"
echo "== starting inferwatch demo: the simulator, the load generator and the agent (Ctrl-C stops them)"
exec .venv/bin/inferwatch demo "$@"
