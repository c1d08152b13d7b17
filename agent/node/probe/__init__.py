"""The streaming probe: a synthetic streamed request against the runtime, validated chunk by chunk.

``sse`` splits the raw byte stream into events (and notices CRLF framing and non-UTF-8 bytes),
``schema`` validates each payload against the per-protocol JSON Schema in ``schemas/`` and checks the
event order, ``client`` sends the request and measures client-side TTFT, inter-token latency and total
time. The ``probe`` collector runs it periodically; ``inferwatch probe`` runs it once.
"""

from inferwatch.agent.node.probe.client import PROTOCOLS, ProbeResult, Violation, run_probe

__all__ = ["PROTOCOLS", "ProbeResult", "Violation", "run_probe"]
