"""The status page's HTML (a sink): the overview of :mod:`inferwatch.agent.node.api.statuspage` as one server-rendered
page.

Inline CSS and inline SVG, no script, nothing fetched from elsewhere (not even a favicon), so it works on an
air-gapped node. States are words and symbols as well as colours (✖ FAIL, ▲ WARN, ▼ for a histogram mode, solid /
dashed / dotted for P50 / P95 / P99), every chart has an ``aria-label`` that says what it shows, and every number
is a ``<data value="...">`` holding the full-precision value next to the rounded text (what the browser test reads).
"""

from __future__ import annotations

import html
import marshal
import math
import time
from typing import Any
from urllib.parse import quote

from inferwatch.agent.catalog.engine import GOODPUT_TPOT_TARGET_S
from inferwatch.agent.node.api.display import fmt_age, fmt_bytes, fmt_seconds
from inferwatch.agent.node.api.pagehistory import CHART_STEP_S
from inferwatch.agent.node.api.statuspage import GOODPUT_TTFT_S, TAIL_RATIO_MAX, log_widths

STATUS_WORD = {"fail": "✖ FAIL", "warn": "▲ WARN", "ok": "✔ OK", "skip": "– SKIP"}


def _data(v: float | None, text: str) -> str:
    """A number for machines (``value``, full precision) and for people (``text``)."""
    if v is None:
        return "<span>—</span>"
    return f'<data value="{v!r}">{html.escape(text)}</data>'


RUNTIME_WORD = {"": "—", "active": "✔ in use", "inactive": "✖ NOT IN USE (fallback)"}


def _count(v: float | None) -> str:
    return _data(v, f"{v:g}") if v is not None else "—"


def _pct(v: float | None) -> str:
    return f"{v:.0%}" if v is not None else "—"


def _e(v: object) -> str:
    return html.escape(str(v))


def _badge(status: str) -> str:
    word = STATUS_WORD.get(status, status.upper())
    return f'<span class="badge s-{_e(status)}">{_e(word)}</span>'


CSS = """
:root{--fg:#1a1a1a;--muted:#4a4a4a;--bg:#fff;--line:#d0d0d0;--fail:#b00020;--warn:#8a5300;--ok:#1b6e20;
--skip:#555;--p50:#1f4e9a;--p95:#8a5300;--p99:#b00020;--bar:#3a5f9f;--mode:#b00020}
*{box-sizing:border-box}
body{margin:0;font:14px/1.45 system-ui,-apple-system,"Segoe UI",Roboto,sans-serif;color:var(--fg);background:var(--bg)}
header,main,footer{padding:8px 16px;max-width:1400px;margin:0 auto}
header{border-bottom:1px solid var(--line)}
h1{font-size:20px;margin:4px 0}h2{font-size:17px;margin:16px 0 6px}h3{font-size:15px;margin:8px 0 4px}
.muted{color:var(--muted)}
.grid{display:grid;grid-template-columns:repeat(auto-fit,minmax(340px,1fr));gap:12px}
.card{border:1px solid var(--line);border-radius:6px;padding:8px 12px;min-width:0}
.scroll{overflow-x:auto}
table{border-collapse:collapse;width:100%}th,td{text-align:left;padding:3px 6px;border-bottom:1px solid var(--line);
vertical-align:top}th{font-weight:600}
.badge{display:inline-block;padding:0 6px;border-radius:4px;color:#fff;font-weight:600;white-space:nowrap}
.s-fail{background:var(--fail)}.s-warn{background:var(--warn)}.s-ok{background:var(--ok)}.s-skip,.s-absent,
.s-pending{background:var(--skip)}.s-failed{background:var(--fail)}
.model-body{display:grid;grid-template-columns:repeat(auto-fit,minmax(300px,1fr));gap:4px 16px}
h4{font-size:14px;margin:8px 0 2px}
.kv{display:grid;grid-template-columns:minmax(0,13em) minmax(0,1fr);gap:2px 12px}
.kv dt{color:var(--muted)}.kv dd{margin:0}
svg{max-width:100%;height:auto}
svg text{font:11px system-ui,sans-serif;fill:#1a1a1a}
.legend span{margin-right:10px;white-space:nowrap}
.l50{stroke:var(--p50)}.l95{stroke:var(--p95);stroke-dasharray:6 3}.l99{stroke:var(--p99);stroke-dasharray:2 2}
.bar{fill:var(--bar)}.bar.mode{fill:var(--mode)}
a{color:#0b4fa8}
@media (max-width:600px){header,main,footer{padding:6px 8px}.grid{grid-template-columns:1fr}}
"""


