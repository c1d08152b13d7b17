#!/usr/bin/env bash
# Install inferwatch into .venv and run the agent on this host (http://127.0.0.1:9435/metrics).
set -euo pipefail
cd "$(dirname "$0")/.."
if [ ! -x .venv/bin/python ]; then python3 -m venv .venv; fi
.venv/bin/python -m pip install -q --disable-pip-version-check -e .
exec .venv/bin/inferwatch run "$@"
