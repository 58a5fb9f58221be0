# One command per task. Every target creates and uses the local virtual environment itself.
PYTHON ?= python3
VENV   ?= .venv
BIN    := $(VENV)/bin
STAMP  := $(VENV)/.installed

.PHONY: all venv check test demo bench bench-emulator proto proto-check lint typecheck imports manifests clean

all: check test

$(STAMP): pyproject.toml
	$(PYTHON) -m venv $(VENV)
	$(BIN)/python -m pip install --quiet --upgrade pip
	$(BIN)/python -m pip install --quiet -e '.[dev]'
	touch $(STAMP)

venv: $(STAMP)

## check: ruff, mypy --strict, import-linter layering contracts, generated code freshness, manifests
check: lint typecheck imports proto-check manifests

lint: $(STAMP)
	$(BIN)/ruff check .
	$(BIN)/ruff format --check .

typecheck: $(STAMP)
	$(BIN)/mypy

imports: $(STAMP)
	$(BIN)/lint-imports

manifests: $(STAMP)
	$(BIN)/python -m tests.validate_manifests deviceclasses $(wildcard deploy) $(wildcard examples)

## proto: regenerate the gRPC code from kubeletplugin/proto/*.proto
proto: $(STAMP)
	$(BIN)/python -m kubeletplugin.proto.generate

proto-check: $(STAMP)
	$(BIN)/python -m kubeletplugin.proto.generate --check

## test: the whole suite (unit, integration, contract); tests marked gpu run only where a GPU exists
test: $(STAMP)
	$(BIN)/python -m pytest

## demo: the simulator on the reference cluster, the four two-axis patterns
demo: $(STAMP)
	@for pattern in examples/four-patterns/*.yaml; do \
		echo "=== $$pattern"; \
		$(BIN)/biaxial simulate examples/reference-cluster.yaml $$pattern || exit 1; \
	done

## bench: decision throughput, latency, cold start and memory at 100..5000 nodes
bench: $(STAMP)
	$(BIN)/python -m bench.decisions

bench-emulator: $(STAMP)
	$(BIN)/python -m bench.emulator

clean:
	rm -rf $(VENV) .mypy_cache .ruff_cache .pytest_cache build *.egg-info
