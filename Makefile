# The routine commands, over .venv (scripts/test.sh creates it and installs the Debian tools; or:
# python3 -m venv .venv && .venv/bin/pip install -e '.[test]'). CI runs scripts/test.sh: the installs
# (Debian tools, .venv, .venv-tools' checkov, the llama.cpp server builds), then the checks of
# `make lint types test`: ruff check, ruff format --check, mypy, lint-imports, the whole pytest suite.
#
#   make lint types test            what CI checks (lint: ruff + the import contract; test: the whole suite,
#                                   TESTS=... for part of it)
#   make test TESTS=tests/test_config.py
#   make generate                   rewrite every generated file from its source
#   make check-generated            fail when a generated file differs from a fresh generation
#   make rules                      promtool check + unit tests of the alert rules only

VENV ?= .venv
PY := $(VENV)/bin/python
# Bytecode cached under build/ even where the environment says not to write it (scripts/test.sh says why).
unexport PYTHONDONTWRITEBYTECODE
export PYTHONPYCACHEPREFIX ?= $(CURDIR)/build/pycache
TESTS ?=
PROMTOOL ?= promtool

# Order matters: the dashboards name alerts (checked against the rule files), the link generator reads the
# dashboards' variables, the SLO generator calls the link generator, and the Kubernetes manifests copy the rules
# and dashboards they produce.
GENERATORS := inferwatch.agent.catalog.docs inferwatch.dashboards.generate inferwatch.agent.alerts.links inferwatch.agent.alerts.slo inferwatch.agent.alerts.table deploy.kubernetes.generate inferwatch.agent.node.engine.coverage inferwatch.agent.node.collectordocs

.PHONY: all test lint fmt types generate check-generated rules

all: lint types check-generated test

test:
	$(PY) -m pytest $(TESTS)

lint:
	$(VENV)/bin/ruff check .
	$(VENV)/bin/ruff format --check .
	$(VENV)/bin/lint-imports

fmt:
	$(VENV)/bin/ruff check --fix .
	$(VENV)/bin/ruff format .

types:
	$(VENV)/bin/mypy

generate:
	@set -e; for g in $(GENERATORS); do $(PY) -m $$g; done

check-generated:
	@rc=0; for g in $(GENERATORS); do $(PY) -m $$g --check || rc=1; done; \
	  if [ $$rc -ne 0 ]; then echo "generated files are stale: run make generate" >&2; fi; exit $$rc

rules:
	$(PROMTOOL) check rules alerts/*.rules.yml
	$(PROMTOOL) test rules tests/rules/*.test.yml