def _histogram_svg(model: str, h: dict[str, Any]) -> str:
    counts: list[float] = h["counts"]
    bounds: list[float | None] = h["bounds"]
    nonzero = [i for i, c in enumerate(counts) if c > 0]
    if not nonzero:
        return '<p class="muted">No requests in the window yet.</p>'
    lo = max(nonzero[0] - 1, 0)
    hi = min(nonzero[-1] + 1, len(counts) - 1)
    while hi - lo < 7 and (lo > 0 or hi < len(counts) - 1):
        lo, hi = max(lo - 1, 0), min(hi + 1, len(counts) - 1)
    shown = range(lo, hi + 1)
    width, height, pad_b, pad_t = 360, 150, 34, 8
    finite = [b if b is not None else math.inf for b in bounds]
    widths = log_widths(finite)
    dens = [c / w for c, w in zip(counts, widths, strict=True)]
    scale = width / sum(widths[i] for i in shown)
    top = max(dens[i] for i in shown) or 1.0
    modes = {m["index"] for m in h["modes"]}
    bars, labels = [], []
    x = 0.0
    for n, i in enumerate(shown):
        c = counts[i]
        bw = widths[i] * scale
        bh = (height - pad_b - pad_t) * dens[i] / top
        le = bounds[i]
        ge = bounds[i - 1] if i else 0.0
        rng = f"{fmt_seconds(ge)}–{fmt_seconds(le)}" if le is not None else f"> {fmt_seconds(ge)}"
        cls = "bar mode" if i in modes else "bar"
        bars.append(
            f'<rect class="{cls}" x="{x + 0.5:.1f}" y="{height - pad_b - bh:.1f}" width="{max(bw - 1, 0.5):.1f}" '
            f'height="{bh:.1f}" data-ge="{ge!r}" data-le="{"+Inf" if le is None else repr(le)}" data-count="{c:g}">'
            f"<title>{_e(rng)}: {c:g} requests{' (mode)' if i in modes else ''}</title></rect>"
        )
        if i in modes:
            bars.append(
                f'<text x="{x + bw / 2:.1f}" y="{max(height - pad_b - bh - 2, 10):.1f}" text-anchor="middle">▼</text>'
            )
        if le is not None and (n % 2 == 0 or len(shown) <= 8):
            labels.append(
                f'<text x="{x + bw:.1f}" y="{height - pad_b + 14}" text-anchor="middle">{_e(fmt_seconds(le))}</text>'
            )
        x += bw
    mode_text = (
        f"{len(h['modes'])} modes: " + " and ".join(m["range"] for m in h["modes"])
        if len(h["modes"]) > 1
        else ("one mode: " + h["modes"][0]["range"] if h["modes"] else "no clear mode")
    )
    window = f"last {h['window_s']:.0f} s" if h["window_s"] else "since the engine started"
    label = f"TTFT histogram of {model}, {window}, {h['total']:g} requests; {mode_text}"
    return (
        f'<svg viewBox="0 0 {width} {height}" width="{width}" height="{height}" role="img" aria-label="{_e(label)}" '
        f'class="ttft-hist" data-modes="{len(h["modes"])}">'
        f'<line x1="0" y1="{height - pad_b}" x2="{width}" y2="{height - pad_b}" stroke="#1a1a1a"/>'
        + "".join(bars)
        + "".join(labels)
        + f'<text x="{width / 2}" y="{height - 4}" text-anchor="middle">TTFT, log scale; bar area = requests</text>'
        + "</svg>"
        f'<p class="modes"><strong>{_e(mode_text)}</strong> <span class="muted">({_e(window)}, '
        f"{h['total']:g} requests; ▼ and red bars mark modes)</span></p>"
    )


# Line charts kept drawn, by (model, quantity): a chart's points change once per history step (10 s), not per request.
# Each is kept with its points as marshal bytes (exact: floats as their 8 bytes, None apart; ~4 kB for an hour's
# line, and the SVG ~5 kB). The page history keeps at most 256 lines (MAX_SERIES): the default page's 20 cards keep 40.
LINES_KEPT = 512
_drawn: dict[tuple[str, str], tuple[bytes, str]] = {}


