"""The alert rules with the real tools: promtool check/test, the SLO generator, the catalog lint, the test profile."""

from __future__ import annotations

import json
import re
from pathlib import Path

import promql_parser
import pytest
import yaml

from inferwatch.agent.alerts import links, profile, slo
from inferwatch.agent.catalog import prometheus_series_names
from inferwatch.agent.config import DEFAULT_RUNBOOKS_BASE_URL
from inferwatch.agent.errors import ConfigError
from tests.alerting import (
    ALERTS_DIR,
    RULE_TESTS_DIR,
    load_rules,
    rule_files,
    rule_test_files,
    run_tool,
    tool,
)
from tests.conftest import ROOT

pytestmark = pytest.mark.integration
PROMTOOL_TEST_TIMEOUT_S = 600
SEVERITIES = {"critical", "warning", "info"}
ANNOTATIONS = {"summary", "description", "runbook_url", "dashboard_url"}
EVIDENCE = (
    "evidence_url"  # every page outside the SLO groups: the agent's evidence bundle (inferwatch.agent.alerts.links)
)


def test_promtool_check_rules_passes() -> None:
    r = run_tool(tool("promtool"), "check", "rules", *rule_files())
    assert r.returncode == 0, r.stdout + r.stderr
    assert r.stdout.count("SUCCESS") == len(rule_files())


@pytest.mark.parametrize("path", rule_test_files(), ids=lambda p: p.name)
def test_promtool_unit_tests_pass(path: Path) -> None:
    # One file per test, so they spread over the workers: all thirteen in one promtool run took 38 s on a quiet
    # machine and outran a 120 s timeout under the suite's six-worker load (CI, stop 43). promtool evaluates every
    # rule at every step of a case's timeline (slo and engine-signals: 11-13 s quiet, over 120 s at load 17), so the
    # timeout is a hang guard sized for a loaded machine, not a speed check.
    r = run_tool(tool("promtool"), "test", "rules", path, timeout_s=PROMTOOL_TEST_TIMEOUT_S)
    assert r.returncode == 0, r.stdout + r.stderr
    assert r.stdout.count("SUCCESS") == 1, r.stdout


def test_the_rule_tests_are_all_found() -> None:
    names = {p.name for p in rule_test_files()}
    assert {"slo.test.yml", "engine-signals.test.yml", "hang.test.yml", "simd.test.yml"} <= names
    assert len(names) >= 13, names


def test_every_alert_has_a_firing_case_with_links_and_a_near_miss() -> None:
    firing: dict[str, list[dict]] = {}
    quiet: set[str] = set()
    for path in rule_test_files():
        for case in yaml.safe_load(path.read_text())["tests"]:
            for check in case.get("alert_rule_test", []):
                if check["exp_alerts"]:
                    firing.setdefault(check["alertname"], []).extend(check["exp_alerts"])
                else:
                    quiet.add(check["alertname"])
    severities: dict[str, set[str]] = {}  # an SLO's burn alert is one name with a page and a ticket severity
    for rule in load_rules():
        if "alert" in rule:
            severities.setdefault(rule["alert"], set()).add(rule["labels"]["severity"])
    for rule in load_rules():
        if "alert" not in rule:
            continue
        name = rule["alert"]
        assert name in firing, f"{name}: no firing case in tests/rules"
        for exp in firing[name]:
            assert set(exp["exp_annotations"]) == ANNOTATIONS | (set(rule["annotations"]) & {EVIDENCE}), name
            assert exp["exp_annotations"]["runbook_url"].endswith(f"/{name}")
            assert exp["exp_labels"]["severity"] in severities[name]
        if name != "Watchdog":  # always fires by design
            assert name in quiet, f"{name}: no near-miss case (exp_alerts: []) in tests/rules"


