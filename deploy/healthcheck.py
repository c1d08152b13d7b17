"""Compose healthcheck for the services built from this repository's image (stdlib only, no curl in the image).

Usage: ``python healthcheck.py [--bearer-file FILE] URL [URL...]``: exit 0 when every URL answers 2xx within
``TIMEOUT_S``, else 1 with the first failure on stderr (``docker inspect`` shows it). With ``--bearer-file``
each request carries ``Authorization: Bearer <the file's first line>``.
"""

from __future__ import annotations

import sys
import urllib.error
import urllib.request
from pathlib import Path

TIMEOUT_S = 3.0  # below the compose healthcheck timeout (5s)


def check(urls: list[str], token: str | None) -> str | None:
    """None when every URL answers 2xx, else what went wrong with the first that did not."""
    opener = urllib.request.build_opener(urllib.request.ProxyHandler({}))  # never via an HTTP(S)_PROXY
    for url in urls:
        req = urllib.request.Request(url, headers={"Authorization": f"Bearer {token}"} if token else {})
        try:
            with opener.open(req, timeout=TIMEOUT_S) as resp:
                if not 200 <= resp.status < 300:
                    return f"{url}: HTTP {resp.status}"
        except urllib.error.HTTPError as exc:
            return f"{url}: HTTP {exc.code}"
        except (OSError, ValueError) as exc:
            return f"{url}: {exc}"
    return None


def main(argv: list[str]) -> int:
    token = None
    if argv[:1] == ["--bearer-file"] and len(argv) >= 2:
        try:
            token = Path(argv[1]).read_text(encoding="utf-8").splitlines()[0].strip()
        except (OSError, IndexError) as exc:
            print(f"healthcheck: cannot read a token from {argv[1]}: {exc}", file=sys.stderr)
            return 1
        argv = argv[2:]
    if not argv:
        print("usage: healthcheck.py [--bearer-file FILE] URL [URL...]", file=sys.stderr)
        return 2
    problem = check(argv, token)
    if problem:
        print(f"healthcheck: {problem}", file=sys.stderr)
        return 1
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
