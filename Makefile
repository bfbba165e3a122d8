# SPDX-License-Identifier: Apache-2.0
# Two commands: `make run` (the agent on its local default) and `make test`. Both install what they need first.

VENV      ?= .venv
PY        := $(VENV)/bin/python
STAMP     := $(VENV)/.installed
export PATH := $(CURDIR)/$(VENV)/bin:$(PATH)

.PHONY: install run test build test-deps clean bench

install: $(STAMP) build

$(STAMP): pyproject.toml scripts/install-system.sh
	bash scripts/install-system.sh
	python3 -m venv $(VENV)
	$(PY) -m pip install -q --upgrade pip
	$(PY) -m pip install -q -e '.[test]'
	touch $(STAMP)

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
test-deps:
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
