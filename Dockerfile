# One image for the agent and the simulator (and the demo's load generator and alert sink).
#   docker build -t inferwatch:0.1.0 .        (docker-compose.yml builds it for you)
# Python 3.11 on Debian 12, pinned to a patch release; dependencies as declared in pyproject.toml.
FROM python:3.11.11-slim-bookworm

ENV PYTHONDONTWRITEBYTECODE=1 \
    PYTHONUNBUFFERED=1 \
    PIP_NO_CACHE_DIR=1 \
    PIP_DISABLE_PIP_VERSION_CHECK=1

WORKDIR /app
COPY . /app
# Editable install: runbooks/ and dashboards/json stay next to the code, where the agent looks for them.
RUN pip install -e . \
    && useradd --system --uid 10001 --home-dir /app --shell /usr/sbin/nologin inferwatch
# The agent and the runtime run as the same user, so with CAP_SYS_PTRACE (docker-compose.yml) the agent can
# read /proc/<pid> of the runtime and profile it with py-spy.
USER 10001
EXPOSE 8000 9435 4317 4318 9099
ENTRYPOINT ["python", "-m", "agent"]
CMD ["run", "--listen-address", "0.0.0.0"]
