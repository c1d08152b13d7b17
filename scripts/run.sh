#!/usr/bin/env bash
# Install inferwatch into .venv and run `inferwatch demo`: the vLLM-compatible simulator, a load generator and
# the agent on 127.0.0.1 (agent http://127.0.0.1:9435/metrics) until Ctrl-C. Arguments go to `inferwatch demo`.
set -euo pipefail
cd "$(dirname "$0")/.."
if [ ! -x .venv/bin/python ]; then python3 -m venv .venv; fi
.venv/bin/python -m pip install -q --disable-pip-version-check -e .
exec .venv/bin/inferwatch demo "$@"
