# extproc developer entry points. `make help` lists them.

PYTHON ?= python3
VENV := .venv
BIN := $(VENV)/bin
# Two installs, each marked by a stamp newer than what it was built from. The runtime one (what `make run`
# needs): extproc editable with the Rust extension and its dependencies only. The test one adds the `test`
# extras (pytest, ruff, transformers, matplotlib...) on top without rebuilding extproc. Editing
# pyproject.toml or anything under native/ (or protos/, when there is one) reinstalls both, so Rust
# changes rebuild the extension.
RUNTIME_STAMP := $(VENV)/.installed-runtime
TEST_STAMP := $(VENV)/.installed
BUILD_INPUTS := pyproject.toml $(shell find native protos -path native/target -prune -o -type f -print 2>/dev/null)
# The `test` extras as pip requirements, read from pyproject.toml (tomllib: Python >= 3.11).
TEST_EXTRAS := import tomllib; project = tomllib.load(open("pyproject.toml", "rb"))["project"]; \
	print("\n".join(project["optional-dependencies"]["test"]))
CARGO := cargo
MANIFEST := --manifest-path native/Cargo.toml
# The binding crate's build script asks this interpreter for its ABI (clippy); the core crate needs no Python.
PYO3_ENV := PYO3_PYTHON=$(abspath $(BIN)/python)
ARGS ?=
# The fuzzer of the core's input surfaces (native/fuzz, docs/reliability.md "Fuzzing"). `make test` runs it
# for a fixed budget with a fixed seed (reproducible: the same inputs every run); `make fuzz` for longer.
FUZZ := $(CARGO) run --release --quiet $(MANIFEST) -p extproc-fuzz --
FUZZ_TEST_ARGS := --seconds 5 --seed 15

.DEFAULT_GOAL := help
.PHONY: help venv .venv run test test-rust test-python envoy-module lint envoy-configs deploy-configs docs bench bench-routing bench-routing-scale-out bench-routing-trace vllm-engine fuzz soak wasm-plugin clean

help: ## list the targets
	@echo "usage: make TARGET"
	@awk 'BEGIN {FS = ":.*## "} /^[a-zA-Z_.-]+:.*## / {printf "  %-14s %s\n", $$1, $$2}' $(MAKEFILE_LIST)

$(BIN)/python:
	$(PYTHON) -m venv $(VENV)
	$(BIN)/python -m pip install --upgrade pip

$(RUNTIME_STAMP): $(BUILD_INPUTS) | $(BIN)/python
	$(BIN)/python -m pip install -e .
	@touch $@

$(TEST_STAMP): $(RUNTIME_STAMP)
	$(BIN)/python -c '$(TEST_EXTRAS)' > $(VENV)/test-requirements.txt
	$(BIN)/python -m pip install -r $(VENV)/test-requirements.txt
	@touch $@

.venv: $(TEST_STAMP) ## create .venv and install extproc editable (builds the Rust extension) with test tools
venv: .venv

run: $(RUNTIME_STAMP) ## run the local stack in the foreground; real engines: ARGS="--engine grpc://h:p --model-dir DIR"
	$(BIN)/extproc up $(ARGS)

test: test-rust test-python ## all tests: cargo test, then pytest

test-rust: $(TEST_STAMP) ## Rust unit tests of the core crate (no Python; reads tokenizer files from .venv), a 25 s fuzz run
	$(CARGO) test --release $(MANIFEST) -p extproc-core -p extproc-fuzz
	$(FUZZ) $(FUZZ_TEST_ARGS)

fuzz: ## fuzz the core's input surfaces, 10 s per target; ARGS="--seconds 600 --target request --seed N" (--help)
	$(FUZZ) $(ARGS)

soak: $(RUNTIME_STAMP) ## minutes of mixed load with engine faults, disconnects and an extproc restart (not in test); ARGS="--minutes 10"
	$(BIN)/python -m load.soak $(ARGS)

vllm-engine: $(RUNTIME_STAMP) ## build the real vLLM engine the tests run (its venv + tiny model, cached in ~/.cache/extproc/vllm)
	$(BIN)/python -m load.vllm_engine prepare

