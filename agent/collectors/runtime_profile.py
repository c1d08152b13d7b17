"""The runtime's debug ``runtime_profile``, fetched on a slow interval, redacted and kept as snapshots.

Reads ``GET runtime_profile.url`` with ``runtime_profile.header`` (default ``X-Runtime-Debug:
runtime_profile=1``) through :class:`~agent.diag.profile_service.RuntimeProfileService`, which the API
shares for on-demand captures. Emits ``inferwatch.runtime.profile.available`` (1 non-empty, 0 ``{}``),
``...fetch.errors{reason}`` and ``...value{field}`` for numeric allowlisted fields.
A failed fetch is a counted error and a ``fail`` finding, not a collector crash.
"""

from __future__ import annotations

from typing import ClassVar

from agent.collectors.base import BaseCollector, Collection
from agent.config import DEFAULT_PROFILE_INTERVAL_S
from agent.diag.profile_service import RuntimeProfileService
from agent.errors import NoDataError
from agent.samples import Sample, attrs

SERVICE = "runtime_profile"


class RuntimeProfileCollector(BaseCollector):
    name: ClassVar[str] = "runtime_profile"
    lane: ClassVar[str | None] = None  # network / subprocess: a thread of its own
    default_enabled: ClassVar[bool] = False  # switched on when runtime_profile.url is set
    default_interval_s: ClassVar[float | None] = DEFAULT_PROFILE_INTERVAL_S
    description: ClassVar[str] = "Redacted snapshots of the runtime's debug runtime_profile (slow interval)."

    @property
    def service(self) -> RuntimeProfileService:
        svc = self.ctx.services.get(SERVICE)
        if svc is None:
            svc = self.ctx.services[SERVICE] = RuntimeProfileService(self.ctx.settings)
        assert isinstance(svc, RuntimeProfileService)
        return svc

    def collect(self) -> Collection:
        if not self.ctx.settings.runtime_profile.url:
            raise NoDataError(
                "runtime_profile.url is not set",
                hint="set runtime_profile.url (e.g. http://127.0.0.1:8000/debug/runtime_profile)",
            )
        svc = self.service
        result = svc.capture("interval")
        samples = [
            Sample("inferwatch.runtime.profile.fetch.errors", n, attrs(reason=r)) for r, n in sorted(svc.errors.items())
        ]
        if result.outcome != "error":
            samples.append(Sample("inferwatch.runtime.profile.available", 1 if result.outcome == "available" else 0))
        samples += [
            Sample("inferwatch.runtime.profile.value", v, attrs(field=k)) for k, v in sorted(result.gauges.items())
        ]
        details = {"snapshot": result.id, "outcome": result.outcome, "redacted_fields": result.redacted}
        return Collection(samples, svc.findings(), details)