def _line_svg(model: str, quantity: str, points: list[list[Any]]) -> str:
    """A chart's SVG, drawn again only when its points changed (:data:`LINES_KEPT` kept)."""
    key = marshal.dumps(points, 2)  # version 2: no back-references, so equal points give equal bytes
    kept = _drawn.get((model, quantity))
    if kept is not None and kept[0] == key:
        return kept[1]
    svg = _draw_line(model, quantity, points)
    if len(_drawn) >= LINES_KEPT:
        _drawn.clear()
    _drawn[(model, quantity)] = (key, svg)
    return svg


def _draw_line(model: str, quantity: str, points: list[list[Any]]) -> str:
    label_q = {"ttft": "TTFT", "itl": "ITL"}[quantity]
    pts = [p for p in points if any(v is not None for v in p[1:])]
    if len(pts) < 2:
        return f'<p class="muted">{label_q} history: collecting (one point per {CHART_STEP_S:g} s, one hour kept).</p>'
    width, height, pad = 360, 110, 18
    t0, t1 = pts[0][0], pts[-1][0]
    top = max(v for p in pts for v in p[1:] if v is not None) or 1.0
    span = max(t1 - t0, 1e-9)
    lines = []
    xs = [f"{(p[0] - t0) / span * (width - 50) + 46:.1f}," for p in pts]  # each point's x, once for the three lines
    y0, dy = height - pad, height - 2 * pad
    for k, cls in ((1, "l50"), (2, "l95"), (3, "l99")):
        xy = " ".join([f"{x}{y0 - (p[k] / top) * dy:.1f}" for x, p in zip(xs, pts, strict=True) if p[k] is not None])
        lines.append(f'<polyline class="{cls}" fill="none" stroke-width="1.8" points="{xy}"/>')
    minutes = span / 60
    label = f"{label_q} P50, P95 and P99 of {model} over the last {minutes:.0f} min; P99 now {fmt_seconds(pts[-1][3])}"
    return (
        f'<svg viewBox="0 0 {width} {height}" width="{width}" height="{height}" role="img" aria-label="{_e(label)}">'
        f'<text x="0" y="{pad}">{_e(fmt_seconds(top))}</text><text x="0" y="{height - pad}">0</text>'
        f'<line x1="46" y1="{height - pad}" x2="{width}" y2="{height - pad}" stroke="#1a1a1a"/>'
        + "".join(lines)
        + f'<text x="{width - 4}" y="{height - 2}" text-anchor="end">last {minutes:.1f} min</text></svg>'
    )


def _legend() -> str:
    def swatch(cls: str) -> str:
        line = f'<line class="{cls}" x1="0" y1="4" x2="26" y2="4" stroke-width="2"/>'
        return f'<svg width="26" height="8" aria-hidden="true">{line}</svg>'

    return (
        f'<p class="legend"><span>{swatch("l50")} P50 (solid)</span><span>{swatch("l95")} P95 (dashed)</span>'
        f"<span>{swatch('l99')} P99 (dotted)</span></p>"
    )


def _driver(d: dict[str, Any] | None) -> str:
    if d is None:
        return "—"
    share = f" ({d['share']:.0%} of the gap)" if d["share"] is not None else ""
    attribute = f", tail requests share {_e(d['attribute'])}" if d["attribute"] not in ("", "none") else ""
    return f"{_e(d['phase'] or 'none')}{share}{attribute}"


