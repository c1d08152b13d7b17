"""Push of the agent's critical node-local findings straight to Alertmanager's v2 API (``POST /api/v2/alerts``).

The Prometheus path to a page is scrape → evaluation → ``for:`` → group wait: about a minute and a half for a hung
engine. The agent knows within seconds, so it sends the same alert itself, with the **same label set** the shipped
rule produces — ``alertname``, ``severity``, the rule's labels from the agent's own series and its target
(``instance``, ``job`` and ``alertmanager.target_labels`` as Prometheus's relabeling names them; all of them, or the
rule's ``by (...)``), and Prometheus's external labels (``alertmanager.labels``) — so Alertmanager (which
identifies an alert by its label set) holds one alert for both copies: one page, one resolution. The rule stays as
the backstop for an agent that is itself gone.

As Prometheus sends (prometheus ``rules/alerting.go``, ``notifier``): every firing alert is re-sent every
``resend_s`` with ``endsAt = now + 4 × resend_s``; a resolved one is sent with ``endsAt = now`` and re-sent for
:data:`RESOLVED_KEEP_S`; each batch goes to every configured Alertmanager (an HA cluster deduplicates). Annotations:
the rule's static ``summary``, a description from the agent's own values, and the links the rule generates
(``runbook_url``, ``dashboard_url``, ``evidence_url``: agent/alerts/links.py), built from the same bases.

Each alert that starts firing is also handed to ``on_fire`` (the composition root passes the evidence store's
webhook handler: the bundle an Alertmanager webhook would start, without waiting for Alertmanager).

Runs in a thread of its own: a state listener wakes it after every collection of a collector that feeds a pushed
alert, so a POST never delays a collection, and a finding is sent the moment its collection is recorded; a pending
alert's ``for:`` is checked the moment it elapses (the thread sleeps until then, not to its next tick). A wedged
engine's ``for:`` (EngineDown, every failed read a timeout) counts from the start of the first read that timed out
(``engine_timeout_s`` before it was recorded), as the engine has not answered since then. Failures are logged once
when they start and once when they end, and counted (``inferwatch.alertpush.sends{outcome}``).
"""

from __future__ import annotations

import contextlib
import itertools
import logging
import threading
import time
from collections.abc import Callable, Iterable, Mapping
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass, field
from datetime import datetime, timezone
from pathlib import Path
from typing import TYPE_CHECKING, Any
from urllib.parse import quote

from inferwatch.agent import catalog
from inferwatch.agent.catalog.engine import TARGET_ATTRIBUTES
from inferwatch.agent.catalog.spec import prometheus_label
from inferwatch.agent.common import assets
from inferwatch.agent.common.redact import redact_url
from inferwatch.agent.common.samples import AnySample, Collection, Sample, attrs
from inferwatch.agent.common.userfiles import read_text_bounded
from inferwatch.agent.config import DEFAULT_RUNBOOKS_BASE_URL, AlertmanagerSettings
from inferwatch.agent.errors import ConfigError
from inferwatch.agent.node.state import AgentState

if TYPE_CHECKING:  # httpx is imported when an Alertmanager is configured (a push, or basic auth), not before
    import httpx

log = logging.getLogger(__name__)

API_PATH = "/api/v2/alerts"
RESOLVED_KEEP_S = 300.0  # Alertmanager keeps no durable state: a resolution is re-sent this long (its docs: 5 min)
ENDS_AT_RESENDS = 4  # endsAt = now + 4 x resend: two sends may fail before Alertmanager times the alert out
DEFAULT_DASHBOARD_BASE = "http://127.0.0.1:3000"  # the rules' fallback when no dashboard_base external label is set
SECRET_MAX_BYTES = 4096
OUTCOMES = ("ok", "http_status", "error")


