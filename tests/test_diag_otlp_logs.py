"""Snapshot log records over OTLP/gRPC to a real gRPC LogsService on 127.0.0.1 (HTTP is in the leak test)."""

from __future__ import annotations

import json
from concurrent import futures

import grpc
from opentelemetry.proto.collector.logs.v1 import logs_service_pb2, logs_service_pb2_grpc
from opentelemetry.sdk.resources import Resource

from inferwatch.exporters.otlp_logs import EVENT_NAME, SnapshotLogSink, make_log_exporter
from tests.conftest import free_port


def test_snapshot_reaches_a_grpc_receiver(monkeypatch) -> None:
    got: list[logs_service_pb2.ExportLogsServiceRequest] = []

    class Logs(logs_service_pb2_grpc.LogsServiceServicer):
        def Export(self, request, context):
            got.append(request)
            return logs_service_pb2.ExportLogsServiceResponse()

    port = free_port()
    server = grpc.server(futures.ThreadPoolExecutor(max_workers=2))
    logs_service_pb2_grpc.add_LogsServiceServicer_to_server(Logs(), server)
    server.add_insecure_port(f"127.0.0.1:{port}")
    server.start()
    try:
        monkeypatch.setenv("OTEL_EXPORTER_OTLP_ENDPOINT", f"http://127.0.0.1:{port}")
        monkeypatch.delenv("OTEL_EXPORTER_OTLP_PROTOCOL", raising=False)
        sink = SnapshotLogSink(Resource.create({"service.name": "inferwatch-agent"}), make_log_exporter())
        snapshot = {"meta": {"id": "0123456789abcdef", "outcome": "available", "redacted_paths": ["a", "b"]}}
        sink.emit(snapshot)
        assert sink.force_flush()
        sink.shutdown()
        sink.shutdown()  # idempotent
    finally:
        server.stop(0)
    (record,) = [lr for req in got for rl in req.resource_logs for sl in rl.scope_logs for lr in sl.log_records]
    assert json.loads(record.body.string_value) == snapshot
    assert record.event_name == EVENT_NAME
    attrs = {a.key: a.value for a in record.attributes}
    assert attrs["inferwatch.snapshot.id"].string_value == "0123456789abcdef"
    assert attrs["inferwatch.snapshot.redacted_fields"].int_value == 2
