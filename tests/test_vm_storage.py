"""Storage that scales: agents → Prometheus agent mode / vmagent → remote write → VictoriaMetrics + vmalert.

One stack for the module, all real binaries on 127.0.0.1: a simulator under load, two inferwatch agents
(nodes), Prometheus in agent mode scraping node A and vmagent scraping node B, both remote-writing to
VictoriaMetrics **and** to a Prometheus server (remote-write receiver), so the two evaluators hold the same
samples. The Prometheus server evaluates the rule files, vmalert evaluates the same files against
VictoriaMetrics and notifies the shipped Alertmanager configuration (receivers pointed at a local sink).

Rules run in the test profile (every duration / 60, 1 s scrape and evaluation; inferwatch.agent.alerts.profile), as in
the end-to-end pipeline test. Proven here:
- samples arrive in VictoriaMetrics through both remote-write paths;
- ``vmalert -dryRun`` accepts every shipped rule file as written (MetricsQL parse, template parse);
- every rule's expression, evaluated at the same instant by Prometheus and by VictoriaMetrics (what vmalert
  evaluates), gives the same series and values within tolerance;
- every alert's annotations render in vmalert (each alert forced to fire with the labels its templates read,
  evidence queries included) the way Prometheus renders them, and vmalert's alerts reach Alertmanager.
"""

from __future__ import annotations

import contextlib
import json
import math
import re
import subprocess
import time
from collections.abc import Iterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import httpx
import promql_parser
import pytest
import yaml

from inferwatch.agent.alerts.profile import DEFAULT_FACTOR, duration_s, render_file
from tests.conftest import PYTHON, ROOT, free_port
from tests.e2e.harness import Sink, alertmanager_config
from tests.procs import running, wait_http
from tests.tools import require
from tests.vmstack import instant, prometheus_agent, self_metric, victoria_metrics, vmagent, vmalert

pytestmark = [pytest.mark.integration, pytest.mark.slow, pytest.mark.cpu_heavy]

MODEL = "sim-vm"
FAKE_GPU = "NVIDIA H100 80GB HBM3"
EXTERNAL_LABELS = {"runbook_base": "http://127.0.0.1:9435/vm-test-runbooks"}
RULE_FILES = sorted((ROOT / "alerts").glob("*.rules.yml"))
MIN_RUN_S = 75.0  # ≥ the longest full window of the test profile that the comparison relies on (1h / 60)
DATA_TIMEOUT_S = 120.0
SETTLE_S = 3.0  # remote write batches within 1 s; compare at an instant both stores have received
# Values: gauges and *_over_time of the same samples agree exactly; rate()/increase() do not extrapolate in
# MetricsQL (Prometheus extrapolates to the window's edges), which over the profile's 5-10 s windows of 1 s
# samples moves a rate by up to a sample's worth, and recording-rule outputs are read back at each engine's
# own evaluation instants.
REL_TOL_EXACT = 1e-9
REL_TOL_RATE = 0.25
REL_TOL_RECORDED = 0.5  # a recorded input was itself evaluated at each engine's own instants (twice, when chained)
ABS_TOL = 1e-6
PERSIST_INSTANTS = 3  # a disagreement must be there at this many instants a scrape apart (_compare_persistent)
RECORDED_LAG_S = 8.0  # how far apart the two evaluators' recordings may be read (_recorded_lag_explains)
RATE_RE = re.compile(r"\b(rate|increase|irate|delta|idelta)\(")
RECORDED_RE = re.compile(r"\w:\w")
LABEL_RE = re.compile(r"\$labels\.(\w+)")
FUNC_RE = re.compile(r"(?:\{\{-?|\||\()\s*([a-z][A-Za-z0-9]*)\b")
TEMPLATE_KEYWORDS = {"if", "else", "end", "with", "range", "and", "or", "not", "len", "index", "print", "printf"}
NUMBER_RE = re.compile(r"-?\d+(?:\.\d+)?(?:e[+-]?\d+)?")
RANGE_RE = re.compile(r"\[(\w+)(?::\w*)?\]|offset (\w+)")
RATE_RANGE_RE = re.compile(r"\b(?:rate|increase|irate|delta|idelta)\([^\[]*\[(\w+)\]")
PROFILE_SCRAPE_S = (
    1.0  # the test profile's scrape and evaluation interval (tests/vmstack.py, inferwatch.agent.alerts.profile)
)
PRODUCTION_SCRAPE_S = 15.0
RECORDED_WINDOW_RE = re.compile(r":\w*rate(\d+[smhd])\b")  # slo:sli_requests:rate2h reads 2h (shipped)