def test_every_alert_has_the_same_anatomy() -> None:
    for rule in load_rules():
        if "alert" not in rule:
            continue
        name = rule["alert"]
        assert re.fullmatch(r"[A-Z][A-Za-z0-9]+", name), name
        assert rule["labels"]["severity"] in SEVERITIES, name
        assert set(rule["annotations"]) - {EVIDENCE} == ANNOTATIONS, name
        page = rule["labels"]["severity"] == "critical"
        if page and not rule["_group"].startswith(links.SLO_GROUP_PREFIX):
            assert rule["annotations"].get(EVIDENCE) == links.evidence_url(name), f"{name}: a page links its evidence"
        else:
            assert EVIDENCE not in rule["annotations"], f"{name}: only a page about an agent's node has evidence"
        assert "{{" not in rule["annotations"]["summary"], f"{name}: summary must be static (CommonAnnotations)"
        assert rule["annotations"]["summary"].endswith("."), name
        assert "$labels" in rule["annotations"]["description"] or name in {"Watchdog"}, name
        url = rule["annotations"]["runbook_url"]
        # the rule's fallback base is the agent's own runbook server, as in inferwatch.agent.config
        assert url.endswith(f"{{{{ else }}}}{DEFAULT_RUNBOOKS_BASE_URL}{{{{ end }}}}/{name}"), url
        assert (
            "$externalLabels.runbook_base" in url
            and "$externalLabels.dashboard_base" in (rule["annotations"]["dashboard_url"])
        )


def _selector_names(node: object, out: set[str]) -> None:
    if isinstance(node, promql_parser.VectorSelector):
        if node.name:
            out.add(node.name)
        return
    for attr in ("lhs", "rhs", "expr", "args", "vector_selector", "param"):
        child = getattr(node, attr, None)
        if isinstance(child, (list, tuple)):
            for c in child:
                _selector_names(c, out)
        elif child is not None:
            _selector_names(child, out)


_TEMPLATE_QUERY_RE = re.compile(r'printf "([a-z](?:[^"\\]|\\.)*)"')


def test_every_metric_named_in_a_rule_is_in_the_catalog() -> None:
    # up: the scrape's own series; ALERTS: Prometheus's series of pending/firing alerts, only for alerts of this pack
    # http_requests_total: vLLM's own HTTP metrics (prometheus_fastapi_instrumentator), scraped by Prometheus from
    # the engine for the availability SLO; the vLLM-exact simulator's recorded exposition must carry it
    # vllm:inter_token_latency_seconds_*: per data-parallel rank (label engine), which the agent sums away;
    # DataParallelRankSlow reads them from the engine's job
    engine_native = {
        "http_requests_total",
        "vllm:inter_token_latency_seconds_sum",
        "vllm:inter_token_latency_seconds_count",
    }
    recorded = (ROOT / "tests" / "fixtures" / "sim" / "vllm-sim-dp2-a.prom").read_text()
    assert all(re.search(rf"^{re.escape(n)}\{{", recorded, re.M) for n in engine_native)
    known = prometheus_series_names() | {"up", "ALERTS"} | engine_native
    records = {r["record"] for r in load_rules() if "record" in r}
    seen: set[str] = set()
    for rule in load_rules():
        names: set[str] = set()
        _selector_names(promql_parser.parse(rule["expr"]), names)
        # evidence queries inside annotation templates: printf "<promql with %q>" ...
        for text in rule.get("annotations", {}).values():
            for q in _TEMPLATE_QUERY_RE.findall(text):
                _selector_names(promql_parser.parse(q.replace('\\"', '"').replace("%q", '"x"')), names)
        unknown = names - known - records
        assert not unknown, f"{rule.get('alert') or rule.get('record')}: not in the catalog: {sorted(unknown)}"
        seen |= names
    assert len(seen) > 20  # the walk found the selectors (a parser change cannot silently empty it)


def test_slo_rules_are_regenerated_exactly() -> None:
    assert (ALERTS_DIR / "slo.rules.yml").read_text() == slo.generate(), "run: python -m inferwatch.agent.alerts.slo"
    assert slo.main(["--check"]) == 0


def test_links_are_generated_for_every_alert() -> None:
    """runbook_url / dashboard_url come from inferwatch.agent.alerts.links' two templates, in every rule file."""
    for rule in load_rules():
        if "alert" in rule:
            want = links.links(rule["alert"], rule["_group"])
            got = {k: rule["annotations"][k] for k in links.LINK_KEYS}
            assert got == want, f"{rule['alert']}: run python -m inferwatch.agent.alerts.links"
    assert links.main(["--check"]) == 0