# The response path as an Envoy dynamic module (native/envoy-module, issue 17): its own cdylib, built apart
# from the Python extension so that build never waits on it.
envoy-module: ## build the Envoy dynamic module (native/target/release/libextproc_envoy.so)
	$(CARGO) build --release $(MANIFEST) -p extproc-envoy-module

test-python: $(TEST_STAMP) vllm-engine wasm-plugin envoy-module ## the Python suite (unit, real-Envoy integration, load, contract vs real vLLM)
	$(BIN)/pytest -q --durations=30

lint: $(TEST_STAMP) ## ruff check + format check, clippy -D warnings, rustfmt check
	$(BIN)/ruff check .
	$(BIN)/ruff format --check .
	$(PYO3_ENV) $(CARGO) clippy $(MANIFEST) --workspace --all-targets -- -D warnings
	$(CARGO) fmt $(MANIFEST) --all --check
	$(CARGO) clippy --manifest-path $(WASM_PLUGIN)/Cargo.toml --target wasm32-wasip1 --all-targets -- -D warnings
	$(CARGO) fmt --manifest-path $(WASM_PLUGIN)/Cargo.toml --check

envoy-configs: $(RUNTIME_STAMP) ## regenerate the reference Envoy configs in envoy/ (and validate them)
	$(BIN)/python -m extproc.envoy_bootstrap envoy

deploy-configs: $(RUNTIME_STAMP) ## regenerate deploy/'s generated Envoy configs (the gateway's bootstrap, the Istio EnvoyFilter)
	EXTPROC=$(BIN)/extproc sh deploy/kubernetes/envoy/generate.sh
	$(BIN)/envoy --mode validate -c deploy/kubernetes/envoy/envoy.json
	$(BIN)/python deploy/istio/envoyfilter.py

# The example proxy-wasm plugin (deploy/wasm/api-key-auth): its own Cargo workspace, built for WASI; the
# tests load it into the PyPI Envoy (tests/integration/test_wasm_plugin.py).
WASM_PLUGIN := deploy/wasm/api-key-auth
wasm-plugin: ## build the example Wasm plugin (adds rustup's wasm32-wasip1 target when missing)
	@rustc --print target-libdir --target wasm32-wasip1 2>/dev/null | xargs -r ls 2>/dev/null | grep -q . \
		|| { command -v rustup >/dev/null && rustup target add wasm32-wasip1; }
	$(CARGO) build --release --target wasm32-wasip1 --manifest-path $(WASM_PLUGIN)/Cargo.toml
	$(CARGO) test --release --manifest-path $(WASM_PLUGIN)/Cargo.toml

docs: ## regenerate the settings tables in docs/operating.md from extproc/settings.py (no venv needed)
	$(PYTHON) -m extproc.settings --write docs/operating.md

bench: $(TEST_STAMP) envoy-module ## ours (ext_proc and module paths) vs SMG vs the bare engine, with plots (~25 min; ARGS=--quick: ~4 min)
	$(BIN)/python -m load.bench $(ARGS)

bench-routing: $(TEST_STAMP) ## routing workload suite: 7 shapes, ours vs SMG cache_aware vs round robin (hours; ARGS=--quick: ~20 min)
	$(BIN)/python -m load.bench_routing.suite $(ARGS)

bench-routing-scale-out: $(TEST_STAMP) ## engines joining mid-run: ours (discovery) vs SMG (worker API), 7 shapes (~25 min; ARGS=--quick: ~8 min; ARGS="--event restart --start 4": an engine restarting)
	$(BIN)/python -m load.bench_routing.scale_out $(ARGS)

bench-routing-trace: $(TEST_STAMP) ## issue 6's routing benchmark: all policies vs SMG on one mixed trace (~9 min; ARGS=--quick: ~1.5 min)
	$(BIN)/python -m load.bench_routing $(ARGS)

clean: ## remove the venv, build outputs and caches
	rm -rf $(VENV) native/target $(WASM_PLUGIN)/target extproc/_native*.so .pytest_cache .ruff_cache
	find . -name __pycache__ -type d -prune -exec rm -rf {} +
