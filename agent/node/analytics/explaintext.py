"""The tail explainer's report (:func:`inferwatch.agent.node.analytics.explain.explain`) as a terminal table.

What ``inferwatch explain`` prints and ``/api/v1/explain?format=text`` serves: the client's verdict first when there
is one, then per quantity the verdict, each phase's share of the tail gap and the best separators, then the slowest
requests, each with its trace's URL where ``receiver.trace_url`` is set (else its trace id); ``format=html`` (the
status page's link) serves the same with the URLs as links.
"""

from __future__ import annotations

import html
from collections.abc import Mapping
from typing import Any

from inferwatch.agent.node.analytics.explain import QUANTITIES


def render_text(report: Mapping[str, Any]) -> str:
    """The explanation as a terminal table: the verdicts, the decomposition, the separators, the slowest requests."""
    lines = [f"model {report['model']}  source {report['source']}"]
    if report["source"] == "spans":
        sampled = "  (sampled: weighted)" if report.get("sampled") else ""
        lines[0] += (
            f"  window {report['window_s']:.0f}s (covered {report['covered_s']:.0f}s)  "
            f"{report['requests']} requests{sampled}"
        )
    else:
        lines.append(report["note"])
    client = report.get("client")
    if client:  # what the client saw comes first: the engine's verdicts below explain only the part inside it
        lines.append("")
        lines.append(f"CLIENT TTFT: {client['headline']}")
        if client.get("shares"):
            lines.append("  share of the tail gap: " + "  ".join(f"{p} {v:+.0%}" for p, v in client["shares"].items()))
    for q in QUANTITIES:
        d = report["quantities"].get(q)
        if not d:
            lines.append(f"{q}: no data")
            continue
        lines.append("")
        lines.append(f"{q.upper()}: {d['headline']}")
        shares = "  ".join(f"{p} {v:+.0%}" for p, v in d["shares"].items())
        lines.append(f"  share of the tail gap: {shares}")
        for s in d.get("separators", [])[:3]:
            mark = "separates" if s["separates"] else "does not separate"
            lines.append(
                f"  {s['attribute']}={s['value']}: {s['share_of_requests']:.0%} of requests, "
                f"{s['share_of_tail']:.0%} of the tail (z {s['z']:.1f}, {mark})"
            )
    rows = report.get("slowest") or []
    if rows:
        lines.append("")
        lines.append(f"slowest {len(rows)} by {report.get('slowest_by', 'ttft')}:")
        head = (
            "request_id",
            "trace_id",
            "prompt",
            "gen",
            "queue",
            "prefill",
            "decode",
            "pre",
            "ttft",
            "e2e",
            "front",
            "client",
            "labels",
        )
        table = [head]
        for r in rows:
            table.append(
                (
                    str(r["request_id"] or "-")[:28],
                    str(r.get("trace_url") or r["trace_id"] or "-"),
                    _cell(r["prompt_tokens"]),
                    _cell(r["completion_tokens"]),
                    _sec(r["queue_s"]),
                    _sec(r["prefill_s"]),
                    _sec(r["decode_s"]),
                    _cell(r["preemptions"]),
                    _sec(r["ttft_s"]),
                    _sec(r["e2e_s"]),
                    _sec(r["frontend_gap_s"]),
                    _sec(r.get("client_gap_s")),
                    ",".join(f"{k}={v}" for k, v in sorted(r["labels"].items())) or "-",
                )
            )
        widths = [max(len(row[c]) for row in table) for c in range(len(head))]
        lines.extend("  ".join(cell.ljust(w) for cell, w in zip(row, widths, strict=True)).rstrip() for row in table)
    return "\n".join(lines) + "\n"


def render_html(report: Mapping[str, Any]) -> str:
    """The terminal table as a page: the same text, each slow request's trace id or trace URL a link to its trace
    (``trace_url`` in the rows, from the receiver's ``trace_url``)."""
    body = html.escape(render_text(report))
    for row in report.get("slowest") or []:
        link, tid = row.get("trace_url"), row.get("trace_id")
        if link and tid:
            shown = html.escape(link)
            body = body.replace(shown, f'<a href="{shown}" target="_blank" rel="noopener">{shown}</a>', 1)
    title = html.escape(f"tail explanation: {report['model']}")
    return (
        f'<!doctype html><html lang="en"><head><meta charset="utf-8"><title>{title}</title></head>'
        f"<body><pre>{body}</pre></body></html>\n"
    )


def _cell(v: object) -> str:
    return "-" if v is None else str(v)


def _sec(v: float | None) -> str:
    return "-" if v is None else f"{v:.3f}"