def test_evidence_url_links_the_agent_only_when_the_job_is_the_agents() -> None:
    url = links.evidence_url("EngineDown")
    assert url == (
        '{{ if eq $labels.job "inferwatch-agent" }}http://{{ $labels.instance }}'
        "/api/v1/evidence/latest?alertname=EngineDown{{ end }}"
    )
    assert links.AGENT_JOB == "inferwatch-agent"  # AgentDown's up{job=...} and deploy/prometheus.yml's job_name
    assert 'up{job="inferwatch-agent"}' in (ALERTS_DIR / "inferwatch.rules.yml").read_text()
    assert set(links.links("EngineDown", "inferwatch-engine", "critical")) == {*links.LINK_KEYS, links.EVIDENCE_KEY}
    assert set(links.links("StreamSchemaViolation", "inferwatch-engine", "warning")) == set(links.LINK_KEYS)
    assert set(links.links("TTFTErrorBudgetBurn", "inferwatch-slo-ttft-500ms-alerts", "critical")) == set(
        links.LINK_KEYS
    )
    # every page's rendered link (tests/rules: the expected annotation) points at its alert on the agent
    for path in rule_test_files():
        for case in yaml.safe_load(path.read_text())["tests"]:
            for check in case.get("alert_rule_test", []):
                for exp in check["exp_alerts"]:
                    got = exp["exp_annotations"].get(EVIDENCE)
                    if got:
                        instance = exp["exp_labels"]["instance"]
                        want = f"http://{instance}/api/v1/evidence/latest?alertname={check['alertname']}"
                        assert got == want and exp["exp_labels"]["job"] == links.AGENT_JOB, (path.name, got)


def test_link_rewrite_adds_missing_links_and_undoes_hand_edits(tmp_path: Path) -> None:
    shipped = (ALERTS_DIR / "inferwatch.rules.yml").read_text()
    lines = shipped.split("\n")
    at = lines.index("      - alert: EngineDown")
    runbook = next(i for i in range(at, len(lines)) if "runbook_url:" in lines[i])
    edited = lines[:runbook] + lines[runbook + 2 :]  # a new rule: no links at all
    text = "\n".join(edited).replace("/d/inferwatch-node{{ with", "/d/inferwatch-nodes{{ with", 1)  # a hand edit
    assert "/d/inferwatch-nodes" in text
    path = tmp_path / "inferwatch.rules.yml"
    path.write_text(text)
    assert links.main(["--check", str(path)]) == 1
    assert links.main([str(path)]) == 0 and path.read_text() == shipped
    assert links.main(["--check", str(path)]) == 0


def test_every_rule_group_links_a_dashboard_with_its_variables() -> None:
    for rule in load_rules():
        if "alert" in rule:
            links.dashboard_for_group(rule["_group"])
    with pytest.raises(ConfigError, match="GROUP_DASHBOARDS"):
        links.dashboard_for_group("inferwatch-new")
    for uid in {*links.GROUP_DASHBOARDS.values(), links.SLO_DASHBOARD}:
        board = json.loads((ROOT / "dashboards" / "json" / f"{uid}.json").read_text())
        queries = {v["name"]: v.get("query") for v in board["templating"]["list"]}
        for var, label in links.LINK_VARIABLES:
            if var in queries:  # the variable's values are the label the link fills it from
                query = queries[var]["query"] if isinstance(queries[var], dict) else queries[var]
                assert query.rstrip().endswith(f", {label})"), (uid, var, query)
        assert "instance" in queries, uid


def _spec(**over: object) -> dict:
    base = {
        "name": "ttft-x",
        "alert": "TTFTErrorBudgetBurn",
        "histogram": "gen_ai_server_time_to_first_token_seconds",
        "threshold_s": 0.5,
        "objective": 0.99,
        "group_by": ["gen_ai_request_model"],
    }
    return {"version": 1, "period": "30d", "slos": [{**base, **over}]}


def test_slo_thresholds_print_as_written() -> None:
    text = slo.render(slo.parse_spec(_spec(objective=0.999, threshold_s=1.0)))
    assert "(14.4 * 0.001)" in text and "(6 * 0.001)" in text and "vector(0.999)" in text
    assert "0.000999" not in text and "0.0010000" not in text
    assert 'le="1.0"' in text  # as the agent's exporter writes le (repr of the float)
    assert "within 1s" in text