@dataclass
class Stack:
    tmp: Path
    vm: str
    prom: str
    prom_agent: str
    vmagent: str
    vmalert: str
    alertmanager: str
    sink: Sink
    instances: dict[str, str]  # path → instance label of the node scraped through it
    started: float  # unix time the first samples were written
    forced: dict[str, dict[str, str]] = field(default_factory=dict)  # alertname → forced labels


def _rules(paths: list[Path]) -> list[dict[str, Any]]:
    return [r for p in paths for g in yaml.safe_load(p.read_text())["groups"] for r in g["rules"]]


def _label_values(prom: str, instance: str, names: set[str]) -> dict[str, str]:
    """For each label name, a value a real series of ``instance`` carries (so evidence queries find data)."""
    out = {"instance": instance, "job": "inferwatch-agent", "gen_ai_request_model": MODEL}
    for name in sorted(names - set(out)):
        found = instant(prom, f'count by ({name}) ({{instance="{instance}",{name}!=""}})', time.time())
        out[name] = found[0]["metric"][name] if found else "forced"
    return out


def _forced_rules(prom: str, instance: str) -> dict[str, Any]:
    """Every shipped alert, once, firing at once for ``instance`` with the labels its annotations read."""
    rules, seen = [], set()
    for rule in _rules(RULE_FILES):
        name = rule.get("alert")
        if name is None or name in seen:
            continue
        seen.add(name)
        text = " ".join(str(v) for v in rule.get("annotations", {}).values())
        labels = _label_values(prom, instance, set(LABEL_RE.findall(text)))
        expr = f'up{{job="inferwatch-agent",instance="{instance}"}}'
        for k, v in labels.items():
            if k not in ("instance", "job"):
                expr = f'label_replace({expr}, "{k}", "{v}", "", "")'
        rules.append(
            {
                "alert": name,
                "expr": expr,
                "labels": {**rule.get("labels", {}), "forced": "true"},
                "annotations": rule.get("annotations", {}),
            }
        )
    rules.append({"alert": "TemplateProbe", "expr": "vector(1)", "labels": {"forced": "true"}, "annotations": _probe()})
    return {"groups": [{"name": "forced", "rules": rules}]}


def _used_functions() -> set[str]:
    """Template functions the shipped annotations call (text inside quoted strings excluded)."""
    used: set[str] = set()
    for rule in _rules(RULE_FILES):
        for text in rule.get("annotations", {}).values():
            for block in re.findall(r"\{\{(.*?)\}\}", str(text), re.S):
                used |= set(FUNC_RE.findall("{{" + re.sub(r'"(?:[^"\\]|\\.)*"', '""', block)))
    return used - TEMPLATE_KEYWORDS


def _probe() -> dict[str, str]:
    """One annotation per function the shipped annotations call, each applied to fixed inputs, so that both
    engines render it with data (a forced copy of a real alert may take its ``else`` branch: no GPU here).
    The inputs come through ``query`` | ``first`` | ``value`` / ``label``, the way the annotations read them."""
    inputs = ("0.0123", "1234.5", "1e9")
    out = {}
    for fn in sorted(_used_functions() - {"query", "first", "value", "label"}):
        parts = [
            f'{{{{ with query "label_replace(vector({x}), \\"kernel_release\\", \\"6.1.0-k\\", \\"\\", \\"\\")" }}}}'
            f'{{{{ . | first | value | {fn} }}}}/{{{{ . | first | label "kernel_release" }}}}{{{{ end }}}}'
            for x in inputs
        ]
        out[f"fn_{fn}"] = " ".join(parts)
    out["fn_printf"] = '{{ printf "%.2f %.0f %q" 1234.567 $value "a\\"b" }}'
    return out


def _wait(pred: Any, timeout_s: float, what: str) -> None:
    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline:
        if pred():
            return
        time.sleep(1)
    raise AssertionError(f"timed out after {timeout_s}s waiting for {what}")