@dataclass(frozen=True, slots=True)
class PushRule:
    """How one shipped alert rule derives its alerts from the agent's series, mirrored here.

    ``metrics``: (catalog name, label filter, condition on the value). ``by``: the Prometheus labels the rule keeps
    (``max by (...)``), None for every label of the series. ``for_s``: how long the condition holds first.
    ``increase_s``: the condition of each metric named in ``counters`` is on the counter's increase over that window
    (``increase(x[5m]) > 0``), a counter that appeared above zero counting as an increase; the other metrics (gauges)
    are read as they are, as the rule reads them.
    """

    alert: str
    metrics: tuple[tuple[str, Mapping[str, str], Callable[[float], bool]], ...]
    by: tuple[str, ...] | None
    for_s: float
    dashboard: str
    increase_s: float = 0.0
    fast_for_s: float | None = None  # EngineDown: the `for` while every failed read timed out (a wedged process)
    counters: tuple[str, ...] = ()  # the metrics whose increase over increase_s is the condition


def _eq(x: float) -> Callable[[float], bool]:
    return lambda v: v == x


def _gt0(v: float) -> bool:
    return v > 0


RULES: dict[str, PushRule] = {
    r.alert: r
    for r in (
        # max by (instance, job, gen_ai_request_model, rank) (inferwatch_engine_hung) == 1; the agent's verdict is
        # already past its stall window (agent/node/engine/hang.py), so no for: here (the rule's 30 s is for scrapes).
        PushRule(
            "EngineHungButHealthy",
            (("inferwatch.engine.hung", {}, _eq(1)),),
            ("instance", "job", "gen_ai_request_model", "rank"),
            0.0,
            "inferwatch-engine",
        ),
        # inferwatch_engine_up == 0 for 45s. A /metrics that accepts the connection and never answers (a stopped
        # or wedged process: every read times out) is paged after 6 s, as a hang; a refused one (a restart loading
        # its model) after the rule's 45 s.
        PushRule("EngineDown", (("inferwatch.engine.up", {}, _eq(0)),), None, 45.0, "inferwatch-engine", 0.0, 6.0),
        PushRule(
            "RuntimeHardwareMismatch",
            (
                ("inferwatch.probe.http_errors", {"error_type": "hardware_mismatch"}, _gt0),
                ("inferwatch.runtime.binary.missing_libraries", {}, _gt0),
            ),
            None,
            15.0,
            "inferwatch-node",
            300.0,
            counters=("inferwatch.probe.http_errors",),  # the rule: increase(...[5m]) > 0 or missing_libraries > 0
        ),
        PushRule("CPUFeatureMissing", (("inferwatch.cpu.feature_missing", {}, _eq(1)),), None, 30.0, "inferwatch-node"),
    )
}
_NAMES = {m[0] for r in RULES.values() for m in r.metrics} | {"inferwatch.engine.scrape.errors"}


def _iso(t: float) -> str:
    return datetime.fromtimestamp(t, timezone.utc).isoformat().replace("+00:00", "Z")


def rule_summaries() -> dict[str, str]:
    """The static ``summary`` annotation of every shipped alert rule (the rule files the agent installs)."""
    import yaml  # here: only a pusher with an Alertmanager URL reads them

    out: dict[str, str] = {}
    for path in assets.rule_files():
        doc = yaml.safe_load(path.read_text(encoding="utf-8")) or {}
        for group in doc.get("groups", []):
            for rule in group.get("rules", []):
                if "alert" in rule:
                    out[rule["alert"]] = str(rule.get("annotations", {}).get("summary", ""))
    return out


def _secret(path: Path, what: str) -> str:
    value = read_text_bounded(path, SECRET_MAX_BYTES, f"alertmanager.{what}").strip()
    if not value:
        raise ConfigError(f"alertmanager.{what}: {path} is empty")
    return value


def auth_of(cfg: AlertmanagerSettings) -> httpx.Auth | dict[str, str] | None:
    """Basic auth, or a bearer header, from the configured files (read once, at start)."""
    if cfg.username and cfg.password_file is not None:
        import httpx

        return httpx.BasicAuth(cfg.username, _secret(cfg.password_file, "password_file"))
    if cfg.bearer_token_file is not None:
        return {"Authorization": f"Bearer {_secret(cfg.bearer_token_file, 'bearer_token_file')}"}
    return None


