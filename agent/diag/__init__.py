"""Runtime diagnostics: redacted runtime_profile snapshots, binary compatibility, py-spy, API auth.

Modules: ``redaction`` (policy and keyed hashes), ``snapshots`` (bounded on-disk ring), ``fetch``
(bounded HTTP fetch of the debug profile), ``runtime_proc`` (finding the runtime process in procfs),
``profile_service`` (capture → enrich → redact → store → export), ``binary`` (ldd / ELF check),
``pyspy`` and ``profiles`` (py-spy on demand), ``auth`` (bearer tokens and scopes), ``api`` (routes).
"""
