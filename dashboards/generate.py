"""Generate the dashboards' JSON: ``python -m inferwatch.dashboards.generate [--check] [--out DIR]``.

``--check`` writes nothing and exits 1 when a committed file differs from what the code generates.
"""

from __future__ import annotations

import argparse
import json
import sys
from collections.abc import Callable
from pathlib import Path

from grafana_foundation_sdk.cog.encoder import JSONEncoder
from grafana_foundation_sdk.models import dashboard as dm

from inferwatch.dashboards import JSON_DIR, docs, engine, matrix, node, slo

DOCS_PAGE = JSON_DIR.parents[1] / "docs" / "dashboards.md"

BUILDERS: tuple[tuple[str, Callable[[], dm.Dashboard]], ...] = (
    (slo.UID, slo.build),
    (engine.UID, engine.build),
    (node.UID, node.build),
    (matrix.UID, matrix.build),
)


def render() -> dict[str, str]:
    """Every dashboard as the exact text committed in dashboards/json/<uid>.json."""
    enc = JSONEncoder(sort_keys=True, indent=2, ensure_ascii=False)
    return {f"{uid}.json": enc.encode(build()) + "\n" for uid, build in BUILDERS}


def render_docs(files: dict[str, str]) -> str:
    """docs/dashboards.md for the dashboards in ``files`` (as rendered by :func:`render`)."""
    return docs.render({name.removesuffix(".json"): json.loads(text) for name, text in files.items()})


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__)
    ap.add_argument("--check", action="store_true", help="fail if the committed JSON differs")
    ap.add_argument("--out", type=Path, default=JSON_DIR)
    args = ap.parse_args(argv)
    files = render()
    stale = sorted(p.name for p in args.out.glob("*.json") if p.name not in files)
    differ = [n for n, text in files.items() if not (args.out / n).exists() or (args.out / n).read_text() != text]
    page = render_docs(files)
    docs_differ = args.out == JSON_DIR and (not DOCS_PAGE.exists() or DOCS_PAGE.read_text(encoding="utf-8") != page)
    if args.check:
        for n in differ + stale:
            print(f"dashboards/json/{n} is out of date: run python -m inferwatch.dashboards.generate", file=sys.stderr)
        if docs_differ:
            print("docs/dashboards.md is out of date: run python -m inferwatch.dashboards.generate", file=sys.stderr)
        return 1 if differ or stale or docs_differ else 0
    args.out.mkdir(parents=True, exist_ok=True)
    for n, text in files.items():
        (args.out / n).write_text(text, encoding="utf-8")
    for n in stale:
        (args.out / n).unlink()
    if args.out == JSON_DIR:
        DOCS_PAGE.parent.mkdir(exist_ok=True)
        DOCS_PAGE.write_text(page, encoding="utf-8")
    print(f"wrote {len(files)} dashboards to {args.out}" + (" and docs/dashboards.md" if args.out == JSON_DIR else ""))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
