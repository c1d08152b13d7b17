"""Source back-end of the ``runtime_profile`` collector: the runtime's debug profile, read and redacted.

Modules: ``fetch`` (bounded HTTP fetch), ``redaction`` (policy and keyed hashes), ``process`` (the runtime
process described from procfs, for the enrichment), ``reader`` (fetch → enrich → redact into a snapshot).
"""
