"""Every alert's ``runbook_url`` and ``dashboard_url``, and every page's ``evidence_url``, generated from one
template each.

As kubernetes-mixin's ``add-runbook-links`` maps over every rule and sets ``runbook_url`` from one
pattern, this module writes the link annotations of every alerting rule; nobody types them by hand:

- ``runbook_url``   = ``<runbook_base>/<alertname>``;
- ``dashboard_url`` = ``<dashboard_base>/d/<uid>``, then ``?var-instance=…&var-model=…`` for each link variable
  the dashboard defines and the firing alert carries the label of (a Go-template ``with`` per variable, so an
  alert without the label gets no empty ``var-…=``);
- ``evidence_url``  = ``http://<instance>/api/v1/evidence/latest?alertname=<alertname>``, on every rule with
  ``severity: critical`` (a page) outside the SLO groups: the agent that owns the node keeps the evidence bundle
  it captured for the page. The ``instance`` is the agent's address only when the alert's ``job`` is
  the agent's scrape job (:data:`AGENT_JOB`), so the template renders the URL only then and an empty string
  otherwise (Alertmanager drops a PagerDuty link whose href is empty). The SLO pages carry none: the TTFT SLO is
  per model across nodes (no instance), the availability SLO's instance is the engine's address, and no label
  maps it to its node's agent.

Both bases are the Prometheus external labels ``runbook_base`` / ``dashboard_base`` when set, else the
agent's runbook server (``inferwatch.agent.config.DEFAULT_RUNBOOKS_BASE_URL``) and Grafana on 127.0.0.1:3000. The
dashboard is the one of the rule's group (:data:`GROUP_DASHBOARDS`); its variables are read from
``dashboards/json/<uid>.json``, so a link can only name a dashboard and variables that exist.

Hand-written rule files get their links rewritten in place (a new rule needs none: they are added);
generated ones (``slo.rules.yml``) call :func:`annotation_lines` from their own generator and are only checked.

    python -m inferwatch.agent.alerts.links            # rewrite the links in alerts/*.rules.yml
    python -m inferwatch.agent.alerts.links --check    # exit 1 when any rule's links differ from the templates
"""

from __future__ import annotations

import argparse
import json
import re
import sys
from collections.abc import Sequence
from functools import cache
from pathlib import Path
from typing import Any

import yaml

from inferwatch.agent.alerts import rulefiles
from inferwatch.agent.config import DEFAULT_RUNBOOKS_BASE_URL
from inferwatch.agent.errors import ConfigError

DEFAULT_RUNBOOK_BASE = DEFAULT_RUNBOOKS_BASE_URL  # the agent serves runbooks/<AlertName>.md there
DEFAULT_DASHBOARD_BASE = "http://127.0.0.1:3000"
DASHBOARDS_DIR = rulefiles.ROOT / "dashboards" / "json"
LINK_KEYS = ("runbook_url", "dashboard_url")
EVIDENCE_KEY = "evidence_url"  # critical rules only (see evidence_url)
GENERATED_KEYS = (*LINK_KEYS, EVIDENCE_KEY)
AGENT_JOB = "inferwatch-agent"  # the agent's scrape job, as the rules and deploy/prometheus.yml name it
SLO_DASHBOARD = "inferwatch-slo"
# The dashboard an alert links to, by its rule group. A new group must be added here (the generator says so).
GROUP_DASHBOARDS = {
    "inferwatch-node": "inferwatch-node",
    "inferwatch-latency": SLO_DASHBOARD,
    "inferwatch-engine": "inferwatch-engine",
    "inferwatch-engine-signals": "inferwatch-engine",  # alerts/engine-signals.rules.yml
    "inferwatch-engine-schema": "inferwatch-engine",  # alerts/engine-schema.rules.yml
    "inferwatch-runtime": "inferwatch-node",
    "inferwatch-hygiene": "inferwatch-node",
    "inferwatch-simd": "inferwatch-node",
    "inferwatch-conformance": "inferwatch-node",  # alerts/matrix.rules.yml: one node out of its type's band
    "inferwatch-agent-budget": "inferwatch-node",  # alerts/agent-budget.rules.yml: the agent's own series
}
SLO_GROUP_PREFIX = "inferwatch-slo-"  # inferwatch.agent.alerts.slo's groups, one pair per SLO: all on the SLO dashboard
# Dashboard variables a link fills in, in URL order, with the alert label that carries the value.
LINK_VARIABLES = (("instance", "instance"), ("model", "gen_ai_request_model"))