def _model_card(m: dict[str, Any]) -> str:
    model = m["model"]
    rows = []
    for q, name in (("ttft", "TTFT"), ("itl", "ITL")):
        cur = m["latency"].get(q)
        if cur is None:
            rows.append(f"<tr><th scope='row'>{name}</th><td colspan='3'>not exposed</td><td></td></tr>")
            continue
        cells = "".join(
            f'<td class="q-{q}-p{k}">{_data(cur[f"p{k}"], fmt_seconds(cur[f"p{k}"]))}</td>' for k in ("50", "95", "99")
        )
        rows.append(f"<tr><th scope='row'>{name}</th>{cells}<td>{_e(cur['source'])}, 1m</td></tr>")
    tr = m["tail_ratio"]
    h = m["ttft_histogram"]
    good = h["goodput"] if h else None
    stats = [
        ("TTFT P99/P50 (5m)", _data(tr.get("ttft"), f"{tr['ttft']:.2f}" if tr.get("ttft") is not None else "")),
        (
            "prefill P99/P50 (5m)",
            _data(tr.get("prefill"), f"{tr['prefill']:.2f}" if tr.get("prefill") is not None else "")
            + (" ▲ above 3" if (tr.get("prefill") or 0) > TAIL_RATIO_MAX else ""),
        ),
        (
            f"goodput (TTFT ≤ {fmt_seconds(GOODPUT_TTFT_S)})",
            (
                _data(good["ratio"], f"{good['ratio']:.1%} of requests")
                + (f", {good['per_s']:.2f} req/s" if good["per_s"] is not None else "")
            )
            if good and good["ratio"] is not None
            else "—",
        ),
        (
            "goodput, exact (5m)",
            _data(m["goodput_exact_5m"], f"{m['goodput_exact_5m']:.1%}")
            + f" (TTFT ≤ {fmt_seconds(GOODPUT_TTFT_S)} and TPOT ≤ {fmt_seconds(GOODPUT_TPOT_TARGET_S)}; spans)"
            if m["goodput_exact_5m"] is not None
            else "no spans",
        ),
        (
            "KV-cache in use",
            _data(m["kv_cache_usage_ratio"], f"{(m['kv_cache_usage_ratio'] or 0):.0%}")
            if m["kv_cache_usage_ratio"] is not None
            else "not exposed",
        ),
        (
            "running / waiting",
            _count(m["requests_running"]) + " / " + _count(m["requests_waiting"]),
        ),
        (
            "preemptions (total)",
            _data(m["preemptions_total"], f"{m['preemptions_total']:g}")
            if m["preemptions_total"] is not None
            else "not exposed",
        ),
        (
            "prefix-cache hits (since start)",
            _data(m["prefix_cache_hit_ratio"], f"{m['prefix_cache_hit_ratio']:.1%}")
            if m["prefix_cache_hit_ratio"] is not None
            else "not exposed",
        ),
        ("TTFT tail driver (5m)", _driver(m["tail_driver"])),
        (
            "TTFT bimodal (5m)",
            ", ".join(f"{'yes ▲' if v == 1 else 'no'} ({_e(k)})" for k, v in m["bimodal_ttft_5m"].items()) or "—",
        ),
    ]
    hist = _histogram_svg(model, h) if h else '<p class="muted">The engine exposes no TTFT histogram.</p>'
    charts = "".join(
        f"<h4>{label} P50/P95/P99, last hour</h4>{_line_svg(model, q, m['history'][q])}"
        for q, label in (("ttft", "TTFT"), ("itl", "ITL"))
    )
    engine = f" <span class='muted'>({_e(m['engine'])})</span>" if m["engine"] else ""
    explain = f"api/v1/explain?model={quote(model, safe='')}&amp;format=html"
    stats.append(("why the tail is slow", f'<a href="{explain}" class="explain">tail explanation</a>'))
    kv = "".join(f"<dt>{_e(k)}</dt><dd>{v}</dd>" for k, v in stats)
    return (
        f'<section class="card model" data-model="{_e(model)}" aria-label="model {_e(model)}">'
        f"<h3>{_e(model)}{engine}</h3>"
        '<div class="model-body"><div><div class="scroll" tabindex="0" role="region" aria-label="latency table">'
        "<table><caption class='muted'>Latency over the last minute</caption>"
        "<thead><tr><th scope='col'>quantity</th><th scope='col'>P50</th><th scope='col'>P95</th>"
        f"<th scope='col'>P99</th><th scope='col'>source</th></tr></thead><tbody>{''.join(rows)}</tbody></table></div>"
        f"<dl class='kv'>{kv}</dl></div><div><h4>TTFT histogram</h4>{hist}</div>"
        f"<div>{_legend()}{charts}</div></div></section>"
    )


