# One command per task. Every target creates and uses the local virtual environment itself.
PYTHON ?= python3
VENV   ?= .venv
BIN    := $(VENV)/bin
STAMP  := $(VENV)/.installed

.PHONY: all venv lock lock-check control-plane check test demo bench bench-rules bench-cel bench-emulator bench-preemption bench-queueing bench-chaos bench-badinput bench-vs-kube-scheduler proto proto-check fields fields-check lint typecheck imports manifests manifests-render e2e-kind e2e-node clean

all: check test

LOCK   := requirements/dev.lock

# The environment comes from the lock (exact versions, every file's hash checked); the
# project itself is then installed editable on top without resolving anything again.
$(STAMP): pyproject.toml $(LOCK)
	$(PYTHON) -m venv $(VENV)
	$(BIN)/python -m pip install --quiet --disable-pip-version-check --require-hashes -r $(LOCK)
	$(BIN)/python -m pip install --quiet --disable-pip-version-check --no-deps --no-build-isolation -e .
	touch $(STAMP)

venv: $(STAMP)

## lock: re-resolve requirements/dev.lock and runtime.lock from pyproject.toml's ranges (uv,
## pinned in tests/check_lock.py), then `make venv` installs exactly that
lock: $(STAMP)
	$(BIN)/python -m tests.check_lock --update
	rm -f $(STAMP)

## lock-check: the locks agree with pyproject.toml (every range honoured, every pin hashed)
lock-check: $(STAMP)
	$(BIN)/python -m tests.check_lock

## check: the lock, ruff, mypy --strict, import-linter layering contracts, generated code freshness, manifests
check: lock-check lint typecheck imports proto-check fields-check manifests

lint: $(STAMP)
	$(BIN)/ruff check .
	$(BIN)/ruff format --check .

typecheck: $(STAMP)
	$(BIN)/mypy

imports: $(STAMP)
	$(BIN)/lint-imports

## manifests: deploy/manifests/ rendered from the Helm chart (fails when stale), then every
## manifest, rendered chart object and example validated strictly for Kubernetes 1.34 and 1.37
manifests: $(STAMP)
	$(BIN)/python -m tests.render_chart --check
	$(BIN)/python -m tests.validate_manifests deviceclasses deploy/manifests $(wildcard examples)

## manifests-render: regenerate deploy/manifests/ from deploy/helm/biaxial
manifests-render: $(STAMP)
	$(BIN)/python -m tests.render_chart

## proto: regenerate the gRPC code from kubeletplugin/proto/*.proto
proto: $(STAMP)
	$(BIN)/python -m kubeletplugin.proto.generate

proto-check: $(STAMP)
	$(BIN)/python -m kubeletplugin.proto.generate --check

## fields: regenerate biaxial/simulate/fields.json (the strict manifest schema) from the
## official Kubernetes OpenAPI schemas; fields-check fails when it is stale
fields: $(STAMP)
	$(BIN)/python -m tests.gen_field_schema

fields-check: $(STAMP)
	$(BIN)/python -m tests.gen_field_schema --check

## control-plane: build (or reuse, cached per version) etcd, kube-apiserver,
## kube-controller-manager, kube-scheduler and kwok from upstream's source through the Go module
## proxy; prints where they are. BIAXIAL_K8S_RELEASE=1.34 picks the oldest supported release
control-plane: $(STAMP)
	$(BIN)/python -m tests.cluster.build

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

## e2e-node: a real one-node cluster on this machine (needs root): the control plane and the
## node (kubelet, containerd, runc, CNI) built from source through the Go module proxy (cached),
## local OCI images, the biaxial controller and kubelet plugin as the chart runs them (fake
## GPUs, stand-in device nodes); then tests/node (pods that really run). Leaves nothing behind
e2e-node: $(STAMP)
	$(BIN)/python -m tests.cluster.build --node
	BIAXIAL_E2E_NODE=1 $(BIN)/python -m pytest tests/node -m node -v -rP --durations=0

## e2e-kind: kind cluster with fake GPUs (deploy/kind/up.sh), then tests/e2e against it. Needs
## docker or podman, kind and kubectl; without them tests/e2e is skipped with the reason
e2e-kind: $(STAMP)
	if deploy/kind/up.sh --check-tools; then deploy/kind/up.sh; fi
	BIAXIAL_E2E=1 KUBECONFIG=$${TMPDIR:-/tmp}/biaxial-kind.kubeconfig $(BIN)/python -m pytest tests/e2e -rs -v

bench-emulator: $(STAMP)
	$(BIN)/python -m bench.emulator

clean:
	rm -rf $(VENV) .mypy_cache .ruff_cache .pytest_cache build *.egg-info

## bench-preemption: a full 500-node x 8-GPU cluster and a stream of high-priority pods
bench-preemption: $(STAMP)
	$(BIN)/python -m bench.preemption

## bench-rules: pods carrying a rule between pods (anti-affinity, affinity, spreading) at 500
## and 5000 nodes, as kube-scheduler's scheduler_perf workloads of the same names
bench-rules: $(STAMP)
	$(BIN)/python -m bench.rules

## bench-cel: CEL evaluation speed (typical selector) and the bombs (outcome, time, peak memory)
bench-cel: $(STAMP)
	$(BIN)/python -m bench.cel

## bench-queueing: a flood of unschedulable pods, then ordinary ones: their time to binding
bench-queueing: $(STAMP)
	$(BIN)/python -m bench.queueing

## bench-chaos: ~1,800 pods through two controllers and three plugins while the API fails,
## processes are killed and the leader paused; then the books are checked (a few minutes)
bench-chaos: $(STAMP)
	$(BIN)/python -m bench.chaos

## bench-badinput: each kind of bad input gets its message where the user looks, nothing else
bench-badinput: $(STAMP)
	$(BIN)/python -m bench.badinput

## bench-vs-kube-scheduler: kube-scheduler and biaxial on the same real control plane and pods,
## and upstream's own scheduler_perf DRA benchmark on this machine (needs `make control-plane`;
## the scheduler_perf binary is built on first use, ~10 min on 2 cores; UPSTREAM=0 skips it;
## NODES, PODS, STREAM_PODS, WORKLOADS, QPS, JSON override the defaults)
bench-vs-kube-scheduler: $(STAMP)
	$(BIN)/python -m bench.vs_kube_scheduler $(if $(NODES),--nodes $(NODES)) $(if $(PODS),--pods $(PODS)) \
		$(if $(STREAM_PODS),--stream-pods $(STREAM_PODS)) $(if $(WORKLOADS),--workloads $(WORKLOADS)) \
		$(if $(QPS),--qps $(QPS)) $(if $(JSON),--json $(JSON)) \
		$(if $(filter 0,$(UPSTREAM)),,--upstream-scheduler-perf)