_ALERT_RE = re.compile(r"^(\s*)- alert:\s*(\S+)\s*$")
_RULE_RE = re.compile(r"^(\s*)- (?:alert|record):")
_GROUP_RE = re.compile(r"^\s*- name:\s*(\S+)\s*$")
_ANNOTATIONS_RE = re.compile(r"^(\s*)annotations:\s*$")
_LINK_RE = re.compile(r"^\s*(?:runbook_url|dashboard_url|evidence_url):")


def dashboard_for_group(group: str) -> str:
    if group in GROUP_DASHBOARDS:
        return GROUP_DASHBOARDS[group]
    if group.startswith(SLO_GROUP_PREFIX):
        return SLO_DASHBOARD
    raise ConfigError(f"rule group {group!r} has no dashboard: add it to GROUP_DASHBOARDS in {__name__}")


@cache
def dashboard_variables(uid: str) -> tuple[str, ...]:
    path = DASHBOARDS_DIR / f"{uid}.json"
    try:
        board = json.loads(path.read_text(encoding="utf-8"))
    except (OSError, ValueError) as exc:
        raise ConfigError(f"dashboard {uid!r} for the alert links: cannot read {path}: {exc}") from exc
    return tuple(v["name"] for v in board.get("templating", {}).get("list", []))


def _query(pairs: Sequence[tuple[str, str]], sep: str) -> str:
    """``?var-a=…&var-b=…`` for the labels present: one ``with`` per variable, each branch keeping the separator."""
    if not pairs:
        return ""
    (var, label), rest = pairs[0], pairs[1:]
    present = f"{sep}var-{var}={{{{ . }}}}{_query(rest, '&')}"
    absent = _query(rest, sep)
    otherwise = f"{{{{ else }}}}{absent}" if absent else ""
    return f"{{{{ with $labels.{label} }}}}{present}{otherwise}{{{{ end }}}}"


def _base(external_label: str, default: str) -> str:
    return f"{{{{ with $externalLabels.{external_label} }}}}{{{{ . }}}}{{{{ else }}}}{default}{{{{ end }}}}"


def runbook_url(alert: str) -> str:
    return f"{_base('runbook_base', DEFAULT_RUNBOOK_BASE)}/{alert}"


def dashboard_url(uid: str) -> str:
    variables = dashboard_variables(uid)
    pairs = [(v, label) for v, label in LINK_VARIABLES if v in variables]
    return f"{_base('dashboard_base', DEFAULT_DASHBOARD_BASE)}/d/{uid}{_query(pairs, '?')}"


def evidence_url(alert: str) -> str:
    """The agent's latest evidence bundle for this alert, when the alert's instance is an agent, else empty."""
    return (
        f'{{{{ if eq $labels.job "{AGENT_JOB}" }}}}http://{{{{ $labels.instance }}}}'
        f"/api/v1/evidence/latest?alertname={alert}{{{{ end }}}}"
    )


def carries_evidence(group: str, severity: str | None) -> bool:
    """A page outside the SLO groups (whose subjects are models or engine addresses, not an agent's node)."""
    return severity == "critical" and not group.startswith(SLO_GROUP_PREFIX)


def links(alert: str, group: str, severity: str | None = None) -> dict[str, str]:
    out = {"runbook_url": runbook_url(alert), "dashboard_url": dashboard_url(dashboard_for_group(group))}
    if carries_evidence(group, severity):
        out[EVIDENCE_KEY] = evidence_url(alert)
    return out


def _q(s: str) -> str:
    """A YAML single-quoted scalar."""
    return "'" + s.replace("'", "''") + "'"


def annotation_lines(alert: str, group: str, indent: str, severity: str | None = None) -> list[str]:
    """The link annotations as rule-file lines (``indent``: that of the other annotation keys)."""
    return [f"{indent}{key}: {_q(url)}" for key, url in links(alert, group, severity).items()]


def _indent(line: str) -> int:
    return len(line) - len(line.lstrip(" "))


