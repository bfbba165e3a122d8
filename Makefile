# SPDX-License-Identifier: Apache-2.0
# Two commands: `make run` (the agent on its local default) and `make test`. Both install what they need first.

VENV      ?= .venv
PY        := $(VENV)/bin/python
STAMP     := $(VENV)/.installed
TEST_STAMP := $(VENV)/.installed-test
export PATH := $(CURDIR)/$(VENV)/bin:$(PATH)

.PHONY: install run test build test-deps clean bench

install: $(STAMP) build

# what running needs: the build toolchain, and the package with its dependencies
$(STAMP): pyproject.toml scripts/install-system.sh
	bash scripts/install-system.sh
	python3 -m venv $(VENV)
	$(PY) -m pip install -q --upgrade pip
	$(PY) -m pip install -q -e .
	touch $(STAMP)

# what the tests add: Go (go tool pprof), Podman/Buildah (the image test), the test extras
$(TEST_STAMP): $(STAMP)
	bash scripts/install-system.sh --test
	$(PY) -m pip install -q -e '.[test]'
	touch $(TEST_STAMP)

# Native parts: the BPF objects (clang, one tree: otel_gpu/ebpf), the CUDA-side library, the span context table and
# the span processor's C hooks (a CPython extension, against the venv's Python headers), the unwind-table builder, the
# ELF symbol-table reader and the test fakes (gcc).
build: $(STAMP)
	$(MAKE) -s -C otel_gpu/ebpf
	$(MAKE) -s -C otel_gpu/cuda/native
	$(MAKE) -s -C otel_gpu/instrumentation/native PYTHON=$(CURDIR)/$(PY)
	$(MAKE) -s -C otel_gpu/unwind/native
	$(MAKE) -s -C otel_gpu/symbolize/native
	$(MAKE) -s -C tests/native

# Real backends for the tests, extracted from Debian packages into .cache (never installed system-wide), and helm.
test-deps: $(TEST_STAMP)
	bash scripts/fetch-backends.sh
	bash scripts/fetch-helm.sh

run: install
	$(VENV)/bin/otel-gpu run $(ARGS)

test: install test-deps
	$(PY) -m pytest $(PYTEST_ARGS)

bench: install
	$(PY) bench/run_all.py

clean:
	$(MAKE) -s -C otel_gpu/ebpf clean
	$(MAKE) -s -C otel_gpu/cuda/native clean
	$(MAKE) -s -C otel_gpu/instrumentation/native clean
	$(MAKE) -s -C otel_gpu/unwind/native clean
	$(MAKE) -s -C otel_gpu/symbolize/native clean
	$(MAKE) -s -C tests/native clean
	rm -rf $(VENV) .cache
