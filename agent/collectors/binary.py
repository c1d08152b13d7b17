"""Binary compatibility of the runtime (missing shared libraries, glibc required vs. available).

The check (``ldd`` with a fixed path, see :mod:`agent.diag.binary`) runs on this collector's first
cycle (the check at start) and again only when requested (``POST /api/v1/binary``); other cycles
re-export the kept result as ``inferwatch.runtime.binary.missing_libraries{runtime}``.
"""

from __future__ import annotations

from typing import ClassVar

from agent.collectors.base import BaseCollector, CollectContext, Collection
from agent.diag.services import BinaryService
from agent.errors import NoDataError
from agent.samples import Sample, attrs

SERVICE = "binary"


class BinaryCollector(BaseCollector):
    name: ClassVar[str] = "binary"
    lane: ClassVar[str | None] = None  # network / subprocess: a thread of its own
    default_enabled: ClassVar[bool] = False  # switched on when a runtime process or binary.path is configured
    default_interval_s: ClassVar[float | None] = None
    description: ClassVar[str] = "Runtime binary compatibility, checked at start and on demand."

    def __init__(self, ctx: CollectContext) -> None:
        super().__init__(ctx)
        self._kept: tuple[object, Collection] | None = None  # (report, its collection): re-exported as is

    def quick(self) -> bool:
        return not self.service.due()  # re-exporting the kept result: no ldd, no procfs scan

    @property
    def service(self) -> BinaryService:
        svc = self.ctx.services.get(SERVICE)
        if svc is None:
            svc = self.ctx.services[SERVICE] = BinaryService(self.ctx.settings)
        assert isinstance(svc, BinaryService)
        return svc

    def collect(self) -> Collection:
        svc = self.service
        if svc.due():
            svc.check()
        if svc.absent is not None:
            raise svc.absent
        report = svc.report
        if report is None:
            if svc.error is None:
                raise NoDataError("binary check has not run", hint="it runs at start")
            return Collection((), svc.findings(), {"error": svc.error})
        if self._kept is not None and self._kept[0] is report:
            return self._kept[1]
        runtime = self.ctx.settings.runtime.name
        samples = [
            Sample(
                "inferwatch.runtime.binary.missing_libraries", len(report.missing_libraries), attrs(runtime=runtime)
            ),
            Sample("inferwatch.runtime.binary.compatible", 1 if report.compatible else 0, attrs(runtime=runtime)),
        ]
        collection = Collection(samples, svc.findings(), report.as_dict())
        self._kept = (report, collection)
        return collection