@pytest.mark.parametrize(
    ("over", "message"),
    [
        ({"threshold_s": 0.3}, "not a bucket edge"),
        ({"threshold_s": 0.45}, "not a bucket edge"),
        ({"histogram": "inferwatch_engine_up"}, "not a histogram"),
        ({"histogram": "nope_seconds"}, "not in the metric catalog"),
        ({"objective": 1.0}, "between 0 and 1"),
        ({"objective": "high"}, "not a number"),
        ({"alert": "lower_case"}, "CamelCase"),
        ({"surprise": 1}, "unknown keys"),
    ],
)
def test_slo_spec_errors_are_clear(over: dict, message: str) -> None:
    with pytest.raises(ConfigError, match=message):
        slo.parse_spec(_spec(**over))


def test_slo_check_fails_on_a_hand_edit(tmp_path: Path) -> None:
    out = tmp_path / "slo.rules.yml"
    out.write_text(slo.generate().replace("(14.4 * 0.01)", "(14 * 0.01)", 1))
    assert slo.main(["--check", "--out", str(out)]) == 1
    assert slo.main(["--out", str(out)]) == 0 and out.read_text() == slo.generate()


def test_near_misses_catch_a_loosened_rule(tmp_path: Path) -> None:
    """Mutate the rules the way a careless edit would; the unit tests must notice."""
    src = (ALERTS_DIR / "inferwatch.rules.yml").read_text()
    mutants = {
        "traffic floor dropped": src.replace(">= 50", ">= 0"),
        "tail threshold lowered": src.replace(
            'tail_ratio{quantity="prefill",window="5m",source="histogram"} > 3',
            'tail_ratio{quantity="prefill",window="5m",source="histogram"} > 2.5',
        ),
        "tail ratio back on TTFT (issue 15)": src.replace(
            'tail_ratio{quantity="prefill",window="5m",source="histogram"} > 3',
            'tail_ratio{quantity="ttft",window="5m",source="histogram"} > 3',
        ),
        "tail ratio read from spans too (the fleet drill's false page)": src.replace(
            'tail_ratio{quantity="prefill",window="5m",source="histogram"} > 3',
            'tail_ratio{quantity="prefill",window="5m"} > 3',
        ).replace(
            'samples{quantity="prefill",window="5m",source="histogram"} >= 50',
            'samples{quantity="prefill",window="5m"} >= 50',
        ),
        "inhibitors no longer suppress the tail alert (issue 15)": src.replace(
            'ALERTS{alertname=~"LatencyBimodal|PageCachePressureTailLatency|RuntimePageCacheThrashing|KVTransferSlow|'
            'FrontendDelayHigh"}',
            'ALERTS{alertname="none"}',
        ),
        "production exclusion dropped": src.replace(
            'unless on(instance) inferwatch_agent_info{environment="production"}', ""
        ),
    }
    test_text = (RULE_TESTS_DIR / "inferwatch.test.yml").read_text()
    for what, text in mutants.items():
        assert text != src, what
        (tmp_path / "inferwatch.rules.yml").write_text(text)
        (tmp_path / "t.test.yml").write_text(
            test_text.replace("rule_files: [../../alerts/inferwatch.rules.yml]", "rule_files: [inferwatch.rules.yml]")
        )
        r = run_tool(tool("promtool"), "test", "rules", tmp_path / "t.test.yml", cwd=tmp_path)
        assert r.returncode == 1 and "FAILED" in r.stdout + r.stderr, what


