# One image for the agent and the simulator (and the demo's load generator and alert sink).
#   docker build -t inferwatch:0.1.0 .        (docker-compose.yml builds it for you)
# Python 3.11 on Debian 12, pinned to a patch release by tag (not by digest: the official image's tag is rebuilt
# when Debian updates, and no authoritative record of its current digest was at hand). Three stages:
#   build  builds the inferwatch wheel from this checkout (setuptools and wheel from requirements-build.lock), with
#          the exposition reader's C extension (_fastparse) compiled into it: gcc and the C library's headers are
#          installed in this stage only (the image's Python carries its own headers), and the stage fails if the
#          wheel lacks the extension (setup.py builds it optionally, so a machine without a compiler still installs)
#   final  installs the dependencies from requirements.lock (exact versions, sha256-pinned: pip --require-hashes),
#          then that wheel (not editable: runbooks, rules and dashboards come from the installed package), and
#          runs as the unprivileged user inferwatch (10001) with its own HOME and state directory.
# Regenerate the lock files after a dependency change: scripts/lock.sh. `scripts/lock.sh --check` compares them with
# a fresh resolution; it needs PyPI, so no test runs it (run it by hand). tests/test_compose.py checks offline that
# every dependency has a hashed pin that satisfies it.
# Checked without a Docker engine by tests/test_compose.py (the recipe) and tests/test_compose_processes.py.

FROM python:3.11.11-slim-bookworm AS build
ENV PIP_NO_CACHE_DIR=1 \
    PIP_DISABLE_PIP_VERSION_CHECK=1
RUN apt-get update \
    && apt-get install -y --no-install-recommends gcc libc6-dev \
    && rm -rf /var/lib/apt/lists/*
WORKDIR /src
COPY requirements-build.lock ./
RUN pip install --require-hashes --no-deps -r requirements-build.lock
COPY . .
RUN pip wheel --no-deps --no-build-isolation --wheel-dir /wheels .
RUN python -c "import glob, sys, zipfile; names = zipfile.ZipFile(glob.glob('/wheels/inferwatch-*.whl')[0]).namelist(); sys.exit(not any('/_fastparse.' in n and n.endswith('.so') for n in names))"

# phoenix  the compose stack's trace store (arize-phoenix from PyPI, pinned in deploy/phoenix/requirements.txt, the
#          release the tests run), on the same base; built only for the phoenix service (compose: target phoenix)
FROM python:3.11.11-slim-bookworm AS phoenix
ENV PIP_NO_CACHE_DIR=1 \
    PIP_DISABLE_PIP_VERSION_CHECK=1 \
    PYTHONUNBUFFERED=1 \
    PHOENIX_WORKING_DIR=/var/lib/phoenix \
    PHOENIX_TELEMETRY_ENABLED=false
COPY deploy/phoenix/requirements.txt /tmp/phoenix-requirements.txt
RUN pip install -r /tmp/phoenix-requirements.txt && rm /tmp/phoenix-requirements.txt \
    && useradd --system --uid 10002 --user-group --home-dir /var/lib/phoenix --create-home --shell /usr/sbin/nologin phoenix
COPY deploy/healthcheck.py /app/deploy/
USER 10002:10002
VOLUME ["/var/lib/phoenix"]
EXPOSE 6006 4317
ENTRYPOINT ["phoenix"]
CMD ["serve", "--host", "0.0.0.0", "--port", "6006", "--grpc-port", "4317"]

FROM python:3.11.11-slim-bookworm
ENV PYTHONDONTWRITEBYTECODE=1 \
    PYTHONUNBUFFERED=1 \
    PIP_NO_CACHE_DIR=1 \
    PIP_DISABLE_PIP_VERSION_CHECK=1 \
    HOME=/home/inferwatch \
    INFERWATCH_SNAPSHOTS__DIR=/var/lib/inferwatch/snapshots
COPY requirements.lock /tmp/requirements.lock
RUN pip install --require-hashes --no-deps -r /tmp/requirements.lock && rm /tmp/requirements.lock
COPY --from=build /wheels /tmp/wheels
# --no-deps --no-index: nothing but the locked set above; pip check fails the build if the lock misses a dependency.
RUN pip install --no-deps --no-index /tmp/wheels/inferwatch-*.whl && rm -r /tmp/wheels && pip check
# The user's HOME is its own (py-spy and the default state directory write there); /var/lib/inferwatch holds the
# agent's snapshots and profiles (a named volume in docker-compose.yml copies this ownership), /run/inferwatch
# its API tokens (deploy/agent_entrypoint.py).
RUN useradd --system --uid 10001 --user-group --home-dir /home/inferwatch --create-home --shell /usr/sbin/nologin \
        inferwatch \
    && install -d -o 10001 -g 10001 -m 0755 /var/lib/inferwatch /run/inferwatch
# The demo's helpers (compose entrypoint, healthcheck, alert sink, runbook server and the small HTTP base the last two
# share): scripts, not part of the package.
WORKDIR /app
COPY deploy/agent_entrypoint.py deploy/healthcheck.py deploy/alert_sink.py deploy/runbook_server.py deploy/small_http.py /app/deploy/
# The agent and the runtime run as the same user, so with CAP_SYS_PTRACE (docker-compose.yml) the agent can
# read /proc/<pid> of the runtime and profile it with py-spy.
USER 10001:10001
VOLUME ["/var/lib/inferwatch"]
EXPOSE 8000 9435 9436 4317 4318 9099
ENTRYPOINT ["python", "-m", "inferwatch.agent"]
CMD ["run", "--listen-address", "0.0.0.0"]
