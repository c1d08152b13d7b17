"""Engine target discovery: which engines this agent watches, and who each one is.

A source in the agent's shape (docs/STYLE: sources → processors → state → sinks): each discoverer returns a
:class:`~inferwatch.agent.node.discovery.target.TargetSet`, a frozen value; :meth:`TargetSet.diff` says what was added,
changed and removed since the last one, so the composition root can start, restart and stop per-engine collectors.

- :mod:`inferwatch.agent.node.discovery.static`: the list written in the settings file;
- :mod:`inferwatch.agent.node.discovery.filesd`: a file in Prometheus ``file_sd`` shape, re-read when it changes;
- :mod:`inferwatch.agent.node.discovery.kubernetes`: engine pods on this node, from the Kubernetes API (list, then
watch).

:class:`inferwatch.agent.node.discovery.combined.Discovery` builds the configured ones from ``DiscoverySettings`` and
polls them as one.

Nothing here starts a collector: :mod:`inferwatch.agent.node.targets` does, from each diff.
"""
