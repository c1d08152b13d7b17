"""The agent container's entrypoint (docker-compose.yml): make sure the API tokens exist, then exec the agent.

The agent listens on 0.0.0.0 in the stack, and it refuses to do that without an API token (agent/config/settings.py).
This script keeps three files in DIR, a named volume (``inferwatch-token``), before it becomes the agent:

  DIR/token           the operator's token, scopes read,snapshots,profile,evidence, mode 0600 (the agent's user):
                      INFERWATCH_API_TOKEN if set, else the one kept from an earlier start, else a new random one
  DIR/scrape-token    a read-only token for Prometheus (job inferwatch-agent), mode 0644: the Prometheus
                      container mounts the volume read-only and runs as another user
  DIR/evidence-token  Alertmanager's token for the agent's webhook (scope evidence), mode 0644, mounted read-only
  DIR/tokens          the agent's ``api.tokens_file`` (INFERWATCH_API__TOKENS_FILE) naming all three, mode 0600

Usage: ``python agent_entrypoint.py DIR COMMAND [ARG...]`` (COMMAND is exec'd, e.g. ``python -m inferwatch.agent run``).
The tokens survive restarts (they live on the volume); ``docker compose down -v`` forgets them.
"""

from __future__ import annotations

import os
import secrets
import sys
from pathlib import Path

TOKEN_ENV = "INFERWATCH_API_TOKEN"
MIN_TOKEN_CHARS = 16  # = inferwatch.agent.node.api.auth.MIN_TOKEN_CHARS; the agent rejects shorter tokens
TOKEN_BYTES = 32  # 256 random bits, 43 URL-safe characters


def _write(path: Path, text: str, mode: int) -> None:
    """Write ``text`` to ``path`` atomically with ``mode`` (a reader never sees half a token)."""
    tmp = path.with_name(f".{path.name}.tmp")
    fd = os.open(tmp, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, mode)
    with os.fdopen(fd, "w", encoding="utf-8") as fh:
        fh.write(text)
    os.chmod(tmp, mode)
    os.replace(tmp, path)


def _kept(path: Path) -> str | None:
    try:
        token = path.read_text(encoding="utf-8").strip()
    except FileNotFoundError:
        return None
    return token if len(token) >= MIN_TOKEN_CHARS and token.isprintable() and " " not in token else None


def ensure_tokens(directory: Path, configured: str | None) -> tuple[str, str, str]:
    """The (operator, scrape, evidence) tokens, written to ``directory``; ``configured`` overrides the operator's."""
    if configured is not None and (
        len(configured) < MIN_TOKEN_CHARS or not configured.isprintable() or " " in configured
    ):
        raise ValueError(f"{TOKEN_ENV} must be at least {MIN_TOKEN_CHARS} printable characters without spaces")
    directory.mkdir(parents=True, exist_ok=True)
    operator = configured or _kept(directory / "token") or secrets.token_urlsafe(TOKEN_BYTES)
    scrape = _kept(directory / "scrape-token") or secrets.token_urlsafe(TOKEN_BYTES)
    evidence = _kept(directory / "evidence-token") or secrets.token_urlsafe(TOKEN_BYTES)
    _write(directory / "token", operator + "\n", 0o600)
    _write(directory / "scrape-token", scrape + "\n", 0o644)
    _write(directory / "evidence-token", evidence + "\n", 0o644)
    _write(
        directory / "tokens",
        "# written by deploy/agent_entrypoint.py at each start: TOKEN SCOPES NAME\n"
        f"{operator} read,snapshots,profile,evidence operator\n{scrape} read prometheus\n"
        f"{evidence} evidence alertmanager\n",
        0o600,
    )
    return operator, scrape, evidence


def main(argv: list[str]) -> int:
    if len(argv) < 2:
        print("usage: agent_entrypoint.py DIR COMMAND [ARG...]", file=sys.stderr)
        return 2
    directory, command = Path(argv[0]), argv[1:]
    try:
        ensure_tokens(directory, os.environ.get(TOKEN_ENV) or None)
    except (OSError, ValueError) as exc:
        print(f"agent_entrypoint: {exc}", file=sys.stderr)
        return 2
    source = f"from {TOKEN_ENV}" if os.environ.get(TOKEN_ENV) else "generated (kept on the volume)"
    print(
        f"agent_entrypoint: API token {source} in {directory / 'token'}; "
        f"read it with: docker compose exec agent cat {directory / 'token'}",
        file=sys.stderr,
        flush=True,
    )
    os.execvp(command[0], command)


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