@pytest.fixture(scope="module")
def stack(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Stack]:
    binaries = {b: require(b) for b in ("victoria-metrics", "vmagent", "vmalert", "prometheus")}
    binaries["prometheus-alertmanager"] = require("prometheus-alertmanager")
    tmp = tmp_path_factory.mktemp("vmstore")
    rules_dir = tmp / "rules"
    rules_dir.mkdir()
    for path in RULE_FILES:
        (rules_dir / path.name).write_text(render_file(path, DEFAULT_FACTOR))
    with contextlib.ExitStack() as es:
        sink = es.enter_context(Sink())
        sim_port = free_port()
        sim_cmd = [
            PYTHON,
            "-m",
            "inferwatch.agent",
            "simulate",
            "--port",
            str(sim_port),
            "--model",
            MODEL,
            "--seed",
            "6",
        ]
        sim = es.enter_context(running([*sim_cmd, "--log-level", "warning"], tmp / "sim.log", cwd=ROOT))
        sim_url = f"http://127.0.0.1:{sim_port}"
        agents: dict[str, int] = {}
        for path, gpu in (("prometheus-agent", ""), ("vmagent", FAKE_GPU)):
            # The agent as shipped (tests/node_agent.py), probing the simulator and asking for its runtime
            # profile, so those alerts' inputs exist too; node B has a GPU behind the fake NVML.
            port = free_port()
            env = {
                "INFERWATCH_LISTEN_PORT": str(port),
                # One collection per scrape: at 0.5 s the two agents' collections, on a machine the suite's other
                # heavy files share, outran their 0.5 s budget and /metrics missed the 1 s scrape timeout (32 failed
                # scrapes in 4 minutes), which makes Prometheus and VictoriaMetrics differ by design (staleness).
                "INFERWATCH_INTERVAL_S": "1",
                "INFERWATCH_ENGINE__METRICS_URL": f"{sim_url}/metrics",
                "INFERWATCH_RUNTIME__PID": str(sim.pid),
                "INFERWATCH_PROBE__URL": sim_url,
                "INFERWATCH_PROBE__INTERVAL_S": "2",
                "INFERWATCH_RUNTIME_PROFILE__URL": f"{sim_url}/debug/runtime_profile",
                "INFERWATCH_RUNTIME_PROFILE__INTERVAL_S": "2",
                "DASH_FAKE_GPU": gpu,
            }
            cmd = [PYTHON, "-m", "tests.node_agent"]
            proc = es.enter_context(running(cmd, tmp / f"agent-{path}.log", cwd=ROOT, env=env))
            wait_http(f"http://127.0.0.1:{port}/metrics", timeout_s=60, proc=proc)
            agents[path] = port
        wait_http(f"{sim_url}/health", timeout_s=60, proc=sim)
        load = [PYTHON, "-m", "inferwatch.agent", "loadgen", "--url", sim_url, "--rate", "4", "--duration", "900"]
        load += ["--output-tokens", "32", "--timeout", "900", "--seed", "6", "--no-progress"]
        es.enter_context(running(load, tmp / "loadgen.log", cwd=ROOT))

        # Alertmanager with the shipped routes, receivers at the sink (as the e2e harness does).
        key_file = tmp / "pagerduty_routing_key"
        key_file.write_text("vm0123456789abcdef0123456789abcd\n")
        am_yml = tmp / "alertmanager.yml"
        am_yml.write_text(yaml.safe_dump(alertmanager_config(sink.url, key_file), sort_keys=False))
        am_port = free_port()
        am_url = f"http://127.0.0.1:{am_port}"
        am_cmd = [binaries["prometheus-alertmanager"], f"--config.file={am_yml}", f"--storage.path={tmp / 'am'}"]
        am_cmd += [f"--web.listen-address=127.0.0.1:{am_port}", f"--web.external-url={am_url}"]
        am = es.enter_context(running([*am_cmd, "--cluster.listen-address="], tmp / "alertmanager.log"))
        wait_http(f"{am_url}/-/ready", timeout_s=60, proc=am, ok=lambda r: r.status_code == 200)

        vm = es.enter_context(victoria_metrics(tmp, binaries["victoria-metrics"]))
        runbook_base = EXTERNAL_LABELS["runbook_base"]
        forced_file = tmp / "forced" / "forced.rules.yml"
        forced_file.parent.mkdir()
        forced_file.write_text("groups: []\n")  # filled in once the data is there (label values come from it)

        # The second evaluator: a Prometheus server fed by the same remote writes.
        prom_port = free_port()
        prom = f"http://127.0.0.1:{prom_port}"
        prom_cfg = {
            "global": {"evaluation_interval": "1s", "external_labels": {"runbook_base": runbook_base}},
            "rule_files": [str(rules_dir / "*.rules.yml"), str(forced_file)],
            # Seen on the loaded 2-core VM: after scrape timeouts, vmagent's blocks reached the Prometheus
            # receiver out of order and were refused (HTTP 400 "out of order sample", the block dropped);
            # VictoriaMetrics takes late samples. Accepting them keeps both stores' samples the same.
            "storage": {"tsdb": {"out_of_order_time_window": "5m"}},
        }
        prom_yml = tmp / "prometheus.yml"
        prom_yml.write_text(yaml.safe_dump(prom_cfg, sort_keys=False))
        prom_cmd = [binaries["prometheus"], f"--config.file={prom_yml}", f"--storage.tsdb.path={tmp / 'prom'}"]
        prom_cmd += [f"--web.listen-address=127.0.0.1:{prom_port}", "--web.enable-remote-write-receiver"]
        prom_cmd += ["--web.enable-lifecycle"]
        p = es.enter_context(running(prom_cmd, tmp / "prometheus.log"))
        wait_http(f"{prom}/-/ready", timeout_s=60, proc=p, ok=lambda r: r.status_code == 200)

        writes = [f"{vm}/api/v1/write", f"{prom}/api/v1/write"]
        pa = es.enter_context(
            prometheus_agent(
                tmp, binaries["prometheus"], {"inferwatch-agent": [f"127.0.0.1:{agents['prometheus-agent']}"]}, writes
            )
        )
        va = es.enter_context(
            vmagent(tmp, binaries["vmagent"], {"inferwatch-agent": [f"127.0.0.1:{agents['vmagent']}"]}, writes)
        )
        rule_paths = [rules_dir / p.name for p in RULE_FILES] + [forced_file]
        vma = es.enter_context(vmalert(tmp, binaries["vmalert"], rule_paths, vm, am_url, EXTERNAL_LABELS))
        instances = {path: f"127.0.0.1:{port}" for path, port in agents.items()}
        st = Stack(tmp, vm, prom, pa, va, vma, am_url, sink, instances, time.time())
        started = time.monotonic()

        def ttft_in(base: str) -> bool:
            expr = f'sum(gen_ai_server_time_to_first_token_seconds_count{{gen_ai_request_model="{MODEL}"}})'
            got = instant(base, expr, time.time() - SETTLE_S)
            return bool(got) and float(got[0]["value"][1]) > 0

        _wait(lambda: ttft_in(vm) and ttft_in(prom), DATA_TIMEOUT_S, "TTFT samples in both stores")
        forced = _forced_rules(prom, instances["prometheus-agent"])
        forced_file.write_text(yaml.safe_dump(forced, sort_keys=False, width=1000))
        st.forced = {r["alert"]: r for r in forced["groups"][0]["rules"]}
        httpx.post(f"{prom}/-/reload", timeout=30).raise_for_status()
        httpx.get(f"{vma}/-/reload", timeout=30).raise_for_status()
        left = MIN_RUN_S - (time.monotonic() - started)
        if left > 0:
            time.sleep(left)
        yield st