def _findings_html(findings: list[dict[str, Any]]) -> str:
    if not findings:
        return "<p>No findings yet.</p>"
    urgent = [f for f in findings if f["status"] in ("fail", "warn")]
    calm = [f for f in findings if f["status"] not in ("fail", "warn")]

    def rows(fs: list[dict[str, Any]]) -> str:
        out = []
        for f in fs:
            link = (
                f' · <a href="runbooks/{_e(f["runbook"])}" class="runbook">runbook {_e(f["runbook"])}</a>'
                if f["runbook"]
                else ""
            )
            out.append(
                f'<tr class="finding" data-id="{_e(f["id"])}" data-status="{_e(f["status"])}">'
                f"<td>{_badge(f['status'])}</td><td><strong>{_e(f['summary'])}</strong>"
                f"<br><span class='muted'>{_e(f['evidence'])}</span>{link}</td></tr>"
            )
        return "".join(out)

    head = "<thead><tr><th scope='col'>state</th><th scope='col'>finding, evidence and runbook</th></tr></thead>"
    text = (
        '<div class="scroll" tabindex="0" role="region" aria-label="findings needing attention">'
        f"<table id='urgent'>{head}<tbody>{rows(urgent)}</tbody></table></div>"
        if urgent
        else "<p>✔ Nothing needs attention.</p>"
    )
    if calm:
        text += (
            f"<details><summary>{len(calm)} finding(s) in order</summary>"
            '<div class="scroll" tabindex="0" role="region" aria-label="findings in order">'
            f"<table>{head}<tbody>{rows(calm)}</tbody></table></div></details>"
        )
    return text


def _node_html(ov: dict[str, Any]) -> str:
    n = ov["node"]
    ident = [
        ("machine type", n["machine_type"] or "unknown (no DMI product name)"),
        ("CPU", n["cpu_model"] or "unknown"),
        ("architecture", n["arch"]),
        ("kernel", n["kernel"]),
        ("GPUs", ", ".join(g["model"] for g in ov["gpus"]) or "none seen"),
        ("environment", n["environment"]),
    ]
    es = ov.get("engine_schema")
    if es:  # what the engine collector recognised (docs/engine.md, "Engine releases and schemas")
        ident.append(
            (
                "engine release",
                f"{es['engine']}: {es['release_range']} (schema {es['schema']}); "
                f"{es['quantities_recognised']:.0f} quantities mapped or derived, "
                f"{es['unmapped_families']:.0f} engine families not read",
            )
        )
    kv = "".join(f"<dt>{_e(k)}</dt><dd class='node-{_e(k.split()[0].lower())}'>{_e(v)}</dd>" for k, v in ident)
    feats = []
    for r in ov["cpu_features"]:
        if r["missing"]:
            state = "✖ MISSING"
        elif r["present"]:
            state = "✔ present"
        else:
            state = "– absent"
        feats.append(
            f'<tr class="feature{" missing" if r["missing"] else ""}" data-feature="{_e(r["feature"])}" '
            f'data-missing="{int(r["missing"])}"><td>{_e(r["feature"])}</td>'
            f"<td>{'expected' if r['expected'] else '—'}</td>"
            f"<td>{_badge('fail') + ' ' if r['missing'] else ''}{_e(state)}</td><td>{_e(r['detected_by'])}</td>"
            f'<td data-runtime="{_e(r["runtime"])}">{RUNTIME_WORD[r["runtime"]]}</td></tr>'
        )
    missing = [r["feature"] for r in ov["cpu_features"] if r["missing"]]
    unused = [r["feature"] for r in ov["cpu_features"] if r["runtime"] == "inactive"]
    feat_summary = (
        f"<p><strong>✖ Expected for this CPU but missing: {_e(', '.join(missing))}</strong></p>"
        if missing
        else "<p>✔ Every feature expected for this CPU model is present.</p>"
        if ov["cpu_features"]
        else "<p class='muted'>No CPU feature data yet.</p>"
    )
    if unused:
        feat_summary += (
            f"<p class='runtime-fallback'><strong>✖ The runtime was compiled for {_e(', '.join(unused))} but its "
            "kernels do not use them (a silent fallback to a narrower path, ~20 % slower)</strong></p>"
        )
    mem = ov["memory"]
    mem_rows = [
        ("page cache", mem.get("summary", "no reading")),
        ("Inactive(file)", fmt_bytes(mem.get("inactive_file_bytes"))),
        ("threshold", fmt_bytes(mem.get("threshold_bytes"))),
        ("MemAvailable", fmt_bytes(mem.get("mem_available_bytes"))),
    ]
    mem_rows += [(k.replace("_", " "), f"{v:.2%}") for k, v in mem.items() if k.startswith("psi_") and v is not None]
    mem_kv = "".join(f"<dt>{_e(k)}</dt><dd>{_e(v)}</dd>" for k, v in mem_rows)
    mem_badge = _badge(mem["status"]) + " " if "status" in mem else ""
    gpu_rows = "".join(
        f"<tr><td>{_e(g['model'])}</td><td>{_pct(g.get('utilization_ratio'))}</td>"
        f"<td>{_e(fmt_bytes(g.get('memory_used_bytes')))} / {_e(fmt_bytes(g.get('memory_limit_bytes')))}</td>"
        f"<td>{_e(g.get('temperature_celsius') if g.get('temperature_celsius') is not None else '—')} °C</td>"
        f"<td>{_e(g.get('power_watts') if g.get('power_watts') is not None else '—')} W</td>"
        f"<td>{_e(', '.join(g.get('throttle', [])) or 'no')}</td></tr>"
        for g in ov["gpus"]
    )
    gpu = (
        '<div class="scroll" tabindex="0" role="region" aria-label="GPU table"><table><thead><tr>'
        "<th scope='col'>GPU</th><th scope='col'>busy</th><th scope='col'>memory</th><th scope='col'>temp</th>"
        f"<th scope='col'>power</th><th scope='col'>throttled</th></tr></thead><tbody>{gpu_rows}</tbody></table></div>"
        if ov["gpus"]
        else "<p class='muted'>No GPU seen (no NVML, or no GPU on this node).</p>"
    )
    return (
        '<div class="grid">'
        "<section class='card' aria-labelledby='h-ident'><h3 id='h-ident'>Identity</h3>"
        f"<dl class='kv'>{kv}</dl></section>"
        f"<section class='card' aria-labelledby='h-feat'><h3 id='h-feat'>CPU features: expected vs present</h3>"
        f"{feat_summary}"
        '<div class="scroll" tabindex="0" role="region" aria-label="CPU features"><table id="features"><thead><tr>'
        "<th scope='col'>feature</th><th scope='col'>this CPU model</th><th scope='col'>on this node</th>"
        "<th scope='col'>detected by</th><th scope='col'>the runtime's kernels</th></tr></thead>"
        f"<tbody>{''.join(feats)}</tbody></table></div></section>"
        f"<section class='card' aria-labelledby='h-mem'><h3 id='h-mem'>{mem_badge}Page cache and memory pressure</h3>"
        f"<dl class='kv'>{mem_kv}</dl></section>"
        f"<section class='card' aria-labelledby='h-gpu'><h3 id='h-gpu'>GPU state</h3>{gpu}</section>"
        "</div>"
    )


