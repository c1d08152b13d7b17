"""Runtime checks for ``inferwatch doctor --engine-url URL [--profile-url URL]``.

* ``runtime.probe``: the streaming probe once per protocol (stream schema, hardware_mismatch); a
  protocol the runtime does not serve (404/405) is a skip, not a failure.
* ``runtime.profile``: the debug profile state (available / empty / fetch error / on in production).
* ``runtime.binary``: binary compatibility of the runtime process when it runs on this host.
"""

from __future__ import annotations

from typing import Any

from agent.config import Settings
from agent.errors import NoDataError
from agent.samples import Finding


def check_probe(settings: Settings, engine_url: str | None) -> list[Finding]:
    from agent.collectors.probe import probe_findings
    from agent.probe.client import PROTOCOLS, run_probe

    if not engine_url:
        raise NoDataError("no runtime URL", hint="pass --engine-url http://HOST:PORT to probe the runtime's streams")
    out: list[Finding] = []
    cfg = settings.probe
    for protocol in PROTOCOLS:
        result = run_probe(
            engine_url, protocol, model=cfg.model, prompt=cfg.prompt, max_tokens=cfg.max_tokens, timeout_s=cfg.timeout_s
        )
        if result.status_code in (404, 405):
            out.append(Finding(f"probe.{protocol}", "skip", f"the runtime does not serve {result.url}"))
            continue
        out += probe_findings(result)
    return out


def check_profile(settings: Settings, profile_url: str | None) -> list[Finding]:
    from agent.diag.profile_service import RuntimeProfileService

    url = profile_url or settings.runtime_profile.url
    if not url:
        raise NoDataError(
            "no debug profile URL", hint="pass --profile-url http://HOST:PORT/debug/runtime_profile to check it"
        )
    section = settings.runtime_profile.model_copy(update={"url": url})
    svc = RuntimeProfileService(settings.model_copy(update={"runtime_profile": section}), store=False)
    svc.capture("doctor")
    return svc.findings()


def check_binary(settings: Settings) -> list[Finding]:
    from agent.diag.services import BinaryService

    svc = BinaryService(settings)
    svc.check()
    if svc.absent is not None:
        raise svc.absent
    return svc.findings()


def runtime_checks(ctx: Any) -> list[Finding]:
    """All three, for the doctor CHECKS list; each one's absence is its own skip."""
    findings: list[Finding] = []
    for check_id, fn in (
        ("runtime.probe", lambda: check_probe(ctx.settings, getattr(ctx, "engine_url", None))),
        ("runtime.profile", lambda: check_profile(ctx.settings, getattr(ctx, "profile_url", None))),
        ("runtime.binary", lambda: check_binary(ctx.settings)),
    ):
        try:
            findings += fn()
        except NoDataError as exc:
            findings.append(Finding(check_id, "skip", str(exc.args[0]), {"hint": exc.hint}))
    return findings