def test_samples_arrive_through_both_remote_write_paths(stack: Stack) -> None:
    at = time.time() - SETTLE_S
    for path, inst in stack.instances.items():
        for base in (stack.vm, stack.prom):
            # Scraped successfully within the last 10 s (one scrape that timed out on a loaded machine is not a
            # remote-write path that fails; a path that fails has no good scrape at all).
            up = instant(base, f'max_over_time(up{{job="inferwatch-agent",instance="{inst}"}}[10s])', at)
            assert [u["value"][1] for u in up] == ["1"], f"{path}: up of {inst} in {base}: {up}"
            # Series of the node at instants over the last 10 s (one scrape that timed out leaves a gap, not a path
            # that fails); count_over_time drops the names, so count at each instant instead.
            counts = [instant(base, f'count({{instance="{inst}"}})', at - dt) for dt in range(0, 11, 2)]
            n = max((float(c[0]["value"][1]) for c in counts if c), default=0.0)
            assert n > 100, f"{path}: series of {inst} in {base}: {counts}"
    # The senders' own counters: both wrote, neither dropped.
    assert self_metric(stack.prom_agent, "prometheus_remote_storage_samples_total") > 0
    assert self_metric(stack.prom_agent, "prometheus_remote_storage_samples_failed_total") == 0
    assert self_metric(stack.vmagent, "vmagent_remotewrite_requests_total") > 0
    assert self_metric(stack.vmagent, "vmagent_remotewrite_packets_dropped_total") == 0
    # vmalert's recording rules are written back to VictoriaMetrics.
    rec = instant(stack.vm, f'slo:sli_error:ratio_rate5m{{gen_ai_request_model="{MODEL}"}}', at)
    assert rec, "vmalert's recording rule results are not in VictoriaMetrics"


@pytest.mark.parametrize("path", RULE_FILES, ids=lambda p: p.name)
def test_vmalert_dry_run_loads_every_shipped_rule_file(path: Path, tmp_path: Path) -> None:
    binary = require("vmalert")
    r = subprocess.run([binary, "-dryRun", f"-rule={path}"], capture_output=True, text=True, timeout=60)
    assert r.returncode == 0, r.stdout + r.stderr
    # And it does check: a broken template in the same file is rejected.
    broken = path.read_text().replace("{{ $labels.instance }}", "{{ $labels.instance | nosuchfunc }}", 1)
    if broken != path.read_text():
        bad = tmp_path / path.name
        bad.write_text(broken)
        r = subprocess.run([binary, "-dryRun", f"-rule={bad}"], capture_output=True, text=True, timeout=60)
        assert r.returncode != 0 and "nosuchfunc" in r.stdout + r.stderr