def _engines_html(ov: dict[str, Any]) -> str:
    """One row per engine the agent watches (the configured one, each discovered target)."""
    engines = ov.get("engines", [])
    if not engines:
        return "<p class='muted'>No engine configured or discovered.</p>"

    def where(e: dict[str, Any]) -> str:
        return "/".join(x for x in (e["namespace"], e["pod"], e["container"]) if x) or "—"

    def up(v: float | None) -> str:
        return "—" if v is None else _badge("ok") if v == 1 else _badge("fail")

    rows = "".join(
        f'<tr class="engine" data-name="{_e(e["name"])}" data-state="{_e(e["state"])}"><td>{_e(e["name"])}</td>'
        f"<td>{_e(where(e))}</td><td>{_e(e['kind'])}</td><td>{up(e['up'])}</td><td>{_badge(e['state'])}</td>"
        f"<td>{_e(', '.join(e['models']) or '—')}</td><td>{_e(fmt_age(e['last_success_age_s']))}</td>"
        f"<td>{_e(e['last_error'] or e['hint'] or '')}</td></tr>"
        for e in engines
    )
    return (
        '<div class="scroll" tabindex="0" role="region" aria-label="engine targets"><table id="engines"><thead><tr>'
        "<th scope='col'>engine</th><th scope='col'>namespace/pod/container</th><th scope='col'>kind</th>"
        "<th scope='col'>up</th><th scope='col'>collector</th><th scope='col'>models</th>"
        "<th scope='col'>last success</th><th scope='col'>note</th></tr></thead>"
        f"<tbody>{rows}</tbody></table></div>"
    )


