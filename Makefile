# Switchyard: `make run` serves the embedded default; `make test` runs the whole suite.
VENV    ?= .venv
# The interpreter the venv is made from: its build changes the gateway's CPU per request by about
# a tenth (docs/deployment.md, "How many gateway replicas").
PYTHON  ?= python3
PY      := $(VENV)/bin/python
STAMP   := $(VENV)/.installed-$(shell cat pyproject.toml | cksum | cut -d' ' -f1)
CONFIG  ?= config/default.yaml
# make test's pytest processes: each test file runs whole in one of them (its module fixtures shared)
TEST_JOBS ?= 2

.PHONY: install model run test lint services clean

$(PY):
	$(PYTHON) -m venv $(VENV)
	$(PY) -m pip install -q --upgrade pip

$(STAMP): pyproject.toml | $(PY)
	$(PY) -m pip install -e '.[test]'
	rm -f $(VENV)/.installed-*
	touch $@

# The default model (SmolLM2-135M-Instruct GGUF) is fetched once into ~/.cache/switchyard/models.
model: $(STAMP)
	@$(PY) -m backends.local.default_model

install: $(STAMP) model

# The default model is fetched only while the config serves it (so a config with a model of its own,
# or config/echo.yaml, runs without network); the loopback echo upstream runs only while the config
# routes to it (api_base on port 8001).
run: $(STAMP)
	@if grep -qE '^[^#]*SmolLM2-135M-Instruct\.Q4_1\.gguf' $(CONFIG); then $(PY) -m backends.local.default_model; fi
	@if grep -qE '^[[:space:]]*api_base:[[:space:]]*http://127.0.0.1:8001' $(CONFIG); then \
	  $(PY) -m backends.dev.echo_server --port 8001 & echo_pid=$$!; trap 'kill $$echo_pid 2>/dev/null' EXIT; fi; \
	$(VENV)/bin/switchyard bootstrap --config $(CONFIG) && $(VENV)/bin/switchyard serve --config $(CONFIG)

services:
	bash tests/start_services.sh

# ruff (lint rules in pyproject.toml) and mypy (every `type: ignore` coded and used); import circles
# and the layering rules are checked by tests/test_architecture.py.
lint: install
	$(VENV)/bin/ruff check
	$(VENV)/bin/mypy

test: install lint services
	$(PY) -m pytest -n $(TEST_JOBS) --dist loadfile $(PYTEST_ARGS)

clean:
	rm -rf $(VENV) var .pytest_cache
