"""Sinks that translate the agent state: Prometheus exposition, OTLP metrics (and later logs), Grafana."""