def _health_html(ov: dict[str, Any]) -> str:
    rows = "".join(
        f'<tr class="collector" data-name="{_e(c["name"])}" data-state="{_e(c["state"])}"><td>{_e(c["name"])}</td>'
        f"<td>{_badge(c['state'])}</td><td>{_e(fmt_age(c['last_success_age_s']))}</td>"
        f"<td>{_data(c['duration_s'], fmt_seconds(c['duration_s']))}</td><td>{c['runs']} / {c['errors']}</td>"
        f"<td>{_e(c['last_error'] or c['hint'] or '')}</td></tr>"
        for c in ov["collectors"]
    )
    a = ov["agent"]
    cpu = _data(a["cpu_seconds"], f"{a['cpu_seconds']:.1f} s")
    return (
        f"<p>Agent {_e(ov['version'])}: CPU {cpu} "
        f"({a['cpu_core_share']:.2%} of a core since start, {a['uptime_s'] / 60:.0f} min), "
        f"peak RSS {_data(a['peak_rss_bytes'], fmt_bytes(a['peak_rss_bytes']))}.</p>"
        '<div class="scroll" tabindex="0" role="region" aria-label="collectors"><table id="collectors"><thead><tr>'
        "<th scope='col'>collector</th><th scope='col'>state</th><th scope='col'>last success</th>"
        "<th scope='col'>last duration</th><th scope='col'>runs / errors</th><th scope='col'>note</th></tr></thead>"
        f"<tbody>{rows}</tbody></table></div>"
    )


def render_page(ov: dict[str, Any], refresh_s: int | None = None) -> str:
    """The status page for an overview from :func:`build_overview` (no script; ``refresh_s`` adds a meta refresh)."""
    n = ov["node"]
    counts = {s: sum(1 for f in ov["findings"] if f["status"] == s) for s in ("fail", "warn")}
    title = f"{n['host_name'] or 'node'} — inferwatch"
    refresh = f'<meta http-equiv="refresh" content="{refresh_s}">' if refresh_s else ""
    models = "".join(_model_card(m) for m in ov["models"]) or "<p class='muted'>No engine model seen yet.</p>"
    total = ov.get("models_total", len(ov["models"]))
    if total > len(ov["models"]):
        keep = f"&amp;refresh={refresh_s}" if refresh_s else ""
        models = (
            f"<p>{len(ov['models'])} of {total} models (those with a signal first, then by name; every model's signals"
            f" are in the findings above) · <a href='?models=all{keep}'>all {total} models</a></p>" + models
        )
    when = time.strftime("%Y-%m-%d %H:%M:%S UTC", time.gmtime(ov["generated_at"]))
    return (
        '<!doctype html>\n<html lang="en"><head><meta charset="utf-8">'
        '<meta name="viewport" content="width=device-width, initial-scale=1"><link rel="icon" href="data:,">'
        f"{refresh}<title>{_e(title)}</title><style>{CSS}</style></head><body>"
        f"<header><h1>{_e(n['host_name'] or 'node')} <span class='muted'>· inferwatch status</span></h1>"
        f"<p>{_e(n['machine_type'] or 'unknown machine')} · {_e(n['cpu_model'] or 'unknown CPU')} · kernel "
        f"{_e(n['kernel'])} · <strong>{counts['fail']} failing, {counts['warn']} warning</strong> · "
        f"rendered {_e(when)} (reload for fresh values; <a href='?refresh=15'>auto-refresh every 15 s</a>)</p></header>"
        "<main>"
        "<section aria-labelledby='h-findings'><h2 id='h-findings'>Findings</h2>"
        f"{_findings_html(ov['findings'])}</section>"
        f"<section aria-labelledby='h-engines'><h2 id='h-engines'>Engines</h2>{_engines_html(ov)}</section>"
        f"<section aria-labelledby='h-models'><h2 id='h-models'>Models</h2><div class='grid'>{models}</div></section>"
        f"<section aria-labelledby='h-node'><h2 id='h-node'>Node</h2>{_node_html(ov)}</section>"
        f"<section aria-labelledby='h-self'><h2 id='h-self'>Agent self-health</h2>{_health_html(ov)}</section>"
        "</main><footer class='muted'>Same data as JSON: <a href='api/v1/overview'>/api/v1/overview</a> · "
        "<a href='api/v1/status'>/api/v1/status</a> · <a href='metrics'>/metrics</a> · "
        "evidence bundles: <a href='api/v1/evidence'>/api/v1/evidence</a> (evidence scope) · "
        "<a href='runbooks'>runbooks</a></footer></body></html>\n"
    )
