"""The node daemon: what `inferwatch run` starts beside an inference runtime.

Data flows one way (STYLE.md): sources (``collectors``, ``engine``, ``host``, ``receiver``, ``discovery``,
``probe``, ``simd``, ``debugprofile``) → processors (``analytics``) → state (``state``) → sinks (the API in
``api``, the exporters in :mod:`inferwatch.exporters`), with ``actions`` run on request. ``runner`` drives the
collectors on their schedule; ``wiring`` and ``app`` are the composition root that reads the settings.
"""
