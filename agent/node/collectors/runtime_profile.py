"""The runtime's debug ``runtime_profile``, read on a slow interval and redacted.

Reads ``GET runtime_profile.url`` with ``runtime_profile.header`` (default ``X-Runtime-Debug:
runtime_profile=1``) through :class:`~inferwatch.agent.node.debugprofile.reader.ProfileReader` (``ctx.profile_reader``).
Emits ``inferwatch.runtime.profile.available`` (1 non-empty, 0 ``{}``), ``...fetch.errors{reason}``,
``...value{field}`` for numeric allowlisted fields, and ``...simd_inactive{feature}`` when the profile says
which SIMD features its kernels were compiled for and which they run (:func:`simd_inactive`). The redacted
snapshot goes out as the collection's event, which the snapshot store and the OTLP log sink take from the
state (this collector knows neither). A failed fetch is a counted error and a ``fail`` finding, not a
collector crash.
"""

from __future__ import annotations

import re
from typing import Any, ClassVar

from inferwatch.agent.common.samples import Sample, attrs
from inferwatch.agent.config import DEFAULT_PROFILE_INTERVAL_S, RuntimeProfileSettings
from inferwatch.agent.errors import NoDataError
from inferwatch.agent.node.collectors.base import BaseCollector, CollectContext, Collection
from inferwatch.agent.node.collectors.registry import TIMING_MARGIN_S, Entry


class RuntimeProfileCollector(BaseCollector):
    name: ClassVar[str] = "runtime_profile"
    description: ClassVar[str] = "Redacted snapshots of the runtime's debug runtime_profile (slow interval)."
    reads: ClassVar[str] = "the runtime's debug `runtime_profile` endpoint ([diagnostics.md](diagnostics.md))"

    def __init__(self, ctx: CollectContext, cfg: RuntimeProfileSettings) -> None:
        super().__init__(ctx)
        self.cfg = cfg

    def collect(self) -> Collection:
        if not self.cfg.url:
            raise NoDataError(
                "runtime_profile.url is not set",
                hint="set runtime_profile.url (e.g. http://127.0.0.1:8000/debug/runtime_profile)",
            )
        reader = self.ctx.profile_reader
        snapshot = reader.read("interval")
        result = snapshot.result
        samples = [
            Sample("inferwatch.runtime.profile.fetch.errors", n, attrs(reason=r))
            for r, n in sorted(reader.errors.items())
        ]
        if result.outcome != "error":
            samples.append(Sample("inferwatch.runtime.profile.available", 1 if result.outcome == "available" else 0))
        samples += [
            Sample("inferwatch.runtime.profile.value", v, attrs(field=k)) for k, v in sorted(result.gauges.items())
        ]
        profile = snapshot.document.get("profile")
        samples += [
            Sample("inferwatch.runtime.profile.simd_inactive", v, attrs(feature=f))
            for f, v in sorted(simd_inactive(profile).items())
        ]
        details = {"snapshot": result.id, "outcome": result.outcome, "redacted_fields": result.redacted}
        return Collection(samples, reader.findings(), details, events=(snapshot.document,))


MAX_SIMD_FEATURES = 64  # a profile's feature lists are short; a longer one is cut, not exported whole
FEATURE_RE = re.compile(r"^[a-z0-9_.]{1,32}$")  # cpuinfo-style names (avx512f, sve, amx_bf16); a label value


def simd_inactive(profile: Any) -> dict[str, float]:
    """Feature → 1 (compiled in, not active) or 0 (active), from ``simd_features_compiled`` / ``_active``.

    Both must be lists of strings; anything else (absent, redacted, another shape) gives nothing: no verdict.
    """
    if not isinstance(profile, dict):
        return {}
    compiled, active = profile.get("simd_features_compiled"), profile.get("simd_features_active")
    if not (isinstance(compiled, list) and isinstance(active, list)):
        return {}
    if not all(isinstance(f, str) for f in compiled + active):
        return {}
    on = set(active)
    return {f: 0.0 if f in on else 1.0 for f in compiled[:MAX_SIMD_FEATURES] if FEATURE_RE.match(f)}


ENTRY = Entry(
    RuntimeProfileCollector,
    order=60,
    sections=lambda s: (s.runtime_profile,),
    enabled=lambda s: bool(s.runtime_profile.url),
    needs="on when `runtime_profile.url` is set",
    interval_s=lambda s: DEFAULT_PROFILE_INTERVAL_S,
    timeout_s=lambda s: s.runtime_profile.timeout_s + TIMING_MARGIN_S,
    lane=None,
)
