"""Fleet tools: they never run on a node; they read Prometheus (or a file of its answers) across many nodes.

``matrix`` compares hardware and engines (with ``prices`` for cost per token), ``drift`` finds nodes whose
behaviour moved away from their peers'.
"""