def rewrite(text: str, where: str = "rule file") -> str:
    """``text`` with every alert's link annotations replaced by (or given) the generated ones."""
    lines = text.split("\n")
    # severities of the alerting rules in file order, read once (labels may come before or after annotations)
    severities = [_severity(r) for g in yaml.safe_load(text)["groups"] for r in g["rules"] if "alert" in r]
    out: list[str] = []
    group = alert = ""
    severity: str | None = None
    i = 0
    while i < len(lines):
        line = lines[i]
        if m := _GROUP_RE.match(line):
            group = m.group(1)
        if m := _ALERT_RE.match(line):
            alert = m.group(2)
            severity = severities.pop(0)
        elif _RULE_RE.match(line):
            alert = ""
        m = _ANNOTATIONS_RE.match(line)
        if not (m and alert):
            out.append(line)
            i += 1
            continue
        out.append(line)
        top = len(m.group(1))
        block: list[str] = []
        i += 1
        while i < len(lines) and (not lines[i].strip() or _indent(lines[i]) > top):
            block.append(lines[i])
            i += 1
        children = [b for b in block if b.strip()]
        if not children:
            raise ConfigError(f"{where}: alert {alert} has an empty annotations block")
        child = " " * min(_indent(b) for b in children)
        kept = [b for b in block if not (_LINK_RE.match(b) and _indent(b) == len(child))]
        end = len(kept)
        while end and not kept[end - 1].strip():
            end -= 1  # blank lines after the block stay after the links
        body, tail = kept[:end], kept[end:]
        out += body + annotation_lines(alert, group, child, severity) + tail
        alert = ""
    new = "\n".join(out)
    _verify(text, new, where)
    return new


def _verify(old: str, new: str, where: str) -> None:
    """The rewrite changed nothing but the link annotations, and every alert has the generated ones."""
    before, after = yaml.safe_load(old), yaml.safe_load(new)
    for g_old, g_new in zip(before["groups"], after["groups"], strict=True):
        for r_old, r_new in zip(g_old["rules"], g_new["rules"], strict=True):
            if "alert" not in r_old:
                if r_old != r_new:
                    raise ConfigError(f"{where}: the link rewrite changed record {r_old.get('record')}")
                continue
            want = {k: v for k, v in r_old.get("annotations", {}).items() if k not in GENERATED_KEYS}
            want.update(links(r_old["alert"], g_old["name"], _severity(r_old)))
            rest_old = {k: v for k, v in r_old.items() if k != "annotations"}
            rest_new = {k: v for k, v in r_new.items() if k != "annotations"}
            if r_new.get("annotations") != want or rest_old != rest_new:
                raise ConfigError(f"{where}: the link rewrite of {r_old['alert']} went wrong (annotations layout?)")


def _severity(rule: dict[str, Any]) -> str | None:
    severity = (rule.get("labels") or {}).get("severity")
    return str(severity) if severity is not None else None


def stale(path: Path) -> list[str]:
    """Alerts of ``path`` whose generated annotations differ from the templates (or that carry one they should not)."""
    data = rulefiles.load(path)
    out = []
    for group in data["groups"]:
        for rule in group["rules"]:
            if "alert" in rule:
                have: dict[str, Any] = rule.get("annotations") or {}
                want = links(rule["alert"], group["name"], _severity(rule))
                if {k: have.get(k) for k in GENERATED_KEYS if k in have or k in want} != want:
                    out.append(rule["alert"])
    return out


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(prog="python -m inferwatch.agent.alerts.links", description=__doc__.split("\n")[0])
    ap.add_argument("files", nargs="*", type=Path, help="rule files (default: alerts/*.rules.yml)")
    ap.add_argument("--check", action="store_true", help="write nothing; exit 1 if any rule's links are stale")
    args = ap.parse_args(argv)
    failed = False
    try:
        for path in args.files or rulefiles.rule_files():
            text = path.read_text(encoding="utf-8")
            if args.check or rulefiles.is_generated(text):
                bad = stale(path)
                if bad:
                    fix = "its generator" if rulefiles.is_generated(text) else "python -m inferwatch.agent.alerts.links"
                    print(f"{path}: stale links for {', '.join(bad)}: run {fix}", file=sys.stderr)
                    failed = True
                continue
            new = rewrite(text, str(path))
            if new != text:
                path.write_text(new, encoding="utf-8")
                print(f"wrote {path}")
    except ConfigError as exc:
        print(f"error: {exc}", file=sys.stderr)
        return 2
    return 1 if failed else 0


if __name__ == "__main__":
    sys.exit(main())
