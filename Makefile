# extproc developer entry points. `make help` lists them.

PYTHON ?= python3
VENV := .venv
BIN := $(VENV)/bin
# Installed (editable, with the Rust extension built) when this is newer than everything it was built from:
# editing pyproject.toml or anything under native/ or protos/ (the wire types' source) reinstalls, so Rust
# changes rebuild the extension.
STAMP := $(VENV)/.installed
NATIVE_INPUTS := $(shell find native protos -path native/target -prune -o -type f -print 2>/dev/null)
CARGO := cargo
MANIFEST := --manifest-path native/Cargo.toml
# The binding crate's build script asks this interpreter for its ABI (clippy); the core crate needs no Python.
PYO3_ENV := PYO3_PYTHON=$(abspath $(BIN)/python)
ARGS ?=

.DEFAULT_GOAL := help
.PHONY: help venv .venv run test test-rust test-python lint envoy-configs bench bench-routing vllm-engine clean

help: ## list the targets
	@echo "usage: make TARGET"
	@awk 'BEGIN {FS = ":.*## "} /^[a-zA-Z_.-]+:.*## / {printf "  %-14s %s\n", $$1, $$2}' $(MAKEFILE_LIST)

$(BIN)/python:
	$(PYTHON) -m venv $(VENV)
	$(BIN)/python -m pip install --upgrade pip

$(STAMP): pyproject.toml $(NATIVE_INPUTS) | $(BIN)/python
	$(BIN)/python -m pip install -e '.[test]'
	@touch $@

.venv: $(STAMP) ## create .venv and install extproc editable (builds the Rust extension) with test tools
venv: .venv

run: $(STAMP) ## run the local stack in the foreground; real engines: ARGS="--engine grpc://h:p --model-dir DIR"
	$(BIN)/extproc up $(ARGS)

test: test-rust test-python ## all tests: cargo test, then pytest

test-rust: ## Rust unit tests of the core crate (native/core; no Python needed)
	$(CARGO) test --release $(MANIFEST) -p extproc-core

vllm-engine: $(STAMP) ## build the cached real vLLM engine (.cache/vllm-venv + tiny model) the contract suite runs
	$(BIN)/python -m load.vllm_engine prepare

test-python: $(STAMP) vllm-engine ## the Python suite (unit, real-Envoy integration, load, contract vs real vLLM)
	$(BIN)/pytest -q

lint: $(STAMP) ## ruff check + format check, clippy -D warnings, rustfmt check
	$(BIN)/ruff check .
	$(BIN)/ruff format --check .
	$(PYO3_ENV) $(CARGO) clippy $(MANIFEST) --workspace --all-targets -- -D warnings
	$(CARGO) fmt $(MANIFEST) --check

envoy-configs: $(STAMP) ## regenerate the reference Envoy configs in envoy/ (and validate them)
	$(BIN)/python -m extproc.envoy_bootstrap envoy

bench: $(STAMP) ## ours vs SMG vs the bare engine, side by side, with plots (~9 min; ARGS=--quick: ~1 min)
	$(BIN)/python -m load.bench $(ARGS)

bench-routing: $(STAMP) ## routing policies vs SMG cache_aware on 4 simulated engines (~9 min; ARGS=--quick: ~1.5 min)
	$(BIN)/python -m load.bench_routing $(ARGS)

clean: ## remove the venv, build outputs and caches
	rm -rf $(VENV) native/target extproc/_native*.so .pytest_cache .ruff_cache
	find . -name __pycache__ -type d -prune -exec rm -rf {} +