def _key(metric: dict[str, str]) -> tuple[tuple[str, str], ...]:
    """A series' labels without its name and the external labels.

    vmalert adds its ``-external.label`` labels to the recording-rule results it writes back, so in
    VictoriaMetrics they are on every recorded series; Prometheus adds its external labels only on the way
    out (remote write, federation, alerts), never in its own storage. Either way the labels leave with them.
    vmalert also writes ``alertgroup`` (its rule group) on the ``ALERTS`` series it stores; Prometheus's have none.
    Rules that read ``ALERTS`` match on named labels (``on(instance, gen_ai_request_model)``), so it is left out too.
    """
    alerts = metric.get("__name__") in ("ALERTS", "ALERTS_FOR_STATE")
    skip = set(EXTERNAL_LABELS) | ({"alertgroup"} if alerts else set())
    return tuple(sorted((k, v) for k, v in metric.items() if k != "__name__" and k not in skip))


def _close(a: float, b: float, rel: float) -> bool:
    if math.isinf(rel) or (math.isnan(a) and math.isnan(b)):
        return True
    return abs(a - b) <= max(ABS_TOL, rel * max(abs(a), abs(b)))


def _reach_s(expr: str) -> float:
    """How far back ``expr`` reads: its longest range plus offset, in seconds.

    A recorded series named for its window (``slo:sli_requests:rate2h``) reads that window, compressed.
    """
    found = RANGE_RE.findall(expr)
    reach = sum(max((duration_s(m[i]) for m in found if m[i]), default=0.0) for i in (0, 1))
    recorded = [duration_s(w) / DEFAULT_FACTOR for w in RECORDED_WINDOW_RE.findall(expr)]
    return max([reach, *recorded])


DEGENERATE_RECORDS: set[str] = set()  # recorded names whose own compressed rate is degenerate (filled per run)


def _degenerate_rate(expr: str) -> bool:
    """A rate whose compressed window holds fewer than two scrapes (a shipped ``[1m]`` is ``[1s]`` in the profile),
    directly or through a recorded series made by one (:data:`DEGENERATE_RECORDS`).

    Prometheus computes a rate from the samples inside the window and has none to compare with one; MetricsQL
    also reads the sample before the window, so it answers. Neither is wrong and the shipped rules never meet it:
    every rate window there holds at least two production scrapes
    (``test_every_shipped_rate_window_holds_two_production_scrapes``).
    """
    if any(re.search(rf"(?<![\w:]){re.escape(name)}(?![\w:])", expr) for name in DEGENERATE_RECORDS):
        return True
    return any(duration_s(w) < 2 * PROFILE_SCRAPE_S for w in RATE_RANGE_RE.findall(expr))


def _children(node: Any) -> list[Any]:
    if isinstance(node, promql_parser.BinaryExpr):
        return [node.lhs, node.rhs]
    if isinstance(node, promql_parser.Call):
        return list(node.args)
    if isinstance(node, promql_parser.MatrixSelector):
        return [node.vector_selector]
    if isinstance(node, promql_parser.AggregateExpr):
        return [node.expr] + ([node.param] if node.param is not None else [])
    if isinstance(node, (promql_parser.ParenExpr, promql_parser.UnaryExpr, promql_parser.SubqueryExpr)):
        return [node.expr]
    return []


def _nodes(node: Any) -> Iterator[Any]:
    yield node
    for child in _children(node):
        yield from _nodes(child)


def _quantile_filtered(rules: list[dict[str, Any]]) -> tuple[set[str], set[str]]:
    """Recorded names whose values come from a quantile of recorded bucket rates, and those whose *series* do.

    The first are compared by series only (:func:`_compare`). A comparison that filters on such a value (the
    conformance band's "nodes inside", a node's P95 over the band's edge) keeps or drops a series as the
    interpolated quantile jumps between bucket edges, at each engine's own instants (seen: one node inside the
    band in Prometheus, none in VictoriaMetrics), so for those even which series exist is noise: the label names
    they carry are compared instead.
    """
    exprs = {str(r["record"]): promql_parser.parse(str(r["expr"])) for r in rules if r.get("record")}
    quantiled: set[str] = set()
    filtered: set[str] = set()
    changed = True
    while changed:
        changed = False
        for name, tree in exprs.items():
            if name not in quantiled and _reads_quantile(tree, quantiled):
                quantiled.add(name)
                changed = True
            if name not in filtered and _filters_quantile(tree, quantiled, filtered):
                filtered.add(name)
                changed = True
    return quantiled, filtered