@dataclass
class _Alert:
    labels: dict[str, str]
    annotations: dict[str, str]
    starts_at: float
    ends_at: float | None = None  # set when resolved
    sent_at: float = float("-inf")


@dataclass
class _Pending:
    since: float


@dataclass
class _History:
    first_seen: float
    points: list[tuple[float, float]] = field(default_factory=list)


class AlertPusher:
    """See the module docstring. ``start``/``stop`` are idempotent; ``stop`` is bounded by the POST timeout."""

    def __init__(
        self,
        cfg: AlertmanagerSettings,
        state: AgentState,
        runbooks_base: str = DEFAULT_RUNBOOKS_BASE_URL,
        client: httpx.Client | None = None,
        clock: Callable[[], float] = time.time,
        on_fire: Callable[[Mapping[str, Any]], object] | None = None,
        engine_timeout_s: float = 0.0,
    ) -> None:
        self.cfg = cfg
        self.engine_timeout_s = engine_timeout_s  # a timed-out read started this long before it was recorded
        self.on_fire = on_fire  # told of each alert that starts firing, as Alertmanager's webhook would tell it
        self.state = state
        self.clock = clock
        self.rules = [RULES[a] for a in cfg.alerts]
        self.instance = cfg.instance or ""
        self.runbooks_base = cfg.labels.get("runbook_base") or runbooks_base
        self.dashboard_base = cfg.labels.get("dashboard_base") or DEFAULT_DASHBOARD_BASE
        # the shipped rules' summaries: parsed only when there is an Alertmanager to push to (~0.5 MB and the YAML
        # parse of every rule file at start otherwise)
        self.summaries = rule_summaries() if cfg.urls else {}
        auth = auth_of(cfg)
        headers = auth if isinstance(auth, dict) else None
        basic = None if auth is None or isinstance(auth, dict) else auth
        self.urls = [u.rstrip("/") + API_PATH for u in cfg.urls]
        self._own_client = client is None
        self._client_args: dict[str, Any] = {"headers": headers, "auth": basic}
        self._made_client = client  # made on the first push: no Alertmanager configured, no client (~5 MB)
        self._client_lock = threading.Lock()
        self._alerts: dict[tuple[tuple[str, str], ...], _Alert] = {}
        self._pending: dict[tuple[tuple[str, str], ...], _Pending] = {}
        self._history: dict[tuple[str, tuple[tuple[str, str], ...]], _History] = {}
        self._other_errors_up: float | None = None  # engine read failures other than timeouts, while it was up
        self._timeouts_only = False
        self._lock = threading.Lock()  # the alerts' state; held while the state's samples are read
        self._count_lock = threading.Lock()  # the send counts, read by the state (its samples) and the senders
        self._wake = threading.Event()
        self._due_at: float | None = None  # when the earliest pending alert's for: elapses (the clock's time)
        self._stop = threading.Event()
        self._thread: threading.Thread | None = None
        self._pool = ThreadPoolExecutor(max_workers=max(1, len(self.urls)), thread_name_prefix="alertpush")
        self._counts = dict.fromkeys(OUTCOMES, 0)
        self._failing: set[str] = set()
        self.sent: list[tuple[float, list[dict[str, object]]]] = []  # the last batches (tests, the benchmark)

    @property
    def enabled(self) -> bool:
        return bool(self.urls)

    @property
    def client(self) -> httpx.Client:
        """The HTTP client the pushes go through, made on first use with the process's one TLS context."""
        with self._client_lock:
            if self._made_client is None:
                import httpx

                from inferwatch.agent.common.httpclient import shared_ssl_context

                self._made_client = httpx.Client(
                    trust_env=False, follow_redirects=False, verify=shared_ssl_context(False), **self._client_args
                )
            return self._made_client

    # --- the state listener and the thread ---
    def on_record(self, name: str, collection: Collection) -> None:
        """Wake the sender after a collection (cheap: no I/O on the collector's thread)."""
        self._wake.set()

    def start(self) -> None:
        if not self.enabled or self._thread is not None:
            return
        self._thread = threading.Thread(target=self._run, name="alertpush", daemon=True)
        self._thread.start()

    def stop(self) -> None:
        self._stop.set()
        self._wake.set()
        if self._thread is not None:
            self._thread.join(self.cfg.timeout_s + 1.0)
        self._pool.shutdown(wait=False, cancel_futures=True)
        with self._client_lock:
            client, self._made_client = self._made_client, None
        if self._own_client and client is not None:
            client.close()

    def _run(self) -> None:
        tick = min(1.0, self.cfg.resend_s)  # pending alerts' for: is checked at least this often
        while not self._stop.is_set():
            due = self._due_at
            self._wake.wait(tick if due is None else min(tick, max(0.0, due - self.clock())))
            self._wake.clear()
            if self._stop.is_set():
                break
            try:
                self.step()
            except Exception:  # a bug here must not end the pushes for good
                log.exception("alert push step failed")

    # --- evaluation ---
    def _series(self, samples: Iterable[AnySample]) -> dict[str, list[tuple[dict[str, str], float]]]:
        """Every wanted sample as (Prometheus labels without empty values, value), by catalog name."""
        out: dict[str, list[tuple[dict[str, str], float]]] = {}
        for s in samples:
            if s.name not in _NAMES or not isinstance(s, Sample):
                continue
            # an engine target's identity under the labels /metrics gives it (engine_name, namespace, pod, container)
            labels = {TARGET_ATTRIBUTES.get(k) or prometheus_label(k): v for k, v in s.attributes if v != ""}
            spec = catalog.CATALOG.get(s.name)
            if spec is not None:  # only the catalog's labels are exported
                keep = {*spec.prometheus_labels, *TARGET_ATTRIBUTES.values()}
                labels = {k: v for k, v in labels.items() if k in keep}
            out.setdefault(s.name, []).append((labels, s.value))
        return out

    def _labels(self, rule: PushRule, series_labels: Mapping[str, str]) -> dict[str, str]:
        labels = {**series_labels, **self.cfg.target_labels, "instance": self.instance, "job": self.cfg.job}
        if rule.by is not None:
            labels = {k: v for k, v in labels.items() if k in rule.by}
        labels = {k: v for k, v in labels.items() if v != ""}
        labels["alertname"] = rule.alert
        labels["severity"] = "critical"
        for k, v in self.cfg.labels.items():  # external labels never override the alert's own
            labels.setdefault(k, v)
        return labels

    def _increased(self, name: str, labels: Mapping[str, str], value: float, now: float, window_s: float) -> bool:
        """``increase(x[window]) > 0 or (x > 0 unless x offset window)``: a rise (or a reset) within the window, or a
        series first seen within the window already above zero."""
        key = (name, tuple(sorted(labels.items())))
        h = self._history.get(key)
        if h is None:
            h = self._history[key] = _History(first_seen=now)
        h.points.append((now, value))
        h.points = [p for p in h.points if p[0] >= now - window_s]
        values = [v for _t, v in h.points]
        rose = any(b != a for a, b in itertools.pairwise(values))
        return rose or (now - h.first_seen <= window_s and value > 0)

    def firing(self, now: float) -> dict[tuple[tuple[str, str], ...], tuple[PushRule, dict[str, str], str]]:
        """The alerts whose condition holds now (before their for:), by label set: (rule, labels, description)."""
        series = self._series(self.state.samples())
        self._engine_timeouts(series)
        out: dict[tuple[tuple[str, str], ...], tuple[PushRule, dict[str, str], str]] = {}
        for rule in self.rules:
            for name, match, cond in rule.metrics:
                for labels, value in series.get(name, []):
                    if any(labels.get(k) != v for k, v in match.items()):
                        continue
                    if rule.increase_s and name in rule.counters:
                        ok = self._increased(name, labels, value, now, rule.increase_s) and value > 0
                    else:
                        ok = cond(value)
                    if not ok:
                        continue
                    full = self._labels(rule, labels)
                    key = tuple(sorted(full.items()))
                    if key not in out:
                        out[key] = (rule, full, self._describe(rule, labels, value))
        return out

    def _engine_timeouts(self, series: Mapping[str, list[tuple[dict[str, str], float]]]) -> None:
        """Track whether every failed engine read since the engine went down timed out (a stopped or wedged process
        accepts the connection and never answers); a refused or failing read (a restart) keeps the rule's for:."""
        errors = series.get("inferwatch.engine.scrape.errors", [])
        other = sum(v for labels, v in errors if labels.get("reason") != "timeout")
        down = any(v == 0 for _l, v in series.get("inferwatch.engine.up", []))
        if not down:
            self._other_errors_up = other
            self._timeouts_only = True
        elif self._other_errors_up is None or other > self._other_errors_up:
            self._timeouts_only = False

    def _for_s(self, rule: PushRule) -> float:
        if rule.fast_for_s is not None and self._timeouts_only:
            return rule.fast_for_s
        return rule.for_s

    def _describe(self, rule: PushRule, labels: Mapping[str, str], value: float) -> str:
        where = self.instance
        if rule.alert == "EngineHungButHealthy":
            stall = self._value("inferwatch.engine.stall", labels)
            return (
                f"{where}: rank {labels.get('rank', '')} of {labels.get('gen_ai_request_model', '')} has produced no "
                f"token for {stall:.0f}s with requests in flight; /metrics and /health still answer (pushed by the "
                "agent). The agent captured an evidence bundle (stacks, thread states, scrapes): evidence_url."
            )
        if rule.alert == "EngineDown":
            return f"{where}: the agent could not scrape or parse the {labels.get('engine', '')} engine's /metrics."
        if rule.alert == "CPUFeatureMissing":
            return (
                f"{where}: CPU {labels.get('cpu_model', '')} should have {labels.get('feature', '')} but it is not "
                "reported; runtimes fall back to narrower SIMD (~20% slower, no errors)."
            )
        return f"{where}: the runtime cannot run on this node's hardware ({dict(labels)} = {value:g})."

    def _value(self, name: str, labels: Mapping[str, str]) -> float:
        want = {k: v for k, v in labels.items() if k in ("gen_ai_request_model", "rank")}
        for s in self.state.samples():
            if s.name == name and isinstance(s, Sample):
                got = {prometheus_label(k): v for k, v in s.attributes}
                if all(got.get(k) == v for k, v in want.items()):
                    return s.value
        return float("nan")

    def annotations(self, rule: PushRule, labels: Mapping[str, str], description: str) -> dict[str, str]:
        """The rule's annotations as its generated link templates render them (agent/alerts/links.py)."""
        instance = labels.get("instance", "")
        model = labels.get("gen_ai_request_model", "")
        query = []
        if instance:
            query.append(f"var-instance={instance}")
            if model and rule.dashboard != "inferwatch-node":
                query.append(f"var-model={model}")
        elif model and rule.dashboard != "inferwatch-node":
            query.append(f"var-model={model}")
        dashboard = f"{self.dashboard_base}/d/{rule.dashboard}" + ("?" + "&".join(query) if query else "")
        out = {
            "summary": self.summaries.get(rule.alert, ""),
            "description": description,
            "runbook_url": f"{self.runbooks_base}/{rule.alert}",
            "dashboard_url": dashboard,
        }
        if labels.get("job") == "inferwatch-agent":
            out["evidence_url"] = f"http://{instance}/api/v1/evidence/latest?alertname={quote(rule.alert)}"
        return out

    def step(self) -> list[dict[str, object]]:
        """Evaluate, then send what is new, resolved or due for a resend; returns the batch sent (may be empty)."""
        now = self.clock()
        with self._lock:
            current = self.firing(now)
            batch: list[_Alert] = []
            for key, (rule, labels, description) in current.items():
                alert = self._alerts.get(key)
                if alert is not None and alert.ends_at is None:
                    alert.annotations["description"] = description
                    if now - alert.sent_at >= self.cfg.resend_s:
                        batch.append(alert)
                    continue
                pending = self._pending.get(key)
                if pending is None:  # a wedged engine has not answered since its first timed-out read began
                    wedged = rule.fast_for_s is not None and self._timeouts_only
                    pending = self._pending[key] = _Pending(now - (self.engine_timeout_s if wedged else 0.0))
                if now - pending.since < self._for_s(rule):
                    continue
                del self._pending[key]
                alert = _Alert(labels, self.annotations(rule, labels, description), now)
                self._alerts[key] = alert
                batch.append(alert)
            for key in set(self._pending) - set(current):
                del self._pending[key]
            self._due_at = min(
                (p.since + self._for_s(current[k][0]) for k, p in self._pending.items()),
                default=None,
            )
            for key, alert in list(self._alerts.items()):
                if key in current:
                    continue
                if alert.ends_at is None:
                    alert.ends_at = now
                    batch.append(alert)
                elif now - alert.ends_at > RESOLVED_KEEP_S:
                    del self._alerts[key]
                elif now - alert.sent_at >= self.cfg.resend_s:
                    batch.append(alert)
            payload = [self._postable(a, now) for a in batch]
            started = [p for a, p in zip(batch, payload, strict=True) if a.sent_at == float("-inf")]
            for a in batch:
                a.sent_at = now
        if payload:
            self._send(payload)
            self.sent.append((now, payload))
            del self.sent[:-100]
        if started and self.on_fire is not None:  # e.g. the evidence capture (what the webhook would start)
            try:
                self.on_fire({"alerts": [{**p, "status": "firing"} for p in started]})
            except Exception:
                log.exception("alert push: the on_fire action failed")
        return payload

    def _postable(self, a: _Alert, now: float) -> dict[str, object]:
        ends = a.ends_at if a.ends_at is not None else now + ENDS_AT_RESENDS * self.cfg.resend_s
        return {
            "labels": dict(a.labels),
            "annotations": dict(a.annotations),
            "startsAt": _iso(a.starts_at),
            "endsAt": _iso(ends),
        }

    def _send(self, payload: list[dict[str, object]]) -> None:
        futures = [self._pool.submit(self._post, url, payload) for url in self.urls]
        for f in futures:
            with contextlib.suppress(Exception):  # counted and logged in _post; a stuck one ends at its own timeout
                f.result(timeout=self.cfg.timeout_s + 1.0)

    def _post(self, url: str, payload: list[dict[str, object]]) -> None:
        import httpx  # imported by the client already: a push has one

        try:
            r = self.client.post(url, json=payload, timeout=self.cfg.timeout_s)
            outcome = "ok" if r.status_code == 200 else "http_status"
            message = f"HTTP {r.status_code}: {r.text[:200]}"
        except httpx.HTTPError as exc:
            outcome, message = "error", f"{type(exc).__name__}: {exc}"
        with self._count_lock:
            self._counts[outcome] += 1
            was_failing = url in self._failing
            if outcome == "ok":
                self._failing.discard(url)
            else:
                self._failing.add(url)
        if outcome != "ok" and not was_failing:
            log.warning("alert push to %s failing: %s", redact_url(url), message)
        elif outcome == "ok" and was_failing:
            log.info("alert push to %s works again", redact_url(url))

    def samples(self) -> list[AnySample]:
        """``inferwatch.alertpush.sends{outcome}``: POSTs to an Alertmanager, by outcome."""
        with self._count_lock:
            return [Sample("inferwatch.alertpush.sends", n, attrs(outcome=k)) for k, n in self._counts.items()]
