"""The test profile: the shipped rule files with time compressed by a constant factor.

End-to-end tests run Prometheus with 1 s scrape and evaluation intervals, i.e. 60 times faster than a 1 m
production evaluation interval. To keep every rule's meaning, the same factor is applied mechanically to
every duration in the rules: ``for:``, ``keep_firing_for:``, range selectors ``[5m]`` and ``offset 1d`` in
expressions (``for: 5m`` → ``5s``, ``[1h]`` → ``[60s]``). A caller may set a floor on ranges (``min_range_s``,
``--min-range``): a ``[1m]`` rate becomes ``[1s]``, which at a 1 s scrape holds one sample at most and so yields
nothing. Nothing else changes; annotation templates (their evidence queries included) are kept as written.

    python -m inferwatch.agent.alerts.profile alerts/inferwatch.rules.yml --factor 60 > /tmp/inferwatch.rules.yml
"""

from __future__ import annotations

import argparse
import re
import sys
from pathlib import Path
from typing import Any

import yaml

DEFAULT_FACTOR = 60
_UNIT_S = {"ms": 0.001, "s": 1, "m": 60, "h": 3600, "d": 86400, "w": 604800, "y": 31536000}
_DURATION_RE = re.compile(r"^(?:\d+(?:ms|s|m|h|d|w|y))+$")
_PART_RE = re.compile(r"(\d+)(ms|s|m|h|d|w|y)")
_RANGE_RE = re.compile(r"\[(\w+)(?::(\w*))?\]")
_OFFSET_RE = re.compile(r"\boffset\s+(-?)(\w+)")


def duration_s(text: str) -> float:
    if not _DURATION_RE.match(text):
        raise ValueError(f"not a Prometheus duration: {text!r}")
    return sum(int(n) * _UNIT_S[u] for n, u in _PART_RE.findall(text))


def compress_duration(text: str, factor: int) -> str:
    seconds = duration_s(text) / factor
    if seconds == 0:
        return "0s"
    return f"{max(1, round(seconds))}s"


def compress_expr(expr: str, factor: int, min_range_s: int = 0) -> str:
    """``expr`` with every range and offset divided by ``factor``; a range (not a subquery step) is at least
    ``min_range_s`` seconds, so that a short window still holds enough scrapes at the profile's scrape interval
    (a shipped ``[1m]`` is ``[1s]`` at factor 60, where a 1 s scrape leaves a rate at most one sample)."""

    def rng(m: re.Match[str]) -> str:
        window = compress_duration(m.group(1), factor)
        if duration_s(window) < min_range_s:
            window = f"{min_range_s}s"
        step = m.group(2)
        if step is None:
            return f"[{window}]"
        return f"[{window}:{compress_duration(step, factor) if step else ''}]"

    expr = _RANGE_RE.sub(rng, expr)
    return _OFFSET_RE.sub(lambda m: f"offset {m.group(1)}{compress_duration(m.group(2), factor)}", expr)


def compress_rules(data: dict[str, Any], factor: int = DEFAULT_FACTOR, min_range_s: int = 0) -> dict[str, Any]:
    """A copy of a parsed rule file with every duration divided by ``factor`` (ranges at least ``min_range_s``)."""
    groups = []
    for group in data.get("groups", []):
        rules = []
        for rule in group.get("rules", []):
            rule = dict(rule)
            rule["expr"] = compress_expr(str(rule["expr"]), factor, min_range_s)
            for key in ("for", "keep_firing_for"):
                if key in rule:
                    rule[key] = compress_duration(str(rule[key]), factor)
            rules.append(rule)
        g = dict(group)
        g["rules"] = rules
        if "interval" in g:
            g["interval"] = compress_duration(str(g["interval"]), factor)
        groups.append(g)
    return {**data, "groups": groups}


def render_file(path: Path, factor: int = DEFAULT_FACTOR, min_range_s: int = 0) -> str:
    data = yaml.safe_load(path.read_text(encoding="utf-8"))
    header = f"# Test profile of {path.name}: every duration divided by {factor} (inferwatch.agent.alerts.profile).\n"
    return header + yaml.safe_dump(compress_rules(data, factor, min_range_s), sort_keys=False, width=1000)


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(prog="python -m inferwatch.agent.alerts.profile", description=__doc__.split("\n")[0])
    ap.add_argument("rule_file", type=Path)
    ap.add_argument("--factor", type=int, default=DEFAULT_FACTOR)
    ap.add_argument("--min-range", type=int, default=0, metavar="SECONDS", help="shortest compressed range")
    args = ap.parse_args(argv)
    sys.stdout.write(render_file(args.rule_file, args.factor, args.min_range))
    return 0


if __name__ == "__main__":
    sys.exit(main())