def _reads_quantile(tree: Any, quantiled: set[str]) -> bool:
    """Whether ``tree``'s values come from a quantile (a ``count`` of such series counts series, not values)."""
    if isinstance(tree, promql_parser.AggregateExpr) and str(tree.op) == "count":
        return False
    if isinstance(tree, promql_parser.Call) and tree.func.name == "histogram_quantile":
        return True
    if isinstance(tree, promql_parser.VectorSelector) and tree.name in quantiled:
        return True
    return any(_reads_quantile(child, quantiled) for child in _children(tree))


def _filters_quantile(tree: Any, quantiled: set[str], filtered: set[str]) -> bool:
    for n in _nodes(tree):
        if isinstance(n, promql_parser.VectorSelector) and n.name in filtered:
            return True
        if (
            isinstance(n, promql_parser.BinaryExpr)
            and str(n.op) in ("==", "!=", ">", "<", ">=", "<=")
            and not (n.modifier is not None and n.modifier.return_bool)
            and _reads_quantile(n, quantiled)
        ):
            return True
    return False


def _compare_persistent(stack: Stack, expr: str, at: float, noisy: tuple[set[str], set[str]]) -> tuple[int, list[str]]:
    """:func:`_compare` at ``at``; a disagreement counts if it is there at PERSIST_INSTANTS instants a scrape apart.

    Over the profile's 5 s windows one lumpy sample at a window's edge moves a rate by its whole increment: a
    request's TTFT landing in the second between Prometheus's first sample in the window and the sample before
    the window that MetricsQL reads moved ``rate(..._seconds_sum[5s])`` from 0.080 to 0.109 (CI, stop 24). That
    lasts while the sample is at the edge, one scrape; a difference in meaning (a label matched otherwise, a
    function that is not the same) is there at every instant.

    An expression with no series at ``at`` is asked at the earlier instants too, and its count is the most seen:
    the scrape that timed out on the loaded machine leaves the node's series stale until the next one (the whole
    run, stop 27: the fake GPU's throttle gauge had no series at ``at`` while the test ran beside a busy agent).
    """
    n, problems = _compare(stack, expr, at, noisy)
    for i in range(1, PERSIST_INSTANTS):
        if not problems and n:
            break
        m, again = _compare(stack, expr, at - i * PROFILE_SCRAPE_S, noisy)
        n = max(n, m)
        if not again:
            problems = []
    values_only = not any(p.startswith("only in ") for p in problems)
    if problems and values_only and RECORDED_RE.search(expr) and _recorded_lag_explains(stack, expr, at):
        problems = []
    return n, problems


def _recorded_lag_explains(stack: Stack, expr: str, at: float) -> bool:
    """Each series' VictoriaMetrics value at ``at`` is Prometheus's at an instant up to RECORDED_LAG_S away.

    A recorded series is written by each evaluator at its own instants, and vmalert's results reach VictoriaMetrics
    through a remote write: on a loaded machine (CI, stop 44) vmalert's recording of the TTFT bucket rates stood at
    2.0 while Prometheus's, evaluated seconds later over a burst the starved load generator let out, stood at 7.25,
    on every bucket, for three instants in a row. The same values a few seconds apart are the same meaning; a label
    matched otherwise or a different function differs at every shift (and series present in one store only are never
    excused here).
    """
    vm = {_key(s["metric"]): float(s["value"][1]) for s in instant(stack.vm, expr, at)}
    prom: dict[tuple[tuple[str, str], ...], list[float]] = {}
    steps = int(RECORDED_LAG_S / PROFILE_SCRAPE_S)
    for i in range(-steps, steps + 1):
        for s in instant(stack.prom, expr, at + i * PROFILE_SCRAPE_S):
            prom.setdefault(_key(s["metric"]), []).append(float(s["value"][1]))
    if not vm or vm.keys() - prom.keys():
        return False
    return all(any(_close(v, p, REL_TOL_RECORDED) for p in prom[k]) for k, v in vm.items())


