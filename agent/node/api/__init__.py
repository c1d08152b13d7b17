"""The agent's HTTP API (a sink of the state, and the door to the actions).

Modules: ``server`` (the ASGI app: ``/metrics`` in front of the Starlette routes, health, status, runbooks),
``routes`` (findings, snapshots, binary check, py-spy profiles, the authentication middleware),
``auth`` (bearer tokens and scopes), ``services`` (the typed set the routes get from the wiring).
The API never reads /proc: the runtime process comes from the agent's one locator.
"""
