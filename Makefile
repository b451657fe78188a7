# `make run` and `make test` create .venv if missing and install what they need
# (the `local` extra builds llama-cpp-python from source once, ~6 minutes; pip caches the wheel;
# the `train` extra brings torch 2.13.0 (CPU), used by the exporter, its parity test and `gateway train`).
PYTHON ?= python3.11
VENV := .venv
BIN := $(VENV)/bin

.PHONY: run run-emulated test typecheck bench bench-compare clean

$(BIN)/python:
	$(PYTHON) -m venv $(VENV)
	$(BIN)/pip install -q --upgrade pip

$(VENV)/.installed: pyproject.toml | $(BIN)/python
	$(BIN)/pip install -q -e '.[dev,local,train]'
	touch $@

run: $(VENV)/.installed
	$(BIN)/gateway up --routes routes/local.yaml --policies policies/local.yaml

run-emulated: $(VENV)/.installed
	$(BIN)/gateway up --routes routes/emulator.yaml --policies policies/emulator.yaml

test: $(VENV)/.installed
	$(BIN)/pytest

typecheck: $(VENV)/.installed
	$(BIN)/mypy

bench: $(VENV)/.installed
	$(BIN)/python bench/proxy_overhead.py

# issue 9: direct vs bare proxy vs gateway (cache off/on) vs LiteLLM, then routing quality; both write
# docs/BENCHMARKS.md. compare.py creates .venv-litellm (bench/litellm/requirements.txt) on first use.
bench-compare: $(VENV)/.installed
	$(BIN)/python bench/compare.py
	$(BIN)/python bench/routing_quality.py

clean:
	rm -rf $(VENV) .pytest_cache .mypy_cache