def _compare(stack: Stack, expr: str, at: float, noisy: tuple[set[str], set[str]]) -> tuple[int, list[str]]:
    """Series only one engine returns, and values further apart than the tolerance.

    A window that reaches back before the first sample is compared by series only: Prometheus divides a
    rate by the whole window, MetricsQL by the span its samples cover (docs/scaling.md), so the two differ
    by design until the window is full. A quantile of recorded bucket rates is compared by series only too:
    over the profile's 5 s windows each engine's recording holds a handful of requests, recorded at its own
    instants, and the interpolated quantile jumps between bucket edges (measured: 0.084 s against 0.040 s).
    Which series exist must still agree, except where a comparison filters on such a quantile
    (:func:`_quantile_filtered`): there the label names must.
    """
    if _degenerate_rate(expr):
        return 0, []
    prom = {_key(s["metric"]): float(s["value"][1]) for s in instant(stack.prom, expr, at)}
    vm = {_key(s["metric"]): float(s["value"][1]) for s in instant(stack.vm, expr, at)}
    rel = REL_TOL_RECORDED if RECORDED_RE.search(expr) else REL_TOL_RATE if RATE_RE.search(expr) else REL_TOL_EXACT
    tree = promql_parser.parse(expr)
    quantiled, filtered = noisy
    if _reach_s(expr) > at - stack.started or (RECORDED_RE.search(expr) and _reads_quantile(tree, quantiled)):
        rel = math.inf
    if _filters_quantile(tree, quantiled, filtered):
        names = {tuple(k for k, _ in key) for key in prom} ^ {tuple(k for k, _ in key) for key in vm}
        return len(prom), [f"label names only in one engine: {sorted(names)}"] if names and prom and vm else []
    problems = [f"only in Prometheus: {dict(k)} = {prom[k]}" for k in prom.keys() - vm.keys()]
    problems += [
        f"only in VictoriaMetrics: {dict(k)} = {vm[k]}"
        for k in vm.keys() - prom.keys()
        if not _scrape_gap(stack, expr, dict(k).get("instance"), at)
    ]
    problems += [
        f"{dict(k)}: Prometheus {prom[k]} vs VictoriaMetrics {vm[k]}"
        for k in prom.keys() & vm.keys()
        if not _close(prom[k], vm[k], rel)
    ]
    return len(prom), problems


def _scrape_gap(stack: Stack, expr: str, instance: str | None, at: float) -> bool:
    """Whether ``instance`` had fewer than two good scrapes inside the shortest rate window of ``expr`` at ``at``.

    The same degenerate window as :func:`_degenerate_rate`, made by the data instead of the rule: when scrapes
    of a node time out on the loaded machine (CI, stop 25: one node's ``increase(...[3s])`` was only in
    VictoriaMetrics at three instants in a row), Prometheus has fewer than two samples in the window and answers
    nothing, while MetricsQL also reads the sample before the window and answers. Both stores hold the same
    samples (the same remote writes), so Prometheus's count of the node's good scrapes says which case it is.
    """
    windows = [duration_s(w) for w in RATE_RANGE_RE.findall(expr)]
    if not instance or not windows:
        return False
    query = f'sum_over_time(up{{job="inferwatch-agent",instance="{instance}"}}[{int(min(windows) * 1000)}ms])'
    good = instant(stack.prom, query, at)
    return not good or float(good[0]["value"][1]) < 2


def _operands(expr: str) -> list[str]:
    """The operands of every binary operation in ``expr`` (numbers left out), outermost first.

    A healthy node leaves most alerts empty in both engines, which agrees without saying much; the operands
    (the tail ratio, the window minimum, the token increase, ...) carry the data the alert decides on.
    """
    out: list[str] = []

    def walk(node: Any) -> None:
        while isinstance(node, promql_parser.ParenExpr):
            node = node.expr
        if isinstance(node, promql_parser.BinaryExpr):
            for side in (node.lhs, node.rhs):
                inner = side
                while isinstance(inner, promql_parser.ParenExpr):
                    inner = inner.expr
                if not isinstance(inner, promql_parser.NumberLiteral):
                    out.append(inner.prettify())
                walk(side)

    walk(promql_parser.parse(expr))
    return out


def test_every_rule_expression_agrees_between_prometheus_and_victoriametrics(stack: Stack) -> None:
    rules = _rules(sorted((stack.tmp / "rules").glob("*.rules.yml")))
    noisy = _quantile_filtered(rules)
    DEGENERATE_RECORDS.update(r["record"] for r in rules if "record" in r and _degenerate_rate(str(r["expr"])))
    at = time.time() - SETTLE_S
    report: dict[str, Any] = {}
    failures: dict[str, list[str]] = {}
    for rule in rules:
        name = rule.get("alert") or rule["record"]
        key = f"{name} {json.dumps(rule.get('labels', {}), sort_keys=True)}"
        n, problems = _compare_persistent(stack, str(rule["expr"]), at, noisy)
        full = _reach_s(str(rule["expr"])) <= at - stack.started
        operands = {}
        for sub in _operands(str(rule["expr"])):
            m, sub_problems = _compare_persistent(stack, sub, at, noisy)
            operands[sub] = m
            problems += [f"operand {sub}: {p}" for p in sub_problems]
        report[key] = {"series": n, "values_compared": full, "operands": operands, "problems": problems}
        if problems:
            failures[key] = problems
    print("\nPrometheus vs VictoriaMetrics:", json.dumps(report, indent=1))
    assert not failures, json.dumps(failures, indent=1)
    # Not vacuous: the SLO recording rules and Watchdog produced series in both.
    nonempty = {k.split(" ")[0] for k, v in report.items() if v["series"]}
    assert {"slo:sli_error:ratio_rate5m", "slo:sli_requests:rate1h", "Watchdog"} <= nonempty, sorted(nonempty)
    with_data = {k.split(" ")[0] for k, v in report.items() if any(v["operands"].values())}
    want = {"EngineHungButHealthy", "TailLatencyRatioHigh", "LatencyBimodal", "AgentDown", "GPUThrottling"}
    want |= {"RuntimeProfileUnavailable", "DebugProfileEnabledInProduction", "CPUFeatureMissing"}
    assert want <= with_data, sorted(want - with_data)


