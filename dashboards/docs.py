"""Render docs/dashboards.md from the dashboards themselves (rows, panels, descriptions, queries).

Called by ``python -m inferwatch.dashboards.generate``; tests/test_dashboards.py fails when the committed page differs,
so the page can never describe a panel that does not exist.
"""

from __future__ import annotations

import re
from collections.abc import Mapping
from pathlib import Path
from typing import Any

from inferwatch.dashboards import TARGET_GRAFANA

INTRO_TEMPLATE = Path(__file__).with_name("docs_intro.md")  # hand-written top of the page ($TARGET_GRAFANA)


def _unit(p: Mapping[str, Any]) -> str:
    return str(p.get("fieldConfig", {}).get("defaults", {}).get("unit", ""))


def _rows(dash: Mapping[str, Any]) -> list[tuple[str, list[Mapping[str, Any]]]]:
    rows: list[tuple[str, list[Mapping[str, Any]]]] = []
    for p in dash["panels"]:
        if p["type"] == "row":
            rows.append((str(p["title"]), list(p.get("panels", []))))
        elif rows:
            rows[-1][1].append(p)
        else:
            rows.append(("", [p]))
    return rows


def render(dashboards: Mapping[str, Mapping[str, Any]]) -> str:
    out = [INTRO_TEMPLATE.read_text(encoding="utf-8").replace("$TARGET_GRAFANA", TARGET_GRAFANA)]
    for uid, dash in dashboards.items():
        out.append(f"## {dash['title']}\n")
        out.append(f"uid `{uid}` · variables: {', '.join('`' + v['name'] + '`' for v in dash['templating']['list'])}\n")
        out.append(f"{dash.get('description', '')}\n")
        for title, panels in _rows(dash):
            out.append(f"### Row: {title}\n")
            for p in panels:
                desc = str(p.get("description", "")).replace("\n\n", " ")
                desc = re.sub(r"runbooks/(\w+)\.md", r"[\1](../runbooks/\1.md)", desc)
                out.append(f"- **{p['title']}** ({p['type']}, unit `{_unit(p)}`). {desc}")
                for t in p.get("targets", []):
                    kind = "instant" if t.get("instant") else "range"
                    out.append(f"  - `{t['refId']}` ({kind}): `{t['expr']}`")
            out.append("")
    return "\n".join(out).rstrip() + "\n"
