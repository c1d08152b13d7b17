"""Processors over per-request samples: windowed sketches, latency quantiles, bimodality.

Modules: ``windows`` (windowed DDSketches and sums), ``bimodality`` (the bimodality test), ``latency``
(per-model span analytics), ``processor`` (:class:`~inferwatch.agent.node.analytics.processor.SpanAnalytics`, which the
runner schedules like a collector, so its samples go through the validated ``record()`` path).
"""
