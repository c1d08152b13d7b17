"""The OTLP metrics request of one collection, encoded with a fraction of the SDK encoder's Python calls.

The SDK's ``encode_metrics`` builds a protobuf message per data point and a ``KeyValue`` message per attribute of
each point, every export: with everything on (~1,560 points a collection, ~4 attributes each) that was ~23 ms of
CPU per export, as much as the collection itself. :class:`MetricsEncoder` builds the same
``ExportMetricsServiceRequest`` (equal message for message: tests/test_otlp_encode.py compares the two): a gauge's or
a sum's points are written as protobuf bytes and parsed into the metric's message in one call. A point's attribute
bytes are kept with its attributes mapping, found again by identity: the exporter (``OTLPExporter.collect`` in
exporters/otlp.py) keeps one mapping per series and hands the same object every export, so the kept bytes cost no
second copy of the attributes (a mapping seen for the first time is encoded; what is kept is dropped once it outgrows
twice the last collection's points). Histograms, points with exemplars and anything else go through the SDK's own
encoding. Resources and scopes are encoded as the SDK encodes them.
"""

from __future__ import annotations

import logging
import struct
import threading
from typing import Any

from opentelemetry.exporter.otlp.proto.common._internal import (
    _encode_attributes,
    _encode_instrumentation_scope,
    _encode_key_value,
)
from opentelemetry.exporter.otlp.proto.common._internal.metrics_encoder import EncodingException, _encode_metric
from opentelemetry.proto.collector.metrics.v1.metrics_service_pb2 import ExportMetricsServiceRequest
from opentelemetry.proto.metrics.v1 import metrics_pb2 as pb2
from opentelemetry.sdk.metrics.export import Gauge, MetricsData, Sum

log = logging.getLogger(__name__)

# NumberDataPoint's fields (opentelemetry/proto/metrics/v1/metrics.proto): attributes 7 (KeyValue), start_time_unix_nano
# 2 and time_unix_nano 3 (fixed64), as_double 4 (double), as_int 6 (sfixed64); Gauge's and Sum's data_points are 1.
_ATTRIBUTE_TAG = b"\x3a"
_POINT_TAG = b"\x0a"
_START, _TIME, _DOUBLE, _INT = 0x11, 0x19, 0x21, 0x31
_TIME_DOUBLE = struct.Struct("<BQBd")
_TIME_INT = struct.Struct("<BQBq")
_START_TIME_DOUBLE = struct.Struct("<BQBQBd")
_START_TIME_INT = struct.Struct("<BQBQBq")
_ONE_BYTE = [bytes((i,)) for i in range(0x80)]
MIN_KEPT = 1_024  # attribute encodings kept whatever the collection's size


def _varint(n: int) -> bytes:
    if n < 0x80:
        return _ONE_BYTE[n]
    out = bytearray()
    while n > 0x7F:
        out.append((n & 0x7F) | 0x80)
        n >>= 7
    out.append(n)
    return bytes(out)


def _sdk_encode(metric: Any, out: pb2.Metric) -> None:
    """The SDK's encoding of one metric, its error as the SDK raises it."""
    try:
        _encode_metric(metric, out)
    except Exception as ex:
        raise EncodingException(ex, metric) from None


class MetricsEncoder:
    """``encode_metrics`` for the agent's gauges and counters; thread-safe (one export at a time)."""

    def __init__(self) -> None:
        self._attributes: dict[int, tuple[Any, bytes]] = {}  # id(mapping) -> (the mapping, its attribute bytes)
        self._points = 0  # the data points of the last collection
        self._lock = threading.Lock()

    def __call__(self, data: MetricsData) -> ExportMetricsServiceRequest:
        with self._lock:
            if len(self._attributes) > 2 * self._points + MIN_KEPT:  # series gone, or mappings not kept by the caller
                self._attributes.clear()
            self._points = 0
            request = ExportMetricsServiceRequest()  # built in place: a message passed to a constructor is copied
            for rm in data.resource_metrics:
                resource_metrics = request.resource_metrics.add(schema_url=rm.resource.schema_url)
                resource_metrics.resource.attributes.extend(_encode_attributes(rm.resource.attributes))
                for sm in rm.scope_metrics:
                    scope = resource_metrics.scope_metrics.add(schema_url=sm.scope.schema_url)
                    scope.scope.CopyFrom(_encode_instrumentation_scope(sm.scope))
                    for metric in sm.metrics:
                        self._metric(
                            metric,
                            scope.metrics.add(name=metric.name, description=metric.description, unit=metric.unit),
                        )
            return request

    def _metric(self, metric: Any, out: pb2.Metric) -> None:
        data = metric.data
        points = data.data_points
        if not isinstance(data, (Gauge, Sum)) or any(p.exemplars for p in points):
            _sdk_encode(metric, out)
            return
        if not points:  # as the SDK: a metric without points has no data field set
            return
        gauge = isinstance(data, Gauge)
        self._points += len(points)
        try:
            body = b"".join([self._point(p, gauge) for p in points])
        except (struct.error, OverflowError):  # an integer outside int64: the SDK's encoding says what is wrong
            _sdk_encode(metric, out)
            return
        if isinstance(data, Sum):
            out.sum.MergeFromString(body)
            out.sum.aggregation_temporality = int(data.aggregation_temporality)  # type: ignore[assignment]
            out.sum.is_monotonic = data.is_monotonic
        else:
            out.gauge.MergeFromString(body)

    def _point(self, p: Any, gauge: bool) -> bytes:
        mapping = p.attributes
        kept = self._attributes.get(id(mapping))
        if kept is not None and kept[0] is mapping:  # the mapping is held here: its id is not another's
            attributes = kept[1]
        else:
            parts = []
            for key, value in (mapping or {}).items():
                try:
                    kv = _encode_key_value(key, value).SerializeToString()
                except Exception:  # as the SDK's _encode_attributes: an attribute it cannot encode is left out
                    log.exception("Failed to encode key %s", key)
                    continue
                parts.append(_ATTRIBUTE_TAG + _varint(len(kv)) + kv)
            attributes = b"".join(parts)
            self._attributes[id(mapping)] = (mapping, attributes)
        value = p.value
        is_int = isinstance(value, int)
        if gauge:  # the SDK leaves a gauge point's start time out
            fields = (_TIME_INT if is_int else _TIME_DOUBLE).pack(
                _TIME, p.time_unix_nano, _INT if is_int else _DOUBLE, value
            )
        else:
            fields = (_START_TIME_INT if is_int else _START_TIME_DOUBLE).pack(
                _START, p.start_time_unix_nano, _TIME, p.time_unix_nano, _INT if is_int else _DOUBLE, value
            )
        point = attributes + fields
        return _POINT_TAG + _varint(len(point)) + point