def _alerts(url: str) -> dict[str, dict[str, Any]]:
    body = httpx.get(f"{url}/api/v1/alerts", timeout=10).json()
    return {a["labels"]["alertname"]: a for a in body["data"]["alerts"] if a["labels"].get("forced") == "true"}


def _evidence(text: str) -> str:
    return DURATION_OR_NA_RE.sub("#", NUMBER_RE.sub("#", text))


DURATION_OR_NA_RE = re.compile(r"#(?:ns|us|µs|ms|s|m|h)\b|\bn/a\b")


def test_every_annotation_renders_in_vmalert_as_in_prometheus(stack: Stack) -> None:
    def both_fire() -> bool:
        return set(_alerts(stack.vmalert)) >= set(stack.forced) and set(_alerts(stack.prom)) >= set(stack.forced)

    _wait(both_fire, 60, "every forced alert active in vmalert and Prometheus")

    def differences() -> dict[str, dict[str, tuple[str, str]]]:
        vma, prom = _alerts(stack.vmalert), _alerts(stack.prom)
        diffs: dict[str, dict[str, tuple[str, str]]] = {}
        for name in stack.forced:
            for key, text in prom[name]["annotations"].items():
                got = vma[name]["annotations"].get(key, "")
                # Evidence values are read at each engine's own instant: compare the text around the numbers. A
                # duration read from a 1m recording may be absent in Prometheus only ("n/a"): the test profile's
                # [1s] rate holds at most one 1 s scrape there, while VictoriaMetrics' rate reaches back to the
                # sample before its window (production's [1m] holds four 15 s scrapes in both).
                if _evidence(got) != _evidence(text) or "<no value>" in got:
                    diffs.setdefault(name, {})[key] = (text, got)
        return diffs

    # An annotation's query can find a series at one engine's evaluation and not yet at the other's (a 1m recording
    # made an instant later: "n/a" beside a value); each engine re-renders at every evaluation, so a difference of
    # timing goes within a few of them and a difference of rendering stays.
    diffs = differences()
    deadline = time.monotonic() + 45
    while diffs and time.monotonic() < deadline:
        time.sleep(2)
        diffs = differences()
    assert not diffs, json.dumps(diffs, indent=1)
    vma, prom = _alerts(stack.vmalert), _alerts(stack.prom)
    # The probe: every function the annotations use, on fixed inputs; here the text must be identical.
    probe_p, probe_v = prom["TemplateProbe"]["annotations"], vma["TemplateProbe"]["annotations"]
    print("\ntemplate probe (Prometheus | vmalert):")
    for key in sorted(probe_p):
        print(f"  {key}: {probe_p[key]!r} | {probe_v.get(key)!r}")
    assert probe_v == probe_p
    used = _used_functions()
    assert {"query", "first", "value", "label", "humanizePercentage"} <= used, used
    assert all(f"fn_{fn}" in probe_p for fn in used - {"query", "first", "value", "label"})
    assert all(v and "<no value>" not in v for v in probe_p.values())


def test_vmalert_alerts_reach_alertmanager(stack: Stack) -> None:
    def delivered() -> bool:
        names = {d.alertname for d in stack.sink.snapshot()}
        return "Watchdog" in names and bool(names & set(stack.forced) - {"Watchdog"})

    _wait(delivered, 90, "vmalert's alerts delivered through Alertmanager")
    alerts = httpx.get(f"{stack.alertmanager}/api/v2/alerts", timeout=10).json()
    sources = {a["generatorURL"].split("/vmalert")[0].split("/graph")[0] for a in alerts}
    assert any(s.startswith(stack.vmalert) for s in sources), sources


def test_every_shipped_rate_window_holds_two_production_scrapes() -> None:
    """What lets the profile skip a degenerate compressed rate (``_degenerate_rate``): at the production 15 s
    scrape every rate window of the shipped rules holds at least two samples, so Prometheus and MetricsQL agree."""
    short = [
        (path.name, w)
        for path in RULE_FILES
        for w in RATE_RANGE_RE.findall(path.read_text())
        if duration_s(w) < 2 * PRODUCTION_SCRAPE_S
    ]
    assert short == []
    assert _degenerate_rate("rate(x[1s]) > 1") and not _degenerate_rate("rate(x[5s]) > 1")
