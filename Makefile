# `make run` and `make test` create .venv if missing and install what they need
# (llama.cpp is built from source once, see LLAMA_CMAKE_ARGS; the `train` extra brings torch 2.13.0 (CPU),
# used by the exporter, its parity test and `gateway train`).
PYTHON ?= python3.11
VENV := .venv
BIN := $(VENV)/bin

.PHONY: run run-emulated test typecheck mutate mutate-all bench bench-compare clean chromium loadgen nginx llama

$(BIN)/python:
	$(PYTHON) -m venv $(VENV)
	$(BIN)/pip install -q --upgrade pip

# llama.cpp is built once, by the `llama` target (gateway/local/llama_build.py: llama-server for the local
# tiers and the libllama that the llama_cpp binding loads, cached under ~/.cache/gateway/llama.cpp);
# the binding (tokenizer, F16 conversion, training) is installed first, without compiling anything and
# without pip's wheel cache: a wheel without its library must not reach another project's install
LLAMA_CMAKE_ARGS ?= -DLLAMA_BUILD=OFF -DLLAVA_BUILD=OFF
LLAMA_VERSION = $(shell $(PYTHON) -c 'from gateway.local.llama_build import VERSION; print(VERSION)')

# llama.cpp compiles on every core while pip installs (llama_build needs only the standard library and pip;
# it returns at once when built); its output goes to $(VENV)/llama-build.log, printed if it fails
$(VENV)/.installed: pyproject.toml | $(BIN)/python
	$(BIN)/python -m gateway.local.llama_build > $(VENV)/llama-build.log 2>&1 & build=$$!; \
	CMAKE_ARGS="$(LLAMA_CMAKE_ARGS)" $(BIN)/pip install -q --no-cache-dir 'llama-cpp-python[server]==$(LLAMA_VERSION)' \
	  && $(BIN)/pip install -q -e '.[dev,local,train]'; installed=$$?; \
	wait $$build || { cat $(VENV)/llama-build.log; exit 1; }; [ $$installed -eq 0 ]
	touch $@

# returns at once when this version and these flags are built; links the binding to the build
llama: $(VENV)/.installed
	$(BIN)/python -m gateway.local.llama_build

# the request log, one JSON line per request, that `gateway costs .gateway/requests.log*` reads (the console
# keeps the banner); rotated at 100 MB, 7 files kept
REQUEST_LOG = --log-file .gateway/requests.log --log-max-bytes 100000000

run: $(VENV)/.installed llama
	$(BIN)/gateway up --routes routes/local.yaml --policies policies/local.yaml $(REQUEST_LOG)

run-emulated: $(VENV)/.installed
	$(BIN)/gateway up --routes routes/emulator.yaml --policies policies/emulator.yaml $(REQUEST_LOG)

# the dashboard's browser test needs Debian's Chromium: installed with apt when missing
chromium:
	@command -v chromium >/dev/null 2>&1 || { s=""; [ "$$(id -u)" -ne 0 ] && s=sudo; \
	  $$s apt-get update -qq && $$s apt-get install -y -qq chromium >/dev/null; }

# bench/req_per_core.py and its test drive Debian's wrk (a compiled closed-loop load generator)
loadgen:
	@command -v wrk >/dev/null 2>&1 || { s=""; [ "$$(id -u)" -ne 0 ] && s=sudo; \
	  $$s apt-get update -qq && $$s apt-get install -y -qq wrk >/dev/null; }

# the upstream client's tests against a real server in front of a replica (tests/integration/test_nginx_*.py),
# with TLS certificates made by the openssl CLI
nginx:
	@{ command -v nginx || [ -x /usr/sbin/nginx ]; } >/dev/null 2>&1 && command -v openssl >/dev/null 2>&1 || \
	  { s=""; [ "$$(id -u)" -ne 0 ] && s=sudo; $$s apt-get update -qq && $$s apt-get install -y -qq nginx openssl >/dev/null; }

# tests/deploy/test_manifests.py renders deploy/k8s with `kubectl kustomize` (no cluster): Debian's kubectl
kubectl:
	@command -v kubectl >/dev/null 2>&1 || { s=""; [ "$$(id -u)" -ne 0 ] && s=sudo; \
	  $$s apt-get update -qq && $$s apt-get install -y -qq kubernetes-client >/dev/null; }

# every test runs: in CI (CI=true) a skip fails unless README "Optional tests" documents it (tests/conftest.py)
# PYTHONDONTWRITEBYTECODE emptied: the gateway's modules are compiled once, not again in every process a test starts
test: $(VENV)/.installed llama chromium loadgen nginx kubectl
	PYTHONDONTWRITEBYTECODE= $(BIN)/pytest

typecheck: $(VENV)/.installed
	$(BIN)/mypy

# issue 42: mutation testing of the core (mutmut, in a copy of the tree under /tmp; not in CI: slow). By default
# the core modules changed since `git merge-base HEAD origin/main` (no remote: since the last commit touching
# docs/TESTING.md); `make mutate ARGS=--all` or `make mutate-all` for all of them; `ARGS="limits admission"`
# for some. Scores and the equivalent mutants: docs/TESTING.md, tools/mutants-equivalent.txt.
mutate: $(VENV)/.installed
	$(BIN)/python tools/mutate.py $(ARGS)

mutate-all: $(VENV)/.installed
	$(BIN)/python tools/mutate.py --all $(ARGS)

bench: $(VENV)/.installed
	$(BIN)/python bench/proxy_overhead.py

# issue 9: direct vs bare proxy vs gateway (cache off/on) vs LiteLLM, then routing quality; both write
# docs/BENCHMARKS.md. compare.py creates .venv-litellm (bench/litellm/requirements.txt) on first use.
bench-compare: $(VENV)/.installed
	$(BIN)/python bench/compare.py
	$(BIN)/python bench/routing_quality.py
	$(BIN)/python bench/req_per_core.py

clean:
	rm -rf $(VENV) .pytest_cache .mypy_cache
