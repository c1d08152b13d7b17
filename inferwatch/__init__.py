"""inferwatch: observability and SLO diagnostics for LLM inference runtimes.

Everything installed lives under this one name. The repository keeps one folder per part at its top and
setup.py maps each onto a subpackage here (in the checkout, the symlinks beside this file):

- ``inferwatch.agent`` (``agent/``): the node daemon (``agent.node``), the doctor, the fleet tools and the CLI;
- ``inferwatch.exporters`` (``exporters/``): Prometheus, OTLP and Grafana sinks;
- ``inferwatch.simulator`` (``simulator/``): the simulated engine and the load generator;
- ``inferwatch.dashboards`` (``dashboards/``): the Grafana dashboards and their generator.
"""
