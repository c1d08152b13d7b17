"""Actions: run on an explicit request (the API, the CLI) or at start, never on the collection path.

Modules: ``binary`` (ldd / ELF check of the runtime binary; posts its result into the state), ``pyspy``
(the py-spy program, fixed path, validated arguments, timeouts), ``profiles`` (py-spy recordings on
demand), ``snapshots`` (the runtime_profile snapshot ring and OTLP log sink; on-demand captures),
``ring`` (the bounded on-disk ring both keep their files in).
"""
