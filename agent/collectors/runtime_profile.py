"""The runtime's debug ``runtime_profile``, read on a slow interval and redacted.

Reads ``GET runtime_profile.url`` with ``runtime_profile.header`` (default ``X-Runtime-Debug:
runtime_profile=1``) through :class:`~agent.debugprofile.reader.ProfileReader` (``ctx.profile_reader``).
Emits ``inferwatch.runtime.profile.available`` (1 non-empty, 0 ``{}``), ``...fetch.errors{reason}`` and
``...value{field}`` for numeric allowlisted fields; the redacted snapshot goes out as the collection's
event, which the snapshot store and the OTLP log sink take from the state (this collector knows neither).
A failed fetch is a counted error and a ``fail`` finding, not a collector crash.
"""

from __future__ import annotations

from typing import ClassVar

from agent.collectors.base import BaseCollector, Collection
from agent.errors import NoDataError
from agent.samples import Sample, attrs


class RuntimeProfileCollector(BaseCollector):
    name: ClassVar[str] = "runtime_profile"
    description: ClassVar[str] = "Redacted snapshots of the runtime's debug runtime_profile (slow interval)."

    def collect(self) -> Collection:
        if not self.ctx.settings.runtime_profile.url:
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
        details = {"snapshot": result.id, "outcome": result.outcome, "redacted_fields": result.redacted}
        return Collection(samples, reader.findings(), details, events=(snapshot.document,))
