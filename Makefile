# `make run` and `make test` create .venv if missing and install what they need.
PYTHON ?= python3.11
VENV := .venv
BIN := $(VENV)/bin

.PHONY: run test typecheck bench clean

$(BIN)/python:
	$(PYTHON) -m venv $(VENV)
	$(BIN)/pip install -q --upgrade pip

$(VENV)/.dev: pyproject.toml | $(BIN)/python
	$(BIN)/pip install -q -e '.[dev]'
	touch $@

run: $(VENV)/.dev
	$(BIN)/gateway up --routes routes/emulator.yaml --policies policies/default.yaml

test: $(VENV)/.dev
	$(BIN)/pytest

typecheck: $(VENV)/.dev
	$(BIN)/mypy

bench: $(VENV)/.dev
	$(BIN)/python bench/proxy_overhead.py

clean:
	rm -rf $(VENV) .pytest_cache .mypy_cache
