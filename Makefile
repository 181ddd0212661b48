# thaw's build and test entry points. `make demo` and `make test` are the two
# commands of the README: each runs every set-up step it needs (ci/setup.sh,
# idempotent and cached) first.
SHELL := /bin/bash
PY := .venv/bin/python
export PYTHONDONTWRITEBYTECODE := 1

.PHONY: setup build demo cluster cluster-down test test-unit test-functional test-integration release carry carry-node clean

setup:
	@bash ci/setup.sh

build:
	@bash ci/build-go.sh

demo: setup
	@.venv/bin/thaw demo

# A real two-node Kubernetes cluster on this machine (control/dev/cluster.py,
# docs/cluster.md); it prints how to reach it. `make cluster-down` removes it.
cluster: setup
	@$(PY) -m control.dev.cluster up

cluster-down:
	@$(PY) -m control.dev.cluster down

# All tiers; integration tests need root and run against the real stack.
test: setup
	@bash ci/test.sh

test-unit: setup
	@$(PY) -m pytest tests/unit -q

test-functional: setup
	@$(PY) -m pytest tests/functional -q

test-integration: setup
	@$(PY) -m pytest tests/integration -q

# dist/thaw-<version>/: what a node installs from without a compiler or a
# checkout (ci/release.sh, docs/install.md).
release: setup
	@bash ci/release.sh

# What the H200 machine needs that it lacks (see bench/gpu/README.md).
carry: setup
	@bash ci/carry.sh

# The GPU node run (bench/gpu/node.sh): two parts, one per device call.
carry-node: setup
	@bash ci/carry-node.sh

clean:
	rm -rf build dist .venv .carry .carry-node