def test_test_profile_compresses_every_duration(tmp_path: Path) -> None:
    assert profile.compress_duration("5m", 60) == "5s"
    assert profile.compress_duration("1h30m", 60) == "90s"
    assert profile.compress_duration("1d", 60) == "1440s"
    assert profile.compress_duration("0s", 60) == "0s"
    expr = 'rate(x[5m]) > 0 and y offset 1d and max_over_time(z[1h:5m]) and w{window="5m"}'
    assert profile.compress_expr(expr, 60) == (
        'rate(x[5s]) > 0 and y offset 1440s and max_over_time(z[60s:5s]) and w{window="5m"}'
    )
    # a floor on ranges (not on subquery steps or offsets): a [1m] rate is [1s] otherwise, one 1 s scrape at most
    expr = "rate(x[1m]) / rate(x[5m]) and avg_over_time(y[2m:15s]) and z offset 1m"
    assert profile.compress_expr(expr, 60, min_range_s=3) == (
        "rate(x[3s]) / rate(x[5s]) and avg_over_time(y[3s:1s]) and z offset 1s"
    )
    with pytest.raises(ValueError):
        profile.duration_s("5 minutes")
    for path in rule_files():
        out = tmp_path / path.name
        out.write_text(profile.render_file(path))
        r = run_tool(tool("promtool"), "check", "rules", out)
        assert r.returncode == 0, r.stdout + r.stderr
        rules = [r for g in yaml.safe_load(out.read_text())["groups"] for r in g["rules"]]
        assert all(not re.search(r"\[\d+[mhd]", r["expr"]) for r in rules), path
        assert all(r.get("for", "0s").endswith("s") for r in rules), path


def _availability(**over: object) -> dict:
    base = {
        "name": "avail-x",
        "alert": "EngineErrorBudgetBurn",
        "kind": "availability",
        "total": 'http_requests_total{handler=~"/v1/.+"}',
        "errors": 'http_requests_total{handler=~"/v1/.+",status="5xx"}',
        "objective": 0.999,
        "group_by": ["instance"],
        "fast_page": {"alert": "EngineErrorRateHigh", "error_ratio": 0.05, "window": "5m", "for": "1m"},
    }
    return {"version": 1, "period": "30d", "slos": [{**base, **over}]}


@pytest.mark.parametrize(
    ("over", "message"),
    [
        ({"kind": "throughput"}, "must be one of"),
        ({"histogram": "gen_ai_server_time_to_first_token_seconds"}, "unknown keys"),
        ({"errors": "rate(http_requests_total[5m])"}, "counter selector"),
        ({"total": 'http_requests_total{status="5xx"'}, "counter selector"),
        ({"fast_page": {"alert": "EngineErrorRateHigh", "error_ratio": 5, "window": "5m", "for": "1m"}}, "between"),
        ({"fast_page": {"alert": "EngineErrorRateHigh", "error_ratio": 0.05, "window": "4m", "for": "1m"}}, "recorded"),
        ({"fast_page": {"alert": "EngineErrorBudgetBurn", "error_ratio": 0.05, "window": "5m", "for": "1m"}}, "share"),
    ],
)
def test_availability_slo_spec_errors_are_clear(over: dict, message: str) -> None:
    with pytest.raises(ConfigError, match=message):
        slo.parse_spec(_availability(**over))


def test_latency_fast_page_is_the_slos_own_alert_labelled_as_a_one_window_burn() -> None:
    fast = {"error_ratio": 0.4, "window": "5m", "for": "1m"}
    text = slo.render(slo.parse_spec(_spec(fast_page=fast)))
    rules = [r for g in yaml.safe_load(text)["groups"] for r in g["rules"] if r.get("alert")]
    assert [r["alert"] for r in rules] == ["TTFTErrorBudgetBurn"] * 5
    page = rules[-1]
    assert page["labels"] == {"severity": "critical", "long": "5m", "short": "5m", "burn_rate": "40"}
    assert page["for"] == "1m" and 'ratio_rate5m{slo="ttft-x"} > 0.4' in page["expr"]
    assert "gone in 18 hours" in page["annotations"]["description"]
    with pytest.raises(ConfigError, match="recorded"):
        slo.parse_spec(_spec(fast_page={**fast, "window": "10m"}))
    with pytest.raises(ConfigError, match="share"):  # naming it the SLO's alert explicitly is still an error
        slo.parse_spec(_spec(fast_page={**fast, "alert": "TTFTErrorBudgetBurn"}))


def test_availability_sli_counts_a_missing_failure_series_as_zero() -> None:
    text = slo.render(slo.parse_spec(_availability()))
    assert 'rate(http_requests_total{handler=~"/v1/.+",status="5xx"}[5m])) or 0 * sum by (instance)' in text
    assert "- alert: EngineErrorRateHigh" in text and 'ratio_rate5m{slo="avail-x"} > 0.05' in text
    assert text.count("- alert: EngineErrorBudgetBurn") == 4
