"""Kubernetes manifests for the agent and its monitoring objects (docs/kubernetes.md); generate.py writes the copies."""
